"""How a thread is shown to a person, in plain text and JSON: steps, approval requests, stop reasons, a thread's
history, with secret arguments masked. Shared by the two user interfaces above the graph, the CLI and the inbox.

What masks is explicit: a `Display` is built from the graph being shown (`Display.for_graph`, its tools'
policies) and every renderer that can print a call's arguments is one of its methods. Nothing ambient: a renderer
called without the graph's policies cannot exist, so no interface can forget to mask."""

from __future__ import annotations

import json
import shutil
import time
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, TextIO

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Interrupt

from gatedloop.checkpoints import threads
from gatedloop.checkpoints.ledger import Ledger
from gatedloop.checkpoints.threads import ThreadSummary
from gatedloop.graph.parts_of import parts_of
from gatedloop.graph.pending import PendingRequest, waiting_words
from gatedloop.graph.thread_graph import ledger_of, made_by
from gatedloop.nodes.wire.masking import Redactor, thread_redactor, unknown_policies
from gatedloop.tools.policy import GATED_WRITE, MASK, ToolPolicy

STOP_WORDS = {
    "completed": "completed",
    "step_limit": "stopped: the model-call limit was reached",
    "budget_exhausted": "stopped: a budget (tokens or tool calls) is used up",
    "deadline": "stopped: the deadline passed",
    "cancelled": "stopped: cancelled on request",
    "loop_detected": "stopped: the model kept repeating the same call",
    "incomplete": "stopped: the model's responses were incomplete (cut off or malformed)",
    "invalid_answer": "stopped: the model's final answer did not match the response format",
    "refused": "stopped: the model refused",
    "needs_attention": "stopped: a write's outcome is unknown and needs a person",
    "error": "stopped: an error (details with --debug)",
}


def short(value: Any, width: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def visible(text: str) -> str:
    """Characters that show nothing (controls, zero-width and bidi marks, line separators) as escapes."""
    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in text)


def wrapped(text: str, indent: str) -> list[str]:
    """Cut into lines that fit the terminal; every character kept (joining the lines gives the text back)."""
    width = max(40, shutil.get_terminal_size((100, 24)).columns - len(indent))
    lines = []
    while len(text) > width:
        cut = text.rfind(" ", width // 2, width) + 1 or width  # after a space when there is one, else mid-word
        lines.append(indent + text[:cut])
        text = text[cut:]
    return [*lines, indent + text]


# --- a thread's history: words for audit events -------------------------------------------------------------


def clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(at))


def day_and_clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 120:
        return f"{minutes} min {secs} s"
    return f"{minutes // 60} h {minutes % 60} min"


DECISION_WORDS = {
    "approve": "approved",
    "edit": "edited and approved",
    "reject": "rejected",
    "respond": "answered in the tool's place",
}
UNKNOWN_WORDS = {"done": "it happened", "not_done": "it did not happen (run it)", "abandon": "leave it (abandon)"}


