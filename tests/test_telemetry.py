"""OpenTelemetry (`gatedloop[otel]`, docs/observability.md): an approval asked in this process and answered in
another, exported over OTLP/HTTP to a receiver here, is the model calls, the tool runs and the approval (decider,
seconds waited) in one trace: the answering run continues the asking one (not when nothing was kept, nor for a
client's forged context); no secret argument, exception text, argument or answer reaches any of it; an unknown
outcome and a person's settlement are reported too; off, gatedloop loads nothing of it.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import otel_app
import pytest
from langchain_core.tools import tool
from langgraph.types import Command
from openai_stub import ScriptedOpenAIServer
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_receiver import OtlpReceiver, Point, Span, tree
from span_text import traced

from gatedloop.graph import CallContext, ToolPolicy, build_graph, open_sqlite
from gatedloop.graph.parts_of import parts_of
from gatedloop.graph.resumed_trace import ASKED_IN
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.graph.telemetry import asked_by_env, telemetry_for

SUPPORT = Path(__file__).parent / "support"


def _no_otel_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LANGSMITH_", "LANGCHAIN_"))}


def _one(spans: list[Span], **where: Any) -> Span:
    found = [s for s in spans if all(s.attributes.get(k.replace("__", ".")) == v for k, v in where.items())]
    assert len(found) == 1, f"{len(found)} spans with {where}:\n{tree(spans)}"
    return found[0]


def _total(points: list[Point], metric: str, **where: Any) -> float:
    return sum(
        p.value
        for p in points
        if p.metric == metric and all(p.attributes.get(k.replace("__", ".")) == v for k, v in where.items())
    )


@pytest.mark.slow
def test_an_approval_answered_in_another_process_is_exported_with_its_wait_and_nothing_secret(tmp_path: Path):
    db = str(tmp_path / "runs.sqlite")
    config = {"configurable": {"thread_id": "pay-1"}}
    with OtlpReceiver() as otlp, ScriptedOpenAIServer(otel_app.replies()) as model:
        # This process asks, with the providers the app passes in...
        tracer_provider = TracerProvider(resource=Resource({"service.name": "asker"}))
        tracer_provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp.url}/v1/traces")))
        metrics_out = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{otlp.url}/v1/metrics"))
        meter_provider = MeterProvider(metric_readers=[metrics_out], resource=Resource({"service.name": "asker"}))
        with open_sqlite(db) as saver:
            graph = otel_app.build(
                saver, model.base_url, tracer_provider=tracer_provider, meter_provider=meter_provider
            )
            asked = graph.invoke({"messages": [("user", "send 5 to acct-9")]}, config, context=otel_app.ASKER)
        request_id = asked["__interrupt__"][0].value["request_id"]
        tracer_provider.shutdown()
        meter_provider.shutdown()

        # ... and another process answers, with nothing but the standard variables.
        env = {**_no_otel_env(), "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_SERVICE_NAME": "decider"}
        argv = [sys.executable, str(SUPPORT / "otel_app.py"), db, model.base_url, "pay-1"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout.strip()) == (0, "completed"), done.stderr[-3000:]
        spans = otlp.wait_for(lambda got: any(s.service == "decider" and s.name == "approval transfer" for s in got))
        points = otlp.points()

    ask_root = _one(spans, gen_ai__operation__name="invoke_agent", gatedloop__interrupted=True)
    decide_root = _one(spans, gen_ai__operation__name="invoke_agent", gatedloop__status="completed")
    assert (ask_root.service, decide_root.service) == ("asker", "decider")
    assert ask_root.attributes["gen_ai.conversation.id"] == decide_root.attributes["gen_ai.conversation.id"] == "pay-1"

    # One trace for the turn: the run that took the answer, in another process, continues the one that asked.
    assert (decide_root.trace_id, decide_root.parent_id) == (ask_root.trace_id, ask_root.span_id)
    assert not decide_root.links  # the deciding process had no span of its own to link to
    chats = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
    assert [s.service for s in sorted(chats, key=lambda s: s.start_ns)] == ["asker", "decider"]
    for chat in chats:
        assert chat.name == "chat gpt-4o-mini"
        assert chat.attributes["gen_ai.provider.name"] == "openai"
        assert chat.attributes["gen_ai.request.model"] == chat.attributes["gen_ai.response.model"] == "gpt-4o-mini"
        assert (chat.attributes["gen_ai.usage.input_tokens"], chat.attributes["gen_ai.usage.output_tokens"]) == (10, 5)

    pay = _one(spans, gen_ai__operation__name="execute_tool", gen_ai__tool__name="transfer")
    assert pay.service == "decider" and not pay.error
    assert pay.attributes["gen_ai.tool.call.id"] == "call_pay"
    assert (pay.attributes["gatedloop.tool.effect"], pay.attributes["gatedloop.reviewer"]) == ("write", "bob")
    balance = _one(spans, gen_ai__operation__name="execute_tool", gen_ai__tool__name="balance")
    assert balance.error and balance.attributes["error.type"] == "builtins.RuntimeError"

    approval = _one(spans, gatedloop__question="approval")
    assert approval.name == "approval transfer" and approval.service == "decider"
    assert {k: v for k, v in approval.attributes.items() if k != "gatedloop.waited_s"} == {
        "gatedloop.question": "approval",
        "gatedloop.request.id": request_id,
        "gatedloop.tool.name": "transfer",
        "gatedloop.tool.call_id": "call_pay",
        "gatedloop.requester": "alice",
        "gatedloop.approvers": ["finance"],
        "gatedloop.decider": "bob",
        "gatedloop.decider.roles": ["finance"],
        "gatedloop.verdict": "approve",
        "gatedloop.quorum.required": 1,
        "gatedloop.quorum.approvals": 1,
        "gatedloop.waiting": False,
    }
    waited = approval.attributes["gatedloop.waited_s"]
    assert waited > 0 and abs(waited - (approval.end_ns - approval.start_ns) / 1e9) < 0.01
    # Under the run that asked; linked to the step of the other process that took the answer.
    assert approval.parent_id == ask_root.span_id
    [(_, span_id)] = approval.links
    [taker] = [s for s in spans if s.span_id == span_id]
    assert (taker.name, taker.parent_id, taker.links) == ("approve", decide_root.span_id, ())
    assert {s.trace_id for s in [*chats, approval, pay, balance, taker]} == {ask_root.trace_id}

    for body in otlp.bodies:  # every span and metric of both processes, as sent
        for never in (otel_app.PIN, otel_app.TOKEN, "acct-9", "send 5"):
            assert never.encode() not in body, never

    assert _total(points, "gatedloop.requests.asked", gatedloop__tool__name="transfer") == 1
    assert _total(points, "gatedloop.requests.decided", gatedloop__verdict="approve") == 1
    assert _total(points, "gatedloop.requests.wait", gatedloop__tool__name="transfer") == 1
    assert _total(points, "gatedloop.writes.run", gatedloop__tool__name="transfer") == 1


FORGED = {"traceparent": "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"}
"""A trace context a client puts in a run's metadata, to hang the thread's spans where it likes."""


def _pay_graph(saver: Any, tracer_provider: TracerProvider | None, approvals_required: int = 1) -> Any:
    @tool
    def pay(amount: int) -> str:
        """Pay (write)."""
        return f"paid {amount}"

    model = ScriptedChatModel(script=[reply(calls=[call("pay", {"amount": 3}, "call_pay")]), reply("paid")])
    policy = ToolPolicy(effect="write", approvers=frozenset({"finance"}), approvals_required=approvals_required)
    return build_graph(model, [pay], policies={"pay": policy}, checkpointer=saver, tracer_provider=tracer_provider)


def test_the_answering_run_continues_the_asking_trace_and_links_the_apps_own_span(db: str):
    """The run that takes the answer is a child of the run that asked (the context kept with the request), so the
    model calls, the approval and the tool run are one trace; the app's own span around the answer (a served
    request's, say) is linked, not the parent."""
    tracer_provider, spans_out = traced()
    config = {"configurable": {"thread_id": "t-one-trace"}}
    with open_sqlite(db) as saver:
        graph = _pay_graph(saver, tracer_provider)
        graph.invoke({"messages": [("user", "pay 3")]}, config, context=CallContext(user_id="alice"))
        with tracer_provider.get_tracer("app").start_as_current_span("POST /threads/runs") as app_span:
            out = graph.invoke(
                Command(resume={"decisions": [{"type": "approve"}]}),
                config,
                context=CallContext(user_id="bo", roles=frozenset({"finance"})),
            )
    assert out["status"] == "completed"
    spans = spans_out.get_finished_spans()
    asking, answering = sorted((s for s in spans if s.name == "invoke_agent gatedloop"), key=lambda s: s.start_time)
    assert asking.parent is None
    assert answering.parent is not None and answering.parent.span_id == asking.context.span_id
    assert [link.context for link in answering.links] == [app_span.get_span_context()]
    [approval] = [s for s in spans if s.name == "approval pay"]
    [paid] = [s for s in spans if s.name == "execute_tool pay"]
    chats = [s for s in spans if s.name.startswith("chat")]
    assert len(chats) == 2
    assert {s.context.trace_id for s in [asking, answering, approval, paid, *chats]} == {asking.context.trace_id}
    assert app_span.get_span_context().trace_id != asking.context.trace_id


