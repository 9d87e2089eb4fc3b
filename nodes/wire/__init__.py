"""What crosses the trust boundary, checked but not decided on: the layer below the gate (nodes/gate/), which
holds the decisions only. Nothing here reads the ledger or weighs evidence.

- hitl.py: the approval request and answer wire format, and its checks (an answer well-formed and addressed).
- resume.py: a resume value read strictly (its depth and size) before any decision is checked.
- senders.py: the sender bound to an answer as it entered, read back where the answer is judged.
- identity.py: who is calling, as stored with a request or an answer (the one rule for who acts).
- masking.py: secret arguments masked wherever a call is shown (requests, cards, notices, titles).
- model_view.py: the model's kept view of a long thread, as the state stores it.
"""
