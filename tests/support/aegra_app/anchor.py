"""The anchor of bench/aegra_throughput.py: `create_agent` with `HumanInTheLoopMiddleware`, the tools and the
waiting model of the `throughput` graph (`AEGRA_TEST_MODEL_WAIT` seconds per call, default 0)."""

from __future__ import annotations

import os

from aegra_payments import MODEL_WAIT_ENV, anchor_graph

graph = anchor_graph(model_wait_s=float(os.environ.get(MODEL_WAIT_ENV, "0")))
