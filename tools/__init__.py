"""gatedloop.tools."""
