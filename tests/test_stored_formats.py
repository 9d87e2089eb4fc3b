"""Stored formats stay readable: threads written by commits 2077b07 and 1ee2d3b resume on today's code.

tests/data/threads_COMMIT.sqlite was written by that commit's code (tests/data/make_threads.py says how) with the
graph of tests/data/stored_threads_app.py: 2077b07 from before graphs were recorded, 1ee2d3b the last from before
the evidence chain. Each holds a thread paused on an approval, one with one of two quorum
approvals, one with an edit waiting for its second approval, one asking whether a write whose connection was lost
happened, a completed thread of several turns, and one stopped by a limit. Each test copies each file and resumes
a thread with today's code; the expected JSON beside it is what the old code read back from it. A change to
checkpoint keys, ledger tables or columns, interrupt wire shapes or serialized state that old files cannot take
fails here.

1ee2d3b recorded each thread's graph (its name and tools) but not its tools' policies: today's code refuses such a
thread until an operator upgrades it explicitly (graph/thread_graph.py, `claim_thread`), so every run on that
file's threads here upgrades (`upgrade=True`, CLI `--upgrade-graph`), and a test shows the refusal without it.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from cli_in_process import run_cli
from langchain_core.messages import HumanMessage, ToolMessage

from gatedloop.checkpoints import idempotency_key, open_sqlite
from gatedloop.checkpoints.chain import CHAINED, GENESIS_TABLE, content_hash, row_key
from gatedloop.checkpoints.threads import describe_thread
from gatedloop.graph import GatedState, InvalidDecision, runs
from gatedloop.graph.thread_graph import NOT_RECORDED, GraphMismatch

DATA = Path(__file__).parent / "data"
if str(DATA) not in sys.path:
    sys.path.insert(0, str(DATA))

from stored_threads_app import (  # noqa: E402 (tests/data is importable only from here on)
    COMMITS,
    EFFECTS_TABLE,
    FINANCE_ALICE,
    FINANCE_BOB,
    REQUESTER,
    REVIEWER,
    Effects,
    build,
)

APP_TABLES = {EFFECTS_TABLE, "sqlite_sequence"}


@dataclass(frozen=True)
class OldFile:
    """A file an old commit wrote, and what that commit read back from it (its expected JSON)."""

    commit: str
    path: Path
    expected: dict[str, Any]

    @classmethod
    def of(cls, commit: str) -> OldFile:
        expected = json.loads((DATA / f"threads_{commit}.expected.json").read_text())
        assert expected["commit"] == commit
        return cls(commit, DATA / f"threads_{commit}.sqlite", expected)

    @property
    def threads(self) -> dict[str, Any]:
        return self.expected["threads"]

    @property
    def upgrade(self) -> bool:
        """Its threads' graphs were recorded without their policies (1ee2d3b): each must be upgraded explicitly."""
        return "gatedloop_thread_graphs" in schema(self.path) and "gatedloop_thread_policies" not in schema(self.path)


OLD_FILES = [OldFile.of(commit) for commit in COMMITS]
THREAD_IDS = sorted(OLD_FILES[0].threads)
assert all(sorted(old.threads) == THREAD_IDS for old in OLD_FILES), "every old file holds the same threads"


@pytest.fixture(params=OLD_FILES, ids=COMMITS)
def old(request: pytest.FixtureRequest) -> OldFile:
    return request.param


@pytest.fixture
def db(tmp_path: Path, old: OldFile) -> Path:
    """A copy of the old file: tests write to it."""
    copy = tmp_path / "threads.sqlite"
    shutil.copyfile(old.path, copy)
    return copy


@pytest.fixture
def graph(db: Path) -> Iterator[Any]:
    with open_sqlite(db) as saver:
        yield build(saver, db)


def schema(path: Path) -> dict[str, dict[str, str]]:
    """table -> column -> declared type, from sqlite_master."""
    with closing(sqlite3.connect(path)) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: {c[1]: c[2] for c in conn.execute(f"PRAGMA table_info('{t}')")} for t in tables}


def new_effects(old: OldFile, db: Path) -> list[tuple[str, dict[str, Any], str | None]]:
    """The tool executions since the old code wrote the file."""
    rows = Effects(db).rows()
    before = [tuple(row) for row in old.expected["effects"]]
    assert [(tool, args, key) for tool, args, key in rows[: len(before)]] == before
    return rows[len(before) :]


