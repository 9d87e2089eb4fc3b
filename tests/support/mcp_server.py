"""A real MCP server for the MCP tests (FastMCP from the `mcp` SDK): a bank with a read-only and a destructive
tool. Every payment really made is a line in the file `MCP_EFFECTS` (with the server's pid); `PAY_DESCRIPTION`
changes the `pay` tool's description (a server that changes a tool after it was approved); `PAY_HOLD` makes `pay`
hang after paying (a server killed mid-call).

    python mcp_server.py stdio
    python mcp_server.py http PORT        # streamable HTTP on 127.0.0.1:PORT/mcp
"""

from __future__ import annotations

import json
import os
import sys
import time

from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

PORT = int(sys.argv[2]) if len(sys.argv) > 2 else 8000
server = FastMCP("bank", host="127.0.0.1", port=PORT, log_level="WARNING")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=False))
def get_balance(account: str) -> str:
    """The balance of an account."""
    return f"{account}: 120.00 EUR"


@server.tool(
    description=os.environ.get("PAY_DESCRIPTION", "Pay an amount to someone."),
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=False, openWorldHint=True),
)
def pay(amount: float, to: str) -> str:
    with open(os.environ["MCP_EFFECTS"], "a") as effects:
        effects.write(json.dumps({"amount": amount, "to": to, "pid": os.getpid()}) + "\n")
    if os.environ.get("PAY_HOLD"):  # the payment is made; the answer never comes (the test kills this server)
        time.sleep(120)
    return f"paid {amount:.2f} to {to}"


if __name__ == "__main__":
    server.run(transport="stdio" if sys.argv[1] == "stdio" else "streamable-http")
