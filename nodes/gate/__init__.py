"""The trust boundary: the only code that weighs the graph's state against recorded evidence.

The state is untrusted (a client or `update_state` can write it); the ledger's evidence is not. Everything that
decides whether a call may be asked about, run, or answered lives here, so a review of the gate is a review of
these modules:

- call_arguments.py: a call's arguments read once, into the plan. proposals.py: which calls a model really proposed.
- open_calls.py: no open call and no foreign answer before the model is asked (used by `model`).
- hitl.py: the approval request and answer wire format. identity.py: who is calling (the one rule for who acts).
- admission.py: may this call run, decided from the evidence, never from the state.
- outcomes.py: what running a call produced (`Outcome`) and its constructors; running itself is in nodes/run/.
- answers.py: the one place a call's `ToolMessage` is built, recorded and checked against the history.
"""
