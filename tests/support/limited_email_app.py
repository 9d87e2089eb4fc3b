"""grants_app's agent with `email` approved by a person (finance) and limited to one per requester per hour, a
person deciding past it: a second email a reviewer approves is sent back to a person at its claim. For the tests of
decisions after a send-back (tests/test_limits.py).

`graph` (no checkpointer; effects to `$GRANTS_EFFECTS`, or a throwaway file) is what `--graph limited_email_app:graph`
loads; `build(saver, effects)` is the same graph on a saver.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from grants_app import FINANCE, POLICIES, make_tools, responder
from sample_app import Effects

from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel
from gatedloop.tools import ToolPolicy
from gatedloop.tools.usage import HOUR, UsageLimit


def build(saver: Any, effects: Effects, required: int = 1) -> Any:
    """`required`: how many finance reviewers approve an email."""
    email = ToolPolicy(
        effect="write",
        approvers=FINANCE,
        approvals_required=required,
        limits=[UsageLimit(at_most=1, window_s=HOUR, per="requester")],
    )
    model = ScriptedChatModel(responder=responder)
    return build_graph(model, make_tools(effects), policies={**POLICIES, "email": email}, checkpointer=saver)


def __getattr__(name: str) -> Any:
    """`graph`, built when the CLI asks for it."""
    if name != "graph":
        raise AttributeError(name)
    return build(None, Effects(os.environ.get("GRANTS_EFFECTS") or Path(tempfile.mkdtemp()) / "effects.sqlite"))
