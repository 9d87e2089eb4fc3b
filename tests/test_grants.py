"""Standing grants (issue 53; invariant 17), on the real graph and a real database.

A reviewer who may decide a tool's calls approves some of them ahead of time, within bounds, a number of times,
until an expiry. A call inside a live grant runs with no request; one outside it (another payee, a larger amount,
another requester) asks as before. The grant is itself decided under the tool's rule (roles, quorum, no self-grant,
the tool opting in), never covers an edit, and covers nothing once revoked, expired or used up, also when that
happens between the call's admission and its claim. Its uses are taken with the write's claim: eight processes
racing for the last use run one write. The signed chain covers the grants.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from backends import Backend, isolated
from cli_in_process import run_cli
from grants_app import ANA, BO, CY, DEE, HOOKS, build, run_race
from pydantic import BaseModel
from sample_app import Effects

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import ToolPolicy, runs
from gatedloop.nodes.gate.grants import GrantNotAllowed, GrantRefused, within_bounds

PAY_BO = ["to=bo", "amount<=100"]


@dataclass
class App:
    graph: Any
    saver: Any
    effects: Effects

    def grant(self, tool: str = "pay", where: list[str] = PAY_BO, by: Any = BO, **options: Any) -> str:
        return runs.grant(
            self.graph, tool, context=by, where=where, uses=options.pop("uses", 3), expires_in_s=3600, **options
        )

    def view(self, grant_id: str) -> runs.GrantView:
        return next(v for v in runs.grants(self.graph) if v.grant_id == grant_id)

    def ask(self, thread: str, text: str, who: Any = ANA) -> dict[str, Any]:
        return runs.start(self.graph, thread, text, context=who)

    def paid(self) -> list[tuple[str, float]]:
        return [(args["to"], args["amount"]) for tool, args, _ in self.effects.rows() if tool in ("pay", "wire")]


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        effects = Effects(tmp_path / "effects.sqlite")
        yield App(build(saver, effects), saver, effects)
    HOOKS.clear()


def asked(out: dict[str, Any]) -> dict[str, Any]:
    """The one action of the request a run paused on."""
    assert "__interrupt__" in out, out.get("status")
    [action] = out["__interrupt__"][0].value["action_requests"]
    return dict(action)


def test_a_call_inside_a_grant_runs_with_no_request_and_one_outside_it_asks(app: App):
    grant_id = app.grant(requester="ana")
    out = app.ask("inside", "pay bo 50")
    assert out["status"] == "completed" and "__interrupt__" not in out
    assert app.paid() == [("bo", 50.0)] and app.view(grant_id).uses_left == 2
    used = [row for row in app.saver.ledger.audit("inside") if row["event"] == "grant_used"]
    assert [row["detail"]["grant"] for row in used] == [grant_id]  # the approval record names the grant
    [use] = app.saver.ledger.chained_rows("gatedloop_grant_uses")
    assert (use["thread_id"], use["grant_id"]) == ("inside", grant_id)

    for thread, text, who in (("payee", "pay cy 50", ANA), ("amount", "pay bo 150", ANA), ("who", "pay bo 50", DEE)):
        assert asked(app.ask(thread, text, who))["name"] == "pay", thread
    assert app.paid() == [("bo", 50.0)] and app.view(grant_id).uses_left == 2

    app.saver.copy_thread("inside", "copied")  # a copy keeps the started write's approval: the grant's use
    assert app.saver.ledger.grant_uses("copied", [use["call_id"]]) == {use["call_id"]: (grant_id, use["args_digest"])}
    assert app.saver.ledger.verify_chain().ok


def test_revoked_expired_and_used_up_grants_cover_nothing_even_between_admission_and_claim(app: App):
    revoked = app.grant()
    runs.revoke(app.graph, revoked, context=CY)  # any finance reviewer may revoke, not only its granter
    asked(app.ask("revoked", "pay bo 10"))
    with pytest.raises(GrantRefused, match="already revoked by cy"):
        runs.revoke(app.graph, revoked, context=BO)

    expiring = runs.grant(app.graph, "pay", context=BO, where=PAY_BO, uses=3, expires_in_s=0.3)
    time.sleep(0.35)
    asked(app.ask("expired", "pay bo 10"))
    assert [app.view(g).status for g in (revoked, expiring)] == ["revoked", "expired"]

    # One use, two calls in one turn: both pass validation under it; the second's claim finds it used up.
    once = app.grant(uses=1)
    action = asked(app.ask("used-up", "pay bo 10; pay bo 20"))
    assert action["args"]["amount"] == 20 and f"{once} used up" in action["sent_back"]
    assert "Sent back to a person: the standing grant that covered this call lapsed" in action["description"]

    # Revoked after the call was admitted under it and before its claim: the claim sees it.
    late = app.grant()
    HOOKS["hook"] = lambda: app.saver.ledger.revoke_grant(late, "cy", time.time())
    action = asked(app.ask("revoked-late", "hook; pay bo 30"))
    assert f"{late} revoked by cy" in action["sent_back"]
    assert app.paid() == [("bo", 10.0)]
    assert app.view(late).uses_left == 3  # a refused claim took nothing

    out = runs.resume(app.graph, "revoked-late", {"decisions": [{"type": "approve"}]}, context=BO)
    assert out["status"] == "completed" and app.paid() == [("bo", 10.0), ("bo", 30.0)]  # a person decided it


def test_a_write_claimed_under_a_grant_it_used_up_is_settled_after_a_stop_not_asked_again(app: App):
    """The use its claim took is the call's approval: the run stops mid-write, the grant is used up (and then
    revoked), and the resumed thread asks whether the write happened (invariant 3), not for a new approval."""
    grant_id = app.grant(uses=1)

    def stop() -> None:
        raise KeyboardInterrupt

    HOOKS["pay"] = stop
    with pytest.raises(BaseException, match="raised KeyboardInterrupt"):
        app.ask("stopped", "pay bo 10")
    HOOKS.clear()
    runs.revoke(app.graph, grant_id, context=BO)
    out = runs.resume(app.graph, "stopped", None)
    assert out["__interrupt__"][0].value["kind"] == "unknown_outcome" and app.paid() == []


def test_a_grant_of_a_two_approver_tool_is_pending_until_a_second_granter_confirms_it(app: App):
    grant_id = app.grant("wire")
    assert app.view(grant_id).status == "pending (1 of 2 granters)"
    asked(app.ask("pending", "wire bo 50"))
    with pytest.raises(GrantNotAllowed, match="already a granter"):
        runs.confirm_grant(app.graph, grant_id, context=BO)
    with pytest.raises(GrantNotAllowed, match="needs one of the roles"):
        runs.confirm_grant(app.graph, grant_id, context=DEE)
    assert runs.confirm_grant(app.graph, grant_id, context=CY).status == "live"
    assert app.ask("live", "wire bo 60")["status"] == "completed"
    assert app.paid() == [("bo", 60.0)] and app.view(grant_id).granted_by == ["bo", "cy"]


def test_the_requester_cannot_grant_her_own_calls(app: App):
    with pytest.raises(GrantNotAllowed, match="bo may not grant her own calls of pay"):
        app.grant(requester="bo")
    app.grant()  # for anyone: never for bo's own calls (pay does not allow self-approval)
    asked(app.ask("own", "pay bo 10", BO))
    assert app.ask("other", "pay bo 10", ANA)["status"] == "completed"
    assert app.paid() == [("bo", 10.0)]


def test_an_edit_is_never_covered(app: App):
    grant_id = app.grant("wire")
    runs.confirm_grant(app.graph, grant_id, context=CY)
    request = app.ask("edited", "wire bo 150")["__interrupt__"][0].value
    edit = {"type": "edit", "edited_action": {"name": "wire", "args": {"to": "bo", "amount": 50}}}
    out = runs.resume(app.graph, "edited", {"decisions": [edit], "request_id": request["request_id"]}, context=BO)
    assert asked(out)["approved_by"] == ["bo"]  # inside the grant's bounds now, yet the grant does not stand in
    assert app.paid() == [] and app.view(grant_id).uses_left == 3
    out = runs.resume(app.graph, "edited", {"decisions": [{"type": "approve"}]}, context=CY)
    assert out["status"] == "completed" and app.paid() == [("bo", 50.0)] and app.view(grant_id).uses_left == 3


def test_a_grant_is_refused_for_a_tool_that_does_not_opt_in_and_for_bounds_it_cannot_hold(app: App):
    with pytest.raises(GrantNotAllowed, match="mail is not grantable"):
        app.grant("mail", where=["to=bo"])
    with pytest.raises(ValueError, match="grantable and limits apply to writes"):
        ToolPolicy(effect="read", grantable=True)
    for where, problem in (
        (["colour=red"], "no argument 'colour'"),
        (["to<=5"], "a string, not a number"),
        (["amount<=lots"], "'lots' is not a number"),
        (["amount<100"], "expected name=value"),
        (["to=bo", "to in bo,cy"], "contradicts or repeats"),
        (["amount>=50", "amount<=10"], "admit no value"),
    ):
        with pytest.raises(GrantRefused, match=problem):
            app.grant(where=where)
    with pytest.raises(GrantRefused, match="no tool named 'refund'"):
        app.grant("refund")
    assert runs.grants(app.graph) == []


@pytest.mark.slow
def test_the_last_use_holds_under_eight_processes_racing_for_it(backend: Backend, tmp_path: Path, monkeypatch):
    """Eight processes, each with a thread of its own, propose a payment inside a grant with one use left: one
    write runs, the other seven ask a person (sent back at their claim, or asked at validation)."""
    with isolated(backend) as store:
        if store.name == "postgres":
            monkeypatch.setenv("GATEDLOOP_TEST_PG_URL", store.db)  # the children's `env` database: this schema
        with store.open() as saver:
            graph = build(saver, Effects(tmp_path / "effects.sqlite"))
            grant_id = runs.grant(graph, "pay", context=BO, where=PAY_BO, uses=1, expires_in_s=600)
        said = run_race(store.child_db, tmp_path, 8)
        assert sorted(line.split()[0] for line in said) == ["asked"] * 7 + ["ran"], said
        assert len(Effects(tmp_path / "effects.sqlite").rows("pay")) == 1
        with store.open() as saver:
            graph = build(saver, Effects(tmp_path / "effects.sqlite"))
            assert [(v.grant_id, v.uses_left) for v in runs.grants(graph)] == [(grant_id, 0)]
            assert len(saver.ledger.chained_rows("gatedloop_grant_uses")) == 1
            assert saver.ledger.verify_chain().ok


def cli_env(tmp_path: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GATEDLOOP_")}
    return {**env, "GRANTS_EFFECTS": str(tmp_path / "effects.sqlite")}


def gatedloop(tmp_path: Path, *args: str, code: int, user: str = "bo", roles: str = "finance") -> Any:
    argv = ["--db", str(tmp_path / "runs.sqlite"), "--graph", "grants_app:graph", "--user", user, "--roles", roles]
    ran = run_cli([*argv, *args], cli_env(tmp_path))
    assert ran.returncode == code, ran.stdout + ran.stderr
    return ran


def test_the_grant_commands(tmp_path: Path):
    create = ("grant", "create", "--tool", "pay", "--where", "to=bo", "--where", "amount<=100", "--uses", "3")
    made = gatedloop(tmp_path, *create, "--expires", "2h", "--requester", "ana", "--note", "rent", "--json", code=0)
    [line] = [json.loads(text) for text in made.stdout.splitlines()]
    assert line == {"type": "grant", "id": line["id"], "status": "live"} and line["id"].startswith("g-")
    grant_id = line["id"]

    listed = gatedloop(tmp_path, "grant", "list", code=0).stdout
    header = [cell.strip() for cell in listed.splitlines()[0].split("  ") if cell.strip()]
    assert header == ["id", "tool", "bounds", "uses left", "expires", "granted by", "status"]
    assert grant_id in listed and "amount<=100, to=bo (requester ana)" in listed and "3/3" in listed
    assert "live - rent" in listed
    [shown] = [json.loads(text) for text in gatedloop(tmp_path, "grant", "list", "--json", code=0).stdout.splitlines()]
    assert (shown["id"], shown["uses_left"], shown["granted_by"]) == (grant_id, 3, ["bo"])
    gatedloop(tmp_path, "run", "pay bo 50", "--thread", "t1", code=0, user="ana", roles="staff")  # no request
    story = gatedloop(tmp_path, "show", "t1", code=0).stdout
    assert f"runs under the standing grant {grant_id}" in story
    assert f"approved by the standing grant {grant_id} for ana (2 uses left)" in story

    for options, problem in (
        ("--tool pay --where amount<100 --uses 3 --expires 2h", "--where 'amount<100': expected name=value"),
        ("--tool pay --where colour=red --uses 3 --expires 2h", "no argument 'colour'"),
        ("--tool pay --uses 0 --expires 2h", "argument --uses: 0 is not at least 1"),
        ("--tool pay --uses 3 --expires 2x", "--expires '2x': expected a positive duration"),
        ("--tool refund --uses 3 --expires 2h", "no tool named 'refund'"),
    ):
        failed = gatedloop(tmp_path, "grant", "create", *options.split(), code=2)
        assert problem in failed.stderr, failed.stderr
    refused = gatedloop(tmp_path, *create, "--expires", "2h", code=6, user="ana", roles="staff")
    assert "granting calls of pay needs one of the roles ['finance']" in refused.stderr
    assert len(gatedloop(tmp_path, "grant", "list", "--json", code=0).stdout.splitlines()) == 1  # nothing written

    wire = gatedloop(tmp_path, "grant", "create", "--tool", "wire", "--uses", "1", "--expires", "30m", code=0)
    wire_id = wire.stdout.split("\n")[0]
    assert "pending (1 of 2 granters)" in wire.stdout and f"gatedloop grant confirm {wire_id}" in wire.stdout
    assert "live (granted by bo, cy)" in gatedloop(tmp_path, "grant", "confirm", wire_id, code=0, user="cy").stdout

    assert "revoked" in gatedloop(tmp_path, "grant", "revoke", grant_id, code=0).stdout
    assert "already revoked by bo" in gatedloop(tmp_path, "grant", "revoke", grant_id, code=2).stderr
    assert "revoked - rent" in gatedloop(tmp_path, "grant", "list", code=0).stdout

    team = ("--where", "to in bo,cy,dee,eve,fay,gus", "--where", "amount>=1", "--where", "amount<=100")
    gatedloop(tmp_path, "grant", "create", "--tool", "pay", *team, "--uses", "9", "--expires", "1d", code=0)
    listed = gatedloop(tmp_path, "grant", "list", code=0).stdout.splitlines()
    at = listed[0].index("bounds")  # long bounds wrap a clause per line, in their own column
    [first] = [k for k, line in enumerate(listed) if line[at:].startswith("amount>=1,")]
    assert [line[at:].split("  ")[0] for line in listed[first : first + 3]] == [
        "amount>=1,",
        "amount<=100,",
        "to in bo,cy,dee,eve,fay,gus",
    ]
    assert listed[first].split()[-1] == "live" and listed[first + 1][:at].strip() == ""


def test_audit_verify_passes_with_grants_and_fails_when_a_grant_row_is_edited(app: App, tmp_path: Path):
    """The chain covers the grants: `audit verify` passes, the write's receipt names the grant it ran under (and
    verifies offline), and an edited grant row is found."""
    grant_id = app.grant()
    assert app.ask("t", "pay bo 50")["status"] == "completed"
    runs.revoke(app.graph, grant_id, context=BO)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    db = ["--db", str(tmp_path / "runs.sqlite")]
    verify = [*db, "audit", "verify"]
    assert run_cli(verify, env).returncode == 0
    exported = tmp_path / "receipts.jsonl"
    assert run_cli([*db, "audit", "export", "--out", str(exported)], env).returncode == 0
    [write] = [r for r in map(json.loads, exported.read_text().splitlines()) if r["kind"] == "write"]
    assert write["summary"]["grant"] == grant_id and "gatedloop_grant_uses" in [r["table"] for r in write["rows"]]
    assert run_cli(["audit", "verify", str(exported)], env).returncode == 0
    with sqlite3.connect(tmp_path / "runs.sqlite") as conn:
        conn.execute("UPDATE gatedloop_grants SET uses = 99 WHERE grant_id = ?", (grant_id,))
    failed = run_cli(verify, env)
    assert failed.returncode == 1 and f'gatedloop_grants ["{grant_id}"]' in failed.stderr, failed.stderr


def test_a_list_argument_is_bounded_element_by_element_and_refused_where_a_bound_could_not_hold(tmp_path: Path):
    """`to in bo,cy` on a list argument covers a call whose every recipient is bo or cy (in any order, repeated);
    one more recipient outside it asks. An optional list (`cc`, default None) bounded the same way may be left out,
    but a copy to someone outside it asks. `=`, a range, or any rule on an object argument is refused with how to
    bound it instead, rather than made into a grant that could never cover a call."""
    from langchain_core.tools import tool

    from gatedloop.graph import build_graph
    from gatedloop.graph.scripted import ScriptedChatModel, call, reply

    sent: list[list[str]] = []

    @tool
    def announce(to: list[str], headers: dict[str, str] | None = None, cc: list[str] | None = None) -> str:
        """Announce to several people (write)."""
        sent.append(to + (cc or []))
        return "announced"

    def responder(messages: list[Any]) -> Any:
        if messages[-1].type == "tool":
            return reply("done")
        to, _, cc = str(messages[-1].content).partition(" cc ")
        args = {"to": to.split(), **({"cc": cc.split()} if cc else {})}
        return reply(calls=[call("announce", args, "a1")])

    policies = {"announce": ToolPolicy(effect="write", approvers=frozenset({"finance"}), grantable=True)}
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build_graph(ScriptedChatModel(responder=responder), [announce], policies=policies, checkpointer=saver)
        for where, problem in (
            (["to=bo"], "'to' is a list: bound its elements with 'to in a,b'"),
            (["to<=3"], "'to' is a list: bound its elements"),
            (["headers=x"], "'headers' is an object with no declared fields: a grant cannot bound it"),
            (["headers.x=y"], "'headers' has no declared fields to bound"),
        ):
            with pytest.raises(GrantRefused, match=problem):
                runs.grant(graph, "announce", context=BO, where=where, uses=5, expires_in_s=60)
        where = ["to in bo,cy", "cc in bo"]
        grant_id = runs.grant(graph, "announce", context=BO, where=where, uses=5, expires_in_s=60)
        assert runs.grants(graph)[0].bounds == "cc in bo, to in bo,cy"
        for thread, text in (("l1", "cy bo"), ("l2", "bo bo cc bo")):
            assert runs.start(graph, thread, text, context=ANA)["status"] == "completed"
        assert "__interrupt__" in runs.start(graph, "l3", "bo dee", context=ANA)  # dee is outside: a person decides
        assert "__interrupt__" in runs.start(graph, "l4", "bo cc eve", context=ANA)  # and so is a copy to eve
        assert sent == [["cy", "bo"], ["bo", "bo", "bo"]]
        assert [v.uses_left for v in runs.grants(graph) if v.grant_id == grant_id] == [3]


class Item(BaseModel):
    """A line of an order (a model of the module: the tool's annotations are read from its globals)."""

    sku: str
    qty: int


class Payment(BaseModel):
    currency: str
    amount: float


def test_the_fields_of_an_object_and_of_every_object_of_a_list_are_bounded(tmp_path: Path):
    """A tool taking pydantic models (`items: list[Item]`, `payment: Payment`, referred to by `$ref` in its schema):
    `items.sku in A,B` and `items.qty<=5` bound every line of the order, `payment.currency=EUR` and
    `payment.amount<=100` the payment's fields. An order inside them runs with no request; a line of another product,
    a sixth unit, another currency or a larger amount asks. A rule on a whole object or
    a list of objects is refused, naming the fields to bound instead. A line without the bounded field, or a line
    that is not an object, is outside (the tool's own schema refuses such a call before any grant is looked at)."""
    from langchain_core.tools import tool

    from gatedloop.graph import build_graph
    from gatedloop.graph.scripted import ScriptedChatModel, call, reply

    ordered: list[str] = []

    @tool
    def order(items: list[Item], payment: Payment, note: str = "") -> str:
        """Order items and pay for them (write)."""
        ordered.append(",".join(f"{i.qty}x{i.sku}" for i in items) + f" {payment.amount:g} {payment.currency}")
        return "ordered"

    def responder(messages: list[Any]) -> Any:
        if messages[-1].type == "tool":
            return reply("done")
        return reply(calls=[call("order", json.loads(str(messages[-1].content)), "o1")])

    def order_of(items: list[dict[str, Any]], currency: str = "EUR", amount: float = 40) -> str:
        return json.dumps({"items": items, "payment": {"currency": currency, "amount": amount}})

    policies = {"order": ToolPolicy(effect="write", approvers=frozenset({"finance"}), grantable=True)}
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build_graph(ScriptedChatModel(responder=responder), [order], policies=policies, checkpointer=saver)
        for where, problem in (
            (
                ["items in A"],
                r"'items' is a list of objects: bound its elements' fields with 'items.field in a,b' "
                r"\(its fields: qty, sku\)",
            ),
            (
                ["payment=EUR"],
                r"'payment' is an object: bound its fields with 'payment.field=value' "
                r"\(its fields: amount, currency\)",
            ),
            (["items.colour=red"], "'items' has no field 'colour' \\(its fields: qty, sku\\)"),
            (["note.x=1"], "'note' has no declared fields to bound"),
            (["items.qty>=b"], "'b' is not a number"),
            (["items.sku>=1"], "'items.sku' is a string, not a number"),
            (["items.sku=A", "items.sku in A,B"], "already has a rule"),
        ):
            with pytest.raises(GrantRefused, match=problem):
                runs.grant(graph, "order", context=BO, where=where, uses=5, expires_in_s=60)
        where = ["items.sku in A,B", "items.qty<=5", "payment.currency=EUR", "payment.amount<=100"]
        runs.grant(graph, "order", context=BO, where=where, uses=5, expires_in_s=60)
        shown = "items.qty<=5, items.sku in A,B, payment.amount<=100, payment.currency=EUR"
        assert runs.grants(graph)[0].bounds == shown
        inside = order_of([{"sku": "A", "qty": 2}, {"sku": "B", "qty": 5}])
        assert runs.start(graph, "in", inside, context=ANA)["status"] == "completed"
        for thread, text in (
            ("sku", order_of([{"sku": "A", "qty": 1}, {"sku": "C", "qty": 1}])),
            ("qty", order_of([{"sku": "A", "qty": 6}])),
            ("currency", order_of([{"sku": "A", "qty": 1}], currency="USD")),
            ("amount", order_of([{"sku": "A", "qty": 1}], amount=100.5)),
        ):
            assert "__interrupt__" in runs.start(graph, thread, text, context=ANA), thread
        assert ordered == ["2xA,5xB 40 EUR"]
    each_line = {"items": {"each": {"qty": {"max": 5}}}}  # as stored; the tool's schema refuses such a call earlier
    assert not within_bounds(each_line, {"items": [{"sku": "A"}]}) and not within_bounds(each_line, {"items": ["A"]})
    assert within_bounds(each_line, {"items": []}) and not within_bounds({"p": {"fields": {"a": {"eq": 1}}}}, {"p": 1})
