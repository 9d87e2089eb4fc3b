"""Crash safety side by side: one scripted payment, real effects counted, gatedloop and its peers each driven as its
own docs recommend for durable human approval, each in a real child process that is killed for real.

    .venv/bin/python -m bench.effects                       # 20 trials of each timing scenario, 5 of the others
    .venv/bin/python -m bench.effects --quick               # smoke run: 2 trials of each
    .venv/bin/python -m bench.effects --json out.json --trials 50 --frameworks gatedloop,langchain

Frameworks (each peer installed by this kit in its own venv under `--cache`, default `.bench-venvs/`, or skipped
with the reason):

- `gatedloop`, `gatedloop+reconcile`: `build_graph` on `open_sqlite`, `runs.start` / `runs.resume`, `pay` a gated
  write approved by the role `finance`; the second gives the policy a `reconcile` that asks the payment provider.
  Measured at `--gatedloop-ref` (default HEAD, exported with `git archive`, so edits in the working tree do not
  leak in; `worktree` for the working tree).
- `langchain`: `create_agent` + `HumanInTheLoopMiddleware(interrupt_on={"pay": True})` on `SqliteSaver` (the
  anchor of bench/anchor.py); a crash is continued with `invoke(None)` on the same thread.
- `openai-agents`: `function_tool(needs_approval=True)`, the paused run's `RunState` stored as JSON and resumed with
  `RunState.from_json`, `state.approve`, `Runner.run`.
- `pydantic-ai`: `requires_approval=True`, `DeferredToolRequests`; the message history stored and continued with
  `deferred_tool_results`.

The drivers are in bench/effects_peers/ (one script per framework; their docstrings say what each does and why).
A payment is one line appended to `payments.log` in the trial's folder (O_APPEND, fsync), which no framework writes;
a trial's count is that file's lines. Every trial starts from a copy of one paused run per framework (made once
with the driver's `start`), so the kill, the race or the answer is all that differs between frameworks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DRIVERS = Path(__file__).resolve().parent / "effects_peers"
LEDGER = "payments.log"
CHILD_TIMEOUT_S = 240.0
PIP_TIMEOUT_S = 1200.0


@dataclass(frozen=True)
class Peer:
    """A framework installed by the kit in a venv of its own."""

    venv: str
    packages: tuple[str, ...]
    versions_of: tuple[str, ...]


@dataclass(frozen=True)
class Framework:
    key: str
    label: str
    driver: str
    peer: Peer | None = None  # None: the project's own venv (gatedloop)
    args: tuple[str, ...] = ()
    untested: str = ""  # durable add-ons the docs offer, not measured here


FRAMEWORKS: tuple[Framework, ...] = (
    Framework("gatedloop", "gatedloop (no reconcile)", "gatedloop_driver.py"),
    Framework("gatedloop+reconcile", "gatedloop + reconcile", "gatedloop_driver.py", args=("--reconcile",)),
    Framework(
        "langchain",
        "LangChain create_agent + HITL, SqliteSaver",
        "langchain_driver.py",
        Peer(
            "langchain",
            ("langchain", "langgraph-checkpoint-sqlite"),
            ("langchain", "langgraph", "langgraph-checkpoint-sqlite"),
        ),
        untested="LangGraph Platform / Agent Server (its task queue and runs API)",
    ),
    Framework(
        "openai-agents",
        "OpenAI Agents SDK, RunState JSON",
        "openai_agents_driver.py",
        Peer("openai-agents", ("openai-agents",), ("openai-agents", "openai")),
        untested="Temporal (temporalio openai_agents plugin), DBOS (dbos-openai-agents), Restate",
    ),
    Framework(
        "pydantic-ai",
        "Pydantic AI, deferred tools",
        "pydantic_ai_driver.py",
        Peer("pydantic-ai", ("pydantic-ai-slim",), ("pydantic-ai-slim",)),
        untested="Temporal, DBOS, Prefect (pydantic_ai.durable_exec)",
    ),
)


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    expected: str  # "once" or "never": what a safe framework does
    timing: bool  # a kill or a race: runs --trials times; else --fixed-trials
    meaning: str


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "kill_after",
        "killed after the payment",
        "once",
        True,
        "The reviewer approves; the process is SIGKILLed right after the payment is on disk, inside the tool, before "
        "the framework records the tool's result. A new process resumes the run the framework's way.",
    ),
    Scenario(
        "kill_before",
        "killed before the payment",
        "once",
        True,
        "As above, but the SIGKILL lands inside the tool just before the payment. A resume should pay exactly once.",
    ),
    Scenario(
        "two_resumers",
        "two resumers at once",
        "once",
        True,
        "Two processes, each with the approval, resume the same paused run at the same moment (both wait on a go "
        "file, imports done).",
    ),
    Scenario(
        "same_answer_twice",
        "same answer submitted twice",
        "once",
        False,
        "The reviewer's answer arrives twice, one after the other (a retried request, a double click): each is handled "
        "by a new process the framework's way.",
    ),
    Scenario(
        "wrong_role",
        "approver without the role",
        "never",
        False,
        "pay may be approved by the role finance; mallory (role support) approves.",
    ),
    Scenario(
        "policy_changed",
        "policy changed while waiting",
        "never",
        False,
        "The run paused under 'finance approves pay'; while it waits the rule becomes 'treasury approves pay' "
        "(gatedloop: an operator upgrades the thread to the new graph, which the audit records); then bo (finance) "
        "approves.",
    ),
)


# ------------------------------------------------------------------------------------------- child processes


class Child:
    """A driver in a real child process: its markers read as they come, a SIGKILL on request."""

    def __init__(self, command: Sequence[str], env: dict[str, str], log: Path) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            list(command), stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL, env=env, text=True
        )
        self.killed = False
        self.ended = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, marker: str, timeout: float = CHILD_TIMEOUT_S) -> bool:
        """True once a line starting with `marker` arrived; False if the child ended (or timed out) first."""
        if any(line.split(" ", 1)[0] == marker for line in self.lines):
            return True
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                return False
            if line is None:
                self._queue.put(None)
                return False
            self.lines.append(line)
            if line.split(" ", 1)[0] == marker:
                return True
        return False

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.killed = True
        self.finish()

    def finish(self, timeout: float = CHILD_TIMEOUT_S) -> str:
        """Wait for the child to end (SIGKILL at the timeout) and say how it ended (see `outcome`)."""
        if self.ended:
            return self.ended
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.lines.append("timeout")
        self._reader.join(timeout=10)
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        self._log.close()
        self.ended = outcome(self.lines, self.proc.returncode, self.killed)
        return self.ended


OUTCOME_MARKERS = ("final", "paused", "waiting", "refused", "raised", "busy", "noop", "timeout")


def outcome(lines: Sequence[str], returncode: int | None, killed: bool = False) -> str:
    """How one process ended, in a few words, from the last marker that says so."""
    if killed:
        return "killed"
    for line in reversed(lines):
        word, _, rest = line.partition(" ")
        if word not in OUTCOME_MARKERS:
            continue
        if word == "final":
            return "completed"
        if word == "paused":
            return "waiting for approval"
        if word == "waiting":
            return f"waiting for a person ({rest.replace('_', ' ')})"
        if word in ("refused", "raised"):
            return f"{word} {rest.split(':', 1)[0]}"
        if word == "busy":
            return "ThreadBusy"
        if word == "noop":
            return "nothing to resume"
        return "timed out"
    return f"exited {returncode} without an outcome"


# ------------------------------------------------------------------------------------------- environments


@dataclass
class Runtime:
    """How to run one framework's driver: its interpreter and environment, or why it cannot run."""

    framework: Framework
    python: str | None
    env: dict[str, str]
    versions: dict[str, str] = field(default_factory=dict)
    skipped: str = ""

    def command(self, trial: Path, action: str, *extra: str) -> list[str]:
        assert self.python is not None
        driver = str(DRIVERS / self.framework.driver)
        return [self.python, driver, "--dir", str(trial), "--action", action, *self.framework.args, *extra]


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _tail(text: str, lines: int = 3) -> str:
    """The last lines of a tool's error output that say something (pip repeats harmless 'WARNING: Location' lines)."""
    useful = [line for line in text.splitlines() if line.strip() and not line.startswith("WARNING: Location")]
    return " / ".join(useful[-lines:])[:400]