def audit_text(event: dict[str, Any], earlier: list[dict[str, Any]]) -> str:
    """One audit event in words; `earlier` are the same call's events before it (for waits and re-run reasons)."""
    name, detail, actor = event["event"], event.get("detail") or {}, event.get("actor")
    by = f" by {actor}" if actor else ""
    if name == "validated":
        repair = f" (arguments repaired: {detail['repair']})" if detail.get("repair") else ""
        verdict = {"ask": "needs approval", "run": "runs without approval"}.get(str(detail.get("verdict")), "checked")
        if detail.get("grants"):
            verdict = f"runs under the standing grant {', '.join(detail['grants'])}"
        asker = f" (requested by {actor})" if actor else ""
        return f"validated{asker}: {verdict}{repair}"
    if name == "refused":
        return f"refused before running: {detail.get('error')}"
    if name.startswith("answer_refused"):
        return f"an answer{by} was refused: {detail.get('error')}"
    if name == "approval_expired":
        return "approval expired: the request was older than its time limit; not run"
    if name == "superseded":
        return "superseded: a new message came before it ran; not run"
    if name.startswith("foreign_answer_removed"):
        return "an answer gatedloop did not write was removed from the history (the call stayed open)"
    if name == "decision" or name.startswith("decision:"):
        words = DECISION_WORDS.get(str(detail.get("decision")), str(detail.get("decision")))
        asked = next((e for e in reversed(earlier) if e["event"] == "validated"), None)
        waited = f" after {duration(event['at'] - asked['at'])}" if asked else ""
        changed = ""
        if detail.get("decision") == "edit" and detail.get("args") != detail.get("proposed"):
            proposed, ran = (json.dumps(detail.get(k), ensure_ascii=False) for k in ("proposed", "args"))
            changed = f": {visible(proposed)} -> {visible(ran)}"  # in full: what the reviewer changed
        return f"{words}{by}{waited}{changed}{_reason(detail)}"
    if name == "executed":
        reused = ", stored result reused" if detail.get("reused") else ""
        error = f" ({detail['error_type']})" if detail.get("error_type") else ""
        return f"ran: {detail.get('outcome')}{error} in {duration((detail.get('duration_ms') or 0) / 1000)}{reused}"
    if name.startswith("rerun_"):
        attempt = detail.get("attempt") or name.removeprefix("rerun_")
        said_not_done = any(
            e["event"] == "unknown_outcome_decision" and (e.get("detail") or {}).get("decision") == "not_done"
            for e in earlier
        )
        why = (
            "a person said the earlier attempt had not happened"
            if said_not_done
            else "the process running it stopped and the tool's system reported it had not happened"
        )
        return f"run again (attempt {attempt}): {why}"
    if name.startswith("unknown_outcome_asked"):
        return "outcome unknown; a person was asked whether it happened"
    if name == "unknown_outcome_decision":
        decided = UNKNOWN_WORDS.get(str(detail.get("decision")), detail.get("decision"))
        return f"outcome unknown; decided{by}: {decided}{_reason(detail)}"
    if name == "grant_used":
        whose = f" for {detail['requester']}" if detail.get("requester") else ""
        return f"approved by the standing grant {detail.get('grant')}{whose} ({detail.get('uses_left')} uses left)"
    if name.startswith("sent_back:"):
        return f"sent back to a person: {detail.get('reason')}"
    if name == "limit_refused":
        return f"refused: {detail.get('reason')}"
    if name == "reconciled":
        return "settled: the tool's system reports it had happened (its result is used, not run again)"
    if name == "marked done":
        return f"settled: marked done{by} (the given result is used)"
    return f"{name}{by}: {short(detail, 80)}"


def describe_thread(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, ledger: Ledger | None = None
) -> ThreadSummary:
    """Where a thread stands (`gatedloop.checkpoints.threads.describe_thread`), a pending approval request saying
    what it waits for, per role ("waiting for finance: refund; support: send_email"): a reviewer reading the list
    knows whether it is hers, and who else must decide before anything runs."""
    return threads.describe_thread(graph, thread_id, ledger, waiting_words)


def print_lines(lines: Iterable[str], out: TextIO) -> None:
    for line in lines:
        print(line, file=out, flush=True)