def answers(out: dict[str, Any]) -> dict[str, ToolMessage]:
    found: dict[str, ToolMessage] = {}
    for message in out["messages"]:
        if isinstance(message, ToolMessage):
            assert message.tool_call_id not in found, f"{message.tool_call_id} answered twice"
            found[message.tool_call_id] = message
    return found


def cli(db: Path, *args: str) -> Any:
    """`gatedloop --db DB --graph stored_threads_app.py:cli_graph ARGS`, in process."""
    env = {"STORED_THREADS_DB": str(db), "GATEDLOOP_MODEL": "demo", "OPENAI_API_KEY": ""}
    graph_ref = f"{DATA / 'stored_threads_app.py'}:cli_graph"
    return run_cli(["--db", str(db), "--graph", graph_ref, *args], env, cwd=db.parent)


def shown(db: Path, thread_id: str) -> list[dict[str, Any]]:
    """`gatedloop show THREAD --json` with this graph, in process: the audit trail as the CLI reads it."""
    ran = cli(db, "--json", "show", thread_id)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return [json.loads(line) for line in ran.stdout.splitlines()]


def rebuilt_request_matches(old: OldFile, graph: Any, thread_id: str, refused_answer: dict[str, Any], who: Any) -> None:
    """A refused answer makes today's code ask again: the request it rebuilds from the old thread's evidence has
    the old request's keys and values (the same request id, digests, approvals so far), plus the refusal."""
    with pytest.raises(InvalidDecision) as refused:
        runs.resume(graph, thread_id, refused_answer, context=who, upgrade=old.upgrade)
    again = runs.pending_request(graph, thread_id)
    stored = old.threads[thread_id]["request"]
    assert again is not None and again.pop("error") == str(refused.value)
    for action, stored_action in zip(again.get("action_requests", []), stored.get("action_requests", []), strict=True):
        assert action.pop("description").startswith(stored_action["description"] + "\n")  # + the refusal
    assert again == {**stored, **without_descriptions(stored)}


def without_descriptions(request: dict[str, Any]) -> dict[str, Any]:
    actions = request.get("action_requests")
    if actions is None:
        return {}
    return {"action_requests": [{k: v for k, v in a.items() if k != "description"} for a in actions]}


def test_the_old_files_tables_and_columns_are_all_in_todays_schema(tmp_path: Path, old: OldFile):
    today = tmp_path / "today.sqlite"
    with open_sqlite(today):
        pass
    old, new = schema(old.path), schema(today)
    assert {"checkpoints", "writes", "gatedloop_ledger", "gatedloop_audit", "gatedloop_calls"} <= old.keys()
    missing = {
        f"{table}.{column} {kind}"
        for table, columns in old.items()
        if table not in APP_TABLES
        for column, kind in columns.items()
        if new.get(table, {}).get(column) != kind
    }
    assert not missing, f"old files have columns today's schema lost or retyped: {sorted(missing)}"


@pytest.mark.parametrize("thread_id", THREAD_IDS)
def test_todays_code_reads_each_old_thread_as_the_old_code_did(old: OldFile, db: Path, thread_id: str):
    facts = old.threads[thread_id]
    if old.upgrade:  # `show` checks the thread's graph too, and has no upgrade: refused, read-only
        ran = cli(db, "show", thread_id)
        assert ran.returncode == 6 and NOT_RECORDED in ran.stderr and "--upgrade-graph" in ran.stderr, ran.stderr
    else:
        records = shown(db, thread_id)  # first, read-only: the file as the old code left it, and left as it was
        assert [r["event"] for r in records if r["type"] == "audit"] == facts["audit_events"]
        assert [r["status"] for r in records if r["type"] == "status"] == [facts["status"] or "waiting"]
    assert db.read_bytes() == old.path.read_bytes()
    with open_sqlite(db) as saver:
        graph = build(saver, db)
        out = runs.output(graph, thread_id)
        assert out.get("status") == facts["status"]
        assert sorted(out.keys() - {"__interrupt__"}) == facts["state_keys"]
        assert set(facts["state_keys"]) <= set(get_type_hints(GatedState)), "a stored state key left the schema"
        assert runs.pending_request(graph, thread_id) == facts["request"]
        entries = saver.ledger.entries(thread_id)
        assert [[e.call_id, e.tool, e.state, e.attempts] for e in entries] == facts["ledger"]
        assert [e["event"] for e in saver.ledger.audit(thread_id)] == facts["audit_events"]


