"""The bookings example's two graphs (`examples/bookings`, whose folder `aegra.json` lists in `dependencies`, so
`bookings_agent` imports), as Aegra names graphs: by file, `./bookings.py:tables`. Compiled without a checkpointer
or `ledger=`, like the demo (`./demo.py`): the ledger lives in the database of the saver Aegra gives each run."""

from __future__ import annotations

from bookings_agent.graphs import rooms, tables

import gatedloop.graph.aegra_auth  # noqa: F401  (a bad auth configuration fails the start: see demo.py)

__all__ = ["rooms", "tables"]
