"""Naming a graph the way `langgraph.json` does: `MODULE:ATTR` or `path/to/file.py:ATTR`, or the name of one of the
graphs of the `langgraph.json` in the working folder.

ATTR is a graph from `build_graph` compiled without a checkpointer (the CLI and the inbox attach their own), or a
factory returning one: called with no arguments, with an empty config, or with a config and no server runtime,
whichever it takes; it may be `async`. These are the forms `langgraph dev` serves.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langgraph.graph.state import CompiledStateGraph

from gatedloop.graph.parts_of import parts_of

GRAPH_ENV = "GATEDLOOP_GRAPH"
DEMO = "demo"
"""`--graph demo`: the built-in demo, even where a langgraph.json names other graphs."""
MANIFEST = "langgraph.json"


class GraphNotFound(ValueError):
    """The graph a reference names cannot be loaded, or is not a gatedloop graph; the message says why."""


@dataclass(frozen=True)
class NamedGraph:
    reference: str  # as given: MODULE:ATTR, path.py:ATTR, or a langgraph.json graph name
    graph: CompiledStateGraph


def choose_graph(given: str | None, environ: dict[str, str], folder: Path) -> NamedGraph | None:
    """The graph the user named: `given` (a `--graph`), else `GATEDLOOP_GRAPH`, else the one graph of the
    `langgraph.json` in `folder`. None for the demo: when nothing names a graph, or the name is `demo`."""
    reference = given or environ.get(GRAPH_ENV) or None
    manifest = _manifest_graphs(folder)
    if reference == DEMO and DEMO not in manifest:
        return None
    if reference is None:
        if not manifest:
            return None
        if len(manifest) > 1:
            raise GraphNotFound(
                f"{folder / MANIFEST} names several graphs ({', '.join(sorted(manifest))}); pick one with --graph NAME"
            )
        [reference] = manifest
    if ":" not in reference:
        if reference not in manifest:
            where = (
                f"the graphs of {folder / MANIFEST}: {', '.join(sorted(manifest))}" if manifest else "no " + MANIFEST
            )
            raise GraphNotFound(f"--graph {reference!r} is neither MODULE:ATTR nor one of {where}")
        return NamedGraph(reference, load_graph(manifest[reference], folder))
    return NamedGraph(reference, load_graph(reference, folder))


def load_graph(reference: str, folder: Path) -> CompiledStateGraph:
    """The gatedloop graph `reference` (MODULE:ATTR or path.py:ATTR, a path relative to `folder`) names."""
    target, _, attr = reference.rpartition(":")
    if not target or not attr:
        raise GraphNotFound(f"{reference!r} must be MODULE:ATTR or path/to/file.py:ATTR")
    module = _import(target, folder)
    if not hasattr(module, attr):
        raise GraphNotFound(f"{target} has no attribute {attr!r}")
    found = _built(getattr(module, attr), reference)
    if not isinstance(found, CompiledStateGraph) or parts_of(found) is None:
        raise GraphNotFound(
            f"{reference} is a {type(found).__name__}, not a graph from gatedloop.graph.build_graph "
            "(or a factory of one)"
        )
    if found.checkpointer is not None:
        raise GraphNotFound(
            f"{reference} was compiled with a checkpointer; build it without one (as langgraph.json needs): "
            "the CLI attaches the --db database"
        )
    return found


def _manifest_graphs(folder: Path) -> dict[str, str]:
    path = folder / MANIFEST
    if not path.is_file():
        return {}
    try:
        graphs = json.loads(path.read_text()).get("graphs") or {}
    except (ValueError, AttributeError) as exc:
        raise GraphNotFound(f"{path} is not a valid langgraph.json: {exc}") from exc
    return {name: spec if isinstance(spec, str) else str(spec.get("path", "")) for name, spec in graphs.items()}


def _import(target: str, folder: Path) -> Any:
    """A module by dotted name (the folder is importable, as under `langgraph dev`) or by file path."""
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    try:
        if target.endswith(".py"):
            path = (folder / target).resolve()
            if not path.is_file():
                raise GraphNotFound(f"no file {path}")
            # Named by its path too: two served files called graphs.py must not be one module.
            name = f"gatedloop_user_graph_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise GraphNotFound(f"cannot import {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            return module
        return importlib.import_module(target)
    except GraphNotFound:
        raise
    except Exception as exc:  # the user's module failed to import: say which, and why
        raise GraphNotFound(f"cannot import {target}: {type(exc).__name__}: {exc}") from exc


def _built(found: Any, reference: str) -> Any:
    """A factory's graph (a compiled graph is returned as it is)."""
    if isinstance(found, CompiledStateGraph) or not callable(found):
        return found
    required = [
        p
        for p in inspect.signature(found).parameters.values()
        if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    arguments: list[Any] = [{"configurable": {}}, None][: len(required)]
    if len(required) > len(arguments):
        raise GraphNotFound(f"{reference} is a factory with {len(required)} parameters; it may take (config, runtime)")
    try:
        made = found(*arguments)
        return asyncio.run(made) if inspect.iscoroutine(made) else made
    except Exception as exc:
        raise GraphNotFound(f"{reference}: the factory failed: {type(exc).__name__}: {exc}") from exc