def test_a_request_that_waits_for_a_second_approver_stays_one_trace(db: str):
    """Two approvals required: the first approver's run asks again, the second's takes the last answer; both
    continue the trace of the run that first asked (the request's notice, kept once)."""
    tracer_provider, spans_out = traced()
    config = {"configurable": {"thread_id": "t-quorum"}}
    approve = Command(resume={"decisions": [{"type": "approve"}]})
    with open_sqlite(db) as saver:
        graph = _pay_graph(saver, tracer_provider, approvals_required=2)
        graph.invoke({"messages": [("user", "pay 3")]}, config, context=CallContext(user_id="alice"))
        waits = graph.invoke(approve, config, context=CallContext(user_id="bo", roles=frozenset({"finance"})))
        assert waits["__interrupt__"]
        out = graph.invoke(approve, config, context=CallContext(user_id="cy", roles=frozenset({"finance"})))
    assert out["status"] == "completed"
    spans = spans_out.get_finished_spans()
    first, *answering = sorted((s for s in spans if s.name == "invoke_agent gatedloop"), key=lambda s: s.start_time)
    assert len(answering) == 2
    assert [s.parent.span_id if s.parent else None for s in answering] == [first.context.span_id] * 2
    approvals = [s for s in spans if s.name == "approval pay"]
    assert [dict(s.attributes or {})["gatedloop.decider"] for s in approvals] == ["bo", "cy"]
    assert {s.context.trace_id for s in spans} == {first.context.trace_id}


