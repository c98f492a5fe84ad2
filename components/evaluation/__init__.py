"""Evaluation: held-out tasks answered greedily and scored by their own reward — the verdict a reward
gives (``verdicts``: ``Score``, ``Graded``, ``is_correct``) and greedy evaluation (``greedy``: scores,
accuracy, a mixture's metrics). Written against an engine's ``generate`` and a reward's protocol, so
that explore's workflows, verify's scoring, bench and promotion share it without importing each other."""
