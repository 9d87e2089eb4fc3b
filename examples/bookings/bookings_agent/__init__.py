"""An agent of its own (tools, policies, model), served with gatedloop: see ../README.md."""
