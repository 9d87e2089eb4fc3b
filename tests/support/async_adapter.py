"""An async face for a synchronous checkpointer, so async-only callers (the conformance suite) can drive it.

Each `a<method>` runs `<method>` in a worker thread. Only the methods the wrapped saver's class overrides get
an async twin, so `langgraph-checkpoint-conformance`, which counts a capability as supported when its `a*`
method is overridden, counts exactly what the sync saver implements. Hand-written: LangGraph ships async
savers and sync savers, but no bridge from sync to async.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

ASYNC_TWINS = {
    "put": "aput",
    "put_writes": "aput_writes",
    "get_tuple": "aget_tuple",
    "delete_thread": "adelete_thread",
    "delete_for_runs": "adelete_for_runs",
    "copy_thread": "acopy_thread",
    "prune": "aprune",
}


class _SyncSaverAsAsync(BaseCheckpointSaver):
    def __init__(self, inner: BaseCheckpointSaver):
        super().__init__(serde=inner.serde)
        self.inner = inner

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.inner.get_next_version(current, channel)


def _twin(name: str) -> Callable[..., Any]:
    async def call(self: _SyncSaverAsAsync, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(getattr(self.inner, name), *args, **kwargs)

    call.__name__ = ASYNC_TWINS[name]
    return call


async def _alist(self: _SyncSaverAsAsync, config: Any, **kwargs: Any) -> AsyncIterator[Any]:
    for item in await asyncio.to_thread(lambda: list(self.inner.list(config, **kwargs))):
        yield item


def as_async(saver: BaseCheckpointSaver) -> BaseCheckpointSaver:
    """`saver` behind async methods, one for each sync method its class implements."""
    kind = type(saver)
    methods: dict[str, Any] = {
        ASYNC_TWINS[name]: _twin(name)
        for name in ASYNC_TWINS
        if getattr(kind, name) is not getattr(BaseCheckpointSaver, name)
    }
    if kind.list is not BaseCheckpointSaver.list:
        methods["alist"] = _alist
    adapter = type(f"Async{kind.__name__}", (_SyncSaverAsAsync,), methods)
    return adapter(saver)
