"""gatedloop.graph."""
