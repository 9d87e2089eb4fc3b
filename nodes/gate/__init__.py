"""The trust boundary: the only code that weighs the graph's state against recorded evidence.

The state is untrusted (a client or `update_state` can write it); the ledger's evidence is not. Everything that
decides whether a call may be asked about, run, or answered lives here, so a review of the gate is a review of
these modules:

- parts.py: what the nodes and the gate are built from (registry, ledger, model, limits, clock).
- call_arguments.py: a call's arguments read once, into the plan. proposals.py: which calls a model really proposed.
- open_calls.py: no open call and no foreign answer before the model is asked (used by `model`).
- hitl.py: the approval request and answer wire format. identity.py: who is calling (the one rule for who acts).
- admission.py: may this call run, decided from the evidence, never from the state.
- running.py: running reads and claimed writes. tool_env.py: what a tool is run with. masked_trace.py: a tool with
  secret arguments, traced masked.
- unknown.py: writes whose outcome is unknown (settle them, or ask a person).
- notices.py: the notification outbox rows for requests a person must answer (approvals, unknown outcomes).
- answers.py: the one place a call's `ToolMessage` is built, recorded and checked against the history.
"""