def installed_versions(python: str, names: Sequence[str]) -> dict[str, str]:
    code = "import importlib.metadata as m, json, sys; print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    out = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, timeout=120, check=True)
    return dict(json.loads(out.stdout))


def ensure_peer(peer: Peer, cache: Path, reinstall: bool, log: Callable[[str], None]) -> tuple[str | None, str]:
    """The peer's venv under `cache` (made and installed from PyPI on first use): its python, or None and why."""
    venv = cache / peer.venv
    python = venv / "bin" / "python"
    stamp = venv / ".bench-installed.json"
    if stamp.exists() and python.exists() and not reinstall:
        return str(python), ""
    log(f"installing {' '.join(peer.packages)} into {venv} ...")
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], capture_output=True, text=True, check=True)
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *peer.packages],
            capture_output=True,
            text=True,
            timeout=PIP_TIMEOUT_S,
        )
    except (subprocess.SubprocessError, OSError) as failed:
        return None, f"could not create or install the venv: {failed}"
    if done.returncode != 0:
        return None, f"pip install {' '.join(peer.packages)} failed: {_tail(done.stderr or done.stdout)}"
    stamp.write_text(json.dumps({"packages": peer.packages, "at": datetime.now(UTC).isoformat()}), encoding="utf-8")
    return str(python), ""


