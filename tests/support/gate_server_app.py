"""tests/support/gate_app.py's payments graph as `langgraph dev` serves it (tests/test_gate_devserver.py).

Loaded by the dev server from its file path, with this folder on `PYTHONPATH` (for `gate_app` and `sample_app`).
The server supplies the checkpointer (gatedloop's SQLite saver on `GATEDLOOP_DB`); the ledger, with its approval
evidence and audit trail, lives in the same file, and every real payment is a row in `effects.sqlite` beside it.
`pay` needs an approval above 100 and a reviewer with the role `finance`.
"""

from __future__ import annotations

from gate_app import build
from sample_app import Effects

from gatedloop.checkpoints.devserver import studio_db_path
from gatedloop.checkpoints.ledger import SqliteLedger


def make_graph():
    db = studio_db_path()
    return build(None, Effects(db.with_name("effects.sqlite")), ledger=SqliteLedger(db), approvers={"finance"})


graph = make_graph()
