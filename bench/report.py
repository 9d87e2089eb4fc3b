"""Ratios, the issue's targets (pass/miss), and the Markdown table, from the results dict of `bench.run`."""

from __future__ import annotations

from typing import Any


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def judge(plan: Any, results: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """gatedloop/anchor ratios for every paired figure, and each target as measured / threshold / pass."""
    lo, hi = str(min(plan.lengths)), str(max(plan.lengths))
    r_lo, r_hi = (str(n) for n in plan.resume_lengths)
    ratios: dict[str, Any] = {}
    targets: list[dict[str, Any]] = []

    def target(name: str, value: float | None, threshold: float, unit: str = "", at_least: bool = False) -> None:
        passed = value is not None and (value >= threshold if at_least else value <= threshold)
        shown: Any = f">= {threshold}" if at_least else threshold
        targets.append({"target": name, "value": value, "threshold": shown, "unit": unit, "pass": passed})

    request = results.get("request")
    if request:
        g, a = request["gatedloop"], request["anchor"]
        rounds = g["rounds"]
        g_end, a_end = g["curve"][-1], a["curve"][-1]
        early = next((p for p in g["curve"] if p["round"] >= rounds // 8), g["curve"][0])
        ratios["request_blob_bytes"] = _ratio(g_end["blob_bytes"], a_end["blob_bytes"])
        ratios["request_ms_per_step"] = _ratio(g["total_s"], a["total_s"])
        target(
            f"one request, {rounds} tool rounds: stored bytes <= 1/20 of the anchor", ratios["request_blob_bytes"], 0.05
        )
        target(
            f"one request: bytes per step at {rounds} <= 1.5x at {early['round']} (mean so far, snapshots included)",
            _ratio(g_end["mean_bytes_per_step"], early["mean_bytes_per_step"]),
            1.5,
        )
        target(f"one request, {rounds} tool rounds: ms per step <= 0.5x the anchor", ratios["request_ms_per_step"], 0.5)

    storage = results.get("storage")
    if storage:
        for kind in storage["gatedloop"]:
            for n in storage["gatedloop"][kind]:
                g, a = storage["gatedloop"][kind][n], storage["anchor"][kind][n]
                ratios[f"blob_bytes/{kind}/{n}"] = _ratio(g["blob_bytes"], a["blob_bytes"])
                ratios[f"file_bytes/{kind}/{n}"] = _ratio(g["file_bytes"], a["file_bytes"])
        for kind, label in (("read", "no approvals"), ("write", "approval every turn")):
            target(
                f"stored checkpoint bytes at {hi} turns <= 1/20 of anchor ({label}; gatedloop/anchor)",
                ratios[f"blob_bytes/{kind}/{hi}"],
                0.05,
            )
            target(
                f"SQLite file size at {hi} turns <= 1/20 of anchor ({label}; gatedloop/anchor)",
                ratios[f"file_bytes/{kind}/{hi}"],
                0.05,
            )
            g = storage["gatedloop"][kind]
            target(
                f"gatedloop stored bytes/turn at {hi} <= 2x at {lo} ({label}; {hi}/{lo})",
                _ratio(g[hi]["blob_bytes_per_turn"], g[lo]["blob_bytes_per_turn"]),
                2.0,
            )
    timing = results.get("time")
    if timing:
        for kind in timing["gatedloop"]:
            for n in timing["gatedloop"][kind]:
                g, a = timing["gatedloop"][kind][n], timing["anchor"][kind][n]
                ratios[f"ms_per_turn/{kind}/{n}"] = _ratio(g["mean_ms_per_turn"], a["mean_ms_per_turn"])
                ratios[f"window_ms_per_turn/{kind}/{n}"] = _ratio(g["window_ms_per_turn"], a["window_ms_per_turn"])
                ratios[f"cpu_ms_per_turn/{kind}/{n}"] = _ratio(g["cpu_mean_ms_per_turn"], a["cpu_mean_ms_per_turn"])
        if "read" in timing["gatedloop"]:
            g = timing["gatedloop"]["read"]
            target(
                f"{hi}-turn thread: ms/turn around turn {hi} <= 2x around turn {lo} (gatedloop, one read per turn)",
                _ratio(g[hi]["window_ms_per_turn"], g[lo]["window_ms_per_turn"]),
                2.0,
            )
            target(
                f"{hi}-turn thread: ms/turn around turn {hi} <= 0.5x the anchor's",
                ratios[f"window_ms_per_turn/read/{hi}"],
                0.5,
            )
        if "write" in timing["gatedloop"]:
            lengths = "/".join(timing["gatedloop"]["write"])
            worst = max(ratios[f"ms_per_turn/write/{n}"] for n in timing["gatedloop"]["write"])
            target(
                f"approval every turn, {lengths} turns: <= 1.0x the anchor at every length (wall, worst)", worst, 1.0
            )
            first = next(iter(timing["gatedloop"]["write"]))
            target(
                f"approval every turn, {first} turns: <= 0.9x the anchor (wall; issue 21)",
                ratios[f"ms_per_turn/write/{first}"],
                0.9,
            )
            worst_cpu = max(ratios[f"cpu_ms_per_turn/write/{n}"] for n in timing["gatedloop"]["write"])
            target(f"approval every turn, {lengths} turns: <= 1.0x the anchor (CPU time, worst)", worst_cpu, 1.0)
    resume = results.get("resume")
    if resume:
        for n in (r_lo, r_hi):
            ratios[f"resume_ms/{n}"] = _ratio(resume["gatedloop"][n]["total_ms"], resume["anchor"][n]["total_ms"])
        target(
            f"resume in a fresh process, {r_hi} vs {r_lo} turns <= 1.5x (gatedloop total)",
            _ratio(resume["gatedloop"][r_hi]["total_ms"], resume["gatedloop"][r_lo]["total_ms"]),
            1.5,
        )
    reads = results.get("parallel_reads")
    if reads:
        ratios["parallel_reads_ms"] = _ratio(reads["gatedloop"]["turn_ms"], reads["anchor"]["turn_ms"])
        target("gatedloop turn with 8 reads of 200 ms <= 300 ms", reads["gatedloop"]["turn_ms"], 300.0, "ms")
    concurrency = results.get("concurrency")
    if concurrency:
        g, a = concurrency["gatedloop"], concurrency["anchor"]
        ratios["concurrent_turns_per_s"] = _ratio(g["turns_per_s"], a["turns_per_s"])
        if "gatedloop_pool64" in concurrency:
            ratios["concurrent_turns_per_s_pool64"] = _ratio(
                concurrency["gatedloop_pool64"]["turns_per_s"], a["turns_per_s"]
            )
        finished = g["hung_runs"] == 0 and g["errors_total"] == 0 and min(g["turns_completed"]) == g["turns_expected"]
        target(
            f"{g['threads']} threads at once, async, one SQLite file: >= 1.2x the anchor's turns/s",
            ratios["concurrent_turns_per_s"],
            1.2,
            at_least=True,
        )
        targets.append(
            {
                "target": f"{g['threads']} concurrent threads finish with zero lock errors (gatedloop, all runs)",
                "value": f"{g['lock_errors_total']} lock errors, {g['errors_total']} errors, "
                f"{g['hung_runs']}/{len(g['turns_completed'])} runs hung",
                "threshold": "0 lock errors, all turns done",
                "unit": "",
                "pass": finished and g["lock_errors_total"] == 0,
            }
        )
    rss = results.get("memory_rss")
    if rss:
        for kind in rss["gatedloop"]:
            ratios[f"rss_peak_mb/{kind}"] = _ratio(
                rss["gatedloop"][kind]["rss_peak_mb"], rss["anchor"][kind]["rss_peak_mb"]
            )
            ratios[f"rss_growth_mb/{kind}"] = _ratio(
                rss["gatedloop"][kind]["rss_growth_mb"], rss["anchor"][kind]["rss_growth_mb"]
            )
            target(
                f"peak RSS, {rss['gatedloop'][kind]['turns']}-turn thread ({_mode(kind)}) <= the anchor's",
                ratios[f"rss_peak_mb/{kind}"],
                1.0,
            )
    for row in floor_rows(plan, results):
        for saver in ("gated", "plain"):
            ratios[f"floor/{row['shape']}/{saver}"] = row[f"floor_{saver}_ratio"]
    floor, timing, concurrency = results.get("floor") or {}, results.get("time"), results.get("concurrency")
    if "turns" in floor and timing and "write" in timing["gatedloop"]:
        target(
            f"approval every turn, {lo} turns: CPU <= 1.3x the floor's CPU (gatedloop's saver; issue 30)",
            _ratio(
                timing["gatedloop"]["write"][lo]["cpu_mean_ms_per_turn"], floor["turns"]["gated"].get("cpu_ms_per_turn")
            ),
            1.3,
        )
    if "concurrency" in floor and concurrency:
        target(
            f"{plan.threads} threads at once, async: turns/s >= 0.8x the floor's (gatedloop's saver; issue 30)",
            _ratio(concurrency["gatedloop"]["turns_per_s"], floor["concurrency"]["gated"]["turns_per_s"]),
            0.8,
            at_least=True,
        )
    traced = results.get("tracemalloc")
    if traced:
        ratios["tracemalloc_peak_mb"] = _ratio(
            traced["gatedloop"]["tracemalloc_peak_mb"], traced["anchor"]["tracemalloc_peak_mb"]
        )
    return ratios, targets


def floor_rows(plan: Any, results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each measured floor shape beside the two systems' figures of the same run; ratios are all to the anchor,
    oriented so that lower is better (turns/s inverted: anchor / x)."""
    floor = results.get("floor") or {}
    rows: list[dict[str, Any]] = []

    def row(shape: str, label: str, unit: str, gated: Any, anchor: Any, target: str, key: str, per_s: bool) -> None:
        plain = floor[shape]["plain"][key]
        mine = floor[shape]["gated"][key]
        ratio = (lambda x: _ratio(anchor, x)) if per_s else (lambda x: _ratio(x, anchor))
        rows.append(
            {
                "shape": shape,
                "label": label,
                "unit": unit,
                "anchor": anchor,
                "gatedloop": gated,
                "floor_gated": mine,
                "floor_plain": plain,
                "gatedloop_ratio": ratio(gated),
                "floor_gated_ratio": ratio(mine),
                "floor_plain_ratio": ratio(plain),
                "target": target,
            }
        )

    request, timing, concurrency = results.get("request"), results.get("time"), results.get("concurrency")
    if "request" in floor and request:
        label = f"one request, {plan.request_rounds} tool rounds: whole request"
        g, a = request["gatedloop"]["total_s"], request["anchor"]["total_s"]
        row("request", label, "s", g, a, "<= 0.5", "total_s", False)
    lo = str(min(plan.lengths))
    if "turns" in floor and timing and "write" in timing["gatedloop"]:
        g, a = timing["gatedloop"]["write"][lo]["mean_ms_per_turn"], timing["anchor"]["write"][lo]["mean_ms_per_turn"]
        row("turns", f"approval every turn, {lo} turns: mean ms/turn", "ms", g, a, "<= 0.9", "mean_ms_per_turn", False)
    if "concurrency" in floor and concurrency:
        g, a = concurrency["gatedloop"]["turns_per_s"], concurrency["anchor"]["turns_per_s"]
        label = f"{plan.threads} threads at once, async: turns/s (ratio: anchor's time per turn over x's)"
        row("concurrency", label, "/s", g, a, "<= 0.83 (1.2x the turns/s)", "turns_per_s", True)
    return rows


def markdown(plan: Any, results: dict[str, Any]) -> str:
    meta = results["meta"]
    ratios = results.get("ratios", {})
    lines = [
        "# gatedloop vs create_agent + HumanInTheLoopMiddleware",
        "",
        f"Command: `{meta['command']}` ({'quick smoke run' if meta['quick'] else 'full run'}, "
        f"{meta['seconds']} s). Commit {meta['git_commit']}{' (dirty tree)' if meta['git_dirty'] else ''}"
        + (
            f" at start, **{meta['git_commit_end']} at the end (the source changed during the run)**"
            if meta.get("git_commit_end") not in (None, meta["git_commit"])
            else ""
        )
        + ", "
        f"Python {meta['python']}, SQLite {meta['sqlite']}, {meta['cpus']} CPUs, {meta['platform']}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
        f"Load average (1/5/15 min) at start {meta.get('loadavg_start')}, at end {meta.get('loadavg_end')} "
        "(other work on the machine skews times; the systems are interleaved run by run).",
        "",
        f"Medians of {plan.reps} runs per cell unless said otherwise. Ratio = gatedloop / anchor (lower is better).",
        "",
    ]
    request = results.get("request")
    if request:
        g = request["gatedloop"]
        lines += [
            f"## One long request ({g['rounds']} tool rounds)",
            "",
            "One user message, then one read per round (a fresh order id each time, so never a repeat) until "
            f'{g["rounds"]} results are in, then a text answer; streamed, `durability="sync"`, a child process '
            f"per run, median of {plan.request_reps} runs. *Per step* = bytes added (or ms spent) over the last "
            f"{g['sample_every']} rounds / {g['sample_every']}; *mean* = everything so far / rounds so far.",
            "",
            "| rounds | gatedloop blobs | anchor blobs | ratio | gatedloop bytes/step | anchor bytes/step |"
            " gatedloop mean bytes/step | gatedloop ms/step | anchor ms/step | gatedloop mean ms | anchor mean ms |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        anchor_at = {p["round"]: p for p in request["anchor"]["curve"]}
        for p in g["curve"]:
            a = anchor_at.get(p["round"])
            if a is None:
                continue
            lines.append(
                f"| {p['round']} | {_fmt_bytes(p['blob_bytes'])} | {_fmt_bytes(a['blob_bytes'])} | "
                f"{_fmt(_ratio(p['blob_bytes'], a['blob_bytes']), 4)} | {_fmt_bytes(p['window_bytes_per_step'])} | "
                f"{_fmt_bytes(a['window_bytes_per_step'])} | {_fmt_bytes(p['mean_bytes_per_step'])} | "
                f"{_fmt(p['window_ms_per_step'])} | {_fmt(a['window_ms_per_step'])} | "
                f"{_fmt(p['mean_ms_per_step'])} | {_fmt(a['mean_ms_per_step'])} |"
            )
        totals = "; ".join(f"{s} {', '.join(f'{t:.2f}' for t in r['runs_total_s'])}" for s, r in request.items())
        cpu = "; ".join(f"{s} {', '.join(f'{t:.2f}' for t in r.get('runs_cpu_s', []))}" for s, r in request.items())
        lines += ["", f"Whole request, per run (s): {totals}. CPU time of the process, per run (s): {cpu}.", ""]
    storage = results.get("storage")
    if storage:
        lines += [
            "## Stored checkpoint bytes",
            "",
            "Blob bytes = `checkpoint`+`metadata` in `checkpoints` + `value` in `writes`; file = the SQLite file "
            "after `PRAGMA wal_checkpoint(TRUNCATE)` (gatedloop's file also holds its ledger and audit tables).",
            "",
            "| turns | mode | gatedloop blobs | anchor blobs | ratio | gatedloop file | anchor file | ratio |"
            " gatedloop blobs/turn | anchor blobs/turn |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for kind in storage["gatedloop"]:
            for n, g in storage["gatedloop"][kind].items():
                a = storage["anchor"][kind][n]
                lines.append(
                    f"| {n} | {_mode(kind)} | {_fmt_bytes(g['blob_bytes'])} | {_fmt_bytes(a['blob_bytes'])} | "
                    f"{_fmt(ratios.get(f'blob_bytes/{kind}/{n}'), 4)} | {_fmt_bytes(g['file_bytes'])} | "
                    f"{_fmt_bytes(a['file_bytes'])} | {_fmt(ratios.get(f'file_bytes/{kind}/{n}'), 4)} | "
                    f"{_fmt_bytes(g['blob_bytes_per_turn'])} | {_fmt_bytes(a['blob_bytes_per_turn'])} |"
                )
        lines.append("")
    timing = results.get("time")
    if timing:
        lines += [
            "## Orchestration time per turn",
            "",
            'Zero-latency scripted model and tools, `durability="sync"`, one thread. *Mean* = total time of the '
            "first N turns / N; *at N* = mean of the 25 turns just before N. *CPU* = the same mean in CPU time of "
            "the child process (all its threads), which other work on the machine disturbs much less than wall "
            "time. An approval turn includes its resume.",
            "",
            "| turns | mode | gatedloop mean ms | anchor mean ms | ratio | gatedloop at N | anchor at N | ratio |"
            " gatedloop CPU ms | anchor CPU ms | CPU ratio |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for kind in timing["gatedloop"]:
            for n, g in timing["gatedloop"][kind].items():
                a = timing["anchor"][kind][n]
                lines.append(
                    f"| {n} | {_mode(kind)} | {_fmt(g['mean_ms_per_turn'])} | {_fmt(a['mean_ms_per_turn'])} | "
                    f"{_fmt(ratios.get(f'ms_per_turn/{kind}/{n}'))} | {_fmt(g['window_ms_per_turn'])} | "
                    f"{_fmt(a['window_ms_per_turn'])} | {_fmt(ratios.get(f'window_ms_per_turn/{kind}/{n}'))} | "
                    f"{_fmt(g['cpu_mean_ms_per_turn'])} | {_fmt(a['cpu_mean_ms_per_turn'])} | "
                    f"{_fmt(ratios.get(f'cpu_ms_per_turn/{kind}/{n}'))} |"
                )
        runs = []
        for system in ("gatedloop", "anchor"):
            for kind, by_length in timing[system].items():
                longest = by_length[max(by_length, key=int)]
                runs.append(f"{system}/{_mode(kind)} {', '.join(f'{x:.1f}' for x in longest['runs_mean_ms'])}")
        lines += ["", "Per-run wall means (ms/turn) at the longest length: " + "; ".join(runs) + ".", ""]
    resume = results.get("resume")
    if resume:
        lines += [
            "## Resume latency in a fresh process",
            "",
            f"A subprocess opens a copy of the file, builds the graph, loads the paused thread (`get_state`) and "
            f"approves; the turn then runs to its answer. Total = open + load + resume, after imports (import "
            f"time and the whole process's wall time shown apart). Median of {plan.resume_trials} trials.",
            "",
            "| turns | system | open ms | load ms | resume ms | total ms | imports ms | process wall ms |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for n in resume["gatedloop"]:
            for system in ("gatedloop", "anchor"):
                r = resume[system][n]
                lines.append(
                    f"| {n} | {system} | {_fmt(r['open_ms'], 1)} | {_fmt(r['load_ms'], 1)} | "
                    f"{_fmt(r['resume_ms'], 1)} | {_fmt(r['total_ms'], 1)} | {_fmt(r['import_ms'], 0)} | "
                    f"{_fmt(r['process_wall_ms'], 0)} |"
                )
        lines += [
            "",
            "Ratios (total): "
            + ", ".join(f"{n} turns {_fmt(ratios.get(f'resume_ms/{n}'))}" for n in resume["gatedloop"])
            + ".",
            "",
        ]
    reads = results.get("parallel_reads")
    if reads:
        g, a = reads["gatedloop"], reads["anchor"]
        lines += [
            "## One turn with 8 independent reads of 200 ms each",
            "",
            f"Wall time of the whole turn (model -> 8 calls -> model). Serial would be {g['serial_ms']:.0f} ms. "
            f"Median of {plan.read_trials} turns.",
            "",
            "| system | turn ms | runs |",
            "|---|---:|---|",
            f"| gatedloop | {_fmt(g['turn_ms'], 1)} | {', '.join(f'{x:.0f}' for x in g['runs_ms'])} |",
            f"| anchor | {_fmt(a['turn_ms'], 1)} | {', '.join(f'{x:.0f}' for x in a['runs_ms'])} |",
            "",
        ]
    concurrency = results.get("concurrency")
    if concurrency:
        g = concurrency["gatedloop"]
        lines += [
            f"## {g['threads']} threads at once on one SQLite file (async)",
            "",
            f"`open_async_sqlite` (anchor: `AsyncSqliteSaver`) and `ainvoke` on {g['threads']} threads at once, each "
            f"{g['turns_per_thread']} turn(s) with an approval (2 `ainvoke` calls per turn), in a child process per "
            f"run. A run in which no turn finishes for {plan.stall_s:g} s is stopped and counted as hung (its "
            f"turns/s covers the time until the last finished turn). Median of {plan.concurrency_reps} runs; errors "
            "summed. The `pool64` row is gatedloop with the event loop's default executor set to 64 threads "
            "(before commit 914ffca that avoided a deadlock of the sync execute node; see README).",
            "",
            "| run | executor threads | turns/s | wall s | turns done / expected | errors | lock errors | hung runs |",
            "|---|---:|---:|---:|---|---:|---:|---:|",
        ]
        for label, c in concurrency.items():
            done = ", ".join(map(str, c["turns_completed"]))
            lines.append(
                f"| {label} | {c['default_executor_workers']} | {_fmt(c['turns_per_s'], 1)} | {_fmt(c['wall_s'])} | "
                f"{done} / {c['turns_expected']} | {c['errors_total']} | {c['lock_errors_total']} | "
                f"{c['hung_runs']}/{len(c['turns_completed'])} |"
            )
        for label, c in concurrency.items():
            for sample in c["error_samples"]:
                lines.append(f"\n{label} error: `{sample}`")
            hung = next((r for r in c["runs"] if r.get("stacks")), None)
            if hung:
                lines += [
                    "",
                    f"Where the threads of the first hung `{label}` run were (threads: innermost frames):",
                    "",
                ]
                for group in hung["stacks"][:4]:
                    lines.append(f"- {group['threads']} x `{group['name']}`: " + " <- ".join(reversed(group["stack"])))
        lines += [
            "",
            f"Throughput ratio gatedloop/anchor: {_fmt(ratios.get('concurrent_turns_per_s'))}"
            f" (pool64 row: {_fmt(ratios.get('concurrent_turns_per_s_pool64'))}).",
            "",
        ]
        lines += _cpu_by_thread(concurrency, results.get("floor", {}).get("concurrency", {}))
    rss = results.get("memory_rss")
    if rss:
        lines += [
            "## Peak memory of a long thread",
            "",
            "`ru_maxrss` of the child process that ran each long thread (before = after imports, warm-up and graph "
            f"build). Median of {plan.reps} runs.",
            "",
            "| turns | mode | system | peak RSS MB | RSS before turns MB | growth MB |",
            "|---:|---|---|---:|---:|---:|",
        ]
        for kind in rss["gatedloop"]:
            for system in ("gatedloop", "anchor"):
                m = rss[system][kind]
                lines.append(
                    f"| {m['turns']} | {_mode(kind)} | {system} | {_fmt(m['rss_peak_mb'], 1)} | "
                    f"{_fmt(m['rss_before_mb'], 1)} | {_fmt(m['rss_growth_mb'], 1)} |"
                )
        lines.append("")
    traced = results.get("tracemalloc")
    if traced:
        lines += [
            f"tracemalloc (one run, {plan.memory_turns} approval turns, traced from the first turn): "
            + ", ".join(
                f"{s} peak {t['tracemalloc_peak_mb']} MB / at end {t['tracemalloc_end_mb']} MB"
                for s, t in traced.items()
            )
            + ".",
            "",
        ]
    rows = floor_rows(plan, results)
    if rows:
        lines += [
            "## The floor: gatedloop's graph with nodes that do nothing",
            "",
            "`bench/floor.py`: the same state schema, routing and supersteps (three per read round, eight per approval"
            ' turn with an `interrupt()`), `durability="sync"`, nodes that only write what gatedloop\'s nodes'
            " write: no model call, no ledger, no tool. On gatedloop's saver and on LangGraph's own; medians, same"
            " run. Ratios to the anchor, lower is better (for turns/s: the anchor's time per turn over x's). A target"
            " below the floor's ratio cannot be met by this graph on LangGraph, whatever its nodes do.",
            "",
            "| shape | anchor | gatedloop | floor, gatedloop's saver | floor, LangGraph's saver | gatedloop ratio |"
            " floor ratio (gatedloop's saver / LangGraph's) | target |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['label']} | {_fmt(r['anchor'])} {r['unit']} | {_fmt(r['gatedloop'])} {r['unit']} |"
                f" {_fmt(r['floor_gated'])} {r['unit']} | {_fmt(r['floor_plain'])} {r['unit']} |"
                f" {_fmt(r['gatedloop_ratio'], 3)} | {_fmt(r['floor_gated_ratio'], 3)} /"
                f" {_fmt(r['floor_plain_ratio'], 3)} | {r['target']} |"
            )
        lines.append("")
    targets = results.get("targets") or []
    if targets:
        lines += ["## Targets", "", "| target | measured | threshold | result |", "|---|---:|---:|---|"]
        for t in targets:
            value = t["value"] if isinstance(t["value"], int | str) else _fmt(t["value"], 3)
            lines.append(
                f"| {t['target']} | {value}{t['unit']} | {t['threshold']}{t['unit']} | "
                f"{'pass' if t['pass'] else '**miss**'} |"
            )
        lines.append("")
    return "\n".join(lines)


def _mode(kind: str) -> str:
    return {"read": "no approval", "write": "approval"}.get(kind, kind)


def _cpu_by_thread(concurrency: dict[str, Any], floor: dict[str, Any]) -> list[str]:
    """Where each system's CPU per turn went, by thread (`bench.thread_cpu`), beside the floor's; then the context
    switches per turn, by thread: how often a turn's work stops to wait."""
    cpu = _by_thread(
        concurrency,
        floor,
        "cpu_ms_per_turn_by_thread",
        "CPU per turn by thread, ms (median of the runs; event loop: LangGraph's async machinery and the nodes' "
        "coroutines; aiosqlite: the checkpointer's SQL; executor: what the nodes send off the loop, gatedloop's "
        "gate logic and ledger; tool pool: gatedloop's tool runs):",
    )
    switches = _by_thread(
        concurrency,
        floor,
        "switches_per_turn_by_thread",
        "Context switches per turn by thread (median of the runs; each is a thread that stopped to wait, for the "
        "GIL, a lock, a queue or a sleep, or was stopped):",
        digits=0,
    )
    return [*cpu, *switches]


def _by_thread(concurrency: dict[str, Any], floor: dict[str, Any], key: str, title: str, digits: int = 2) -> list[str]:
    splits = {label: c.get(key) or {} for label, c in concurrency.items()}
    splits.update({f"floor ({saver} saver)": f.get(key) or {} for saver, f in floor.items()})
    splits = {label: split for label, split in splits.items() if split}
    roles = sorted({role for split in splits.values() for role in split})
    if not roles:
        return []
    lines = [title, "", "| run | " + " | ".join(roles) + " | all |", "|---|" + "---:|" * (len(roles) + 1)]
    for label, split in splits.items():
        cells = " | ".join(_fmt(split.get(role, 0.0), digits) for role in roles)
        lines.append(f"| {label} | {cells} | {_fmt(sum(split.values()), digits)} |")
    return [*lines, ""]
