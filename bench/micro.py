"""Micro-benchmarks behind the per-turn proposals in bench/README.md (each isolates one cost).

    .venv/bin/python -m bench.micro [--messages 1600] [--writes 100] [--commits 300]

- `fold`: replaying `--writes` message writes onto a history of `--messages` messages (what every invoke of
  a long thread does when it loads `messages` from its DeltaChannel), with the reducer in nodes/state.py and
  with the one it replaced (add_messages applied write by write, which rebuilds an id index per write).
- `callback`: LangChain's fallback for a callback handler without `on_chat_model_start`: it renders the
  whole history with `get_buffer_string` on every model call.
- `ledger`: one audit `record()` commit on the ledger's connection as it is (synchronous=FULL in WAL mode:
  an fsync per commit) and with synchronous=NORMAL. fsync cost depends on what else the disk is doing.
- `chain` (`--only chain`): the CPU of an approval turn (a message, the pause, the approval, the write, the
  answer) with the evidence chain off (the ledger's writes as before it: no RETURNING, no chain rows), on without
  a key, and on with an Ed25519 key (the head signed at the decision): three threads on fresh files, one turn of
  each in turn, in one process.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage, convert_to_messages
from langchain_core.messages.utils import get_buffer_string
from langgraph.graph.message import add_messages


def history(n: int) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for i in range(n // 4):
        call = {"name": "lookup_order", "args": {"order_id": f"A-{i:05d}"}, "id": f"call-{i}", "type": "tool_call"}
        out += [
            HumanMessage(f"turn {i} [read] please check order A-{i:05d}", id=f"h{i}"),
            AIMessage("", tool_calls=[call], id=f"a{i}"),
            ToolMessage('{"status": "shipped"}', tool_call_id=f"call-{i}", id=f"t{i}"),
            AIMessage(f"Order A-{i:05d} has shipped.", id=f"b{i}"),
        ]
    return out


def fold_per_write(base: list[BaseMessage] | None, writes: list[Any]) -> list[BaseMessage]:
    """The reducer before the fix: add_messages once per write."""
    merged: list[BaseMessage] = list(base or [])
    for write in writes:
        incoming = convert_to_messages(write if isinstance(write, list) else [write])
        for offset, message in enumerate(incoming):
            if message.id is None:
                message.id = f"msg-{len(merged) + offset}"
        merged = add_messages(merged, incoming)  # type: ignore[assignment]
    return merged


def best_of(fn: Any, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times) * 1000


def bench_fold(n: int, k: int) -> dict[str, float]:
    from gatedloop.checkpoints.channels import fold_messages

    base = history(n)
    writes = [[m] for m in history(k * 4)[:k]]
    for i, w in enumerate(writes):
        w[0].id = f"new-{i}"
    current = best_of(lambda: fold_messages(base, writes))
    before = best_of(lambda: fold_per_write(base, writes))
    assert [m.id for m in fold_messages(base, writes)] == [m.id for m in fold_per_write(base, writes)]
    return {"fold_current_ms": round(current, 3), "fold_per_write_ms": round(before, 3)}


def bench_callback(n: int) -> dict[str, float]:
    base = history(n)
    return {"get_buffer_string_ms": round(best_of(lambda: get_buffer_string(base)), 3)}


def bench_ledger(commits: int) -> dict[str, float]:
    from gatedloop.checkpoints.ledger import SqliteLedger

    result = {}
    for label, pragma in (("ledger_record_as_is_ms", None), ("ledger_record_normal_ms", "NORMAL")):
        ledger = SqliteLedger(Path(tempfile.mkdtemp(prefix="gatedloop-micro-")) / "ledger.sqlite")
        if pragma:
            ledger._conn.execute(f"PRAGMA synchronous={pragma}")
        times = []
        for i in range(commits):
            started = time.perf_counter()
            ledger.record("t", f"c{i}", "validated", {"i": i})
            times.append(time.perf_counter() - started)
        ledger.close()
        result[label] = round(statistics.median(times) * 1000, 4)
    return result


def _approval_thread(mode: str, stack: Any) -> Any:
    """One thread on a fresh file with the chain `mode`; returns `turn()`, which runs one approval turn."""
    import types

    from langchain_core.tools import tool

    from gatedloop.checkpoints import open_sqlite
    from gatedloop.checkpoints.chain import Signer
    from gatedloop.graph import CallContext, build_graph, runs
    from gatedloop.graph.scripted import ScriptedChatModel, call, reply
    from gatedloop.tools import ToolPolicy

    @tool
    def refund(order_id: str) -> dict[str, Any]:
        """Refund an order."""
        return {"order_id": order_id, "refunded": True}

    def responder(messages: list[BaseMessage]) -> AIMessage:
        if isinstance(messages[-1], ToolMessage):
            return reply("refunded")
        turn = sum(isinstance(m, HumanMessage) for m in messages)
        return reply(calls=[call("refund", {"order_id": f"A-{turn}"}, f"refund-{turn}")])

    saver = stack.enter_context(open_sqlite(Path(tempfile.mkdtemp(prefix="gatedloop-chain-")) / "runs.sqlite"))
    ledger = saver.ledger
    ledger.signer = Signer.generate() if mode == "signed" else None
    if mode == "off":  # this ledger writes as before the chain: no RETURNING, no chain rows

        def plain_batch(self: Any, statements: Any) -> None:
            def run() -> Any:
                for query, params in statements:
                    yield query, params, False

            if statements:
                self._transaction(run())

        ledger._write = ledger._write_plain
        ledger._run_batch = types.MethodType(plain_batch, ledger)
    graph = build_graph(
        ScriptedChatModel(responder=responder),
        [refund],
        policies={"refund": ToolPolicy(effect="write", approval="always")},
        checkpointer=saver,
    )
    who, reviewer = CallContext("ann", frozenset()), CallContext("rev", frozenset())
    count = [0]

    def turn() -> None:
        count[0] += 1
        runs.start(graph, "t", f"refund order {count[0]}", context=who)
        out = runs.resume(graph, "t", {"decisions": [{"type": "approve"}]}, context=reviewer)
        assert out["status"] == "completed"

    def verified() -> bool:
        return mode == "off" or ledger.verify_chain(ledger.signer and ledger.signer.verifier).ok

    turn.verified = verified  # type: ignore[attr-defined]
    return turn


def bench_chain(turns: int, warmup: int = 10) -> dict[str, float]:
    """Three threads side by side (chain off, hashed, signed), one turn of each in turn (the order rotating), so
    that a slow moment of a loaded machine falls on all three alike; CPU time of this process per turn."""
    from contextlib import ExitStack

    modes = ("off", "hash", "signed")
    spent: dict[str, list[float]] = {mode: [] for mode in modes}
    with ExitStack() as stack:
        threads = {mode: _approval_thread(mode, stack) for mode in modes}
        for index in range(warmup + turns):
            for mode in modes[index % 3 :] + modes[: index % 3]:
                started = time.process_time()
                threads[mode]()
                if index >= warmup:
                    spent[mode].append(time.process_time() - started)
        assert all(thread.verified() for thread in threads.values())
    off = statistics.median(spent["off"])
    result = {f"chain_{mode}_cpu_ms_per_turn": round(statistics.median(v) * 1000, 3) for mode, v in spent.items()}
    for mode in ("hash", "signed"):
        paired = [on - base for on, base in zip(spent[mode], spent["off"], strict=True)]
        result[f"chain_{mode}_overhead_pct"] = round(statistics.median(paired) / off * 100, 2)
    result["turns_per_mode"] = turns
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.micro")
    parser.add_argument("--messages", type=int, default=1600)
    parser.add_argument("--writes", type=int, default=100)
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--turns", type=int, default=200, help="approval turns per chain mode (chain)")
    parser.add_argument("--only", choices=("fold", "callback", "ledger", "chain"), help="one benchmark")
    args = parser.parse_args(argv)
    benches = {
        "fold": lambda: bench_fold(args.messages, args.writes),
        "callback": lambda: bench_callback(args.messages),
        "ledger": lambda: bench_ledger(args.commits),
        "chain": lambda: bench_chain(args.turns),
    }
    results: dict[str, Any] = {"messages": args.messages, "writes": args.writes} if args.only != "chain" else {}
    for name, bench in benches.items():
        if args.only in (None, name):
            results.update(bench())
    for key, value in results.items():
        print(f"{key:28s} {value}")


if __name__ == "__main__":
    main()
