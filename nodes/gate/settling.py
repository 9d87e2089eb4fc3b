"""The settle table for a write whose outcome is unknown: what to do next, decided from facts, never by I/O.

A write that timed out, lost its connection or whose process died may or may not have happened. In order:

- the ledger holds a finished outcome (a late finish): `recorded`, answer with it;
- the tool's `reconcile` returned a result: `reconciled`, it happened, answer with the result;
- `reconcile` returned None (it did not happen), the write was claimed, and no attempt may still be running:
  `rerun` (one winner, by a conditional re-claim), or `superseded` when a new message made the call moot;
- anything else (`reconcile` cannot tell or raised, or an attempt may still be running): `ask`, a person decides.

When a person is asked, her answer is the second half of the table (`answered_step`): done, abandon, or not done
(run it again, unless a late finish was recorded meanwhile or a new message made the call moot).

nodes/run/unknown.py gathers the facts (the ledger, the tool's `reconcile`, whether a claimant lives) and carries
the step out; these tables are the whole decision, so a unit test needs no database.
"""

from __future__ import annotations

from typing import Literal

CANNOT_TELL = object()
"""The tool's `reconcile` cannot say whether the write happened (it has none, or it raised)."""

SettleStep = Literal["recorded", "reconciled", "rerun", "superseded", "ask"]


def settle_step(
    *,
    recorded: bool,
    reconciled: object = CANNOT_TELL,
    claimed: bool = False,
    may_be_running: bool = True,
    rerun: bool = True,
) -> SettleStep:
    """The next step for an unknown outcome. `reconciled` is the tool's answer (a result, None for "did not
    happen", or CANNOT_TELL); `may_be_running` is consulted only when a re-run is otherwise due, so the caller
    may leave it at its default (True: never re-run what may be running) until then."""
    if recorded:
        return "recorded"
    if reconciled is not CANNOT_TELL and reconciled is not None:
        return "reconciled"
    if reconciled is None and claimed and not may_be_running:
        return "rerun" if rerun else "superseded"
    return "ask"


AnswerStep = Literal["marked_done", "abandoned", "recorded", "superseded", "rerun"]


def answered_step(decision: str, *, recorded: bool, rerun: bool) -> AnswerStep:
    """What a person's accepted answer (`done`, `abandon` or `not_done`) to an unknown outcome leads to.
    `recorded`: the ledger holds a finished outcome by now (a late finish: it did happen, whatever she said of it
    not having); `rerun`: the call may still run (no new message made it moot)."""
    if decision == "done":
        return "marked_done"
    if decision == "abandon":
        return "abandoned"
    if recorded:
        return "recorded"
    return "rerun" if rerun else "superseded"
