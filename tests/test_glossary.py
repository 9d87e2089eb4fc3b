"""The README's glossary names what the code names: every code name in it exists, and every value the code
spells for a glossary word (outcome statuses, ledger states, decision types, verdicts, statuses) is in it."""

from __future__ import annotations

import importlib
import re
import typing

import pytest
from doc_text import section

MODULES = {
    "running": "gatedloop.nodes.run.running",
    "outcomes": "gatedloop.nodes.gate.outcomes",
    "hitl": "gatedloop.nodes.wire.hitl",
    "unknown": "gatedloop.nodes.run.unknown",
    "policy": "gatedloop.tools.policy",
    "ledger": "gatedloop.checkpoints.ledger",
    "threads": "gatedloop.checkpoints.threads",
    "runs": "gatedloop.graph.runs",
    "state": "gatedloop.nodes.state",
    "evidence": "gatedloop.checkpoints.evidence",
    "proposals": "gatedloop.nodes.gate.proposals",
    "admission": "gatedloop.nodes.gate.admission",
    "lease": "gatedloop.checkpoints.lease",
}


def glossary() -> dict[str, tuple[str, str]]:
    """word -> (meaning, code names) from the README's Glossary table."""
    rows = {}
    for line in section("Glossary").splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 3 and cells[0] not in ("word", "---"):
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def resolve(name: str) -> object:
    """`module.Name`, `Name` (searched in every module) or `Name.field` (an attribute or a TypedDict key)."""
    head, _, rest = name.partition(".")
    if head in MODULES:
        found: object = importlib.import_module(MODULES[head])
        parts = rest.split(".")
    else:
        found = next((vars(m)[head] for m in map(importlib.import_module, MODULES.values()) if head in vars(m)), None)
        assert found is not None, f"{head} is defined in none of {sorted(MODULES)}"
        parts = rest.split(".") if rest else []
    for part in parts:
        if part in getattr(found, "__annotations__", {}) and not hasattr(found, part):
            return found
        found = getattr(found, part)
    return found


def test_the_glossary_has_the_words_a_user_meets():
    assert {"request", "call", "decision", "outcome", "status"} <= set(glossary())
    assert {"ledger", "evidence", "plan", "proposal", "admission", "settle", "lease"} <= set(glossary())


@pytest.mark.parametrize("word", sorted(glossary()))
def test_every_code_name_in_the_glossary_exists(word):
    names = re.findall(r"`([A-Za-z_.]+)`", glossary()[word][1])
    assert names, word
    for name in names:
        resolve(name)


@pytest.mark.parametrize(
    ("word", "spelled"),
    [
        ("outcome", "outcomes.OutcomeStatus"),
        ("outcome", "ledger.FinishedState"),
        ("decision", "policy.DecisionType"),
        ("decision", "hitl.UnknownDecisionType"),
        ("verdict", "state.Verdict"),
        ("verdict", "evidence.CallVerdict"),
    ],
)
def test_every_value_the_code_spells_is_in_the_glossary(word, spelled):
    meaning = glossary()[word][0]
    for value in typing.get_args(resolve(spelled)):
        assert f"`{value}`" in meaning, (word, value)


def test_the_glossary_status_points_to_the_table_of_every_status():
    from gatedloop.graph import STATUSES

    table = section("What ends a request (`status`)")
    assert "(docs/policies.md#what-ends-a-request-status)" in glossary()["status"][0]
    assert all(f"| `{status}` |" in table for status in STATUSES)
