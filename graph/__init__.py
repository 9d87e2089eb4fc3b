"""gatedloop.graph: build the gated loop, its limits, its state and the model it talks to."""

from gatedloop.graph.build import build_graph
from gatedloop.nodes.limits import Limits
from gatedloop.nodes.state import STATUSES, GatedState

__all__ = ["STATUSES", "GatedState", "Limits", "build_graph"]
