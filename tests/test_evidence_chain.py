"""Invariant 14: the evidence is a hash chain, signed when a key is configured (issue 33, checkpoints/chain.py).

Every evidence and audit row is chained in its own transaction; `verify` names the first row that does not hold
after a row is deleted, a verdict or an argument digest edited, two rows swapped, or a row inserted with hashes
recomputed by someone without the key; an untouched ledger verifies, on SQLite and Postgres (one body per backend;
on Postgres each test gets a schema of its own, since the chain is one per database). Several writers at once
leave a chain that verifies. An export verifies offline, and not after any byte of a receipt changes.

The chain's ends (issue 50): with a key the genesis is signed, and a new unsigned genesis that excuses every row
(hiding an edit) fails `verify` with the key; a chain begun unsigned by an older release verifies without a key
and says so. A tail cut with its signatures is found against a head published to a witness file (`audit sign
--witness`, or each signed decision's with `GATEDLOOP_AUDIT_WITNESS`), live and offline.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from backends import Backend, isolated
from cli_in_process import run_cli
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command

from gatedloop.checkpoints import chain as chain_mod
from gatedloop.checkpoints.chain import CHAINED, SignedHead, Signer, chain_hash, content_hash, row_key
from gatedloop.checkpoints.evidence import ApprovalRecord, AuditEvent
from gatedloop.checkpoints.receipts import build_receipts, receipt_line, verify_lines, verify_receipt
from gatedloop.checkpoints.witness import append_head
from gatedloop.graph import CallContext, build_graph, runs
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

REQUESTER = CallContext("ann", frozenset())
REVIEWER = CallContext("rev", frozenset({"finance"}))


@tool
def refund(order_id: str, amount: float) -> dict[str, Any]:
    """Refund an order (a write that needs approval)."""
    return {"order_id": order_id, "refunded": amount}


def one_refund(messages: list[BaseMessage]) -> AIMessage:
    if isinstance(messages[-1], ToolMessage):
        return reply("refunded")
    return reply(calls=[call("refund", {"order_id": "A-1", "amount": 12.5}, "refund-1")])


def approved_refund(saver: Any, thread_id: str, justification: str | None = None) -> dict[str, Any]:
    graph = build_graph(
        ScriptedChatModel(responder=one_refund),
        [refund],
        policies={"refund": ToolPolicy(effect="write", approval="always")},
        checkpointer=saver,
    )
    asked = runs.start(graph, thread_id, "refund A-1", context=REQUESTER)["__interrupt__"][0].value
    decision: dict[str, Any] = {"type": "approve"}
    if justification:
        decision["justification"] = justification
    return {**runs.resume(graph, thread_id, {"decisions": [decision]}, context=REVIEWER), "asked": asked}


def sql(saver: Any, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """A statement run as someone with write access to the database would, around gatedloop."""
    ledger = saver.ledger
    if ledger.postgres:
        with ledger._pool.connection() as conn, conn.cursor(row_factory=__import__("psycopg").rows.tuple_row) as cur:
            cur.execute(query.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []
    with ledger._writer as conn:
        cursor = conn.execute(query, params)
        return cursor.fetchall()


def entry_of(saver: Any, table: str, **match: Any) -> chain_mod.ChainEntry:
    rows = [r for r in saver.ledger.chained_rows(table) if all(r[k] == v for k, v in match.items())]
    key = row_key(table, rows[-1])
    return [e for e in saver.ledger.chain() if e.table == table and e.key == key][-1]


def delete_approval(saver: Any) -> chain_mod.ChainEntry:
    entry = entry_of(saver, "gatedloop_approvals", thread_id="t")
    sql(saver, "DELETE FROM gatedloop_approvals WHERE thread_id='t'")
    return entry


def edit_verdict(saver: Any) -> chain_mod.ChainEntry:
    entry = entry_of(saver, "gatedloop_approvals", thread_id="t")
    sql(saver, "UPDATE gatedloop_approvals SET decision='reject' WHERE thread_id='t'")
    return entry


def edit_args_digest(saver: Any) -> chain_mod.ChainEntry:
    entry = entry_of(saver, "gatedloop_calls", thread_id="t", call_id="refund-1")
    sql(saver, "UPDATE gatedloop_calls SET args_digest=? WHERE thread_id='t'", ("0" * 64,))
    return entry


def swap_audit_rows(saver: Any) -> chain_mod.ChainEntry:
    """The decision and the validation trade places (their contents swap seq)."""
    validated = entry_of(saver, "gatedloop_audit", thread_id="t", event="validated")
    rows = {r["event"]: r for r in saver.ledger.chained_rows("gatedloop_audit") if r["thread_id"] == "t"}
    first, second = rows["validated"], rows["decision"]
    for row, other in ((first, second), (second, first)):
        sql(
            saver,
            "UPDATE gatedloop_audit SET event=?, actor=?, at=?, detail=? WHERE seq=?",
            (other["event"] + "~", other["actor"], other["at"], other["detail"], row["seq"]),
        )
    sql(saver, "UPDATE gatedloop_audit SET event=replace(event, '~', '') WHERE thread_id='t'")
    return validated


def forge_approval(saver: Any) -> chain_mod.ChainEntry:
    """Someone without the key inserts an approval with its chain entry, every hash recomputed correctly."""
    head = saver.ledger.chain()[-1]
    sql(
        saver,
        "INSERT INTO gatedloop_approvals (thread_id, call_id, tool, args_digest, reviewer, roles, decision, at)"
        " VALUES ('t', 'refund-1', 'refund', 'forged', 'mallory', '[]', 'approve', 1.0)",
    )
    row = next(r for r in saver.ledger.chained_rows("gatedloop_approvals") if r["reviewer"] == "mallory")
    key, content, seq = row_key("gatedloop_approvals", row), content_hash("gatedloop_approvals", row), head.seq + 1
    sql(
        saver,
        "INSERT INTO gatedloop_chain (seq, row_table, row_key, content_hash, prev_hash, chain_hash, at, signature)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
        (
            seq,
            "gatedloop_approvals",
            key,
            content,
            head.chain_hash,
            chain_hash(seq, "gatedloop_approvals", key, content, head.chain_hash, 2.0),
            2.0,
        ),
    )
    return saver.ledger.chain()[-1]


def insert_unchained(saver: Any) -> str:
    sql(
        saver,
        "INSERT INTO gatedloop_audit (thread_id, call_id, event, actor, at, detail) VALUES ('t', 'x', 'decision',"
        " 'mallory', 1.0, '{}')",
    )
    return "gatedloop_audit"


TAMPERS = {
    "deleted row": (delete_approval, "the row is gone"),
    "edited verdict": (edit_verdict, "no longer matches"),
    "edited argument digest": (edit_args_digest, "no longer matches"),
    "swapped rows": (swap_audit_rows, "no longer matches"),
    "inserted with recomputed hashes, no key": (forge_approval, "no valid signature covers"),
}


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_verify_names_the_first_row_that_does_not_hold(backend: Backend, tamper: str):
    change, reason = TAMPERS[tamper]
    signer = Signer.generate()
    with isolated(backend) as store, store.open() as saver:
        assert saver.ledger.postgres == (backend.name == "postgres")  # the backend it says, not a file named so
        saver.ledger.signer = signer
        assert approved_refund(saver, "t")["status"] == "completed"
        before = saver.ledger.verify_chain(signer.verifier)
        assert before.ok, before.problems
        assert before.signatures >= 1 and before.begins.startswith("chain row 1")
        bad = change(saver)
        after = saver.ledger.verify_chain(signer.verifier)
    assert not after.ok
    assert after.first_bad is not None and after.first_bad.startswith(bad.where()), after.problems
    assert reason in after.first_bad


def test_a_row_written_without_a_chain_entry_is_found(backend: Backend):
    with isolated(backend) as store, store.open() as saver:
        approved_refund(saver, "t")
        table = insert_unchained(saver)
        report = saver.ledger.verify_chain()
    assert not report.ok and report.first_bad is not None and report.first_bad.startswith(table)
    assert "not in" in report.first_bad


def test_several_writers_at_once_leave_a_chain_that_verifies(backend: Backend):
    """Four writers, each on a ledger (connections) of its own, claim, decide and audit at once; the chain holds
    every row once, in commit order, every link and signature good."""
    signer = Signer.generate()
    writers, calls = 4, 6
    with isolated(backend) as store:
        ledgers = [store.ledger() for _ in range(writers)]
        assert ledgers[0].postgres == (backend.name == "postgres")
        start = threading.Barrier(writers)
        failures: list[BaseException] = []

        def write(index: int) -> None:
            ledger = ledgers[index]
            ledger.signer = signer
            try:
                start.wait()
                for n in range(calls):
                    call_id = f"w{index}-{n}"
                    ledger.claim("many", call_id, "book", "digest")
                    record = ApprovalRecord(call_id, "book", "digest", f"rev{index}", frozenset(), "approve", 1.0)
                    event = AuditEvent(call_id, "decision", {"decision": "approve"}, f"rev{index}")
                    ledger.record_approvals("many", [record], [event])
                    ledger.finish("many", call_id, "done", {"n": n})
            except BaseException as exc:  # reported below
                failures.append(exc)

        workers = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        try:
            assert not failures, failures
            report = ledgers[0].verify_chain(signer.verifier)
            assert report.ok, report.problems
            assert report.entries == 1 + writers * calls * 4  # genesis; claim, audit, approval, finish per call
        finally:
            for ledger in ledgers:
                ledger.close()


def test_on_postgres_an_append_that_waited_for_the_lock_chains_after_what_the_holder_committed():
    """The chain's lock and head are read in one round trip on Postgres; the head must still be read after the lock
    is won. A transaction appends an audit row and holds the lock open; another ledger's append waits for it; once
    the holder commits, the waiter chains after the holder's entry (a head read from before the wait would reuse
    its seq: a duplicate key, and a fork)."""
    import psycopg
    from pg_server import require_postgres

    from gatedloop.checkpoints.evidence import audit_statements

    with isolated(Backend("postgres", require_postgres())) as store:
        waiter = store.ledger()
        try:
            waiter.record("t", "first", "note", {})  # the genesis and one entry
            with psycopg.connect(store.db, autocommit=True) as holder:
                with holder.transaction(), holder.cursor() as cur:

                    def execute(query: str, params: Any, fetch: bool) -> list[Any]:
                        cur.execute(query.replace("?", "%s"), tuple(params))
                        return cur.fetchall() if fetch else []

                    held = chain_mod.drive(
                        execute,
                        chain_mod.chained_statements(
                            "?", True, audit_statements("t", [AuditEvent("held", "note", {})]), None, started=True
                        ),
                    )
                    appended: list[BaseException | None] = []

                    def append() -> None:
                        try:
                            waiter.record("t", "waited", "note", {})
                            appended.append(None)
                        except BaseException as exc:  # reported below
                            appended.append(exc)

                    worker = threading.Thread(target=append)
                    worker.start()
                    key = (chain_mod.CHAIN_LOCK_KEY >> 32 & 0xFFFFFFFF, chain_mod.CHAIN_LOCK_KEY & 0xFFFFFFFF)
                    with psycopg.connect(store.db, autocommit=True) as watcher:
                        for _ in range(500):  # until the waiter is queued on the chain's lock
                            waiting = watcher.execute(
                                "SELECT count(*) FROM pg_locks WHERE locktype='advisory' AND NOT granted"
                                " AND classid=%s::oid AND objid=%s::oid",
                                key,
                            ).fetchone()
                            if waiting and waiting[0]:
                                break
                            time.sleep(0.01)
                        else:
                            raise AssertionError("the second append never waited for the chain's lock")
                    assert not appended  # still waiting while the holder's transaction is open
                worker.join(10)
            assert appended == [None]
            entries = waiter.chain()
            assert [e.seq for e in entries] == list(range(1, held.head + 2))
            assert entries[-1].prev_hash == entries[-2].chain_hash and entries[-2].seq == held.head
            report = waiter.verify_chain()
            assert report.ok, report.problems
        finally:
            waiter.close()


def test_the_chained_columns_are_every_column_of_each_evidence_table(db: str):
    """A column added to an evidence table is hashed too (else an edit of it would go unnoticed)."""
    import sqlite3
    from contextlib import closing

    from gatedloop.checkpoints.ledger import SCHEMA

    with closing(sqlite3.connect(db)) as conn:
        conn.executescript(SCHEMA)
        for table, spec in CHAINED.items():
            assert tuple(c[1] for c in conn.execute(f"PRAGMA table_info('{table}')")) == spec.columns, table


# --- receipts -------------------------------------------------------------------------------------------------


def test_an_export_verifies_offline_and_fails_after_any_byte_changes(db: str, tmp_path: Path):
    keys = tmp_path / "keys"
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    made = run_cli(["keys", "init", "--out", str(keys)], env)
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE((keys / "signing.key").stat().st_mode) == 0o600
    env["GATEDLOOP_SIGNING_KEY"] = str(keys / "signing.key")
    os.environ["GATEDLOOP_SIGNING_KEY"] = env["GATEDLOOP_SIGNING_KEY"]
    try:
        from gatedloop.checkpoints import open_sqlite

        with open_sqlite(db) as saver:
            assert saver.ledger.signer is not None
            asked = approved_refund(saver, "t", justification="customer called; order A-1 was damaged")["asked"]
    finally:
        del os.environ["GATEDLOOP_SIGNING_KEY"]
    out = tmp_path / "receipts.jsonl"
    exported = run_cli(["--db", db, "audit", "export", "--out", str(out)], env)
    assert exported.returncode == 0, exported.stderr
    lines = out.read_text().splitlines()
    receipts = [json.loads(line) for line in lines]
    assert [r["kind"] for r in receipts] == ["decision", "write"]
    decision, write = (r["summary"] for r in receipts)
    assert decision["verdict"] == "approve" and decision["decider"] == {"user_id": "rev", "roles": ["finance"]}
    assert decision["requester"] == {"user_id": "ann", "roles": []}
    assert decision["justification"] == "customer called; order A-1 was damaged"
    assert decision["request_id"] == asked["request_id"]  # the request the reviewer was shown
    assert decision["tool"] == "refund" and len(decision["args_digest"]) >= 32 and decision["policy_digest"]
    assert write["verdict"] == "done" and write["outcome_digest"] and write["args_digest"] == decision["args_digest"]
    assert all(r["signed"] for r in receipts)
    assert "refunded" not in lines[1]  # the tool's result is in a receipt only as its hash
    offline = {"PATH": env["PATH"], "HOME": str(tmp_path)}  # no key, no database
    checked = run_cli(["audit", "verify", str(out), "--public-key", str(keys / "signing.pub")], offline)
    assert checked.returncode == 0, checked.stderr
    assert "2 receipts verify" in checked.stdout

    verifier = chain_mod.load_verifier(str(keys / "signing.pub"))
    line = lines[0]
    for position in range(len(line)):
        changed = line[:position] + ("x" if line[position] != "x" else "y") + line[position + 1 :]
        assert verify_receipt(changed, verifier) is not None, f"a change at byte {position} went unnoticed"
    other = Signer.generate().verifier
    assert verify_receipt(line, other) is not None  # another key's holder did not sign it
    out.write_text(line[:-2] + "x" + line[-1] + "\n" + lines[1] + "\n")
    tampered = run_cli(["audit", "verify", str(out), "--public-key", str(keys / "signing.pub")], offline)
    assert tampered.returncode == 1 and "line 1" in tampered.stderr


def test_live_verify_and_sign_from_the_cli(db: str, tmp_path: Path):
    signer = Signer.generate()
    key = tmp_path / "signing.key"
    key.write_bytes(signer.private_pem())
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "GATEDLOOP_SIGNING_KEY": str(key)}
    from gatedloop.checkpoints import open_sqlite

    with open_sqlite(db) as saver:
        saver.ledger.signer = signer
        approved_refund(saver, "t")
    signed = run_cli(["--db", db, "audit", "sign"], env)
    assert signed.returncode == 0 and "signed chain row" in signed.stdout, signed.stderr
    good = run_cli(["--db", db, "audit", "verify"], env)
    assert good.returncode == 0 and "chain rows verify (chain row 1" in good.stdout, good.stderr
    with open_sqlite(db) as saver:
        bad = edit_verdict(saver)
    broken = run_cli(["--db", db, "--json", "audit", "verify"], env)
    assert broken.returncode == 1
    assert json.loads(broken.stdout.splitlines()[-1])["first_bad"].startswith(bad.where())


def test_since_takes_iso_times_and_epoch_seconds():
    from gatedloop.cli.app import CliError
    from gatedloop.cli.evidence import since_time

    assert since_time("2026-01-31T12:00Z") == since_time("2026-01-31T12:00:00+00:00") == 1769860800.0
    assert since_time("1769860800") == 1769860800.0 and since_time(None) is None
    with pytest.raises(CliError, match="ISO 8601"):
        since_time("last tuesday")


def test_receipts_need_no_key_to_be_hash_checked(db: str):
    from gatedloop.checkpoints import open_sqlite

    with open_sqlite(db) as saver:
        saver.ledger.signer = None
        approved_refund(saver, "t")
        receipts = build_receipts(saver.ledger)
        at = [datetime.fromisoformat(r["summary"]["at"]).timestamp() for r in receipts]  # to the millisecond
        assert build_receipts(saver.ledger, thread="another") == []
        assert build_receipts(saver.ledger, since=at[-1] + 1) == []
        assert len(build_receipts(saver.ledger, thread="t", since=at[0])) == len(receipts)
    lines = [receipt_line(r) for r in receipts]
    assert not any(r["signed"] for r in receipts)
    assert verify_lines(lines, None).problems == []
    assert verify_lines(lines, Signer.generate().verifier).problems  # a key expects a signed head


# --- justification ----------------------------------------------------------------------------------------------


def test_a_policy_that_requires_a_justification_refuses_a_decision_without_one(db: str):
    from gatedloop.checkpoints import open_sqlite
    from gatedloop.graph import InvalidDecision

    with open_sqlite(db) as saver:
        graph = build_graph(
            ScriptedChatModel(responder=one_refund),
            [refund],
            policies={"refund": ToolPolicy(effect="write", approval="always", justification=("approve", "reject"))},
            checkpointer=saver,
        )
        request = runs.start(graph, "t", "refund A-1", context=REQUESTER)["__interrupt__"][0].value
        assert request["review_configs"][0]["justification_required"] == ["approve", "reject"]
        with pytest.raises(InvalidDecision, match="'approve' needs a justification"):
            runs.resume(graph, "t", {"decisions": [{"type": "approve", "justification": "  "}]}, context=REVIEWER)
        with pytest.raises(InvalidDecision, match="justification must be a string"):
            runs.resume(graph, "t", {"decisions": [{"type": "approve", "justification": 7}]}, context=REVIEWER)
        assert [e for e in saver.ledger.audit("t") if e["event"].startswith("answer_refused")] == []  # checked first
        # The same answer straight into the graph (no runs.* check first) is refused by the gate, and audited.
        config = {"configurable": {"thread_id": "t"}}
        bare = Command(resume={"decisions": [{"type": "approve"}]})
        out = graph.invoke(bare, config, context=REVIEWER, durability="sync")
        assert "'approve' needs a justification" in out["__interrupt__"][0].value["error"]
        [refused] = [e for e in saver.ledger.audit("t") if e["event"].startswith("answer_refused")]
        assert (refused["actor"], refused["detail"]["request_id"]) == ("rev", request["request_id"])
        out = runs.resume(
            graph, "t", {"decisions": [{"type": "approve", "justification": " ticket 4711 "}]}, context=REVIEWER
        )
        assert out["status"] == "completed"
        audit = saver.ledger.audit("t")
    [decision] = [e for e in audit if e["event"] == "decision"]
    assert decision["detail"]["justification"] == "ticket 4711" and decision["actor"] == "rev"
    assert decision["detail"]["request_id"] == request["request_id"]


def test_a_justification_is_optional_unless_required_and_part_of_the_policy_only_when_set():
    assert ToolPolicy(justification=True).justification == ("approve", "edit", "reject", "respond")
    assert ToolPolicy(justification="reject").justification == ("reject",)
    assert "justification" not in ToolPolicy().summary()  # old threads' policy digests stay as they were
    assert ToolPolicy(justification="approve").summary()["justification"] == ["approve"]
    with pytest.raises(ValueError, match="justification"):
        ToolPolicy(justification=("sign",))  # type: ignore[arg-type]


def test_resume_justification_goes_into_every_decision():
    import argparse

    from gatedloop.cli.main import parser, resume_answer

    args = parser().parse_args(["resume", "t", "--request", "req-1", "--approve", "--justification", "ok by ops"])
    request = {
        "request_id": "req-1",
        "action_requests": [
            {"name": "refund", "tool_call_id": "a", "args_digest": "d1"},
            {"name": "refund", "tool_call_id": "b", "args_digest": "d2"},
        ],
    }
    answer = resume_answer(args, request)
    assert [d["justification"] for d in answer["decisions"]] == ["ok by ops", "ok by ops"]
    assert isinstance(args, argparse.Namespace)


# --- the chain's ends: its genesis and its tail (issue 50) ------------------------------------------------------

DATA = Path(__file__).resolve().parent / "data"


def key_files(tmp_path: Path) -> tuple[Signer, Path, Path]:
    """A fresh key pair on disk: the signer, its private key's file and its public key's file."""
    signer = Signer.generate()
    private, public = tmp_path / "signing.key", tmp_path / "signing.pub"
    private.write_bytes(signer.private_pem())
    public.write_bytes(signer.verifier.public_pem())
    return signer, private, public


def plain_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A CLI environment with no key unless given: what an auditor's shell holds."""
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), **extra}


