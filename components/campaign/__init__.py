"""The campaign as a whole: its stages wired together (``stages.Campaign``), the schedule of its
steps (``schedule``), an attempt at it with its state, MLflow run and resume (``run``), the
durable state (``state``), the validation gate (``preflight``), and the work around it (``bench``,
``promotion``)."""
