"""The views of the thread gatedloop kept for the model (`GatedState.model_view`), as evidence: invariant 18.

A view is what the model is sent in place of the thread's start (a middleware's summary), so a forged one would put
words, calls and answers in front of the model that nobody said. The state cannot tell who wrote it, so `model`
records a digest of each view it keeps, in the ledger (an audit event of the thread, before the state stores the
view), and a view is shown only if its digest is recorded for this thread. Any other (written through a path that
does not strip it, or kept for another thread) is ignored with a warning: the model gets the thread itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

from langchain_core.messages import BaseMessage, messages_to_dict

from gatedloop.checkpoints.ledger import Audit
from gatedloop.nodes.state import ModelView
from gatedloop.tools.arguments import digest

log = logging.getLogger("gatedloop.middleware")

KEPT_EVENT = "model_view_kept"
"""The audit event of a kept view, `model_view_kept:<digest>`, recorded for the thread (no call id)."""


def keep_view(ledger: Audit, thread_id: str, view: ModelView) -> None:
    """Record that gatedloop kept `view` for this thread; called before the state stores it."""
    ledger.record(thread_id, "", _kept_event(view), {"through": view["through"], "head": len(view["head"])})


def kept_view(ledger: Audit, thread_id: str, view: Any) -> ModelView | None:
    """The state's view if gatedloop kept it for this thread; else None (and a warning)."""
    if not view:
        return None
    if _well_formed(view) and ledger.has_event(thread_id, "", _kept_event(view)):
        return cast(ModelView, view)
    log.warning("thread %s: the state's model view is not a view gatedloop kept for this thread: not used", thread_id)
    return None


def _kept_event(view: ModelView) -> str:
    return f"{KEPT_EVENT}:{digest({'head': messages_to_dict(view['head']), 'through': view['through']})}"


def _well_formed(view: Any) -> bool:
    """A `ModelView` in shape, as a write from outside may not be (a dict from JSON, a missing key), so its digest
    can be taken."""
    if not isinstance(view, Mapping) or set(view) != {"head", "through"}:
        return False
    head, through = view["head"], view["through"]
    return isinstance(head, list) and all(isinstance(m, BaseMessage) for m in head) and isinstance(through, str | None)
