"""gatedloop.nodes: the five nodes of the loop, the state they share, and the budgets that end it.

Each node is a closure `(state, runtime) -> partial update` built from `LoopParts` and mutates nothing: it reads
the state, asks the gate, and returns the update.

- The nodes: model.py, validate.py, approve.py, execute.py, finalize.py.
- state.py: the graph's state and the `CallPlan` a call travels in. limits.py: the budgets, each with its stop status.
- build/: what the nodes are built from (`LoopParts`: registry, ledger, model, limits, clock, middleware).
- gate/: the trust boundary, the only code that weighs the state against recorded evidence (see its docstring);
  its functions take what they need, never `LoopParts`, and run no tool. Decisions only.
- wire/: below the gate, what crosses it: request and answer formats, senders, identity, masking, the model's view.
- run/: beside the gate, running tools and the I/O around them (the settle question, the notification outbox).
- provider/: adapting to what providers send (finish words, streamed argument text, structured final answers).

docs/architecture.md draws these layers ("Inside nodes/") and follows one call through them.
"""
