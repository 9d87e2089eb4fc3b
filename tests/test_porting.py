"""Porting from `create_agent` (issue 22, item 7): your own `context_schema`, and errors that tell an unknown thread
from a finished one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from gate_app import build, effects_for

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.threads import UnknownThread
from gatedloop.graph import runs
from gatedloop.nodes.gate.hitl import InvalidDecision


@dataclass(frozen=True)
class TenantContext:
    """A context_schema a create_agent user may already have: identity plus fields of their own."""

    user_id: str
    roles: frozenset[str] = frozenset()
    tenant: str = "acme"


def test_your_context_schema_is_the_graphs_and_its_user_id_and_roles_are_the_identity(tmp_path: Path):
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build(saver, effects_for(saver), approvers={"finance"}, context_schema=TenantContext)
        assert "tenant" in graph.get_context_jsonschema()["properties"]  # what Studio's context form shows
        out = runs.start(graph, "t1", "pay 500 to bo as c1", context=TenantContext("ana", frozenset({"staff"})))
        assert out["__interrupt__"][0].value["action_requests"][0]["requested_by"] == "ana"
        with pytest.raises(InvalidDecision, match="finance"):
            runs.resume(graph, "t1", {"decisions": [{"type": "approve"}]}, context=TenantContext("cy"))
        out = runs.resume(
            graph, "t1", {"decisions": [{"type": "approve"}]}, context=TenantContext("bo", frozenset({"finance"}))
        )
        assert out["status"] == "completed"
        assert [a for _, a, _ in effects_for(saver).rows("pay")] == [{"amount": 500.0, "to": "bo"}]


def test_resuming_an_unknown_thread_is_not_the_same_error_as_resuming_a_finished_one(tmp_path: Path):
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build(saver, effects_for(saver))
        with pytest.raises(UnknownThread, match="unknown thread 'nope'"):
            runs.resume(graph, "nope", {"decisions": [{"type": "approve"}]})
        assert saver.ledger.thread_graph("nope") is None  # nothing recorded for a thread that does not exist
        runs.start(graph, "t1", "pay 5 to cy as c1")  # small: no approval needed
        with pytest.raises(InvalidDecision, match="is not waiting for an answer"):
            runs.resume(graph, "t1", {"decisions": [{"type": "approve"}]})
