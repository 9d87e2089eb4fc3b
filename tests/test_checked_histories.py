"""The history check carried between steps (nodes/gate/checked_histories.py) finds exactly what a check from
scratch finds: the same foreign answers, open calls, proposed ids and model view, step after step, whatever
the steps add, remove or replace."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from gatedloop.nodes.gate.answers import HistoryScan, _answer_digest, answer_digest, model_view
from gatedloop.nodes.gate.checked_histories import CheckedHistories
from gatedloop.tools.arguments import digest


class DigestLedger:
    """The one ledger call the check makes, with the digests of the answers gatedloop 'gave'; counts reads."""

    def __init__(self) -> None:
        self.digests: dict[str, str] = {}
        self.reads: list[int | None] = []

    def answer_digests(self, thread_id: str, call_ids: Sequence[str] | None = None) -> dict[str, str]:
        self.reads.append(None if call_ids is None else len(call_ids))
        if call_ids is None:
            return dict(self.digests)
        return {c: self.digests[c] for c in call_ids if c in self.digests}


def from_scratch(messages: list[BaseMessage], ledger: DigestLedger) -> tuple[list, list, set, list]:
    scan = HistoryScan()
    scan.extend(messages, dict(ledger.digests))
    check = scan.result()
    return check.foreign, check.open_calls, scan.proposed, model_view(messages, check.foreign)


def same(checked, expected) -> None:
    foreign, open_calls, proposed, view = expected
    assert [id(m) for m in checked.check.foreign] == [id(m) for m in foreign]
    assert checked.check.open_calls == open_calls
    assert checked.proposed == proposed
    assert [id(m) for m in checked.view()] == [id(m) for m in view]


STEP = st.sampled_from(["ask", "calls", "answer", "late_answer", "foreign", "forged_digest", "remove", "replace"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(STEP, st.integers(0, 3)), min_size=1, max_size=40))
def test_carried_check_is_the_check_from_scratch(steps):
    ledger = DigestLedger()
    histories = CheckedHistories()
    history: list[BaseMessage] = [HumanMessage("start", id="h-0")]
    open_ids: list[str] = []
    for counter, (kind, n) in enumerate(steps, start=1):
        if kind == "ask":
            history = [*history, HumanMessage(f"q{counter}", id=f"h-{counter}")]
        elif kind == "calls":
            ids = [f"c{counter}-{i}" for i in range(n + 1)]
            calls = [{"name": "lookup", "args": {"i": i}, "id": call_id} for i, call_id in enumerate(ids)]
            history = [*history, AIMessage("", tool_calls=calls, id=f"ai-{counter}")]
            open_ids.extend(ids)
        elif kind in ("answer", "late_answer") and open_ids:
            call_id = open_ids.pop(0 if kind == "late_answer" else -1)
            answer = ToolMessage(f"r{counter}", tool_call_id=call_id, name="lookup", id=f"tool-{call_id}")
            ledger.digests[call_id] = answer_digest(answer)
            history = [*history, answer]
        elif kind in ("foreign", "forged_digest"):
            target = open_ids[0] if open_ids and kind == "forged_digest" else f"nobody-{counter}"
            history = [*history, ToolMessage("forged", tool_call_id=target, id=f"f-{counter}")]
        elif kind == "remove" and len(history) > 1:
            history = [m for i, m in enumerate(history) if i != n % len(history)]
        elif kind == "replace" and len(history) > 1:
            index = n % len(history)
            history = [*history[:index], history[index].model_copy(), *history[index + 1 :]]
        checked = histories.check(ledger, "t", history)  # type: ignore[arg-type]
        same(checked, from_scratch(history, ledger))


def test_a_step_reads_only_the_digests_of_the_answers_it_adds():
    """A long run of rounds: after the first check, each step asks the ledger only for the answers added since
    (one per round), never for the whole thread."""
    ledger = DigestLedger()
    histories = CheckedHistories()
    history: list[BaseMessage] = [HumanMessage("go", id="h")]
    for round_ in range(50):
        history = [*history, AIMessage("", tool_calls=[{"name": "lookup", "args": {}, "id": f"c{round_}"}])]
        answer = ToolMessage("ok", tool_call_id=f"c{round_}", name="lookup", id=f"tool-c{round_}")
        ledger.digests[f"c{round_}"] = answer_digest(answer)
        history = [*history, answer]
        same(histories.check(ledger, "t", history), from_scratch(history, ledger))  # type: ignore[arg-type]
    assert ledger.reads[0] is None
    assert ledger.reads[1:] == [1] * 49


def test_a_check_is_carried_only_within_one_ledger():
    """A graph served on several databases (one ledger each) checks a thread of another database from scratch,
    even when its messages equal those checked before: only that database's ledger says they are authentic."""
    genuine, other = DigestLedger(), DigestLedger()
    histories = CheckedHistories()
    answer = ToolMessage("ok", tool_call_id="c1", name="lookup", id="tool-c1")
    genuine.digests["c1"] = answer_digest(answer)
    history: list[BaseMessage] = [AIMessage("", tool_calls=[{"name": "lookup", "args": {}, "id": "c1"}]), answer]
    assert not histories.check(genuine, "t", history).check.foreign  # type: ignore[arg-type]
    copy = [m.model_copy() for m in history]
    checked = histories.check(other, "t", copy)  # type: ignore[arg-type]
    assert other.reads == [None]
    assert [m.tool_call_id for m in checked.check.foreign] == ["c1"]
    assert [c.id for c in checked.check.open_calls] == ["c1"]


def test_equal_messages_read_back_from_a_checkpoint_carry_the_check():
    """A new invoke reads the last invoke's messages back as new, equal objects: the check goes on from there."""
    ledger = DigestLedger()
    histories = CheckedHistories()
    answer = ToolMessage("ok", tool_call_id="c1", name="lookup", id="tool-c1")
    ledger.digests["c1"] = answer_digest(answer)
    history: list[BaseMessage] = [AIMessage("", tool_calls=[{"name": "lookup", "args": {}, "id": "c1"}]), answer]
    histories.check(ledger, "t", history)  # type: ignore[arg-type]
    read_back = [*[m.model_copy() for m in history], HumanMessage("next", id="h2")]
    same(histories.check(ledger, "t", read_back), from_scratch(read_back, ledger))  # type: ignore[arg-type]
    assert ledger.reads == [None]  # nothing read again: no answer was added
    changed = [*read_back[:1], answer.model_copy(update={"content": "forged"}), read_back[2]]
    checked = histories.check(ledger, "t", changed)  # type: ignore[arg-type]
    assert ledger.reads == [None, None]
    assert [m.content for m in checked.check.foreign] == ["forged"]


ANY_TEXT = st.text(alphabet=st.characters(blacklist_categories=()))  # lone surrogates and controls included


@settings(max_examples=300, deadline=None)
@given(call_id=ANY_TEXT, status=ANY_TEXT, content=ANY_TEXT)
def test_an_answer_digest_is_the_canonical_digest_stored_ledgers_hold(call_id, status, content):
    """The answer digest is written out by hand for speed; it must stay byte for byte `digest` of the answer, or
    every answer a ledger recorded before would read as foreign."""
    expected = digest({"call": call_id, "status": status, "content": content})
    assert _answer_digest.__wrapped__(call_id, status, content) == expected
