"""A reward's verdict on one response: the names a reward's author imports (``Score``, and
``RewardUnavailable`` where no row can be quarantined instead). Defined with the rest of the
verdict in ``components.evaluation.verdicts``, which evaluation, below verify, reads too."""

from rftflow.components.evaluation.verdicts import RewardUnavailable, Score

__all__ = ["RewardUnavailable", "Score"]
