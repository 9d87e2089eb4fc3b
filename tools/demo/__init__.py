"""gatedloop.tools.demo."""

from .calculator import safe_eval
from .store import DemoStore
from .tools import build_demo_tools, demo_policies

__all__ = ["DemoStore", "build_demo_tools", "demo_policies", "safe_eval"]
