"""A transient fault in a user's pipeline step, for campaigns that must survive one: the experience
operator ``fails_once_in_round`` raises the first time it sees round ``round`` while ``ARMED``,
and otherwise keeps every row."""

from __future__ import annotations

from rftflow.components.data.pipelines import register_operator

ARMED = {"fail": False}


def register_fails_once_in_round() -> None:
    """Register (again: a test's registrations may have replaced it) the ``fails_once_in_round`` operator."""
    @register_operator("experiences", "fails_once_in_round")
    def operator(table, round: int = 1):
        if ARMED["fail"] and table.num_rows and table.column("round")[0].as_py() == round:
            ARMED["fail"] = False
            raise RuntimeError(f"a fault in round {round}")
        return table
