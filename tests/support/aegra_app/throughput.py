"""The payments graph with a model that waits `AEGRA_TEST_MODEL_WAIT` seconds per call (default 0), served for
bench/aegra_throughput.py (`aegra_payments.py` beside this folder)."""

from __future__ import annotations

import os

from aegra_payments import MODEL_WAIT_ENV, served_graph

graph = served_graph(model_wait_s=float(os.environ.get(MODEL_WAIT_ENV, "0")), name="throughput")
