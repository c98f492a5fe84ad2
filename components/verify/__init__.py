"""Verify: what a round's rollouts are worth and whether they may be kept — rewards
(``rewards``), scoring a table of rollouts and greedy evaluation (``scoring``), and the round's
check (``check``: scores, the experience contract, the experience pipeline)."""
