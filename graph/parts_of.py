"""What a compiled gatedloop graph was built from, and its identity (name, tools, policies): what the CLI, the
inbox and a thread's graph check read from a graph they were handed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from weakref import WeakKeyDictionary

from gatedloop.checkpoints.evidence import GraphIdentity
from gatedloop.nodes.build.parts import LoopParts

# What each compiled graph was built from, keyed by its `model` node's runnable: the one object LangGraph's copies
# of a compiled graph (`with_config`, `copy`) share, so a user's graph can be found again and served over another
# saver. Hand-written: a compiled graph has no slot for it (`Pregel.copy` passes every attribute to `__init__`).
_PARTS: WeakKeyDictionary[Any, LoopParts] = WeakKeyDictionary()


def remember_parts(graph: Any, parts: LoopParts) -> None:
    """Record what `graph` (just compiled by `build_graph`) was built from."""
    _PARTS[graph.nodes["model"].bound] = parts


def parts_of(graph: Any) -> LoopParts | None:
    """What `build_graph` built `graph` from (its tools, policies, model, limits), or None for another graph."""
    nodes = getattr(graph, "nodes", None)
    model = nodes.get("model") if isinstance(nodes, Mapping) else None
    return _PARTS.get(model.bound) if model is not None else None


def graph_identity(graph: Any) -> GraphIdentity:
    """A graph's name, a digest of its tools' definitions (name, description, argument schema, annotations:
    `ToolRegistry.definition_digest`) and a digest of their policies (`ToolPolicy.summary`, the default gated
    write for a tool with none): what a thread it made remembers, so that another graph, or this one with other
    tools or other rules (approvers dropped, a quorum lowered, ...), never resumes it unnoticed. An approval
    predicate counts by its qualified name (`gatedloop.tools.policy.described`): code is not digested by value."""
    parts = parts_of(graph)
    if parts is None:
        raise TypeError(f"{type(graph).__name__} is not a graph from gatedloop.graph.build_graph")
    return GraphIdentity(graph.name, *parts.registry.identity_digests())
