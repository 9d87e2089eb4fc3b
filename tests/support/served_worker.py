"""One worker of a served graph, as Aegra and LangGraph Platform run one: the graph compiled without a checkpointer
(gate_app's payments app, built without `ledger=`), given LangGraph's own `AsyncPostgresSaver` for this run.

    python served_worker.py URL THREAD ask|approve EFFECTS_FILE

Prints one JSON line: the run's status and the kind of request it waits on (None when it does not)."""

from __future__ import annotations

import asyncio
import json
import sys

from gate_app import build
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.types import Command
from sample_app import Effects

ANA = {"user_id": "ana", "roles": ["staff"]}
BO = {"user_id": "bo", "roles": ["finance"]}


async def main(url: str, thread_id: str, action: str, effects: str) -> None:
    graph = build(None, Effects(effects), approval="always", approvers={"finance"})
    async with AsyncPostgresSaver.from_conn_string(url) as saver:
        await saver.setup()
        served = graph.copy(update={"checkpointer": saver})  # as the server gives a run its checkpointer
        config = {"configurable": {"thread_id": thread_id}}
        if action == "ask":
            out = await served.ainvoke({"messages": [("user", "pay 500 to bo as c1")]}, config, context=ANA)
        else:
            out = await served.ainvoke(Command(resume={"decisions": [{"type": "approve"}]}), config, context=BO)
    waiting = out.get("__interrupt__")
    print(json.dumps({"status": out.get("status"), "waits_on": waiting[0].value.get("kind") if waiting else None}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