def earlier_counts(saver: Any) -> dict[str, dict[str, int]]:
    """What a genesis written now would count as before the chain: every row of every evidence table."""
    counts = {}
    for table, spec in CHAINED.items():
        rows = saver.ledger.chained_rows(table)
        top = max((int(r["seq"]) for r in rows), default=0) if "seq" in spec.columns else 0
        counts[table] = {"rows": len(rows), "max_seq": top}
    return counts


def regenesis(saver: Any, signature: str | None) -> None:
    """Someone without the key edits a decision, deletes the chain and writes one genesis that counts every row as
    earlier than the chain (so none of them is checked), every hash computed correctly."""
    sql(saver, "UPDATE gatedloop_approvals SET decision='reject' WHERE thread_id='t'")
    sql(saver, "DELETE FROM gatedloop_chain")
    key = chain_mod.canonical({"version": 1, "before": earlier_counts(saver)})
    content, zero = chain_mod.sha256(key), chain_mod.ZERO_HASH
    sql(
        saver,
        "INSERT INTO gatedloop_chain (seq, row_table, row_key, content_hash, prev_hash, chain_hash, at, signature)"
        " VALUES (1, 'genesis', ?, ?, ?, ?, 2.0, ?)",
        (key, content, zero, chain_hash(1, "genesis", key, content, zero, 2.0), signature),
    )


