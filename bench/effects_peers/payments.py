"""What every driver of `bench.effects` shares: the payment, the markers a parent kills on, the arguments.

Standard library only: each driver runs in its own framework's venv and imports this file from its own folder.
A payment is one line appended (O_APPEND, fsync) to `payments.log` in the trial's folder, a file no framework
writes; the parent counts its lines. Markers go to stdout, one per line, flushed:

    ready                 imports done, agent built; waiting for the go file (two resumers start together)
    before_effect <id>    the tool was called; nothing paid yet
    effect <id>           the payment is on disk; the framework has not recorded the tool's result
    hold                  the child stops here for good (--hold before|after): the parent SIGKILLs it
    paused <what>         the run is waiting for a reviewer's answer
    waiting <kind>        the run is waiting for a person for another reason (gatedloop: unknown outcome)
    final <text>          the run ended with the model's answer
    refused <why>         the framework refused the answer or the resume; nothing ran
    busy                  another process runs this thread (gatedloop's lease)
    noop <why>            nothing to do (the run is not waiting for anything)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

LEDGER = "payments.log"
LATENCY_S = 0.05
"""The payment provider's round trip, before the payment lands: the same for every framework."""
AMOUNT, PAYEE = 250.0, "acme"
CALL_ID = "c1"
REQUEST = f"pay {AMOUNT:g} to {PAYEE}"
ANSWER = f"Paid {AMOUNT:g} to {PAYEE}."
APPROVER_ROLE = {"finance": "finance", "treasury": "treasury"}


def mark(*parts: Any) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


def _hold() -> None:
    mark("hold")
    while True:
        time.sleep(3600)


def pay(directory: str, key: str, amount: float, to: str, hold: str) -> dict[str, Any]:
    """The side effect under test: one line per payment, on disk before the tool returns."""
    mark("before_effect", key)
    if hold == "before":
        _hold()
    time.sleep(LATENCY_S)
    fd = os.open(os.path.join(directory, LEDGER), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"paid {key} {amount:g} {to} pid={os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    mark("effect", key)
    if hold == "after":
        _hold()
    return {"ok": True, "payment": key, "amount": amount, "to": to}


def find_payment(directory: str, key: str) -> dict[str, Any] | None:
    """The payment provider's own record of a payment (what a `reconcile` asks), or None."""
    try:
        with open(os.path.join(directory, LEDGER), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        words = line.split()
        if len(words) >= 4 and words[1] == key:
            return {"ok": True, "payment": key, "amount": float(words[2]), "to": words[3]}
    return None


def wait_go(go: str | None) -> None:
    if not go:
        return
    mark("ready")
    while not os.path.exists(go):
        time.sleep(0.002)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True, help="the trial's folder: state files and payments.log")
    parser.add_argument("--action", required=True, choices=["start", "answer", "resume"])
    parser.add_argument("--reviewer", default="bo")
    parser.add_argument("--roles", default="finance", help="the reviewer's roles, comma-separated")
    parser.add_argument("--hold", default="none", choices=["none", "before", "after"])
    parser.add_argument("--go", default=None, help="print 'ready', then wait for this file before acting")
    parser.add_argument("--policy", default="finance", choices=sorted(APPROVER_ROLE), help="who may approve pay")
    parser.add_argument("--reconcile", action="store_true", help="gatedloop: pay's policy has a reconcile")
    parser.add_argument("--upgrade", action="store_true", help="gatedloop: an operator upgrades the thread first")
    return parser.parse_args(argv)


def write_json(path: str, value: Any) -> None:
    """Replace a stored JSON file whole (a crash leaves the old one or the new one; two writers at once, the last)."""
    import json

    scratch = f"{path}.{os.getpid()}.tmp"
    with open(scratch, "w", encoding="utf-8") as f:
        json.dump(value, f)
    os.replace(scratch, path)
