"""gatedloop.nodes: the five nodes of the loop, the state they share, and the budgets that end it.

Each node is a closure `(state, runtime) -> partial update` built from `LoopParts` and mutates nothing: it reads
the state, asks the gate, and returns the update.

- The nodes: model.py, validate.py, approve.py, execute.py, finalize.py.
- state.py: the graph's state and the `CallPlan` a call travels in. limits.py: the budgets, each with its stop status.
- gate/: the trust boundary, the only code that weighs the state against recorded evidence (see its docstring).
- provider/: adapting to what providers send (finish words, streamed argument text, structured final answers).

README "Architecture" follows one call through them.
"""
