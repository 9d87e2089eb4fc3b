"""gatedloop.tools: tool policies, the whitelist, structured errors and result shaping."""

from gatedloop.tools.errors import ToolFailure, error_body
from gatedloop.tools.policy import CallContext, ToolPolicy
from gatedloop.tools.registry import ToolRegistry

__all__ = ["CallContext", "ToolFailure", "ToolPolicy", "ToolRegistry", "error_body"]
