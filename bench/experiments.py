"""Prototypes of proposed gatedloop changes, applied by patching at run time (the source is not edited).

    .venv/bin/python -m bench.experiments [--turns 400] [--kind write] [--variants baseline versions ...]

Each variant runs one thread of `--turns` turns in a fresh process (so patches never leak between
variants) and reports ms/turn (mean over the first 50/200/400 turns), stored bytes, a resume of a paused
approval on a fresh saver in the same process (open + get_state + resume), and a turn of 8 slow reads.
The patches are sketches of the proposals in bench/README.md, to measure their effect before anyone
edits gatedloop; they are not the proposed code itself.
"""

from __future__ import annotations

import argparse
import functools
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Proposals from the profile that are not in gatedloop (the others were adopted: one id index per fold, no
# empty `messages` writes, the ledger at synchronous=NORMAL, a turn-wide task executor, the callback no-op).
VARIANTS: dict[str, str] = {
    "baseline": "gatedloop as it is",
    "snapshot": "DoublingDeltaChannel(fold_messages, snapshot_frequency=1000) (nodes/state.py)",
    "cancel": "clear_cancel deletes only when a cancel row exists (checkpoints/ledger.py, nodes/model.py)",
    "versions": "compact channel versions in GatedSqliteSaver.get_next_version (checkpoints/sqlite.py)",
}
COMBOS = {"proposed": ["cancel", "versions"], "proposed_with_snapshot": ["cancel", "versions", "snapshot"]}


# --- the patches -------------------------------------------------------------------------------------


def _state_module() -> Any:
    """nodes/state.py's annotations are strings (`from __future__ import annotations`): LangGraph evaluates
    `DoublingDeltaChannel(fold_messages)` anew from this module's globals when a graph is built, so the patches
    replace those globals (patching a channel instance from `get_type_hints` would change nothing)."""
    from gatedloop.nodes import state

    return state


def apply(variants: list[str]) -> None:
    from gatedloop.checkpoints import ledger, sqlite

    for name in variants:
        if name == "snapshot":
            state = _state_module()
            state.DoublingDeltaChannel = functools.partial(state.DoublingDeltaChannel, snapshot_frequency=1000)
        elif name == "cancel":
            original_clear = ledger.SqliteLedger.clear_cancel

            def clear(self: Any, thread_id: str, _orig: Any = original_clear) -> None:
                if self.cancel_requested(thread_id):
                    _orig(self, thread_id)

            ledger.SqliteLedger.clear_cancel = clear  # type: ignore[method-assign]
        elif name == "versions":

            def next_version(self: Any, current: Any, channel: Any) -> str:
                """Fresh files only: 8 hex digits, no random suffix (old 50-char versions would compare wrongly)."""
                number = 0 if current is None else int(current) if isinstance(current, int) else int(current, 16)
                return f"{number + 1:08x}"

            for cls in (sqlite.GatedSqliteSaver, sqlite.GatedAsyncSqliteSaver):
                cls.get_next_version = next_version  # type: ignore[method-assign]
        elif name != "baseline":
            raise SystemExit(f"unknown variant {name!r}")


# --- one variant, in its own process ------------------------------------------------------------------


def measure(variants: list[str], turns: int, kind: str) -> dict[str, Any]:
    apply(variants)
    from langgraph.types import Command

    import bench.anchor as anchor
    from gatedloop.graph import build_graph

    anchor.build_graph = build_graph  # the patched one, if any
    from bench.scenarios import APPROVE, check_done, config, run_turn, start_paused, stored_bytes, user_text

    work = Path(tempfile.mkdtemp(prefix="gatedloop-exp-"))
    db = work / "exp.sqlite"
    turn_ms: list[float] = []
    turn_cpu_ms: list[float] = []
    with anchor.open_system("gatedloop", db) as graph:
        for turn in range(1, turns):
            started, cpu = time.perf_counter(), time.process_time()
            run_turn("gatedloop", graph, "x", turn, kind)  # type: ignore[arg-type]
            turn_ms.append((time.perf_counter() - started) * 1000)
            turn_cpu_ms.append((time.process_time() - cpu) * 1000)
        start_paused("gatedloop", graph, "x", turns)
    stored = stored_bytes(db)
    copy = work / "copy.sqlite"
    with sqlite3.connect(str(db)) as source, sqlite3.connect(str(copy)) as target:
        source.backup(target)
    started = time.perf_counter()
    with anchor.open_system("gatedloop", copy) as graph:
        snapshot = graph.get_state(config("x"))
        assert snapshot.interrupts, "not paused"
        out = graph.invoke(Command(resume=APPROVE), config("x"), durability="sync")
        check_done("gatedloop", out, turns)
    resume_ms = (time.perf_counter() - started) * 1000
    with anchor.open_system("gatedloop", work / "reads.sqlite") as graph:
        run_turn("gatedloop", graph, "r", 1, "read")
        reads = []
        for turn in range(2, 5):
            started = time.perf_counter()
            out = graph.invoke({"messages": [("user", user_text(turn, "slow8"))]}, config("r"), durability="sync")
            check_done("gatedloop", out, turn)
            reads.append((time.perf_counter() - started) * 1000)
    marks = [n for n in (50, 200, 400) if n < turns] + [turns - 1]
    return {
        "variants": variants,
        "turns": turns,
        "kind": kind,
        "mean_ms_per_turn": {str(n): round(sum(turn_ms[:n]) / n, 2) for n in marks},
        "cpu_mean_ms_per_turn": {str(n): round(sum(turn_cpu_ms[:n]) / n, 2) for n in marks},
        "last25_ms_per_turn": round(sum(turn_ms[-25:]) / len(turn_ms[-25:]), 2),
        "blob_bytes": stored.blob_bytes,
        "file_bytes": stored.file_bytes,
        "checkpoint_rows": stored.checkpoints,
        "write_rows": stored.writes,
        "resume_ms_in_process": round(resume_ms, 1),
        "slow8_turn_ms": round(sorted(reads)[1], 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments")
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--kind", choices=("read", "write"), default="write")
    parser.add_argument("--variants", nargs="*", default=["baseline", *list(VARIANTS)[1:], *COMBOS])
    parser.add_argument("--out", default=str(ROOT / "bench" / "out"))
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(measure(args.child, args.turns, args.kind)))
        return
    results = []
    for variant in args.variants:
        patches = COMBOS.get(variant, [variant])
        started = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.experiments",
                "--turns",
                str(args.turns),
                "--kind",
                args.kind,
                "--child",
                *patches,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            print(f"{variant}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
            continue
        result = {"variant": variant, **json.loads(done.stdout.strip().splitlines()[-1])}
        results.append(result)
        print(f"{variant:12s} {time.perf_counter() - started:6.1f}s {json.dumps(result)}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"experiments-{args.kind}-{args.turns}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
