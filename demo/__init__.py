"""gatedloop.demo: the offline demo built on the core — the scripted model that plays the source articles'
scenarios, their tools and data store, and the graph `langgraph dev` serves to Studio. Nothing in the core imports
it; the CLI and the Studio entry do."""

from gatedloop.demo.calculator import safe_eval
from gatedloop.demo.model import DEMO_QUESTIONS, choose_model, demo_model
from gatedloop.demo.store import DemoStore
from gatedloop.demo.tools import build_demo_tools, demo_policies

__all__ = [
    "DEMO_QUESTIONS",
    "DemoStore",
    "build_demo_tools",
    "choose_model",
    "demo_model",
    "demo_policies",
    "safe_eval",
]
