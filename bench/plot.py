"""Stored checkpoint bytes per turn vs turns, and bytes/ms per step of one long request, from results.json.

.venv/bin/python -m bench.plot [bench/out/results.json] [bench/out/stored_bytes.png]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

STYLE = {"gatedloop": "tab:blue", "anchor": "tab:red"}
MODES = {"read": ("no approval", "-"), "write": ("approval every turn", "--")}


def plot(results: dict[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = results["storage_curve"]
    fig, (per_turn, total) = plt.subplots(1, 2, figsize=(12, 4.8))
    for system, by_kind in curves.items():
        for kind, points in by_kind.items():
            label, dash = MODES.get(kind, (kind, ":"))
            turns = [p["turn"] for p in points]
            per_turn.plot(
                turns,
                [p["blob_bytes"] / p["turn"] / 1024 for p in points],
                dash,
                color=STYLE.get(system),
                marker="o",
                markersize=3,
                label=f"{system}, {label}",
            )
            total.plot(
                turns,
                [p["file_bytes"] / 2**20 for p in points],
                dash,
                color=STYLE.get(system),
                marker="o",
                markersize=3,
                label=f"{system}, {label}",
            )
    per_turn.set(
        title="Stored checkpoint bytes per turn", xlabel="turns in the thread", ylabel="KB per turn", yscale="log"
    )
    total.set(title="SQLite file size (after WAL checkpoint)", xlabel="turns in the thread", ylabel="MB", yscale="log")
    for axis in (per_turn, total):
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    meta = results.get("meta", {})
    fig.suptitle(f"gatedloop vs create_agent + HumanInTheLoopMiddleware ({meta.get('command', '')})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_request(results: dict[str, Any], path: str | Path) -> None:
    """One long request: bytes and ms each step adds, against how many tool rounds came before it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (per_step, ms) = plt.subplots(1, 2, figsize=(12, 4.8))
    for system, summary in results["request"].items():
        points = summary["curve"]
        rounds = [p["round"] for p in points]
        style = {"color": STYLE.get(system), "marker": "o", "markersize": 3}
        per_step.plot(rounds, [p["window_bytes_per_step"] / 1024 for p in points], "-", label=system, **style)
        per_step.plot(
            rounds, [p["mean_bytes_per_step"] / 1024 for p in points], ":", label=f"{system}, mean so far", **style
        )
        ms.plot(rounds, [p["window_ms_per_step"] for p in points], "-", label=system, **style)
        ms.plot(rounds, [p["mean_ms_per_step"] for p in points], ":", label=f"{system}, mean so far", **style)
    every = next(iter(results["request"].values()))["sample_every"]
    per_step.set(
        title=f"Stored bytes per step (each point: the last {every} steps)",
        xlabel="tool rounds in the request",
        ylabel="KB per step",
        yscale="log",
    )
    ms.set(
        title=f"Time per step (each point: the last {every} steps)", xlabel="tool rounds in the request", ylabel="ms"
    )
    for axis in (per_step, ms):
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    meta = results.get("meta", {})
    fig.suptitle(f"One request, many tool rounds: gatedloop vs create_agent ({meta.get('command', '')})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    source = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/out/results.json")
    target = Path(sys.argv[2] if len(sys.argv) > 2 else source.with_name("stored_bytes.png"))
    results = json.loads(source.read_text())
    if "storage_curve" in results:
        plot(results, target)
        print(target)
    if "request" in results:
        plot_request(results, target.with_name("long_request.png"))
        print(target.with_name("long_request.png"))


if __name__ == "__main__":
    main()
