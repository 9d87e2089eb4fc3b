"""Authority does not drift (invariant 11, finding 6): a thread remembers its tools' policies with its graph.

A graph of the same name and tools whose policies changed (approvers dropped, a quorum lowered, self-approval
allowed, an expiry removed, ...) is another graph: resuming with it is refused like a changed tool, naming what
changed, unless an operator upgrades the thread explicitly, which the audit trail records with who did it and each
tool's policy before and after. And an approval the policy in force when the write starts does not accept (a
quorum raised, the approvers' roles changed) is stale: the call is asked again, never run. Every test drives the
real graph on a real SQLite file and counts real payments.

Over a served graph (`langgraph dev` runs the graph without `runs.*`; the compiled graph's own entry makes the
check): `test_a_graph_whose_policies_were_weakened_never_decides_an_old_threads_request` in test_served_identity.py.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sqlite3
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
from cli_in_process import run_cli
from gate_app import build, effects_for
from langgraph.types import Command
from pg_server import new_thread_id

from gatedloop.checkpoints import open_async_sqlite, open_sqlite
from gatedloop.checkpoints.evidence import AuditEvent, GraphIdentity
from gatedloop.graph import runs, thread_graph
from gatedloop.graph.parts_of import graph_identity
from gatedloop.tools import CallContext, ToolPolicy
from gatedloop.tools.policy import described

ANA = CallContext(user_id="ana", roles={"staff"})  # the requester
BO = CallContext(user_id="bo", roles={"finance"})
CY = CallContext(user_id="cy", roles={"finance"})
TESS = CallContext(user_id="tess", roles={"treasury"})
OPS = CallContext(user_id="ops", roles={"ops"})  # the operator who upgrades
T = "t1"
CFG = {"configurable": {"thread_id": T}}
APPROVE = {"decisions": [{"type": "approve", "tool_call_id": "c1"}]}
STRICT = {"approvers": {"finance"}, "approvals_required": 2, "approval_ttl_s": 3600.0}


def paid(saver: Any) -> list[tuple[float, str]]:
    return [(args["amount"], args["to"]) for _, args, _ in effects_for(saver).rows("pay")]


def approvals(db: str) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM gatedloop_approvals").fetchone()[0])


def upgrades(saver: Any) -> list[dict[str, Any]]:
    return [e for e in saver.ledger.audit(T) if e["event"].startswith("graph_upgraded")]


def started(saver: Any, **policy: Any) -> Any:
    """A payment of 500 asked for approval under `policy` (gate_app's pay, 500 > 100 needs approval)."""
    graph = build(saver, effects_for(saver), **policy)
    runs.start(graph, T, "pay 500 to bo as c1", context=ANA)
    return graph


def test_a_graph_rebuilt_with_the_same_policies_is_the_same_graph(db: str):
    """Restarting a process rebuilds every policy, predicates included (a lambda is a new object each time): the
    identity is the same, so a restart never needs an upgrade."""
    with open_sqlite(db) as saver:
        first, second = build(saver, effects_for(saver), **STRICT), build(saver, effects_for(saver), **STRICT)
        assert graph_identity(first) == graph_identity(second)
        [pay] = [p for name, p in graph_identity(first).policies.items() if name == "pay"]
        assert pay["approval"] == "predicate:pay_policy.<locals>.<lambda>"  # described, not digested
        assert (pay["approvers"], pay["approvals_required"], pay["self_approval"]) == (["finance"], 2, False)


def test_a_predicate_is_described_by_its_qualified_name_whatever_module_loaded_it():
    """`python agent.py` (`__main__`), `--graph agent:graph` and `--graph ./agent.py:graph` load one function under
    three module names: the same rule. Another function is another rule."""

    def over_100(args: dict, context: Any) -> bool:
        return args["amount"] > 100

    class OverLimit:
        def __call__(self, args: dict, context: Any) -> bool:
            return True

    as_script = types.FunctionType(over_100.__code__, {}, "over_100")
    as_script.__qualname__, as_script.__module__ = over_100.__qualname__, "__main__"
    assert ToolPolicy(approval=as_script).summary() == ToolPolicy(approval=over_100).summary()
    assert described(functools.partial(over_100)) == described(over_100) == over_100.__qualname__
    assert described(OverLimit()).endswith("<locals>.OverLimit")
    assert ToolPolicy(approval=OverLimit()).summary() != ToolPolicy(approval=over_100).summary()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"approvers": None}, "approvers ['finance'] -> None"),
        ({"approvals_required": 1}, "approvals_required 2 -> 1"),
        ({"self_approval": True}, "self_approval False -> True"),
        ({"approval_ttl_s": None}, "approval_ttl_s 3600.0 -> None"),
        ({"approval": "never"}, "approval predicate:pay_policy.<locals>.<lambda> -> never"),
        ({"allowed_decisions": ("approve", "reject")}, "allowed_decisions"),
        ({"secret_args": {"to"}}, "secret_args [] -> ['to']"),
        ({"effect": "read"}, "effect write -> read"),
    ],
    ids=["approvers", "quorum", "self_approval", "ttl", "approval", "allowed_decisions", "secret_args", "effect"],
)
def test_a_changed_policy_is_another_graph_and_resuming_with_it_changes_nothing(db: str, change: dict, named: str):
    with open_sqlite(db) as saver:
        started(saver, **STRICT)
        runs.resume(build(saver, effects_for(saver), **STRICT), T, APPROVE, context=BO)  # 1 of 2
        before = (approvals(db), runs.output(build(saver, effects_for(saver), **STRICT), T))
        other = build(saver, effects_for(saver), **{**STRICT, **change})
        with pytest.raises(thread_graph.GraphMismatch) as refused:
            runs.resume(other, T, APPROVE, context=CY)
        message = str(refused.value)
        assert "was made by graph 'gate_app'" in message and "policy of pay:" in message
        assert named in message and "\n" not in message
        with pytest.raises(thread_graph.GraphMismatch, match="policy of pay:"):
            thread_graph.check_thread_graph(other, T)  # show, threads, cancel: the same refusal, nothing recorded
        assert paid(saver) == [] and (approvals(db), runs.output(other, T)) == before
        assert upgrades(saver) == []