def test_a_paused_approval_is_refused_to_its_requester_and_runs_once_when_approved(old: OldFile, graph: Any, db: Path):
    rebuilt_request_matches(old, graph, "approval-pending", {"decisions": [{"type": "approve"}]}, REQUESTER)
    out = runs.resume(
        graph, "approval-pending", {"decisions": [{"type": "approve"}]}, context=REVIEWER, upgrade=old.upgrade
    )
    assert out["status"] == "completed"
    assert new_effects(old, db) == [("pay", {"amount": 120.0, "to": "bo"}, idempotency_key("approval-pending", "p1"))]
    assert answers(out)["p1"].status == "success"
    events = [(e["event"], e["actor"]) for e in graph.checkpointer.ledger.audit("approval-pending")]
    assert ("decision", "rev") in events and ("executed", None) in events


def test_a_partial_quorum_keeps_its_first_approval_and_runs_once_on_the_second(old: OldFile, graph: Any, db: Path):
    rebuilt_request_matches(old, graph, "quorum-partial", {"decisions": [{"type": "approve"}]}, REVIEWER)  # not finance
    runs.resume(
        graph, "quorum-partial", {"decisions": [{"type": "approve"}]}, context=FINANCE_ALICE, upgrade=old.upgrade
    )
    request = runs.pending_request(graph, "quorum-partial")
    assert request is not None and request["action_requests"][0]["approved_by"] == ["alice"]  # she counts once
    assert new_effects(old, db) == []
    out = runs.resume(
        graph, "quorum-partial", {"decisions": [{"type": "approve"}]}, context=FINANCE_BOB, upgrade=old.upgrade
    )
    assert out["status"] == "completed"
    assert new_effects(old, db) == [("wire", {"amount": 900.0, "to": "cy"}, idempotency_key("quorum-partial", "w1"))]


def test_an_edit_waiting_for_its_second_approval_runs_once_with_the_edited_arguments(
    old: OldFile, graph: Any, db: Path
):
    rebuilt_request_matches(old, graph, "edit-pending", {"decisions": [{"type": "approve"}]}, REVIEWER)
    out = runs.resume(
        graph, "edit-pending", {"decisions": [{"type": "approve"}]}, context=FINANCE_BOB, upgrade=old.upgrade
    )
    assert out["status"] == "completed"
    assert new_effects(old, db) == [("wire", {"amount": 750.0, "to": "dee"}, idempotency_key("edit-pending", "w1"))]
    body = json.loads(str(answers(out)["w1"].content))
    assert body["ran_with"] == {"amount": 750.0, "to": "dee"}


def test_an_unknown_outcome_is_settled_by_a_person_and_never_replayed(old: OldFile, graph: Any, db: Path):
    done = {"type": "done", "result": {"payment": "seen at the bank"}}
    rebuilt_request_matches(old, graph, "unknown-outcome", {"decisions": [done]}, REQUESTER)  # self_approval=False
    out = runs.resume(graph, "unknown-outcome", {"decisions": [done]}, context=REVIEWER, upgrade=old.upgrade)
    assert out["status"] == "completed"
    assert new_effects(old, db) == []  # the payment the old run made (and lost the answer of) is not made again
    assert json.loads(str(answers(out)["p1"].content)) == done["result"]
    ledger = graph.checkpointer.ledger
    assert [(e.call_id, e.state) for e in ledger.entries("unknown-outcome")] == [("p1", "done")]
    assert ("marked done", "rev") in [(e["event"], e["actor"]) for e in ledger.audit("unknown-outcome")]


@pytest.mark.parametrize("thread_id", ["completed", "limit"])
def test_a_finished_thread_continues_with_a_new_message(old: OldFile, graph: Any, db: Path, thread_id: str):
    before = runs.output(graph, thread_id)["messages"]
    out = runs.start(graph, thread_id, "balance cy", context=REQUESTER, upgrade=old.upgrade)
    assert out["status"] == "completed"
    assert new_effects(old, db) == [("balance", {"account": "cy"}, None)]
    assert [m.id for m in out["messages"][: len(before)]] == [m.id for m in before]
    turns = sum(isinstance(m, HumanMessage) for m in out["messages"])
    assert answers(out)[f"b{turns}"].status == "success"
    assert [r["status"] for r in shown(db, thread_id) if r["type"] == "status"] == ["completed"]