@pytest.mark.parametrize("signature", ["none", "the first genesis's"])
def test_a_new_genesis_that_excuses_every_row_does_not_hide_an_edit(backend: Backend, tmp_path: Path, signature: str):
    signer, _, public = key_files(tmp_path)
    with isolated(backend) as store:
        with store.open() as saver:
            saver.ledger.signer = signer
            approved_refund(saver, "t")
            first = saver.ledger.chain()[0]
            assert first.table == "genesis" and first.signature is not None  # a key signs the genesis too
            regenesis(saver, None if signature == "none" else first.signature)
        checked = run_cli(["--db", store.db, "audit", "verify", "--public-key", str(public)], plain_env(tmp_path))
    assert checked.returncode == 1, checked.stdout
    assert "evidence does not verify: chain row 1 (genesis)" in checked.stderr, checked.stderr


def test_a_cut_tail_is_found_against_a_witnessed_head(backend: Backend, tmp_path: Path):
    """The newest rows, signed decisions and all, deleted with their chain entries: nothing in the database says the
    chain was longer, but the head `audit sign --witness` published outside it does."""
    signer, private, public = key_files(tmp_path)
    witness = tmp_path / "heads.jsonl"
    with isolated(backend) as store:
        with store.open() as saver:
            saver.ledger.signer = signer
            approved_refund(saver, "t")
            cut_from = saver.ledger.chain()[-1].seq + 1
            approved_refund(saver, "t2")
        sign = ["--db", store.db, "audit", "sign", "--key", str(private), "--witness", str(witness)]
        signed = run_cli(sign, plain_env(tmp_path))
        assert signed.returncode == 0, signed.stderr
        [head] = [json.loads(line) for line in witness.read_text().splitlines()]
        assert set(head) == {"seq", "chain_hash", "signature", "key_id", "at"} and head["seq"] > cut_from
        verify = ["--db", store.db, "audit", "verify", "--witness", str(witness), "--public-key", str(public)]
        whole = run_cli(verify, plain_env(tmp_path))
        assert whole.returncode == 0 and "witness" in whole.stdout, whole.stderr
        with store.open() as saver:
            for table, spec in CHAINED.items():
                if "thread_id" in spec.columns:  # the grants' own tables belong to no thread (t2 made none)
                    sql(saver, f"DELETE FROM {table} WHERE thread_id='t2'")
            sql(saver, "DELETE FROM gatedloop_chain WHERE seq >= ?", (cut_from,))
            assert saver.ledger.verify_chain(signer.verifier).ok  # without the witness: unnoticed
        cut = run_cli(verify, plain_env(tmp_path))
    assert cut.returncode == 1, cut.stdout
    assert f"witnessed head chain row {head['seq']}" in cut.stderr and f"ends at chain row {cut_from - 1}" in cut.stderr


