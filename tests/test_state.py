"""The messages reducer: same result as LangGraph's add_messages, batching-invariant, deterministic ids."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langgraph.graph.message import add_messages

from gatedloop.checkpoints.channels import fold_messages

MESSAGE = st.builds(
    lambda kind, ident, text: (HumanMessage if kind else AIMessage)(content=text, id=ident),
    st.booleans(),
    st.sampled_from(["a", "b", "c", "d", "e"]),
    st.text(max_size=5),
)
WRITES = st.lists(st.lists(MESSAGE, max_size=3), max_size=6)


@settings(max_examples=200, derandomize=True)
@given(writes=WRITES, cut=st.integers(0, 6))
def test_fold_matches_add_messages_and_is_batching_invariant(writes, cut):
    expected: list = []
    for write in writes:
        expected = add_messages(expected, [m.model_copy() for m in write])
    once = fold_messages([], [[m.model_copy() for m in w] for w in writes])
    twice = fold_messages(
        fold_messages([], [[m.model_copy() for m in w] for w in writes[:cut]]),
        [[m.model_copy() for m in w] for w in writes[cut:]],
    )
    assert [(m.id, m.content, m.type) for m in once] == [(m.id, m.content, m.type) for m in expected]
    assert [(m.id, m.content) for m in twice] == [(m.id, m.content) for m in once]


def test_ids_from_position_are_the_same_on_every_replay():
    writes = [[("user", "hi")], [AIMessage("hello", id="ai1")], [("user", "again")]]
    first = fold_messages([], writes)
    assert [m.id for m in first] == ["msg-0", "ai1", "msg-2"]
    assert [
        m.id for m in fold_messages([], [[("user", "hi")], [AIMessage("hello", id="ai1")], [("user", "again")]])
    ] == [m.id for m in first]


def test_remove_message_is_honoured():
    merged = fold_messages([], [[HumanMessage("x", id="a"), AIMessage("y", id="b")], [RemoveMessage(id="a")]])
    assert [m.id for m in merged] == ["b"]