def test_the_refusal_tells_the_threads_graph_from_another_of_the_same_name(db: str):
    """Same name, other policies: the message names the thread's graph once, and this one as another of that name
    with its own digests, never "made by graph 'gate_app', not by graph 'gate_app'" (issue 32, item 2)."""
    with open_sqlite(db) as saver:
        made = graph_identity(started(saver, **STRICT))
        other = build(saver, effects_for(saver), **{**STRICT, "approvers": None})
        with pytest.raises(thread_graph.GraphMismatch) as refused:
            thread_graph.check_thread_graph(other, T)
    message = str(refused.value)
    assert message.count("graph 'gate_app'") == 1 and f"was made by graph {made}," in message
    assert f"not by this graph, another of that name ({graph_identity(other).digests()})" in message
    assert made.digests() != graph_identity(other).digests()
    assert "policy of pay: approvers ['finance'] -> None" in message


def test_approvers_dropped_and_the_quorum_lowered_are_refused_then_an_explicit_upgrade_is_audited(db: str):
    """The finding's case: an old pending request is not approvable under the weaker rule until an operator says
    so; then the audit says who upgraded and what each tool's policy was and is."""
    with open_sqlite(db) as saver:
        started(saver, **STRICT)
        weaker = build(saver, effects_for(saver), approvers=None, approvals_required=1, approval_ttl_s=3600.0)
        with pytest.raises(thread_graph.GraphMismatch) as refused:
            runs.resume(weaker, T, APPROVE, context=OPS)  # ops is no finance approver: the old rule refuses her
        assert "approvers ['finance'] -> None" in str(refused.value)
        assert "approvals_required 2 -> 1" in str(refused.value)
        assert paid(saver) == []
        out = runs.resume(weaker, T, APPROVE, context=OPS, upgrade=True)
        assert out["status"] == "completed" and paid(saver) == [(500.0, "bo")]
        [upgraded] = upgrades(saver)
        assert upgraded["actor"] == "ops"
        change = upgraded["detail"]["policies"]["pay"]
        assert (change["from"]["approvers"], change["to"]["approvers"]) == (["finance"], None)
        assert (change["from"]["approvals_required"], change["to"]["approvals_required"]) == (2, 1)
        assert "pay: approvals_required 2 -> 1" in upgraded["detail"]["changes"]
        assert upgraded["detail"]["from"][0] == upgraded["detail"]["to"][0] == "gate_app"
        assert thread_graph.check_thread_graph(weaker, T) is None  # the thread is the weaker graph's now


