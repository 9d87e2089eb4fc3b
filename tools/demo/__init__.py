"""gatedloop.tools.demo."""
