"""The thread as a middleware list shows it to the model, kept between requests.

A `before_model` hook may rewrite the thread's start (`SummarizationMiddleware` replaces it with a summary). In
`create_agent` that rewrite replaces the stored thread; here the stored thread is the gate's evidence and stays
whole, and the rewrite is kept as the state's `model_view`, so the next request's hooks start from it as they
would from `create_agent`'s rewritten thread (and a summarizer is not asked again each request).

What the model is shown is gatedloop's alone (invariant 18): a client's `model_view` is dropped as it enters
(graph/gated.py), and a view is used only if the gate finds it recorded for the thread when `model` kept it
(nodes/gate/views.py), since the state can be written by paths that never pass there.
"""

from __future__ import annotations

import logging
from typing import cast

from langchain_core.messages import AnyMessage, BaseMessage

from gatedloop.nodes.state import ModelView

log = logging.getLogger("gatedloop.middleware")

MODEL_VIEW_FIELD = "model_view"


def view_of(stored: list[BaseMessage], view: ModelView | None) -> list[BaseMessage]:
    """What the hooks start from: the kept view's head, then the stored thread after what it stands for."""
    if not view:
        return stored
    if view["through"] is None:
        return [*view["head"], *stored]
    ids = [m.id for m in stored]
    if view["through"] not in ids:  # the thread was rewritten under the view (update_state): start from it whole
        log.warning("the model view stands for message %r, no longer in the thread: not used", view["through"])
        return stored
    return [*view["head"], *stored[ids.index(view["through"]) + 1 :]]


def view_record(stored: list[BaseMessage], shown: list[BaseMessage]) -> ModelView | None:
    """The view to keep after the hooks shaped `shown` from `stored`: the longest run of the stored thread's last
    messages that `shown` ends with, and what comes before it as the head; None when the model is shown the
    stored thread itself (by ids: an in-place edit, such as a redaction, is made again by its hook each time)."""
    kept = 0
    while kept < min(len(stored), len(shown)) and shown[-1 - kept].id == stored[-1 - kept].id:
        kept += 1
    head = shown[: len(shown) - kept]
    if not head and kept == len(stored):
        return None
    through = stored[len(stored) - kept - 1].id if kept < len(stored) else None
    return ModelView(head=cast(list[AnyMessage], head), through=through)