def test_the_async_runs_refuse_a_weakened_graph_then_upgrade_it_explicitly(db: str):
    """`aresume` keeps the sync schedule (graph/runs.py): refused without `upgrade`, nothing paid; with it the
    upgrade is audited as the operator's and the payment made once."""

    async def main() -> tuple[dict[str, Any], list[tuple[float, str]], list[dict[str, Any]], str]:
        async with open_async_sqlite(db) as saver:
            await runs.astart(build(saver, effects_for(saver), **STRICT), T, "pay 500 to bo as c1", context=ANA)
            weaker = build(saver, effects_for(saver), approvers=None, approvals_required=1, approval_ttl_s=3600.0)
            with pytest.raises(thread_graph.GraphMismatch) as refused:
                await runs.aresume(weaker, T, APPROVE, context=OPS)
            assert paid(saver) == []
            out = await runs.aresume(weaker, T, APPROVE, context=OPS, upgrade=True)
            return out, paid(saver), upgrades(saver), str(refused.value)

    out, payments, [upgraded], refusal = asyncio.run(main())
    assert "approvals_required 2 -> 1" in refusal
    assert out["status"] == "completed" and payments == [(500.0, "bo")]
    assert upgraded["actor"] == "ops" and "pay: approvals_required 2 -> 1" in upgraded["detail"]["changes"]


def test_two_upgrades_of_one_thread_are_both_audited(db: str):
    with open_sqlite(db) as saver:
        started(saver, **STRICT)
        for quorum in (3, 2):
            graph = build(saver, effects_for(saver), **{**STRICT, "approvals_required": quorum})
            thread_graph.claim_thread(graph, T, upgrade=True, context=OPS)
        assert [u["detail"]["policies"]["pay"]["to"]["approvals_required"] for u in upgrades(saver)] == [3, 2]


def _approved_but_not_run(saver: Any, graph: Any, reviewer: CallContext) -> None:
    """The reviewer's approval is recorded and enough for `graph`'s policy, and the run stops before `execute`
    (as a process stopped between the two nodes would)."""
    [pending] = graph.get_state(CFG).interrupts
    graph.invoke(
        Command(resume={pending.id: APPROVE}), CFG, context=reviewer, interrupt_before=["execute"], durability="sync"
    )
    assert graph.get_state(CFG).next == ("execute",) and paid(saver) == []


@pytest.mark.parametrize(
    ("then", "approved_by"),
    [({"approvals_required": 2}, ["bo"]), ({"approvers": {"treasury"}}, [])],
    ids=["quorum-raised-to-two", "approvers-changed"],
)
def test_an_approval_the_upgraded_policy_does_not_accept_is_stale_and_the_call_is_asked_again(
    db: str, then: dict, approved_by: list[str]
):
    """Approved under quorum 1 by a finance reviewer; before the write starts an operator upgrades the thread to
    a stricter policy. `execute` admits the call under the policy in force (from the registry, not from what the
    approval was given under): the call is asked again, and runs once the new rule is met."""
    with open_sqlite(db) as saver:
        first = started(saver, approvers={"finance"}, approvals_required=1)
        _approved_but_not_run(saver, first, BO)
        stricter = build(saver, effects_for(saver), **{"approvers": {"finance"}, "approvals_required": 1, **then})
        with pytest.raises(thread_graph.GraphMismatch):
            runs.resume(stricter, T, None, context=OPS)
        out = runs.resume(stricter, T, None, context=OPS, upgrade=True)
        assert paid(saver) == []
        [action] = out["__interrupt__"][0].value["action_requests"]
        assert action["tool_call_id"] == "c1" and action["approved_by"] == approved_by
        next_reviewer = CY if "approvals_required" in then else TESS
        out = runs.resume(stricter, T, APPROVE, context=next_reviewer)
        assert out["status"] == "completed" and paid(saver) == [(500.0, "bo")]