@dataclass(frozen=True)
class Display:
    """Renderers for one graph's threads: every one that can print a call's arguments masks its tools'
    `secret_args` (policies given here, explicitly); a thread's history also has its free text redacted of the
    thread's secret values (`redact`, see `for_thread`)."""

    policies: Mapping[str, ToolPolicy] = field(default_factory=lambda: MappingProxyType({}))
    redact: Redactor = field(default_factory=Redactor)

    @classmethod
    def for_graph(cls, graph: CompiledStateGraph[Any, Any, Any, Any]) -> Display:
        """The display of a graph built by `build_graph` (its tools' policies); a graph gatedloop did not build
        has no policies to mask by."""
        parts = parts_of(graph)
        return cls(parts.registry.policies if parts is not None else {})

    @classmethod
    def for_thread(
        cls, graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, messages: list[BaseMessage]
    ) -> Display:
        """The display of one thread's history (`gatedloop show`), redacted as the inbox redacts it, by the same
        function (`thread_redactor`: every text cleared of the secret values of the thread's calls and edits). By
        the graph's policies if it made the thread; else nothing says which arguments are secret, so every one is
        (`unknown_policies`)."""
        known = made_by(graph, thread_id)
        display = cls.for_graph(graph) if known else cls(unknown_policies(messages))
        ledger = ledger_of(graph)
        calls = [str(c.get("id")) for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
        edited = ledger.edited_args(thread_id, calls) if ledger is not None else None
        return replace(display, redact=thread_redactor(messages, display.policy, edited))

    def policy(self, name: str) -> ToolPolicy:
        """A tool's policy; one without is a gated write (fail closed), as the registry and the inbox have it."""
        return self.policies.get(name, GATED_WRITE)

    def redacted(self, value: Any) -> Any:
        """`value` with the thread's secret values replaced in every string it holds (lists and dicts walked)."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, list):
            return [self.redacted(v) for v in value]
        if isinstance(value, dict):
            return {k: self.redacted(v) for k, v in value.items()}
        return value

    def shown_args(self, name: str, args: Any) -> Any:
        """`args` with the tool's `secret_args` masked; unparsed text of a tool with secrets is masked whole (nobody
        can tell which part of it is the secret)."""
        policy = self.policies.get(name)
        if policy is None or not policy.secret_args:
            return args
        return policy.masked(args) if isinstance(args, dict) else MASK

    def call_text(self, name: str, args: Any) -> str:
        """A call with every argument in full (a reviewer approves what is shown, so nothing is cut), secrets
        masked, and invisible characters (controls, bidi overrides) written as escapes so nothing hides text."""
        args = self.shown_args(name, args)
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, default=repr)
        return f"{name}({visible(text)})"

    def shown_update(self, update: Any) -> Any:
        """A node's state update for `--json`: the call plans' secret arguments masked (messages: `message_json`)."""
        if not isinstance(update, dict) or not isinstance(update.get("calls"), list):
            return update
        plans = [c for c in update["calls"] if isinstance(c, dict)]
        return {**update, "calls": [{**c, "args": self.shown_args(str(c.get("name")), c.get("args"))} for c in plans]}

    def step_lines(self, node: str, update: Any) -> list[str]:
        """One or more readable lines for a node's state update."""
        if not isinstance(update, dict):
            return []
        lines: list[str] = []
        for message in update.get("messages") or []:
            lines.extend(self._message_lines(node, message))
        if node == "finalize" and update.get("status"):
            lines.append(
                f"[{node}] {STOP_WORDS.get(update['status'], update['status'])}"
                + (f" ({update['stop_detail']})" if update.get("stop_detail") else "")
            )
        elif update.get("stop"):
            lines.append(f"[{node}] stopping: {update.get('stop_detail') or update['stop']}")
        return lines

    def _message_lines(self, node: str, message: BaseMessage) -> list[str]:
        if isinstance(message, AIMessage):
            calls = [self.call_text(c["name"], c["args"]) for c in message.tool_calls]
            calls += [
                self.call_text(c.get("name") or "?", c.get("args")) + " [unparseable]"
                for c in message.invalid_tool_calls
            ]
            if calls:
                return [f"[{node}] proposes {c}" for c in calls]
            return [f"[{node}] answers: {short(message.content, 200)}"]
        if isinstance(message, ToolMessage):
            mark = "✗" if message.status == "error" else "✓"
            return [f"[{node}] {mark} {message.name} -> {short(message.content)}"]
        return []

    def approval_table(self, request: dict[str, Any]) -> str:
        asked = PendingRequest.parse(request)
        rows = []
        if asked.kind == "unknown_outcome":
            for call in asked.calls:
                rows.append(
                    f"  {call.index + 1}. {call.name}  outcome unknown ({call.reason}), key {call.idempotency_key}"
                )
                rows.extend(wrapped(self.call_text(call.name, call.args), "     "))
            head = "A write's outcome is unknown. Answer done (with its result), not_done (run it) or abandon:"
            return "\n".join([head, *rows])
        for call in asked.calls:
            rows.append(
                f"  {call.index + 1}. {call.name}   allowed: {', '.join(call.allowed)}   decided by: {call.deciders()}"
            )
            rows.extend(wrapped(self.call_text(call.name, call.args), "     "))
        for held in asked.decided:
            rows.append(f"  -  {held.name}   decided: {held.words()} (waits for the others)")
        head = "Approval needed:" + (f"  (previous answer refused: {asked.error})" if asked.error else "")
        return "\n".join([head, *rows, f"  waiting for {asked.waiting_for()}"])

    def message_json(self, message: BaseMessage) -> dict[str, Any]:
        """A message as compact JSON: role, content, and the tool-call fields that matter."""
        body: dict[str, Any] = {"role": message.type, "id": message.id, "content": self.redacted(message.content)}
        if isinstance(message, AIMessage):
            body["tool_calls"] = [
                {"id": c["id"], "name": c["name"], "args": self.redacted(self.shown_args(c["name"], c["args"]))}
                for c in message.tool_calls
            ]
            if message.invalid_tool_calls:
                body["invalid_tool_calls"] = [
                    {**c, "args": self.redacted(self.shown_args(c.get("name") or "", c.get("args")))}
                    for c in message.invalid_tool_calls
                ]
        if isinstance(message, ToolMessage):
            body.update(tool_call_id=message.tool_call_id, name=message.name, status=message.status)
        return body

    def jsonable(self, value: Any) -> Any:
        """Stream chunks as plain JSON: messages compacted, interrupts as {id, value}, anything else by repr."""

        def default(item: Any) -> Any:
            if isinstance(item, BaseMessage):
                return self.message_json(item)
            if isinstance(item, Interrupt):
                return {"id": item.id, "value": item.value}
            if isinstance(item, set | frozenset | tuple):
                return list(item)
            return repr(item)

        return json.loads(json.dumps(value, ensure_ascii=False, default=default))

    def json_line(self, record: dict[str, Any]) -> str:
        return json.dumps(self.jsonable(record), ensure_ascii=False)

    def history_lines(self, messages: list[BaseMessage], audit: list[dict[str, Any]]) -> list[str]:
        """The conversation with each call's fate under it, every event with its time (UTC) and durations."""
        events: dict[str, list[dict[str, Any]]] = {}
        for event in audit:
            events.setdefault(event["call_id"], []).append(event)
        lines: list[str] = []
        if audit:
            lines.append(f"first event {day_and_clock(audit[0]['at'])}, last {day_and_clock(audit[-1]['at'])}")
        for message in messages:
            if isinstance(message, HumanMessage):
                lines.append(f"user: {short(self.redacted(message.content), 300)}")
            elif isinstance(message, AIMessage):
                for call in [*message.tool_calls, *message.invalid_tool_calls]:
                    lines.append(f"model: call {call.get('id')}")
                    text = self.redact(self.call_text(call.get("name") or "?", call.get("args")))
                    lines.extend(wrapped(text, "      "))
                    seen = events.get(call.get("id") or "", [])
                    for index, event in enumerate(seen):
                        lines.append(f"    {clock(event['at'])}  {self.redact(audit_text(event, seen[:index]))}")
                if message.content:
                    lines.append(f"model: {short(self.redacted(message.content), 300)}")
            elif isinstance(message, ToolMessage):
                lines.append(f"tool {message.tool_call_id}: {short(self.redacted(message.content), 160)}")
        return lines


def _reason(detail: dict[str, Any]) -> str:
    """A decision's justification, as the timeline shows it (docs/evidence.md)."""
    text = detail.get("justification")
    return f' -- "{visible(short(text, 200))}"' if isinstance(text, str) and text else ""
