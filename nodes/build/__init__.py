"""What the nodes are built from, once, by `build_graph`: the dependency bag (parts.py: registry, ledger, model,
limits, clock, telemetry) and LangChain agent middleware adapted to the loop (middleware.py, imported only when a
graph is built with middleware). The gate never imports this layer; the nodes and the runner do.
"""
