"""Policies for MCP tools (`langchain-mcp-adapters`) from their annotations, failing closed.

An MCP server annotates each tool with hints (`readOnlyHint`, `destructiveHint`, `idempotentHint`,
`openWorldHint`; the adapter puts them in `tool.metadata`). The MCP specification says clients must not trust
them from an untrusted server, so:

- `trusted=False` (the default): every MCP tool is a write that needs approval, whatever it says of itself;
- `trusted=True`: `readOnlyHint: true` makes a read that runs without approval; anything else is a write that
  needs approval.

Either way the hints and the server's name are shown to the reviewer with every request for the tool
(`ToolPolicy.review_note`). An explicit policy always wins: merge as `{**mcp_policies(tools), **yours}`. A tool's
definition (description, schema, annotations) is pinned by the call that was validated (see
`gatedloop.tools.registry.definition_digest`), so a server that changes a tool after approval is not obeyed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.tools import BaseTool

from gatedloop.tools.policy import ToolPolicy

HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
HINT_WORDS = {
    "readOnlyHint": "read-only",
    "destructiveHint": "destructive",
    "idempotentHint": "idempotent",
    "openWorldHint": "open world",
}


def mcp_policies(
    tools: Sequence[BaseTool], trusted: bool = False, *, server: str | None = None
) -> dict[str, ToolPolicy]:
    """A `ToolPolicy` per tool of an MCP server (`MultiServerMCPClient(...).get_tools(server_name=...)`), from its
    annotations: fail closed unless the server is `trusted`. `server` names the server to the reviewer."""
    policies: dict[str, ToolPolicy] = {}
    for tool in tools:
        hints = annotations_of(tool)
        read_only = trusted and hints.get("readOnlyHint") is True
        note = review_note(hints, server, trusted)
        if read_only:
            policies[tool.name] = ToolPolicy(effect="read", approval="never", review_note=note)
        else:
            policies[tool.name] = ToolPolicy(effect="write", approval="always", review_note=note)
    return policies


def annotations_of(tool: BaseTool) -> dict[str, Any]:
    """The MCP hints the adapter copied into the tool's metadata (missing ones are absent)."""
    metadata: Mapping[str, Any] = tool.metadata or {}
    return {hint: metadata[hint] for hint in HINTS if metadata.get(hint) is not None}


def review_note(hints: Mapping[str, Any], server: str | None, trusted: bool) -> str:
    """What the reviewer reads about where the tool comes from and what it says of itself."""
    said = [HINT_WORDS[h] if value else f"not {HINT_WORDS[h]}" for h, value in hints.items()]
    source = f"MCP server {server!r}" if server else "an MCP server"
    trust = "trusted" if trusted else "not trusted: its hints are not believed"
    return f"From {source} ({trust}); it says it is: {', '.join(said) or 'nothing'}"
