"""Tutorial step 3: the agent served by `langgraph dev` (this folder's langgraph.json), driven with langgraph-sdk.

    langgraph dev --config examples/tutorial/langgraph.json      # in one terminal
    python examples/tutorial/serve_client.py http://127.0.0.1:2024

Without auth configured, the run's context says who asks and who answers; with gatedloop's auth
(GATEDLOOP_AUTH_FILE), the token does, and the context's identity is ignored."""

import sys
from typing import Any

from langgraph_sdk import get_sync_client

from gatedloop.graph import PendingRequest
from gatedloop.graph import pending as decide

client = get_sync_client(url=sys.argv[1])
thread_id = client.threads.create()["thread_id"]
# dict[str, Any]: langgraph-sdk's JSON types refuse a literal's nested lists, which a type checker would report
ask: dict[str, Any] = {"messages": [{"role": "user", "content": "Please refund order A-1001, it arrived broken"}]}
ana: dict[str, Any] = {"user_id": "ana", "roles": ["support"]}
client.runs.wait(thread_id, "shop", input=ask, context=ana)
[interrupt] = client.threads.get_state(thread_id)["interrupts"]
asked = PendingRequest.parse(interrupt["value"], interrupt["id"])
answer = asked.answer([decide.approve(call) for call in asked.calls])
bo: dict[str, Any] = {"user_id": "bo", "roles": ["finance"]}
out = client.runs.wait(thread_id, "shop", command={"resume": answer}, context=bo)
assert isinstance(out, dict)  # the run's final state (langgraph-sdk's hints allow a list too)
print(f"status: {out['status']}; answer: {out['answer']}")
