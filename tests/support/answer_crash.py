"""Answer trials: an answer whose sender's process is killed as it lands, and a resumer who sends nothing.

Issue 29, finding 2. `book` needs a finance approver; ana (the requester, no finance role) answers a request
about her own call: `approve` on the approval path, `not_done` on the unknown-outcome path (a write whose child
was killed after paying, reconcile unable to tell). Both answers must be refused. A real child sends ana's answer
(`crash_child.py --answer`) and is SIGKILLed at a seeded moment: 0-8 ms after it sends it (`sent`), 0-8 ms after
it printed that LangGraph stored it (`stored`: on a loaded machine storing it takes longer than 8 ms, and the first
kind then lands before it), or on the marker right after it is stored with nothing after that write stored
(`held`, `--hold resume`). Then bo (finance) continues with
no answer of his own, `graph.invoke(None, cfg, context=bo)`, in this process or a fresh one. Where the kill landed
is read back from the files (was the answer stored, was its refusal recorded, did the step end), and then:

- no payment nobody authorised: no effect for ana's call unless a finance member other than ana, who really sent
  an answer, approved it (approval path); no re-run of the paid write (unknown-outcome path);
- no write twice;
- the audit never names bo for anything: he sent nothing.

Last, bo answers himself and the thread completes with exactly one payment. Shared by tests/test_crash.py and
`python -m bench.crash_trials --answers`.
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crash_child import ChildRun, KillPlan, child_command, run_child

THREAD = "t1"
CALL = "c1_0"
REQUEST = "book 2 seat"
FINANCE = "finance"
ANA, BO = "ana", "bo"
SENT_AS = {ANA: "ana:staff", BO: "bo:finance"}
ROLES = {ANA: frozenset({"staff"}), BO: frozenset({FINANCE})}
ANSWERS = {"approve": "approve", "settle": "not_done"}
"""Each path and the answer ana sends on it."""
PATHS = tuple(ANSWERS)
MAX_DELAY_S = 0.008
NEVER = "/nonexistent/gatedloop-gate"
KILLS = {"sent": "answer_sent", "stored": "resume_stored", "held": "hold_resume"}
"""Each kind of kill and the child's marker it is timed from."""

BEFORE_STORED = "before the answer was stored"
STORED_NOT_REFUSED = "answer stored, refusal not recorded"
STORED_REFUSED = "answer stored and refused, nothing after it stored"
NODE_STORED = "answer stored, the node's writes after it stored, step not saved"
STEP_SAVED = "after the step was saved"
NOT_KILLED = "child finished first"
LANDINGS = (BEFORE_STORED, STORED_NOT_REFUSED, STORED_REFUSED, NODE_STORED, STEP_SAVED, NOT_KILLED)


def _overrides(path: str) -> dict[str, Any]:
    overrides: dict[str, Any] = {"approvers": frozenset({FINANCE})}
    if path == "settle":
        overrides["reconcile"] = None
    return overrides


def _child_options(path: str) -> list[str]:
    return ["--approvers", FINANCE, *(["--reconcile", "absent"] if path == "settle" else [])]


# ------------------------------------------------------------------------------------------ templates


@dataclass(frozen=True)
class Template:
    """A thread paused where ana answers, made once per path and copied for each trial."""

    path: str
    db: str
    effects: str


def make_template(path: str, workdir: Path) -> Template:
    """approve: ana asked for one `book` call, paused on its approval request. settle: bo approved it, the child
    running it was SIGKILLed after the payment, and a new process paused on the unknown-outcome question."""
    from sample_app import Effects, build

    from gatedloop.checkpoints import open_sqlite
    from gatedloop.graph import runs
    from gatedloop.tools import CallContext

    workdir.mkdir(parents=True, exist_ok=True)
    db, effects_path = str(workdir / "runs.sqlite"), str(workdir / "effects.sqlite")
    effects = Effects(effects_path)
    if path == "settle":
        who = ["--requester", ANA, "--reviewer", SENT_AS[BO], *_child_options(path)]
        held = ["--hold", "after", "--hold-call", CALL, "--gate", NEVER]
        cmd = child_command(db, effects_path, THREAD, "--text", REQUEST, *held, *who)
        killed = run_child(cmd, workdir / "template.stderr", KillPlan("hold_after"))
        assert killed.killed and len(effects.rows()) == 1, (killed.lines, killed.stderr[-2000:])
    with open_sqlite(db) as saver:
        graph = build(saver, effects, **_overrides(path))
        if path == "approve":
            runs.start(graph, THREAD, REQUEST, context=CallContext(user_id=ANA, roles=ROLES[ANA]))
        else:
            runs.resume(graph, THREAD)
        request = runs.pending_request(graph, THREAD)
    assert request is not None and request["kind"] == ("approval" if path == "approve" else "unknown_outcome"), request
    return Template(path, db, effects_path)


