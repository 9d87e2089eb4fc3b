"""A graph with a middleware list as `langgraph dev` serves it, for the `model_view` attack over HTTP
(tests/test_gate_devserver.py serves it beside gate_server_app.py, on the same server).

Any middleware list makes `model` send the thread through the kept view; this one only retries tools, so nothing
between the state and the model reshapes what it is sent. The scripted model writes everything it was sent to
`model_seen.txt` beside the database (so a run that fails after the model call still shows what it saw) and answers
with it. The server supplies the checkpointer (gatedloop's SQLite saver on `GATEDLOOP_DB`); the ledger is in the
same file.
"""

from __future__ import annotations

from langchain.agents.middleware import ToolRetryMiddleware
from langchain_core.messages import AIMessage, BaseMessage

from gatedloop.checkpoints.devserver import studio_db_path
from gatedloop.checkpoints.ledger import SqliteLedger
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, reply

SEEN = studio_db_path().with_name("model_seen.txt")


def echo(messages: list[BaseMessage]) -> AIMessage:
    """Every message the model was sent, with the ids of the calls each proposes: written down, and the answer."""
    text = " | ".join(f"{m.type}: {m.text} {[c['id'] for c in getattr(m, 'tool_calls', [])]}" for m in messages)
    with SEEN.open("a", encoding="utf-8") as seen:
        seen.write(text + "\n")
    return reply(text)


graph = build_graph(
    ScriptedChatModel(responder=echo),
    [],
    middleware=[ToolRetryMiddleware(max_retries=1, initial_delay=0, jitter=False)],
    ledger=SqliteLedger(studio_db_path()),
    name="view_app",
)
