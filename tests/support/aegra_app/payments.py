"""The graph tests/test_aegra.py serves with two `aegra serve` processes (`aegra_payments.py` beside this folder)."""

from __future__ import annotations

from aegra_payments import served_graph

graph = served_graph()
