"""Tutorial step 2, in another process: a reviewer answers the waiting request by the thread id.

ana cannot approve her own refund (she is not in `finance`); bo can. The refund runs once, with exactly the
arguments bo was shown."""

import sys

from agent import REFUNDS, make_graph

from gatedloop.graph import CallContext, InvalidDecision, PendingRequest, open_sqlite, runs
from gatedloop.graph import pending as decide

db, thread_id = sys.argv[1], sys.argv[2]
with open_sqlite(db) as saver:
    graph = make_graph(saver)
    asked = PendingRequest.parse(runs.pending_request(graph, thread_id))
    answer = asked.answer([decide.approve(call) for call in asked.calls])
    try:
        runs.resume(graph, thread_id, answer, context=CallContext(user_id="ana", roles={"support"}))
    except InvalidDecision as refused:
        print(f"ana's approval refused: {refused}")
    out = runs.resume(graph, thread_id, answer, context=CallContext(user_id="bo", roles={"finance"}))
    print(f"status: {out['status']}; answer: {out['answer']}")
    print(f"refunds made: {REFUNDS}")
