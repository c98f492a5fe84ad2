"""Verify: what a round's rollouts are worth and whether they may be kept — rewards
(``rewards``: the built-ins, a team's own by import path in ``imported``, weighted combinations),
length shaping (``shaping``), scoring a table of rollouts and greedy evaluation (``scoring``), and
the round's check (``check``: scores, the experience contract, the experience pipeline)."""
