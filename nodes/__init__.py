"""gatedloop.nodes: the five nodes of the loop and what they share. Each node is a closure
`(state, runtime) -> partial update` built from `LoopParts` (parts.py) and mutates nothing.

- The nodes: model.py, validate.py, approve.py, execute.py, finalize.py.
- What they share: state.py (the graph's state and the `CallPlan` a call travels in), limits.py (budgets), parts.py
  (the registry, ledger, model and limits every node is built from).
- model's helpers: call_arguments.py (a call's arguments read once, into the plan), finish.py (did the provider
  finish?), streamed_args.py (streamed argument text), proposals.py (what each reply proposed, as evidence),
  open_calls.py (no open call and no foreign answer before the model is asked), answer_format.py (a structured
  final answer).
- approve's helpers: hitl.py (the approval request and answer wire format), identity.py (who is answering).
- execute's helpers: admission.py (may this call run, from the evidence), running.py (running reads and claimed
  writes), tool_env.py (what a tool is run with), unknown.py (writes whose outcome is unknown).
- answers.py: the one place a call's `ToolMessage` is built, recorded and checked against the history.

README "Architecture" follows one call through them.
"""
