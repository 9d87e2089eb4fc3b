"""Loaded by the `langgraph dev` servers the tests start (tests/support/devserver.py puts this folder on their
PYTHONPATH): the in-memory run queue looks for a new run every 0.5 s when it is idle, and the tests wait on that
for every run they create; here it looks every 0.05 s. Which runs are taken, and in what order, is unchanged."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

TARGET = "langgraph_runtime_inmem.ops"
IDLE_POLL_S = 0.05


def _patch(ops: Any) -> None:
    import asyncio

    original = ops.Runs.next

    async def next_run(wait: bool, limit: int = 1) -> Any:
        if wait:
            await asyncio.sleep(IDLE_POLL_S)
        async for item in original(False, limit):
            yield item

    ops.Runs.next = staticmethod(next_run)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # once: the module is imported once
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            original_exec(module)
            _patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _Finder())