def test_a_thread_recorded_before_policies_were_is_refused_until_upgraded(db: str):
    """A thread whose graph was recorded by gatedloop before policies were (name and tools only) has no policy to
    compare with: today's rules could be weaker than the ones it was made under, so it is not silently accepted.
    A thread recorded before graphs were (no record at all, as in tests/data/threads_2077b07.sqlite) belongs to
    the first graph that runs it, policies included (tests/test_stored_formats.py)."""
    with open_sqlite(db) as saver:
        graph = started(saver, **STRICT)
        with sqlite3.connect(db) as conn:
            conn.execute("DELETE FROM gatedloop_thread_policies WHERE thread_id=?", (T,))
        with pytest.raises(thread_graph.GraphMismatch, match="policies not recorded"):
            runs.resume(graph, T, APPROVE, context=BO)
        thread_graph.claim_thread(graph, T, upgrade=True, context=OPS)
        [upgraded] = upgrades(saver)
        assert upgraded["actor"] == "ops" and upgraded["detail"]["policies"]["pay"]["from"] is None
        assert upgraded["detail"]["policies"]["pay"]["to"]["approvals_required"] == 2
        runs.resume(graph, T, APPROVE, context=BO)
        assert paid(saver) == []  # 1 of 2: the recorded rules hold
        with sqlite3.connect(db) as conn:
            conn.execute("DELETE FROM gatedloop_thread_policies WHERE thread_id=?", (T,))
            conn.execute("DELETE FROM gatedloop_thread_graphs WHERE thread_id=?", (T,))
        out = runs.resume(graph, T, APPROVE, context=CY)  # no record at all: this graph's from now on
        assert out["status"] == "completed" and paid(saver) == [(500.0, "bo")]
        assert graph_identity(graph) == saver.ledger.thread_graph(T)


def test_a_threads_policies_are_kept_beside_its_graph_and_copied_with_it_on_each_backend(backend: Any):
    """The ledger part, on SQLite and Postgres: the first graph recorded stays, an upgrade replaces graph and
    policies with its audit event in one transaction, and `copy_thread` carries the policies to the copy."""
    source, copy = new_thread_id("src"), new_thread_id("copy")
    strict = {"pay": ToolPolicy(approvers={"finance"}, approvals_required=2).summary()}
    weaker = {"pay": ToolPolicy().summary()}
    made, other = GraphIdentity("g", "t" * 16, "p" * 16, strict), GraphIdentity("g", "t" * 16, "q" * 16, weaker)
    with backend.open() as saver:
        ledger = saver.ledger
        ledger.record_thread_graph(source, made)
        ledger.record_thread_graph(source, other)  # not an upgrade: the first one stays
        recorded = ledger.thread_graph(source)
        assert recorded == made and recorded.policies == strict
        saver.copy_thread(source, copy)
        assert ledger.thread_graph(copy) == made and ledger.thread_graph(copy).policies == strict
        upgraded = AuditEvent("", "graph_upgraded:test", {"changes": ["pay: approvals_required 2 -> 1"]}, "ops")
        ledger.record_thread_graph(source, other, replace=True, events=[upgraded])
        assert ledger.thread_graph(source) == other and ledger.thread_graph(source).policies == weaker
        assert [(e["event"], e["actor"]) for e in ledger.audit(source)] == [("graph_upgraded:test", "ops")]
        assert ledger.thread_graph(copy) == made


# --- through the CLI --------------------------------------------------------------------------------------------