@pytest.mark.parametrize("kept", ["asked with telemetry off", "asked by an older version"])
def test_with_no_context_kept_the_answering_run_is_a_trace_of_its_own_and_a_forged_one_is_ignored(db: str, kept: str):
    """Nothing to continue: the answering run starts its own trace, and the approval span is a child of the step
    that took the answer. A trace context a client writes into the run's metadata is dropped either way."""
    tracer_provider, spans_out = traced()
    config = {"configurable": {"thread_id": "t-own-trace"}, "metadata": {ASKED_IN: FORGED}}
    with open_sqlite(db) as saver:
        asker = _pay_graph(saver, None if kept == "asked with telemetry off" else tracer_provider)
        asked = asker.invoke({"messages": [("user", "pay 3")]}, config, context=CallContext(user_id="alice"))
        request_id = asked["__interrupt__"][0].value["request_id"]
        if kept == "asked by an older version":  # its notice kept no `trace`
            with closing(sqlite3.connect(db)) as conn, conn:
                [(payload,)] = conn.execute(
                    "SELECT payload FROM gatedloop_outbox WHERE kind='request' AND request_id=?", (request_id,)
                ).fetchall()
                assert "trace" in json.loads(payload)
                old = {k: v for k, v in json.loads(payload).items() if k != "trace"}
                conn.execute(
                    "UPDATE gatedloop_outbox SET payload=? WHERE kind='request' AND request_id=?",
                    (json.dumps(old), request_id),
                )
        out = _pay_graph(saver, tracer_provider).invoke(
            Command(resume={"decisions": [{"type": "approve"}]}),
            config,
            context=CallContext(user_id="bo", roles=frozenset({"finance"})),
        )
    assert out["status"] == "completed"
    spans = spans_out.get_finished_spans()
    roots = [s for s in spans if s.name == "invoke_agent gatedloop"]
    assert len(roots) == (1 if kept == "asked with telemetry off" else 2)
    assert all(s.parent is None for s in roots)
    answering = roots[-1]
    [approval] = [s for s in spans if s.name == "approval pay"]
    [taker] = [s for s in spans if approval.parent is not None and s.context.span_id == approval.parent.span_id]
    assert (taker.name, taker.parent.span_id if taker.parent else None) == ("approve", answering.context.span_id)
    forged_trace = int(FORGED["traceparent"].split("-")[1], 16)
    assert not [
        s
        for s in spans
        if s.context.trace_id == forged_trace or any(link.context.trace_id == forged_trace for link in s.links)
    ]