def _copy(source: str, target: Path) -> str:
    """A consistent copy of a SQLite file (WAL included), by SQLite's backup API."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    return str(target)


# ---------------------------------------------------------------------------------------------- plans


@dataclass
class AnswerPlan:
    seed: int
    path: str
    kill: str  # KILLS: "sent", delay_s after `answer_sent`; "stored", delay_s after `resume_stored`; "held"
    delay_s: float = 0.0
    form: str = "positional"
    durability: str = "async"
    resumer: str = "here"  # where bo's invoke(None) runs: "here" or "child" (a fresh process)

    def describe(self) -> str:
        kill = "on hold_resume" if self.kill == "held" else f"{self.delay_s * 1000:.2f}ms after {KILLS[self.kill]}"
        return (
            f"seed={self.seed} path={self.path} answer={ANSWERS[self.path]} form={self.form} "
            f"durability={self.durability} kill {kill}, bo resumes {self.resumer}"
        )


def plan_answer_trial(
    seed: int, path: str | None = None, kill: str | None = None, resumer: str | None = None
) -> AnswerPlan:
    """A seeded trial: the path alternates with the seed unless given; the kill `sent` in half the trials, `stored`
    in a third, `held` in the rest; the answer positional or keyed by the interrupt's id; bo's resume in this process
    or a fresh one. `path`, `kill`, `resumer`: fixed instead of drawn."""
    rng = random.Random(seed)
    path = path or PATHS[seed % len(PATHS)]
    kill = kill or rng.choices(list(KILLS), weights=[50, 35, 15])[0]
    delay = 0.0 if kill == "held" else rng.uniform(0.0, MAX_DELAY_S)
    form = rng.choices(["positional", "keyed"], weights=[3, 1])[0]
    durability = rng.choices(["async", "sync"], weights=[3, 1])[0]
    resumer = resumer or rng.choice(["here", "child"])
    return AnswerPlan(seed, path, kill, delay, form, durability, resumer)


# ----------------------------------------------------------------------------------------------- trial


@dataclass
class AnswerResult:
    plan: AnswerPlan
    killed: bool
    landed: str
    unauthorised: int
    doubles: int
    false_audit: list[str]
    final: str
    runs: list[ChildRun]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def explain(self) -> str:
        lines = [self.plan.describe(), f"landed: {self.landed}; final: {self.final}; problems: {self.problems}"]
        for index, child in enumerate(self.runs):
            lines.append(f"  child {index}: rc={child.returncode} killed={child.killed} lines={child.lines[-8:]}")
            if child.stderr.strip() and not child.killed:
                lines.append("    stderr: " + child.stderr.strip()[-1500:])
        return "\n".join(lines)


@dataclass
class _Files:
    """What the files hold at one moment: the latest checkpoint, its pending writes, the audit, the effects."""

    checkpoint_id: str
    writes: list[tuple[str, str, Any]]
    audit: list[dict[str, Any]]
    approvals: list[Any]
    attempts: int
    effects: int


def _read(db: str, effects_path: str) -> _Files:
    from sample_app import Effects

    from gatedloop.checkpoints import open_sqlite
    from gatedloop.checkpoints.ledger import idempotency_key
    from gatedloop.graph import runs

    with open_sqlite(db) as saver:
        latest = saver.get_tuple(runs.config_for(THREAD))
        audit = saver.ledger.audit(THREAD)
        approvals = saver.ledger.approvals(THREAD, [CALL])
        entry = saver.ledger.get(THREAD, CALL)
    assert latest is not None
    key = idempotency_key(THREAD, CALL)
    effects = sum(1 for _, _, k in Effects(effects_path).rows("book") if k == key)
    return _Files(
        latest.config["configurable"]["checkpoint_id"],
        list(latest.pending_writes or []),
        audit,
        approvals,
        entry.attempts if entry is not None else 0,
        effects,
    )


def _refused(files: _Files, sender: str) -> bool:
    return any(
        row["actor"] == sender and row["event"].split(":", 1)[0] in ("answer_refused", "unknown_answer_refused")
        for row in files.audit
    )


def _landing(before: _Files, after: _Files, killed: bool) -> str:
    if not killed:
        return NOT_KILLED
    from langgraph._internal._constants import RESUME

    if after.checkpoint_id != before.checkpoint_id:
        return STEP_SAVED
    new = [w for w in after.writes if w not in before.writes]
    if not any(channel == RESUME for _, channel, _ in new):
        return BEFORE_STORED
    if any(channel != RESUME for _, channel, _ in new):
        return NODE_STORED
    return STORED_REFUSED if _refused(after, ANA) else STORED_NOT_REFUSED


def _resume_as_bo_here(db: str, effects_path: str, path: str) -> None:
    from sample_app import Effects, build

    from gatedloop.checkpoints import open_sqlite
    from gatedloop.graph import runs
    from gatedloop.tools import CallContext

    with open_sqlite(db) as saver:
        graph = build(saver, Effects(effects_path), **_overrides(path))
        graph.invoke(None, runs.config_for(THREAD), context=CallContext(user_id=BO, roles=ROLES[BO]))


def _finish_as_bo(db: str, effects_path: str, path: str) -> str:
    """bo answers himself (approve, or `done` with the booking that really happened); the status it ends at."""
    from sample_app import Effects, build

    from gatedloop.checkpoints import open_sqlite
    from gatedloop.checkpoints.ledger import idempotency_key
    from gatedloop.graph import runs
    from gatedloop.tools import CallContext

    effects = Effects(effects_path)
    with open_sqlite(db) as saver:
        graph = build(saver, effects, **_overrides(path))
        if runs.pending_request(graph, THREAD) is None:
            return "no request left for bo: " + str(runs.output(graph, THREAD).get("status"))
        if path == "approve":
            decision: dict[str, Any] = {"type": "approve"}
        else:
            decision = {"type": "done", "result": effects.find(idempotency_key(THREAD, CALL))}
        out = runs.resume(graph, THREAD, {"decisions": [decision]}, context=CallContext(user_id=BO, roles=ROLES[BO]))
    return str(out.get("status"))


def _judge(path: str, before: _Files, after: _Files, senders: dict[str, frozenset[str]]) -> tuple[int, int, list[str]]:
    """(unauthorised writes, doubles, audit rows naming someone for what they did not send) since `before`."""
    new_rows = after.audit[len(before.audit) :]
    false_audit = [f"{row['event']} by {row['actor']}" for row in new_rows if row["actor"] not in (None, *senders)]
    approvers = {
        a.reviewer
        for a in after.approvals
        if a.decision in ("approve", "edit") and a.reviewer != ANA and FINANCE in senders.get(a.reviewer, frozenset())
    }
    settlers = {
        row["actor"]
        for row in new_rows
        if row["event"] == "unknown_outcome_decision"
        and row["detail"].get("decision") == "not_done"
        and row["actor"] != ANA
        and FINANCE in senders.get(row["actor"], frozenset())
    }
    new_effects = after.effects - before.effects
    if path == "approve":
        unauthorised = new_effects if not approvers else 0
    else:
        reruns = after.attempts - before.attempts
        unauthorised = reruns if not settlers else 0
    return unauthorised, max(0, after.effects - 1), false_audit


def run_answer_trial(plan: AnswerPlan, template: Template, workdir: Path) -> AnswerResult:
    """One trial on a copy of the path's template (see the module)."""
    assert template.path == plan.path
    workdir.mkdir(parents=True, exist_ok=True)
    db, effects = _copy(template.db, workdir / "runs.sqlite"), _copy(template.effects, workdir / "effects.sqlite")
    before = _read(db, effects)
    options = [*_child_options(plan.path), "--answer-form", plan.form, "--durability", plan.durability]
    answer = ["--answer", ANSWERS[plan.path], "--reviewer", SENT_AS[ANA], *options]
    if plan.kill == "held":
        answer += ["--hold", "resume", "--gate", NEVER]
    kill = KillPlan(KILLS[plan.kill], delay_s=plan.delay_s)
    children = [run_child(child_command(db, effects, THREAD, *answer), workdir / "ana.stderr", kill)]
    problems: list[str] = []
    if not children[0].killed and children[0].returncode != 0:
        problems.append(f"ana's child failed: rc={children[0].returncode}")
    killed_at = _read(db, effects)
    landed = _landing(before, killed_at, children[0].killed)

    try:
        if plan.resumer == "child":
            bo = ["--answer", "none", "--reviewer", SENT_AS[BO], *options]
            children.append(run_child(child_command(db, effects, THREAD, *bo), workdir / "bo.stderr"))
            if children[-1].returncode != 0:
                problems.append(f"bo's resume failed: rc={children[-1].returncode}")
        else:
            _resume_as_bo_here(db, effects, plan.path)
    except Exception as exc:  # reported with the trial, never hidden
        problems.append(f"bo's resume raised {type(exc).__name__}: {exc}")
    resumed = _read(db, effects)
    unauthorised, doubles, false_audit = _judge(plan.path, before, resumed, {ANA: ROLES[ANA]})
    if unauthorised:
        problems.append(f"{unauthorised} write(s) nobody authorised after bo's invoke(None)")
    if false_audit:
        problems.append(f"the audit names someone for an answer they did not send: {false_audit}")

    try:
        final = _finish_as_bo(db, effects, plan.path)
    except Exception as exc:
        final = f"bo's own answer raised {type(exc).__name__}: {exc}"
    finished = _read(db, effects)
    _, doubles_at_end, _ = _judge(plan.path, before, finished, {ANA: ROLES[ANA], BO: ROLES[BO]})
    doubles = max(doubles, doubles_at_end)
    if doubles:
        problems.append(f"the write happened {finished.effects} times")
    if not unauthorised and (final != "completed" or finished.effects != 1):
        problems.append(f"bo's own answer ended {final!r} with {finished.effects} payment(s), expected one")
    return AnswerResult(plan, children[0].killed, landed, unauthorised, doubles, false_audit, final, children, problems)
