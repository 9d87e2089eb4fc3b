"""The approval inbox: a server-rendered web page where reviewers see every request they may decide, and decide it.

Served two ways from the same Starlette app (`create_app`): standalone by `gatedloop inbox --db ...`, and inside
LangGraph Server / `langgraph dev` as a custom route (`http.app` in `langgraph.json` names
`gatedloop.inbox.server:app`). Answers go through `gatedloop.graph.runs.resume` with the reviewer's `CallContext`,
the same checked path as the CLI. A user interface above the graph and the demo, below the CLI: it imports the
graph and its wording (`gatedloop.graph.display`); the CLI's `inbox` command imports it, never the reverse.
"""

from gatedloop.inbox.app import InboxBackend, create_app

__all__ = ["InboxBackend", "create_app"]