def test_an_unknown_outcome_and_the_persons_settlement_are_reported(db: str):
    """A write whose connection dropped is unknown (counted, with its reason); the question put to a person is
    counted, and her answer is a span from the question to the answer, in the trace that asked, which the run that
    took the answer continues."""

    @tool
    def pay(amount: int) -> str:
        """Pay (write)."""
        raise ConnectionError("the payment service hung up")

    spans_out = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans_out))
    metrics_in = InMemoryMetricReader()
    model = ScriptedChatModel(script=[reply(calls=[call("pay", {"amount": 3}, "call_pay")]), reply("paid")])
    policies = {"pay": ToolPolicy(effect="write", approval="never", approvers=frozenset({"ops"}))}
    config = {"configurable": {"thread_id": "t-unknown"}}
    with open_sqlite(db) as saver:
        graph = build_graph(
            model,
            [pay],
            policies=policies,
            checkpointer=saver,
            tracer_provider=tracer_provider,
            meter_provider=MeterProvider(metric_readers=[metrics_in]),
        )
        asked = graph.invoke({"messages": [("user", "pay 3")]}, config, context=CallContext(user_id="alice"))
        assert asked["__interrupt__"][0].value["kind"] == "unknown_outcome"
        answer = Command(resume={"decisions": [{"type": "done", "result": {"paid": 3}}]})
        out = graph.invoke(answer, config, context=CallContext(user_id="carol", roles=frozenset({"ops"})))
    assert out["status"] == "completed"

    spans = spans_out.get_finished_spans()
    [write] = [s for s in spans if s.name == "tool_write"]
    assert dict(write.attributes or {})["gatedloop.unknown_reason"] == "connection_lost"
    [settled] = [s for s in spans if s.name == "unknown_outcome pay"]
    attributes = dict(settled.attributes or {})
    assert (attributes["gatedloop.decider"], attributes["gatedloop.verdict"]) == ("carol", "done")
    assert attributes["gatedloop.request.id"] == "unknown:call_pay" and attributes["gatedloop.waited_s"] >= 0
    [asking_root] = [s for s in spans if s.parent is None and (s.attributes or {}).get("gatedloop.interrupted")]
    assert settled.parent is not None and settled.parent.span_id == asking_root.context.span_id
    [answering_root] = [s for s in spans if s.name.startswith("invoke_agent") and s is not asking_root]
    assert answering_root.parent is not None and answering_root.parent.span_id == asking_root.context.span_id
    [link] = settled.links
    [taker] = [s for s in spans if s.context.span_id == link.context.span_id]
    assert taker.name == "settle_unknown_write"
    assert (
        dict(taker.attributes or {})["gatedloop.outcome"] == "ok"
        and not dict(taker.attributes or {})["gatedloop.left_open"]
    )

    data = metrics_in.get_metrics_data()
    assert data is not None
    points = [
        Point(m.name, dict(p.attributes or {}), float(getattr(p, "value", getattr(p, "count", 0))))
        for r in data.resource_metrics
        for s in r.scope_metrics
        for m in s.metrics
        for p in m.data.data_points
    ]
    assert _total(points, "gatedloop.writes.unknown", gatedloop__unknown_reason="connection_lost") == 1
    assert _total(points, "gatedloop.requests.asked", gatedloop__question="unknown_outcome") == 1
    assert _total(points, "gatedloop.requests.decided", gatedloop__question="unknown_outcome") == 1