def gatedloop_tree(ref: str, cache: Path) -> tuple[str | None, str]:
    """A `gatedloop` import path for `ref` (`git archive` into `cache`, linked as setuptools' package-dir maps it),
    and the commit; `worktree`: None (the project venv's editable install) and HEAD marked as the working tree."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if ref == "worktree":
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True).stdout
        return None, f"{head[:12]} + working tree" + (" (uncommitted changes)" if dirty.strip() else "")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    base = cache / f"gatedloop-{commit[:12]}"
    path = base / "path"
    if not (path / "gatedloop").exists():
        for old in cache.glob("gatedloop-*"):  # snapshots of earlier commits: nothing reads them any more
            shutil.rmtree(old, ignore_errors=True)
        source = base / "src"
        source.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True).stdout
        with tempfile.TemporaryFile() as tar_file:
            tar_file.write(archive)
            tar_file.seek(0)
            with tarfile.open(fileobj=tar_file) as tar:
                tar.extractall(source, filter="data")
        mapping = tomllib.loads((source / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
        (path / "gatedloop").mkdir(parents=True)
        for package, folder in mapping["package-dir"].items():
            (path / "gatedloop" / package.split(".", 1)[1]).symlink_to(source / folder, target_is_directory=True)
    return str(path), commit[:12]


def prepare(
    frameworks: Sequence[Framework], cache: Path, ref: str, reinstall: bool, log: Callable[[str], None]
) -> tuple[list[Runtime], str]:
    cache.mkdir(parents=True, exist_ok=True)
    runtimes = []
    tree, commit = gatedloop_tree(ref, cache) if any(f.peer is None for f in frameworks) else (None, "")
    for framework in frameworks:
        env = _clean_env()
        if framework.peer is None:
            if tree:
                env["PYTHONPATH"] = tree
            runtimes.append(Runtime(framework, sys.executable, env, {"gatedloop": commit}))
            continue
        python, reason = ensure_peer(framework.peer, cache, reinstall, log)
        runtime = Runtime(framework, python, env, skipped=reason)
        if python:
            try:
                runtime.versions = installed_versions(python, framework.peer.versions_of)
            except (subprocess.SubprocessError, ValueError) as failed:
                runtime.python, runtime.skipped = None, f"installed, but its versions cannot be read: {failed}"
        runtimes.append(runtime)
    return runtimes, commit


# ------------------------------------------------------------------------------------------- trials


@dataclass
class Trial:
    scenario: str
    framework: str
    index: int
    payments: int = 0
    steps: list[str] = field(default_factory=list)  # how each process ended, in order
    note: str = ""


def payments(trial: Path) -> int:
    try:
        return len((trial / LEDGER).read_text(encoding="utf-8").splitlines())
    except FileNotFoundError:
        return 0


def make_template(runtime: Runtime, folder: Path) -> str:
    """One paused run (the driver's `start`), copied into every trial; an empty string, or why it failed."""
    folder.mkdir(parents=True, exist_ok=True)
    ended = _child(runtime, folder, "start").finish()
    if ended != "waiting for approval" or payments(folder):
        log = (folder / "start.log").read_text(encoding="utf-8", errors="replace")
        return f"the driver's start ended '{ended}', not paused: {_tail(log)}"
    return ""


def _child(runtime: Runtime, trial: Path, action: str, *extra: str, log: str = "") -> Child:
    return Child(runtime.command(trial, action, *extra), runtime.env, trial / f"{log or action}.log")


def payers(trial: Path) -> Counter[int]:
    """Payments per process id (each line of payments.log names the process that made it)."""
    try:
        lines = (trial / LEDGER).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return Counter()
    return Counter(int(word[4:]) for line in lines for word in line.split() if word.startswith("pid="))


def step(child: Child, paid: int) -> str:
    """How one process ended, and whether it paid: 'killed after paying', 'completed'."""
    ended = child.ended or child.finish()
    return ended + {0: "", 1: " after paying"}.get(paid, f" after paying {paid} times")


def run_trial(runtime: Runtime, scenario: Scenario, template: Path, trial: Path, index: int) -> Trial:
    shutil.copytree(template, trial)
    (trial / "start.log").unlink(missing_ok=True)
    result = Trial(scenario.key, runtime.framework.key, index)
    children: list[Child] = []
    if scenario.key in ("kill_after", "kill_before"):
        hold = scenario.key.removeprefix("kill_")
        answer = _child(runtime, trial, "answer", "--hold", hold)
        if answer.wait_for("hold"):
            answer.kill()
        else:
            answer.finish()
            result.note = "the kill did not land: the process ended first"
        children += [answer, _child(runtime, trial, "resume")]
    elif scenario.key == "two_resumers":
        go = trial / "go"
        children += [_child(runtime, trial, "answer", "--go", str(go), log=f"answer-{n}") for n in (1, 2)]
        ready = all(child.wait_for("ready") for child in children)
        go.touch()
        if not ready:
            result.note = "a resumer never got ready"
    elif scenario.key == "same_answer_twice":
        first = _child(runtime, trial, "answer", log="answer-1")
        first.finish()
        children += [first, _child(runtime, trial, "answer", log="answer-2")]
    elif scenario.key == "wrong_role":
        children.append(_child(runtime, trial, "answer", "--reviewer", "mallory", "--roles", "support"))
    elif scenario.key == "policy_changed":
        children.append(_child(runtime, trial, "answer", "--policy", "treasury", "--upgrade"))
    else:
        raise ValueError(f"unknown scenario {scenario.key!r}")
    for child in children:
        child.finish()
    paid = payers(trial)
    result.steps = [step(child, paid[child.proc.pid]) for child in children]
    if scenario.key == "two_resumers":
        result.steps.sort()
    result.payments = payments(trial)
    return result


# ------------------------------------------------------------------------------------------- the table


STEP_NAMES = {
    "kill_after": ("answer", "resume"),
    "kill_before": ("answer", "resume"),
    "two_resumers": ("one", "other"),
    "same_answer_twice": ("1st", "2nd"),
    "wrong_role": ("answer",),
    "policy_changed": ("answer",),
}


def describe(trial: Trial) -> str:
    """A trial's processes in words: 'answer killed, resume completed'."""
    names = STEP_NAMES.get(trial.scenario, ())
    parts = [f"{names[i]} {step}" if i < len(names) else step for i, step in enumerate(trial.steps)]
    text = ", ".join(parts)
    return f"{text} ({trial.note})" if trial.note else text


@dataclass
class Row:
    scenario: str
    framework: str
    trials: int
    paid_once: int
    paid_twice: int  # twice or more
    paid_never: int
    expected: str
    notes: str
    verdict: str
    outcomes: dict[str, int]


def summarize(trials: Sequence[Trial], scenario: Scenario, framework: Framework) -> Row:
    mine = [t for t in trials if t.scenario == scenario.key and t.framework == framework.key]
    seen = Counter(describe(t) for t in mine)
    notes = "; ".join(f"{n}× {text}" if len(seen) > 1 or n > 1 else text for text, n in seen.most_common())
    return Row(
        scenario=scenario.key,
        framework=framework.key,
        trials=len(mine),
        paid_once=sum(t.payments == 1 for t in mine),
        paid_twice=sum(t.payments >= 2 for t in mine),
        paid_never=sum(t.payments == 0 for t in mine),
        expected=scenario.expected,
        notes=notes,
        verdict=verdict(mine, scenario.expected),
        outcomes=dict(seen),
    )


def judge(trial: Trial, expected: str) -> str:
    """One trial against what a safe framework does: 'ok', 'held for a person' (nothing paid, a person asked), or
    what went wrong."""
    if expected == "never":
        return "ok" if trial.payments == 0 else "paid against the rule"
    if trial.payments == 1:
        return "ok"
    if trial.payments >= 2:
        return "paid twice"
    held = bool(trial.steps) and trial.steps[-1].startswith("waiting for a person")
    return "held for a person" if held else "never paid"


def verdict(trials: Sequence[Trial], expected: str) -> str:
    """'' when every trial is ok; else each kind counted, wrong ones in bold ('**20 of 20 paid twice**')."""
    seen = Counter(judge(t, expected) for t in trials)
    parts = []
    for kind, n in seen.most_common():
        if kind == "ok":
            continue
        text = f"{n} of {len(trials)} {kind}"
        parts.append(text if kind == "held for a person" else f"**{text}**")
    return ", ".join(parts)


def table(rows: Sequence[Row], skipped: dict[str, str]) -> str:
    labels = {f.key: f.label for f in FRAMEWORKS}
    titles = {s.key: s for s in SCENARIOS}
    out = [
        "| scenario (a safe run pays) | framework | trials | paid once | paid twice | paid never | notes |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        scenario = titles[row.scenario]
        notes = f"{row.verdict}: {row.notes}" if row.verdict else row.notes
        out.append(
            f"| {scenario.title} ({scenario.expected}) | {labels[row.framework]} | {row.trials} | {row.paid_once} | "
            f"{row.paid_twice} | {row.paid_never} | {notes} |"
        )
    for key, reason in skipped.items():
        out.append(f"| every scenario | {labels[key]} | 0 | | | | skipped: {reason} |")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------- main


def machine() -> dict[str, Any]:
    try:
        load: tuple[float, ...] = os.getloadavg()
    except OSError:
        load = ()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in load],
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="trials of each timing scenario (kills, the race)")
    parser.add_argument("--fixed-trials", type=int, default=5, help="trials of each scenario without a kill or race")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 trials of every scenario")
    parser.add_argument("--scenarios", default=",".join(s.key for s in SCENARIOS))
    parser.add_argument("--frameworks", default=",".join(f.key for f in FRAMEWORKS))
    parser.add_argument("--jobs", type=int, default=2, help="trials run at the same time")
    parser.add_argument("--json", default=None, help="also write the table and every trial to this file")
    parser.add_argument("--cache", default=str(ROOT / ".bench-venvs"), help="peer venvs and gatedloop snapshots")
    parser.add_argument("--reinstall", action="store_true", help="reinstall the peers' venvs from PyPI")
    parser.add_argument("--gatedloop-ref", default="HEAD", help="a git commit, or 'worktree' (the working tree)")
    parser.add_argument("--keep", default=None, help="keep every trial's folder under this directory")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials = args.fixed_trials = 2
    return args


