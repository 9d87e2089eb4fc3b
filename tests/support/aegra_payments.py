"""A payments graph served by Aegra in tests/test_aegra.py, built as docs/server.md says: no checkpointer, no
`ledger=` (Aegra gives each run LangGraph's own `AsyncPostgresSaver`, and gatedloop's ledger must live in its
database).

- `pay` and `wire` are gated writes that only a `finance` reviewer may approve; `pay` has a `reconcile` (it asks the
  effects file whether a payment with that key happened), `wire` has none (an unknown outcome goes to a person).
  The tests ask as ana (staff) and answer as bo (finance, her workspace's supervisor). A finance user may also
  approve her own request (`self_approval=True`): bench/aegra_kills.py and bench/aegra_throughput.py ask and answer
  as bo alone.
- Every real payment is a row in the effects file (`AEGRA_TEST_EFFECTS`, SQLite), with the pid of the process that
  made it: what the tests count.
- A payee named `hold-before-...` or `hold-after-...` makes the first attempt to pay it stop before or after its
  effect and wait (`AEGRA_TEST_CONTROL/<payee>.started` names the pid that waits), so a test can SIGKILL the server
  process that runs it. A later attempt (another worker, after the reaper) does not wait.

The scripted model: "pay 500 to bo as c1" -> one `pay` call with id c1 (or `wire`); after the answer, "done: c1=...".
Each model call appends its process id to `AEGRA_TEST_CONTROL/model-calls`. `served_graph(model_wait_s=...)` (the
`throughput` graph of tests/support/aegra_app/, for bench/aegra_throughput.py) makes every model call wait that long
first, awaited on the run's event loop as a provider's HTTP call would be. `anchor_graph` (the `anchor` graph) is what
that bench measures it against: the same model, payments and effects file under `create_agent` with
`HumanInTheLoopMiddleware`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.tools import BaseTool, InjectedToolArg, InjectedToolCallId, tool
from sample_app import Effects

from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

EFFECTS_ENV = "AEGRA_TEST_EFFECTS"
CONTROL_ENV = "AEGRA_TEST_CONTROL"
MODEL_WAIT_ENV = "AEGRA_TEST_MODEL_WAIT"
"""Seconds each model call of the `throughput` graph waits (bench/aegra_throughput.py sets it for the servers)."""
HOLD_S = 300.0


def responder(messages: list[BaseMessage]) -> AIMessage:
    with (Path(os.environ[CONTROL_ENV]) / "model-calls").open("a") as log:  # which process asked the model
        log.write(f"{os.getpid()}\n")
    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    answers = [m for m in messages[humans[-1] + 1 :] if isinstance(m, ToolMessage)]
    if answers:
        return reply("done: " + "; ".join(f"{m.tool_call_id}={m.status}" for m in answers))
    words = str(messages[humans[-1]].content).split()  # pay 500 to bo as c1
    if len(words) != 6 or words[0] not in ("pay", "wire"):
        return reply("say: pay AMOUNT to WHO as ID")
    return reply(calls=[call(words[0], {"amount": float(words[1]), "to": words[3]}, words[5])])


class WaitingModel(ScriptedChatModel):
    """The scripted model behind a provider that takes `wait_s` per call: awaited under `ainvoke`/`astream` (the
    run's event loop serves other runs meanwhile), slept under `invoke`. The reply is made after the wait, outside
    it: the scripted model's lock is held only for the reply itself, so waits overlap as HTTP calls would."""

    wait_s: float = 0.0

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        time.sleep(self.wait_s)
        return super()._generate(messages, stop, run_manager, **kwargs)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        await asyncio.sleep(self.wait_s)
        return super()._generate(messages, stop, None, **kwargs)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        await asyncio.sleep(self.wait_s)
        for chunk in super()._stream(messages, stop, None, **kwargs):
            if run_manager:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk


def hold(to: str, when: str) -> None:
    """The first attempt of a `hold-<when>-...` payment waits here, for a test to kill this process."""
    if not to.startswith(f"hold-{when}-"):
        return
    control = Path(os.environ[CONTROL_ENV])
    marker = control / f"{to}.started"
    try:
        with marker.open("x") as out:  # only the first attempt of this call
            out.write(str(os.getpid()))
    except FileExistsError:
        return
    time.sleep(HOLD_S)


def pay_once(effects: Effects, tool_name: str, amount: float, to: str, key: str) -> dict[str, Any]:
    """One real payment: its row in the effects file (held before or after it for a `hold-...` payee)."""
    hold(to, "before")
    row = effects.add(tool_name, {"amount": amount, "to": to}, key)
    hold(to, "after")
    return {"payment": row, "amount": amount, "to": to}


def make_tools(effects: Effects) -> list[BaseTool]:
    @tool
    def pay(amount: float, to: str, idempotency_key: Annotated[str, InjectedToolArg]) -> dict[str, Any]:
        """Pay an amount to someone (a write, reconciled by its key)."""
        return pay_once(effects, "pay", amount, to, idempotency_key)

    @tool
    def wire(amount: float, to: str, idempotency_key: Annotated[str, InjectedToolArg]) -> dict[str, Any]:
        """Wire an amount to someone (a write nobody can reconcile)."""
        return pay_once(effects, "wire", amount, to, idempotency_key)

    return [pay, wire]


def anchor_tools(effects: Effects) -> list[BaseTool]:
    """`pay` and `wire` for the anchor: the same payments, keyed by the tool call id (no gate injects a key)."""

    @tool
    def pay(amount: float, to: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> dict[str, Any]:
        """Pay an amount to someone (a write, reconciled by its key)."""
        return pay_once(effects, "pay", amount, to, tool_call_id)

    @tool
    def wire(amount: float, to: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> dict[str, Any]:
        """Wire an amount to someone (a write nobody can reconcile)."""
        return pay_once(effects, "wire", amount, to, tool_call_id)

    return [pay, wire]


def anchor_graph(*, model_wait_s: float, name: str = "anchor") -> Any:
    """What bench/aegra_throughput.py measures the `throughput` graph against: LangChain's `create_agent` with
    `HumanInTheLoopMiddleware` pausing on `pay` and `wire`, the same waiting scripted model, no checkpointer (Aegra
    gives one). No roles, no ledger: the incumbent shape."""
    from langchain.agents import create_agent  # the `middleware` extra: only the bench's server config loads this
    from langchain.agents.middleware import HumanInTheLoopMiddleware

    hitl = HumanInTheLoopMiddleware(interrupt_on={"pay": True, "wire": True})
    model = WaitingModel(responder=responder, wait_s=model_wait_s)
    return create_agent(model, anchor_tools(Effects(os.environ[EFFECTS_ENV])), middleware=[hitl], name=name)


def served_graph(*, model_wait_s: float | None = None, name: str = "payments") -> Any:
    """The payments graph; with `model_wait_s` its model waits that long per call (`WaitingModel`)."""
    effects = Effects(os.environ[EFFECTS_ENV])
    model = (
        ScriptedChatModel(responder=responder)
        if model_wait_s is None
        else WaitingModel(responder=responder, wait_s=model_wait_s)
    )
    gated = {"effect": "write", "approval": "always", "approvers": frozenset({"finance"}), "self_approval": True}
    return build_graph(
        model,
        make_tools(effects),
        policies={
            "pay": ToolPolicy(**gated, reconcile=lambda args, key: effects.find(key)),
            "wire": ToolPolicy(**gated),
        },
        name=name,
    )
