"""A long read-only conversation, and a fresh process that loads it and goes on (tests/test_thread_ops.py).

`asking_responder` answers "ask X" with one `lookup` call, then "answer: X". Run as a script
(`python tests/support/thread_child.py sqlite|postgres DB EFFECTS THREAD`, `DB` as `env` for Postgres reads
`GATEDLOOP_TEST_PG_URL`), it opens the thread in this new process, prints the messages it loaded as one JSON
line, asks one more question and prints the messages after that turn and its status.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import AbstractContextManager
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from sample_app import Effects, build

from gatedloop.graph.scripted import call, reply

LAST_QUESTION = "ask after the prune"


def asking_responder(messages: list[BaseMessage]) -> AIMessage:
    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    question = str(messages[humans[-1]].content).removeprefix("ask ")
    if any(isinstance(m, ToolMessage) for m in messages[humans[-1] + 1 :]):
        return reply(f"answer: {question}")
    return reply(calls=[call("lookup", {"query": question}, f"r{len(humans)}")])


def summary(messages: list[BaseMessage]) -> list[list[Any]]:
    """What must survive: each message's kind, id and content, in order."""
    return [[type(m).__name__, m.id, m.content] for m in messages]


def open_saver(backend: str, db: str) -> AbstractContextManager[Any]:
    if backend == "postgres":
        from gatedloop.checkpoints.postgres import open_postgres

        return open_postgres(os.environ["GATEDLOOP_TEST_PG_URL"] if db == "env" else db)
    from gatedloop.checkpoints import open_sqlite

    return open_sqlite(db)


def main(argv: list[str]) -> int:
    backend, db, effects, thread_id = argv
    config = {"configurable": {"thread_id": thread_id}}
    with open_saver(backend, db) as saver:
        graph = build(saver, Effects(effects), asking_responder)
        loaded = graph.get_state(config).values
        print(json.dumps({"loaded": summary(loaded["messages"])}), flush=True)
        out = graph.invoke({"messages": [("user", LAST_QUESTION)]}, config, durability="sync")
        print(json.dumps({"after": summary(out["messages"]), "status": out["status"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
