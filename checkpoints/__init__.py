"""gatedloop.checkpoints."""
