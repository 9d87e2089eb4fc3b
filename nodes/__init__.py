"""gatedloop.nodes."""
