"""gatedloop.tools: tool policies and the conditions they ask on, limits across threads, the whitelist, structured
errors and result shaping."""

from gatedloop.tools.conditions import (
    any_of,
    ask_when,
    counterparty_unknown,
    not_own,
    recipients_outside,
    refuse_when,
    url_outside,
)
from gatedloop.tools.errors import ToolFailure, error_body
from gatedloop.tools.policy import CallContext, ToolPolicy
from gatedloop.tools.registry import ToolRegistry
from gatedloop.tools.usage import UsageLimit

__all__ = [
    "CallContext",
    "ToolFailure",
    "ToolPolicy",
    "ToolRegistry",
    "UsageLimit",
    "any_of",
    "ask_when",
    "counterparty_unknown",
    "error_body",
    "not_own",
    "recipients_outside",
    "refuse_when",
    "url_outside",
]