def test_off_the_graph_has_no_handler_and_gatedloop_imports_nothing_of_opentelemetry(monkeypatch):
    """With no provider and no variable, a graph is built and run without loading gatedloop's OpenTelemetry modules
    (graph/otel_*.py; the ones in this process are set aside for the test, and must not come back)."""
    for name in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    for name in [m for m in sys.modules if m.startswith("gatedloop.graph.otel")]:
        monkeypatch.delitem(sys.modules, name)
    graph = build_graph(ScriptedChatModel(script=[reply("hi")]), [])
    assert graph.invoke({"messages": [("user", "hello")]})["status"] == "completed"
    assert parts_of(graph).telemetry is None and not graph.config.get("callbacks")
    assert not [m for m in sys.modules if m.startswith("gatedloop.graph.otel")]


@pytest.mark.parametrize(
    ("env", "traces", "metrics"),
    [
        ({}, False, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, True, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_METRICS_EXPORTER": "none"}, True, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, False, False),
    ],
)
def test_the_standard_variables_turn_each_signal_on(monkeypatch, env, traces, metrics):
    for name in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert (asked_by_env("TRACES"), asked_by_env("METRICS")) == (traces, metrics)


def test_variables_that_ask_without_the_extra_installed_warn_and_run_without(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setitem(sys.modules, "gatedloop.graph.otel_gate", None)  # as if opentelemetry were not installed
    with caplog.at_level(logging.WARNING, logger="gatedloop.telemetry"):
        assert telemetry_for("g") is None
    assert "pip install 'gatedloop[otel]'" in caplog.text


def test_an_approval_that_expires_ends_its_span_at_the_deadline_and_counts_as_expired(db: str):
    """Nobody decides within `approval_ttl_s`: the answer that comes late is refused for it, and the approval's span
    ends at the deadline (verdict `expired`, no decider, the seconds waited the TTL); the decisions metric counts
    it under `expired`. The graph's clock (which the expiry is judged by) is moved past the deadline; the ledger
    stamps the request with the wall clock."""

    @tool
    def pay(amount: int) -> str:
        """Pay (write)."""
        return f"paid {amount}"

    shift = [0.0]
    spans_out = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans_out))
    metrics_in = InMemoryMetricReader()
    model = ScriptedChatModel(script=[reply(calls=[call("pay", {"amount": 3}, "call_pay")]), reply("not paid")])
    policies = {"pay": ToolPolicy(effect="write", approvers={"finance"}, approval_ttl_s=60)}
    config = {"configurable": {"thread_id": "t-expiry"}}
    with open_sqlite(db) as saver:
        graph = build_graph(
            model,
            [pay],
            policies=policies,
            checkpointer=saver,
            tracer_provider=tracer_provider,
            meter_provider=MeterProvider(metric_readers=[metrics_in]),
        )
        parts = parts_of(graph)
        assert parts is not None
        parts.clock = lambda: time.time() + shift[0]
        asked = graph.invoke({"messages": [("user", "pay 3")]}, config, context=CallContext(user_id="alice"))
        [action] = asked["__interrupt__"][0].value["action_requests"]
        assert action["expires_at"] == action["requested_at"] + 60
        shift[0] = 125.0
        late = Command(resume={"decisions": [{"type": "approve"}]})
        out = graph.invoke(late, config, context=CallContext(user_id="bo", roles={"finance"}))
    assert out["status"] == "completed" and "paid 3" not in str(out["messages"])

    spans = spans_out.get_finished_spans()
    [expired] = [s for s in spans if s.name == "approval pay"]
    attributes = dict(expired.attributes or {})
    assert attributes["gatedloop.verdict"] == "expired" and attributes["gatedloop.waited_s"] == 60
    assert "gatedloop.decider" not in attributes and attributes["gatedloop.requester"] == "alice"
    assert expired.start_time == int(action["requested_at"] * 10**9)
    assert expired.end_time == int(action["expires_at"] * 10**9)
    data = metrics_in.get_metrics_data()
    assert data is not None
    points = [
        Point(m.name, dict(p.attributes or {}), float(getattr(p, "value", getattr(p, "count", 0))))
        for r in data.resource_metrics
        for s in r.scope_metrics
        for m in s.metrics
        for p in m.data.data_points
    ]
    assert _total(points, "gatedloop.requests.decided", gatedloop__verdict="expired") == 1
    assert _total(points, "gatedloop.requests.decided", gatedloop__verdict="approve") == 0
    assert _total(points, "gatedloop.requests.wait", gatedloop__verdict="expired") == 1
