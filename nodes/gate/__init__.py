"""The trust boundary: the only code that weighs the graph's state against recorded evidence.

The state is untrusted (a client or `update_state` can write it); the ledger's evidence is not. Everything that
decides whether a call may be asked about, run, or answered lives here, so a review of the gate is a review of
these modules (each function takes what it needs, never the nodes' `LoopParts`, and none runs a tool). The formats
it reads and writes (requests, answers, who sent them, masking) are below it, in nodes/wire/:

- call_arguments.py: a call's arguments read once, into the plan. proposals.py: which calls a model really proposed.
- open_calls.py: no open call and no foreign answer before the model is asked (used by `model`).
- admission.py: may this call run, decided from the evidence, never from the state. turn_evidence.py: a turn's
  evidence read once, and the admission `approve` and `execute` share (and why both admit).
- approvals.py: the approval request built from the evidence, each decision applied as a pure function, and the
  evidence an answer leaves. proposals.py also registers the turn's calls (`register_turn`).
- settling.py: the settle table for a write whose outcome is unknown (recorded, reconciled, rerun, ask).
- outcomes.py: what running a call produced (`Outcome`) and its constructors; running itself is in nodes/run/.
- answers.py: the one place a call's `ToolMessage` is built, recorded and checked against the history.
- views.py: the views of the thread kept for the model, recorded and checked (invariant 18).
"""
