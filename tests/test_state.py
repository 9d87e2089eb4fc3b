"""The messages reducer: same result as LangGraph's add_messages, batching-invariant, deterministic ids."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langgraph.graph.message import add_messages

from gatedloop.checkpoints import channels
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


@settings(max_examples=200, derandomize=True)
@given(steps=st.lists(st.tuples(st.integers(0, 40), st.lists(MESSAGE, max_size=3)), min_size=1, max_size=40))
def test_folds_branching_from_earlier_lists_match_add_messages(steps):
    """Folds from any earlier list share its id index (a load replaying steps this process folded, a fork made
    by update_state): each list equals add_messages along its own branch, whatever the others appended."""
    root = fold_messages([], [[HumanMessage("root", id="root")]])
    lists = [(root, [HumanMessage("root", id="root")])]
    for parent, write in steps:
        folded, expected = lists[parent % len(lists)]
        folded = fold_messages(folded, [[m.model_copy() for m in write]])
        expected = add_messages(expected, [m.model_copy() for m in write])
        assert [(m.id, m.content, m.type) for m in folded] == [(m.id, m.content, m.type) for m in expected]
        lists.append((folded, expected))


def test_a_load_replaying_the_steps_folded_here_does_not_rebuild_the_index(monkeypatch):
    """A load folds the writes of the steps this process made on the list they started from: as each step
    did, it only appends (no index of the whole history is built again)."""
    history = fold_messages([], [[HumanMessage(f"q{i}", id=f"h{i}") for i in range(100)]])
    writes = [[AIMessage(f"a{i}", id=f"a{i}")] for i in range(6)]
    stepped = history
    for write in writes:
        stepped = fold_messages(stepped, write)
    rebuilt: list[int] = []
    index = channels._index
    monkeypatch.setattr(channels, "_index", lambda messages: rebuilt.append(len(messages)) or index(messages))
    loaded = fold_messages(history, [[m.model_copy() for m in write] for write in writes])  # read back: new objects
    assert [(m.id, m.content) for m in loaded] == [(m.id, m.content) for m in stepped]
    assert rebuilt == []
