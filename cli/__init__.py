"""gatedloop.cli."""