def _pick(names: str, known: Sequence[Any], what: str) -> list[Any]:
    by_key = {item.key: item for item in known}
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in by_key]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(by_key)})")
    return [by_key[name] for name in wanted]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    scenarios: list[Scenario] = _pick(args.scenarios, SCENARIOS, "scenario")
    frameworks: list[Framework] = _pick(args.frameworks, FRAMEWORKS, "framework")

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    started_at, before = datetime.now(UTC), machine()
    runtimes, commit = prepare(frameworks, Path(args.cache), args.gatedloop_ref, args.reinstall, log)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gatedloop-effects-"))
    root.mkdir(parents=True, exist_ok=True)
    skipped = {r.framework.key: r.skipped for r in runtimes if r.skipped}
    started = time.monotonic()
    trials: list[Trial] = []
    try:
        ready = []
        for runtime in runtimes:
            if runtime.skipped:
                continue
            log(f"{runtime.framework.key}: a paused run to copy ...")
            reason = make_template(runtime, root / "templates" / runtime.framework.key)
            if reason:
                skipped[runtime.framework.key] = reason
            else:
                ready.append(runtime)
        # Frameworks interleaved, trial by trial, so each meets the machine's load at about the same times.
        plan = [
            (runtime, scenario, index)
            for scenario in scenarios
            for index in range(args.trials if scenario.timing else args.fixed_trials)
            for runtime in ready
        ]
        log(f"{len(plan)} trials, {args.jobs} at a time ...")

        def one(item: tuple[Runtime, Scenario, int]) -> Trial:
            runtime, scenario, index = item
            template = root / "templates" / runtime.framework.key
            folder = root / "trials" / scenario.key / runtime.framework.key / str(index)
            folder.parent.mkdir(parents=True, exist_ok=True)
            return run_trial(runtime, scenario, template, folder, index)

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for n, trial in enumerate(pool.map(one, plan), 1):
                trials.append(trial)
                if n % 10 == 0 or n == len(plan):
                    log(f"  {n}/{len(plan)} trials done ({time.monotonic() - started:.0f} s)")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    ran = [r.framework for r in runtimes if r.framework.key not in skipped]
    rows = [summarize(trials, scenario, framework) for scenario in scenarios for framework in ran]
    elapsed = time.monotonic() - started
    command = " ".join(["python -m bench.effects", *(sys.argv[1:] if argv is None else argv)])
    versions = {r.framework.key: r.versions for r in runtimes if r.versions}
    print(table(rows, {k: v for k, v in skipped.items() if k in {f.key for f in frameworks}}))
    print()
    print(f"{command}: {len(trials)} trials in {elapsed:.0f} s, {started_at:%Y-%m-%d %H:%M} UTC")
    print(f"machine: {before['cpu']}, {before['cpus']} CPUs, {before['platform']}, load {before['load_average']}")
    shown = {", ".join(f"{name} {v}" for name, v in found.items()) for found in versions.values()}
    print("versions: " + "; ".join(sorted(shown)))
    untested = [f"{f.label}: {f.untested}" for f in frameworks if f.untested]
    print("durable add-ons not tested: " + "; ".join(untested))
    if args.json:
        document = {
            "command": command,
            "date": started_at.isoformat(timespec="seconds"),
            "elapsed_s": round(elapsed, 1),
            "machine": before,
            "load_average_after": machine()["load_average"],
            "gatedloop_commit": commit,
            "versions": versions,
            "frameworks": {f.key: {"label": f.label, "untested": f.untested} for f in frameworks},
            "scenarios": {s.key: {"title": s.title, "expected": s.expected, "meaning": s.meaning} for s in scenarios},
            "skipped": skipped,
            "rows": [asdict(row) for row in rows],
            "trials": [asdict(trial) for trial in trials],
            "table": table(rows, skipped),
        }
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
