"""gatedloop.graph: build the gated loop, its limits, its state and the model it talks to."""

from gatedloop.graph.build import build_graph
from gatedloop.graph.limits import Limits
from gatedloop.graph.state import STATUSES, GatedState

__all__ = ["STATUSES", "GatedState", "Limits", "build_graph"]