SEATS = textwrap.dedent(
    '''
    """A seat booking whose policy a redeploy changes: SEATS_POLICY=strict (an `events` approver, two of them) or
    weaker (anyone, one)."""
    import json
    import os

    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool

    from gatedloop.graph import build_graph
    from gatedloop.graph.scripted import ScriptedChatModel, call, reply
    from gatedloop.tools import ToolPolicy


    @tool
    def reserve_seat(seats: int) -> str:
        """Reserve seats at the conference."""
        with open(os.environ["SEATS_EFFECTS"], "a") as effects:
            effects.write(json.dumps({"seats": seats}) + "\\n")
        return f"RSV-{seats:04d}"


    def responder(messages):
        if isinstance(messages[-1], ToolMessage):
            return reply(f"Booked: {messages[-1].content}")
        return reply(calls=[call("reserve_seat", {"seats": 2})])


    RULES = {
        "strict": {"approvers": frozenset({"events"}), "approvals_required": 2},
        "weaker": {"approvers": None, "approvals_required": 1},
    }
    POLICY = ToolPolicy(effect="write", approval="always", **RULES[os.environ.get("SEATS_POLICY", "strict")])
    graph = build_graph(
        ScriptedChatModel(responder=responder), [reserve_seat], policies={"reserve_seat": POLICY}, name="seats"
    )
    '''
)


def seats(folder: Path, policy: str, *args: str, code: int) -> Any:
    """`gatedloop --db runs.sqlite --graph seats_agent:graph ARGS` in `folder` with SEATS_POLICY=policy, the
    module imported anew (as a fresh process, or a redeploy, would)."""
    for name in [m for m in sys.modules if m == "seats_agent" or m.startswith("gatedloop_user_graph_")]:
        del sys.modules[name]
    env = {key: value for key, value in os.environ.items() if not key.startswith("GATEDLOOP_")}
    env.update(
        GATEDLOOP_MODEL="demo", OPENAI_API_KEY="", SEATS_EFFECTS=str(folder / "effects.jsonl"), SEATS_POLICY=policy
    )
    ran = run_cli(["--db", "runs.sqlite", "--graph", "seats_agent:graph", *args], env, cwd=folder)
    assert ran.returncode == code, ran.stdout + ran.stderr
    return ran


def booked(folder: Path) -> int:
    path = folder / "effects.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_the_cli_refuses_a_weakened_policy_and_audits_an_explicit_upgrade(tmp_path: Path):
    (tmp_path / "seats_agent.py").write_text(SEATS)
    asked = seats(tmp_path, "strict", "--json", "--user", "ana", "run", "two seats", "--thread", "t1", code=3)
    [request] = [json.loads(line)["request"] for line in asked.stdout.splitlines() if '"request"' in line]
    answer = ("resume", "t1", "--request", request["request_id"], "--approve")

    for refused in (
        seats(tmp_path, "weaker", "--user", "ops", *answer, code=6),
        seats(tmp_path, "weaker", "show", "t1", code=6),
    ):
        [line] = refused.stderr.strip().splitlines()
        assert "was made by graph 'seats'" in line and "policy of reserve_seat:" in line
        assert "approvers ['events'] -> None" in line and "approvals_required 2 -> 1" in line
        assert "--upgrade-graph" in line
    assert booked(tmp_path) == 0

    done = seats(tmp_path, "weaker", "--upgrade-graph", "--user", "ops", *answer, code=0)
    assert "Booked: RSV-0002" in done.stdout and booked(tmp_path) == 1
    shown = seats(tmp_path, "weaker", "--json", "show", "t1", code=0)
    [upgraded] = [
        record
        for record in map(json.loads, shown.stdout.splitlines())
        if record["type"] == "audit" and record["event"].startswith("graph_upgraded")
    ]
    assert upgraded["actor"] == "ops"
    change = upgraded["detail"]["policies"]["reserve_seat"]
    assert change["from"]["approvers"] == ["events"] and change["to"]["approvers"] is None
    assert (change["from"]["approvals_required"], change["to"]["approvals_required"]) == (2, 1)
    with sqlite3.connect(tmp_path / "runs.sqlite") as conn:
        [(actor,)] = conn.execute("SELECT actor FROM gatedloop_audit WHERE event LIKE 'graph_upgraded:%'").fetchall()
    assert actor == "ops"
