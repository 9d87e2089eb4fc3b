"""Tutorial step 1: ask the agent; it reads on its own and stops at the refund, waiting for a person."""

import sys

from agent import make_graph

from gatedloop.graph import CallContext, PendingRequest, open_sqlite, runs

db, thread_id = sys.argv[1], sys.argv[2]
with open_sqlite(db) as saver:  # one SQLite file: checkpoints and gatedloop's ledger
    graph = make_graph(saver)
    ana = CallContext(user_id="ana", roles={"support"})  # who asks: bound to her message as it enters
    out = runs.start(graph, thread_id, "Please refund order A-1001, it arrived broken", context=ana)
    asked = PendingRequest.parse(out["__interrupt__"][0].value)
    for pending in asked.calls:
        print(f"waiting: {pending.name} {pending.args} (approvers: {pending.approvers})")
        print(f"if approved, it {pending.preview}")
    print(f"request {asked.request_id}, thread {thread_id}: paused")