def test_each_signed_decision_appends_its_head_to_the_witness_file(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    signer, _, public = key_files(tmp_path)
    witness = tmp_path / "heads.jsonl"
    monkeypatch.setenv("GATEDLOOP_AUDIT_WITNESS", str(witness))
    with isolated(backend) as store:
        with store.open() as saver:
            saver.ledger.signer = signer
            approved_refund(saver, "t")
            chain = {entry.seq: entry for entry in saver.ledger.chain()}
        heads = [json.loads(line) for line in witness.read_text().splitlines()]
        checked = run_cli(
            ["--db", store.db, "audit", "verify", "--witness", str(witness), "--public-key", str(public)],
            plain_env(tmp_path),
        )
    signed = [seq for seq, entry in chain.items() if entry.signature and entry.table != "genesis"]
    assert signed and [h["seq"] for h in heads] == signed  # one line per signed head, in order
    for head in heads:
        assert head["chain_hash"] == chain[head["seq"]].chain_hash and head["key_id"] == signer.key_id
        assert signer.verifier.check(head["seq"], head["chain_hash"], head["signature"]) is None
    assert checked.returncode == 0, checked.stderr


def _append_heads(path: str, writer: int, count: int) -> None:
    for n in range(count):
        append_head(path, SignedHead(writer * count + n, f"{writer:x}" * 64, "k" * 16 + ":" + "s" * 88, 1.0))


def test_witness_lines_from_several_processes_never_interleave(tmp_path: Path):
    """Forked writers (nothing left to import in them) append at once; every line comes out whole."""
    import multiprocessing

    witness, writers, count = str(tmp_path / "heads.jsonl"), 4, 150
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_append_heads, args=(witness, w, count)) for w in range(writers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    assert [p.exitcode for p in processes] == [0] * writers
    lines = Path(witness).read_text().splitlines()
    assert sorted(json.loads(line)["seq"] for line in lines) == list(range(writers * count))


def test_an_old_chain_with_an_unsigned_genesis_verifies_without_a_key_and_says_so(backend: Backend, tmp_path: Path):
    """A database whose chain began under the previous release (its genesis unsigned, counting rows written before
    the chain) still verifies by hashes; with a key it is refused unless the auditor accepts those rows unchecked."""
    signer, _, public = key_files(tmp_path)
    with isolated(backend) as store:
        with store.open() as saver:
            sql(
                saver,
                "INSERT INTO gatedloop_audit (thread_id, call_id, event, actor, at, detail)"
                " VALUES ('old', 'x', 'validated', NULL, 1.0, '{}')",
            )
            saver.ledger.signer = None
            saver.ledger.record("old", "y", "validated", {})  # the chain begins unsigned, as it used to
            saver.ledger.signer = signer
            approved_refund(saver, "t")
        verify = ["--db", store.db, "audit", "verify"]
        plain = run_cli(verify, plain_env(tmp_path))
        strict = run_cli([*verify, "--public-key", str(public)], plain_env(tmp_path))
        accepted = run_cli([*verify, "--public-key", str(public), "--allow-unsigned-genesis"], plain_env(tmp_path))
    assert plain.returncode == 0 and "genesis (chain row 1) is unsigned" in plain.stdout, plain.stderr
    assert strict.returncode == 1 and "chain row 1 (genesis): unsigned" in strict.stderr, strict.stderr
    assert "--allow-unsigned-genesis" in strict.stderr
    assert accepted.returncode == 0 and "1 earlier rows accepted unchecked" in accepted.stdout, accepted.stderr


def test_an_export_written_before_the_witness_still_verifies_and_is_checked_against_one(tmp_path: Path):
    """tests/data/receipts_466c842.jsonl was exported (with a key) by commit 466c842, before signed geneses and
    witnesses; it verifies as it did, and against a witness of its own head, and not against a later head."""
    export, public = DATA / "receipts_466c842.jsonl", DATA / "receipts_466c842.pub"
    env = plain_env(tmp_path)
    assert run_cli(["audit", "verify", str(export), "--public-key", str(public)], env).returncode == 0
    last = json.loads(export.read_text().splitlines()[-1])["chain"][-1]
    witness = tmp_path / "heads.jsonl"
    own = {"seq": last["seq"], "chain_hash": last["chain_hash"], "signature": last["signature"]}
    witness.write_text(json.dumps({**own, "key_id": last["signature"].split(":")[0], "at": 1.0}) + "\n")
    verify = ["audit", "verify", str(export), "--witness", str(witness)]
    reached = run_cli([*verify, "--public-key", str(public)], env)
    assert reached.returncode == 0, reached.stderr
    later = {**own, "seq": last["seq"] + 5, "key_id": "0" * 16, "signature": "0" * 16 + ":AAAA", "at": 2.0}
    with witness.open("a") as handle:
        handle.write(json.dumps(later) + "\n")
    beyond = run_cli(verify, env)  # no key: the lines' signatures are not checked, their positions are
    assert beyond.returncode == 1 and f"witnessed head chain row {later['seq']}" in beyond.stderr, beyond.stderr
    forged = run_cli([*verify, "--public-key", str(public)], env)
    assert forged.returncode == 1 and "witness line 2" in forged.stderr, forged.stderr
