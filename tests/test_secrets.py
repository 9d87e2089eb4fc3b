"""Secret arguments (`ToolPolicy.secret_args`): masked wherever arguments are shown or logged (issue 10, finding 7),
and never in a span or metric (issue 54)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.tools import tool
from langgraph.types import Command
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from span_text import span_text, traced

from gatedloop.graph import CallContext, build_graph, open_sqlite
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy
from gatedloop.tools.policy import MASK, RAW_ARGS

SECRET = ToolPolicy(secret_args=frozenset({"password", "card"}))


def test_masked_hides_each_named_argument_whole_and_keeps_the_others():
    args = {"user": "ana", "password": "hunter2", "card": {"number": "4111", "cvc": 123}, "amount": 5}
    shown = SECRET.masked(args)
    assert shown == {"user": "ana", "password": MASK, "card": MASK, "amount": 5}
    assert args["password"] == "hunter2" and args["card"] == {"number": "4111", "cvc": 123}, "the input is not changed"


def test_masked_matches_top_level_parameters_only():
    # secret_args names the tool's parameters; a nested field of the same name is not a parameter.
    assert SECRET.masked({"login": {"password": "x"}}) == {"login": {"password": "x"}}


def test_masked_without_secrets_is_a_plain_copy():
    args = {"password": "x"}
    shown = ToolPolicy().masked(args)
    assert shown == args and shown is not args


@pytest.mark.parametrize("raw", ['{"password": "hunter2"', "password=hunter2", None])
def test_unparsed_argument_text_of_a_tool_with_secrets_is_masked_whole(raw: Any):
    assert SECRET.masked({RAW_ARGS: raw}) == {RAW_ARGS: MASK}
    assert ToolPolicy().masked({RAW_ARGS: raw}) == {RAW_ARGS: raw}


@pytest.mark.parametrize("forged", ["password=hunter2", ["hunter2"], 7])
def test_arguments_that_are_not_an_object_are_shown_as_unparsed_text_never_raise(forged: Any):
    assert SECRET.masked(forged) == {RAW_ARGS: MASK}
    assert ToolPolicy().masked(forged) == {RAW_ARGS: forged}


def test_with_telemetry_on_no_secret_argument_masked_value_or_result_reaches_a_span_or_metric(db: str):
    """An approval turn of a tool with `secret_args`, traced and measured: neither a secret argument's value (a
    string, or a whole object's fields), nor the masked field's value after a reviewer's edit, nor the tool's result
    is in any span (attributes, events, links, resource) or metric the turn produced."""
    password, card, new_password, result = "pw-5521-never", "4111-0000-never", "pw-9034-never", "rcpt-7730-never"

    @tool
    def pay_card(user: str, password: str, card: dict[str, str], amount: int) -> dict[str, str]:
        """Pay by card (write)."""
        return {"receipt": result, "paid": str(amount)}

    tracer_provider, spans_out = traced()
    metrics_in = InMemoryMetricReader()
    args = {"user": "ana", "password": password, "card": {"number": card}, "amount": 5}
    model = ScriptedChatModel(script=[reply(calls=[call("pay_card", args, "call_card")]), reply("done")])
    policy = ToolPolicy(effect="write", approvers=frozenset({"finance"}), secret_args=frozenset({"password", "card"}))
    config = {"configurable": {"thread_id": "t-secret"}}
    with open_sqlite(db) as saver:
        graph = build_graph(
            model,
            [pay_card],
            policies={"pay_card": policy},
            checkpointer=saver,
            tracer_provider=tracer_provider,
            meter_provider=MeterProvider(metric_readers=[metrics_in]),
        )
        asked = graph.invoke({"messages": [("user", "pay 5")]}, config, context=CallContext(user_id="ana"))
        [action] = asked["__interrupt__"][0].value["action_requests"]
        assert action["args"]["password"] == MASK and action["args"]["card"] == MASK
        edited = {**args, "password": new_password, "amount": 6}
        edit = {"type": "edit", "edited_action": {"name": "pay_card", "args": edited}}
        out = graph.invoke(
            Command(resume={"decisions": [edit]}), config, context=CallContext(user_id="bo", roles={"finance"})
        )
    assert out["status"] == "completed"
    assert [m.content for m in out["messages"] if m.type == "tool"] and result in str(out["messages"])

    spans = spans_out.get_finished_spans()
    assert {s.name for s in spans} >= {"approval pay_card", "execute_tool pay_card"}
    metrics = metrics_in.get_metrics_data()
    exported = span_text(spans_out) + (metrics.to_json() if metrics is not None else "")
    for never in (password, card, new_password, result):
        assert never not in exported, never