def test_a_thread_waiting_on_an_unknown_outcome_is_described_as_a_question_not_a_crash(graph: Any):
    """The claimed write is the one the person is asked about: `gatedloop threads` says what to answer, and does
    not call it a write whose process stopped (which resuming alone would settle)."""
    summary = describe_thread(graph, "unknown-outcome", graph.checkpointer.ledger)
    assert summary.status == "waiting"
    assert "done, not_done or abandon" in summary.detail
    assert "process stopped" not in summary.detail


def test_resume_without_an_answer_names_the_flags_an_unknown_outcome_takes(old: OldFile, db: Path):
    """`gatedloop resume T` on a thread waiting on an unknown outcome prints the question and how to answer it:
    --done/--not-done/--abandon, not the approval flags (which it would refuse)."""
    ran = cli(db, *(["--upgrade-graph"] if old.upgrade else []), "resume", "unknown-outcome")
    assert ran.returncode == 3, ran.stdout + ran.stderr
    [hint] = [line for line in ran.stdout.splitlines() if "Answer with:" in line]
    assert hint.endswith("--done JSON, --not-done or --abandon") and "--approve" not in hint


@pytest.mark.parametrize("old", [o for o in OLD_FILES if o.upgrade], ids=lambda o: o.commit, indirect=True)
def test_a_thread_whose_policies_were_not_recorded_runs_only_once_upgraded(old: OldFile, graph: Any, db: Path):
    """A 1ee2d3b thread: refused (nothing run, nothing written) until an operator upgrades it; the upgrade is
    audited with every tool's policy from None (unknown) to today's, and the thread then resumes."""
    approve = {"decisions": [{"type": "approve"}]}
    with pytest.raises(GraphMismatch) as refused:
        runs.resume(graph, "approval-pending", approve, context=REVIEWER)
    assert NOT_RECORDED in refused.value.changes
    assert new_effects(old, db) == []
    ledger = graph.checkpointer.ledger
    assert [e["event"] for e in ledger.audit("approval-pending")] == old.threads["approval-pending"]["audit_events"]
    out = runs.resume(graph, "approval-pending", approve, context=REVIEWER, upgrade=True)
    assert out["status"] == "completed"
    [upgraded] = [e for e in ledger.audit("approval-pending") if e["event"].startswith("graph_upgraded:")]
    assert upgraded["actor"] == "rev"
    assert {c["from"] for c in upgraded["detail"]["policies"].values()} == {None}


def test_an_old_file_gains_an_evidence_chain_from_its_first_new_row(old: OldFile, graph: Any, db: Path):
    """Invariant 14 on a file from before the chain: it opens and resumes; the chain's genesis row counts the rows
    the file held, every row written since is chained (and only those: the earlier rows are not claimed as
    verified), and `audit verify` passes, saying where the chain begins and how many earlier rows it leaves out."""
    ledger = graph.checkpointer.ledger
    assert ledger.chain() == []
    held = {
        table: {row_key(table, row): content_hash(table, row) for row in ledger.chained_rows(table)}
        for table in CHAINED
    }
    out = runs.resume(
        graph, "approval-pending", {"decisions": [{"type": "approve"}]}, context=REVIEWER, upgrade=old.upgrade
    )
    assert out["status"] == "completed"
    genesis, *chained = ledger.chain()
    assert genesis.table == GENESIS_TABLE and genesis.seq == 1
    assert {t: v["rows"] for t, v in json.loads(genesis.key)["before"].items()} == {t: len(k) for t, k in held.items()}
    now = {(t, row_key(t, row)): content_hash(t, row) for t in CHAINED for row in ledger.chained_rows(t)}
    before = {(t, key): digest for t, rows in held.items() for key, digest in rows.items()}
    written = {place for place, digest in now.items() if before.get(place) != digest}  # new rows, and rows updated
    assert {(e.table, e.key) for e in chained} == written and written - before.keys()
    assert all(before.get((e.table, e.key)) != e.content_hash for e in chained), "an earlier row's content chained"
    report = ledger.verify_chain()
    assert report.ok, report.problems
    earlier = sum(len(keys) for keys in held.values())
    assert report.begins.startswith("chain row 1, at ") and f"after {earlier} earlier rows" in report.begins
    verified = run_cli(["--db", str(db), "audit", "verify"], {"PATH": "/usr/bin:/bin", "HOME": str(db.parent)})
    assert verified.returncode == 0, verified.stderr
    assert f"{report.entries} chain rows verify ({report.begins})" in verified.stdout
    assert report.entries == 1 + len(chained) and "not verified" in report.begins
