"""The `gatedloop` command, run as a real subprocess on a real SQLite file: results, pauses, and every failure
as one line on stderr with its documented exit code (no traceback without --debug)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pty
import select
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cli_in_process import run_cli
from doc_text import section

from gatedloop.cli.main import (
    ANSWER_HINT,
    DECISION_FLAGS,
    DEFAULT_DB,
    EXIT_BUSY,
    EXIT_COMPLETED,
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_PAUSED,
    EXIT_REFUSED,
    EXIT_USAGE,
    parser,
)

SEAT = "Reserve a seat in workshop WS-101 for Alice"


def cli_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "GATEDLOOP_MODEL": "demo", "OPENAI_API_KEY": "", "GATEDLOOP_GRAPH": "demo"}
    env.pop("OPENAI_BASE_URL", None)
    env.update(extra)
    return env


def cli_command(*args: str, db: str | None) -> list[str]:
    return [sys.executable, "-m", "gatedloop.cli.main", *(["--db", db] if db else []), *args]


def cli(
    *args: str,
    db: str | None,
    code: int | None = EXIT_COMPLETED,
    env: dict[str, str] | None = None,
    real_process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`gatedloop [--db DB] ARGS`, in this process as a fresh one runs it (support/cli_in_process.py), or in a real
    process where it matters (a lock this process holds)."""
    if real_process:
        out = subprocess.run(
            cli_command(*args, db=db),
            capture_output=True,
            text=True,
            env=env or cli_env(),
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
    else:
        out = run_cli(cli_command(*args, db=db)[3:], env or cli_env())
    if code is not None:
        assert out.returncode == code, out.stdout + out.stderr
    return out


def interruptible() -> None:
    """In the child before it starts: Ctrl-C acts as at a shell. A test run started as a background job (`cmd &`
    in a script) has SIGINT ignored, and a child inherits that, so the CLI would never see the signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def one_line(err: str) -> str:
    """The failure as printed: exactly one line, no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("gatedloop: "), err
    return lines[0]


def json_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]  # every line must be JSON


def paused(db: str, thread: str, question: str = SEAT) -> str:
    """Run to the approval; the request id the CLI tells the reviewer to answer (`--request ID`)."""
    out = cli("run", question, "--thread", thread, db=db, code=EXIT_PAUSED)
    assert f"thread {thread} is waiting" in out.stdout and "reserve_seat" in out.stdout
    return out.stdout.split("--request ")[1].split()[0]


def test_demo_runs_offline_shows_an_approval_and_a_resumed_thread(tmp_path):
    out = cli("demo", db=str(tmp_path / "demo.sqlite"))
    assert "Approval needed" in out.stdout
    assert "Resuming thread lunch-" in out.stdout and "in a new process" in out.stdout
    assert out.stdout.count("status: completed") >= 6
    assert "reviewer edits participant to Bob" in out.stdout and "for Bob" in out.stdout
    assert "rejected_by_reviewer" in out.stdout


def test_a_paused_thread_refusals_unknown_threads_json_and_show(tmp_path):
    from gatedloop.checkpoints.lease import thread_lease

    db = str(tmp_path / "runs.sqlite")
    request = paused(db, "w1")
    [listed] = json_lines(cli("threads", "--json", db=db).stdout)
    assert (listed["type"], listed["thread_id"], listed["status"]) == ("thread", "w1", "waiting")
    assert listed["request_id"] == request  # what `resume --request` needs, without parsing text
    waiting = json_lines(cli("--json", "show", "w1", db=db).stdout)[-1]
    assert (waiting["type"], waiting["status"], waiting["request_id"]) == ("status", "waiting", request)

    unnamed = cli("resume", "w1", "--approve", db=db, code=EXIT_USAGE)
    assert f"name the request you answer: --request {request}" in one_line(unnamed.stderr)
    bad = cli("resume", "w1", "--request", request, "--edit", "{not json", db=db, code=EXIT_USAGE)
    assert "--edit is not JSON" in one_line(bad.stderr)
    two = json.dumps([{"event_id": "WS-101", "participant": "Bob"}, {"event_id": "WS-102", "participant": "Al"}])
    extra = cli("resume", "w1", "--request", request, "--edit", two, db=db, code=EXIT_REFUSED)
    assert "--edit needs 1 argument object(s)" in one_line(extra.stderr) and "got 2" in extra.stderr
    for args in (("resume", "nosuch", "--approve"), ("show", "nosuch"), ("cancel", "nosuch")):
        unknown = cli(*args, db=db, code=EXIT_NOT_FOUND)
        assert "unknown thread 'nosuch'" in one_line(unknown.stderr)
    with thread_lease(db, "w1"):
        busy = cli("resume", "w1", "--request", request, "--approve", db=db, code=EXIT_BUSY, real_process=True)
    assert "being run by another process" in one_line(busy.stderr)

    answer = ("resume", "w1", "--request", request, "--approve", "--user", "rita", "--json")
    resumed = json_lines(cli(*answer, db=db).stdout)
    assert resumed[-1]["type"] == "result" and resumed[-1]["status"] == "completed"
    assert any(e["type"] == "tool" and e["event"] == "tool_finished" for e in resumed)
    assert [e["tool"] for e in resumed if e["type"] == "tool" and e["event"] == "tool_finished"] == ["reserve_seat"]

    shown = cli("show", "w1", db=db).stdout
    assert "first event 20" in shown and " UTC" in shown
    approved = next(line for line in shown.splitlines() if "approved by rita after" in line)
    ran = next(line for line in shown.splitlines() if "ran: ok in" in line)
    assert approved.split()[0].count(":") == 2 and ran.endswith((" ms", " s"))  # HH:MM:SS, then a duration
    records = json_lines(cli("--json", "show", "w1", db=db).stdout)
    assert [r["type"] for r in records][-1] == "status" and {"message", "audit"} <= {r["type"] for r in records}
    assert records[-1]["request_id"] is None  # answered: nothing pending
    assert any(r["type"] == "audit" and r["event"] == "decision" and r["actor"] == "rita" for r in records)

    drawn = cli("show", "w1", "--mermaid", db=db).stdout
    steps = [line.split('"')[1].split(". ", 1)[1] for line in drawn.splitlines() if '["' in line]
    assert steps == ["model", "validate", "approve (paused for a person)", "execute", "model", "finalize"]
    assert "done([completed])" in drawn
    again = cli("resume", "w1", "--approve", db=db, code=EXIT_REFUSED)
    assert "not waiting for an answer (status: completed" in one_line(again.stderr)


def test_the_answer_hint_pasted_as_printed_resumes_the_same_thread_in_the_same_database(tmp_path):
    """A run on `--db` other than the default prints a hint naming that database (quoted: the name has a space);
    run word for word, it approves the same thread, and no default database appears (issue 32, item 1)."""
    env = {k: v for k, v in cli_env().items() if k != "GATEDLOOP_DB"}
    ran = run_cli(["--db", "other runs.sqlite", "run", SEAT, "--thread", "h1"], env, cwd=tmp_path)
    assert ran.returncode == EXIT_PAUSED, ran.stdout + ran.stderr
    [line] = [line for line in ran.stdout.splitlines() if "Answer with: " in line]
    command = line.split("Answer with: ")[1].removesuffix(" " + ANSWER_HINT)
    words = shlex.split(command)
    assert words[:3] == ["gatedloop", "resume", "h1"] and "other runs.sqlite" in words
    resumed = run_cli([*words[1:], "--approve"], env, cwd=tmp_path)
    assert resumed.returncode == EXIT_COMPLETED, resumed.stdout + resumed.stderr
    assert "thread: h1  status: completed" in resumed.stdout
    assert not (tmp_path / DEFAULT_DB).exists()


def test_an_answer_for_a_request_no_longer_pending_is_refused(tmp_path):
    """The reviewer was shown WS-101 for Ana; the user then asked for WS-102 for Mallory (issue 10, finding 5)."""
    db = str(tmp_path / "runs.sqlite")
    shown = paused(db, "w7", "Reserve a seat in workshop WS-101 for Ana")
    paused(db, "w7", "Reserve a seat in workshop WS-102 for Mallory")
    out = cli("resume", "w7", "--request", shown, "--approve", db=db, code=EXIT_REFUSED)
    assert "not the pending one" in one_line(out.stderr) and "reserve_seat" in out.stderr
    assert repr(shown) in one_line(out.stderr)
    history = cli("show", "w7", db=db).stdout
    assert "superseded" in history and "Reserved" not in history  # WS-101 superseded, nothing booked
    assert "waiting for any reviewer: reserve_seat" in cli("threads", db=db).stdout


def test_an_answer_for_a_request_never_asked_is_not_called_decided(tmp_path):
    """A mistyped request id is refused without claiming the request was ever pending; nothing runs."""
    db = str(tmp_path / "runs.sqlite")
    paused(db, "w8", "Reserve a seat in workshop WS-101 for Ana")
    out = cli("resume", "w8", "--request", "req-typo", "--approve", db=db, code=EXIT_REFUSED)
    message = one_line(out.stderr)
    assert "'req-typo', which is not the pending one (decided, replaced, or never asked)" in message
    assert "no longer" not in message
    assert "Reserved" not in cli("show", "w8", db=db).stdout
    assert "waiting for any reviewer: reserve_seat" in cli("threads", db=db).stdout


def test_json_before_or_after_the_command_prints_json_lines_only(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    events = json_lines(cli("run", "订单 ORD-2026-001 到哪里了?", "--thread", "j1", "--json", db=db).stdout)
    assert {e["type"] for e in events} == {"step", "tool", "result"}
    assert events[-1] == {
        "type": "result",
        "thread_id": "j1",
        "status": "completed",
        "answer": events[-1]["answer"],
        "stop_detail": None,
    }
    paused_run = cli("--json", "run", SEAT, "--thread", "j2", db=db, code=EXIT_PAUSED)
    request = json_lines(paused_run.stdout)[-1]
    assert request["type"] == "request" and request["thread_id"] == "j2"
    assert request["request"]["action_requests"][0]["name"] == "reserve_seat"  # the request itself, not a repr


def test_cancelled_threads_say_so_and_refuse_answers_with_the_status(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    paused(db, "w5")
    assert "can no longer be answered" in cli("cancel", "w5", db=db).stdout
    listed = cli("threads", db=db).stdout
    assert "cancelled" in listed and "waiting for any reviewer" not in listed
    out = cli("resume", "w5", "--approve", db=db, code=EXIT_REFUSED)
    assert "answer refused" in one_line(out.stderr) and "status: cancelled" in out.stderr


def _claimed(db: str, thread: str) -> bool:
    try:
        with sqlite3.connect(db, timeout=1) as conn:
            rows = conn.execute(
                "SELECT 1 FROM gatedloop_ledger WHERE thread_id=? AND state='claimed'", (thread,)
            ).fetchall()
    except sqlite3.OperationalError:
        return False
    return bool(rows)


@contextlib.contextmanager
def resuming_into_a_held_write(tmp_path: Path, db: str, thread: str, **popen: Any) -> Iterator[subprocess.Popen]:
    """`gatedloop resume THREAD --approve` as a child process, yielded once its reserve_seat write is claimed and
    waiting on the tools' data file, which we hold until the block ends (the child is killed if anything fails)."""
    request = paused(db, thread)
    holder = sqlite3.connect(tmp_path / "runs.demo-data.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    child = subprocess.Popen(
        cli_command("resume", thread, "--request", request, "--approve", db=db),
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        preexec_fn=interruptible,
        **popen,
    )
    try:
        deadline = time.monotonic() + 30
        while not _claimed(db, thread):
            assert time.monotonic() < deadline and child.poll() is None, "the write never started"
            time.sleep(0.05)
        yield child
    except BaseException:
        child.kill()
        raise
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_crash_mid_write_is_explained_and_resume_settles_it(tmp_path):
    """SIGKILL while reserve_seat is writing (it waits on the tools' data file, which we hold)."""
    db = str(tmp_path / "runs.sqlite")
    with resuming_into_a_held_write(tmp_path, db, "w6", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as child:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    sentence = "a write to reserve_seat was running when the process stopped; resume settles it"
    assert sentence in cli("threads", db=db).stdout
    assert sentence in cli("show", "w6", db=db).stdout
    settled = cli("resume", "w6", db=db)
    assert f"settling: {sentence}" in settled.stdout and "status: completed" in settled.stdout
    shown = cli("show", "w6", db=db).stdout
    assert "run again (attempt 2): the process running it stopped" in shown and "rerun_" not in shown


def test_ctrl_c_mid_run_is_one_line_and_the_thread_goes_on_from_its_last_step(tmp_path):
    """SIGINT (Ctrl-C) while reserve_seat waits on the tools' data file, which we hold."""
    db = str(tmp_path / "runs.sqlite")
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    with resuming_into_a_held_write(tmp_path, db, "i1", **pipes) as child:
        child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130
    assert f"interrupted; thread i1 stopped mid-run: gatedloop resume i1 --db {db} goes on" in one_line(err)
    listed = cli("threads", db=db).stdout
    assert "i1" in listed and "resume to go on" in listed and "stopped before ;" not in listed
    assert "status: completed" in cli("resume", "i1", db=db).stdout


class Terminal:
    """The CLI on a pseudo-terminal, as a person at a shell runs it."""

    def __init__(self, *args: str, db: str):
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            cli_command(*args, db=db),
            env=cli_env(),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            close_fds=True,
            preexec_fn=interruptible,
        )
        os.close(slave)
        self.text = ""

    def expect(self, needle: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            assert time.monotonic() < deadline, f"no {needle!r} in {self.text!r}"
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    self.text += os.read(self.master, 4096).decode(errors="replace")
                except OSError:  # the child closed the terminal
                    assert needle in self.text, self.text
                    return

    def wait_reading(self) -> None:
        """Until the child sleeps in its read of the terminal (a signal sent just before that read begins would
        only set Python's flag, and the read would not notice it: a person is never that fast)."""
        deadline = time.monotonic() + 30
        asleep = 0
        while asleep < 3:
            assert time.monotonic() < deadline, "the CLI never waited for input"
            asleep = asleep + 1 if self._reading_the_terminal() else 0
            time.sleep(0.05)

    def _reading_the_terminal(self) -> bool:
        """Asleep in the kernel's terminal read (not in any other wait, such as a lock: under load the process
        sleeps for other reasons before it reaches its prompt's read)."""
        with open(f"/proc/{self.proc.pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] != "S":
                return False
        with open(f"/proc/{self.proc.pid}/wchan") as wchan:
            where = wchan.read().strip()
        return where in ("wait_woken", "n_tty_read") or "tty" in where

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def finish(self) -> int:
        code = self.proc.wait(timeout=60)
        while True:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if not ready:
                break
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                break
            if not chunk:
                break
            self.text += chunk.decode(errors="replace")
        os.close(self.master)
        return code


def test_at_a_terminal_ctrl_c_and_ctrl_d_leave_the_request_waiting_and_resume_prompts(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    term = Terminal("run", SEAT, "--thread", "p1", db=db)
    term.expect("[a]pprove")
    term.wait_reading()
    term.proc.send_signal(signal.SIGINT)  # what the terminal sends for Ctrl-C
    assert term.finish() == EXIT_PAUSED
    assert "Traceback" not in term.text and "KeyboardInterrupt" not in term.text
    assert "thread p1 is still waiting: gatedloop resume p1" in term.text

    term = Terminal("resume", "p1", db=db)  # no answer given: at a terminal it asks
    term.expect("[a]pprove")
    term.send("\x04")  # Ctrl-D
    assert term.finish() == EXIT_PAUSED
    assert "Traceback" not in term.text and "EOFError" not in term.text
    assert "thread p1 is still waiting: gatedloop resume p1" in term.text

    term = Terminal("resume", "p1", "--user", "tess", db=db)
    term.expect("[a]pprove")
    term.send("r\n")
    term.expect("reason")
    term.send("wrong room\n")
    assert term.finish() == EXIT_COMPLETED, term.text
    assert "wrong room" in term.text and "status: completed" in term.text
    assert "rejected by tess" in cli("show", "p1", db=db).stdout


def test_an_unreachable_model_server_ends_with_error_in_one_line_per_failure(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = cli_env(
        GATEDLOOP_MODEL="gpt-4o-mini", OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1"
    )
    out = cli("run", "hello", "--thread", "u1", db=str(tmp_path / "r.sqlite"), code=EXIT_FAILED, env=env)
    assert "status: error" in out.stdout and "could not be reached" in out.stdout
    assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) <= 2, out.stderr


def run_read_only(folder: Path, *args: str, db: str) -> subprocess.CompletedProcess[str]:
    """`gatedloop --db DB ARGS` as a process of its own with `folder` read-only: as root (which ignores file modes)
    a read-only bind mount in a private mount namespace (support/read_only_cli.py, forked from the preloaded
    server), else the folder and files without write permission."""
    if os.geteuid() != 0:
        for item in [folder, *folder.iterdir()]:
            item.chmod(0o555 if item.is_dir() else 0o444)
        return subprocess.run(cli_command(*args, db=db), capture_output=True, text=True, env=cli_env(), timeout=120)
    from preloaded import run

    script = str(Path(__file__).parent / "support" / "read_only_cli.py")
    return run([sys.executable, script, str(folder), "--db", db, *args], cli_env(), timeout=120)


def test_a_read_only_database_fails_in_one_line_naming_it_and_can_still_be_read(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    db = str(folder / "runs.sqlite")
    cli("run", "What is 2 + 3?", "--thread", "r1", db=db)
    for extra in folder.glob("runs.sqlite-*"):  # a cleanly closed copy, as one would hand over
        extra.unlink()

    def run(*args: str, code: int) -> subprocess.CompletedProcess[str]:
        out = run_read_only(folder, *args, db=db)
        assert out.returncode == code, out.stdout + out.stderr
        return out

    failed = run("run", "What is 1 + 1?", code=EXIT_FAILED)
    line = one_line(failed.stderr)
    assert db in line and "demo-data" not in line and "writable" in line
    assert "r1" in run("threads", code=EXIT_COMPLETED).stdout
    assert "2 + 3 = 5" in run("show", "r1", code=EXIT_COMPLETED).stdout


def test_a_busy_tools_data_file_does_not_block_the_cli(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    cli("run", "What is 2 + 3?", db=db)
    holder = sqlite3.connect(tmp_path / "runs.demo-data.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        out = cli("run", "What is 4 + 4?", "--thread", "b1", db=db)  # used to wait 10 s, then a traceback
        assert "4 + 4 = 8" in out.stdout and not out.stderr
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_usage_and_configuration_errors_are_one_line_and_debug_shows_the_traceback(tmp_path):
    from gatedloop.cli.main import EXIT_CODES

    db = str(tmp_path / "runs.sqlite")
    assert "invalid choice" in one_line(cli("bogus", db=db, code=EXIT_USAGE).stderr)
    assert "invalid thread id" in one_line(cli("show", "../x", db=db, code=EXIT_USAGE).stderr)
    env = cli_env(GATEDLOOP_MODEL="gpt-4o-mini")
    env.pop("OPENAI_API_KEY")
    missing_key = cli("run", "hello", db=db, code=EXIT_USAGE, env=env)
    assert "needs OPENAI_API_KEY" in one_line(missing_key.stderr)
    debug = cli("run", "hello", "--debug", db=db, code=None, env=env)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "Missing credentials" in debug.stderr

    cli_doc = section("CLI")
    exit_codes = cli_doc[cli_doc.index("Exit codes") :]
    helptext = cli("--help", db=None).stdout
    for code in EXIT_CODES:
        assert f"| {code} |" in exit_codes, code
        assert f"{code:>3}  " in helptext


def test_resume_help_explains_every_decision_flag():
    """Each decision flag of `resume` is listed in its --help with a line saying what it does (issue 32, item 3:
    --approve and --reject had none)."""
    shown = " ".join(cli("resume", "--help", db=None).stdout.split())
    [commands] = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    options = {o: a for a in commands.choices["resume"]._actions for o in a.option_strings}
    for flag in DECISION_FLAGS:
        action = options["--" + flag.replace("_", "-")]
        assert action.help, f"{action.option_strings[0]} has no help"
        assert action.option_strings[0] in shown and " ".join(action.help.split()) in shown


def test_a_port_outside_1_to_65535_is_refused_before_anything_listens(tmp_path):
    """`--port 99999` used to be announced as 99999 while the socket layer listened on 34463 (99999 mod 65536)."""
    db = str(tmp_path / "runs.sqlite")
    for port, shown in (("99999", "99999"), ("65536", "65536"), ("0", "0"), ("-1", "-1"), ("http", "'http'")):
        out = cli("inbox", "--as", "ana", "--port", port, db=db, code=EXIT_USAGE)
        assert f"argument --port: {shown} is not a port number (1-65535)" in one_line(out.stderr)
    assert not Path(db).exists()


def test_a_db_in_a_folder_that_does_not_exist_is_refused_by_every_command_and_nothing_is_created(tmp_path):
    missing = tmp_path / "nope"
    db = str(missing / "runs.sqlite")
    with socket.socket() as taken:  # were the check gone, the inbox would fail to bind here instead of serving
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for args in (
            ("run", "What is 2 + 3?"),
            ("threads",),
            ("show", "t1"),
            ("cancel", "t1"),
            ("resume", "t1", "--approve"),
            ("inbox", "--as", "ana", "--port", port),
            ("demo",),
        ):
            out = cli(*args, db=db, code=EXIT_NOT_FOUND)
            assert f"the folder {missing} of --db {db} does not exist: create it (mkdir -p {missing})" in one_line(
                out.stderr
            ), args
    assert not missing.exists()


def test_under_json_every_failure_is_one_json_object_on_stderr_with_the_exit_code_of_the_text_one(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    paused(db, "w1")
    failing = {
        ("bogus",): EXIT_USAGE,
        ("inbox", "--as", "ana", "--port", "99999"): EXIT_USAGE,
        ("show", "../x"): EXIT_USAGE,
        ("resume", "w1", "--approve"): EXIT_USAGE,
        ("show", "nosuch"): EXIT_NOT_FOUND,
        ("--db", str(tmp_path / "nope" / "x.sqlite"), "threads"): EXIT_NOT_FOUND,
        ("resume", "w1", "--request", "req-0", "--edit", "[{}, {}]"): EXIT_REFUSED,
    }
    for args, code in failing.items():
        text = one_line(cli(*args, db=db, code=code).stderr)
        as_json = cli(*args, "--json", db=db, code=code)
        assert not as_json.stdout, args
        [error] = json_lines(as_json.stderr)
        assert error == {"type": "error", "error": text.removeprefix("gatedloop: "), "exit": code}


def test_json_holds_for_demo_and_cancel(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    demo = json_lines(cli("--json", "demo", db=str(tmp_path / "demo.sqlite")).stdout)
    scenarios = [r["scenario"] for r in demo if r["type"] == "scenario"]
    assert scenarios == ["order", "trip", "math", "lunch", "workshop", "reject"]
    results = [r for r in demo if r["type"] == "result"]  # the lunch's from the resuming process's own --json
    assert len(results) == 6 and {r["status"] for r in results} == {"completed"}
    [request] = [r for r in demo if r["type"] == "request"]
    assert request["request"]["action_requests"][0]["name"] == "create_event"
    assert demo[-1] == {"type": "demo", "db": str(tmp_path / "demo.sqlite"), "failures": 0}

    paused(db, "w1")
    cancelled = json_lines(cli("cancel", "w1", "--json", db=db).stdout)
    assert cancelled == [{"type": "cancel", "thread_id": "w1", "cancelled": True, "status": "cancelled"}]
    again = json_lines(cli("cancel", "w1", "--json", db=db).stdout)
    assert again == [{"type": "cancel", "thread_id": "w1", "cancelled": True, "status": "cancelled"}]


def test_under_json_a_log_record_is_a_json_line(capsys):
    from gatedloop.cli.output import configure_logging

    configure_logging(debug=False, as_json=True)
    try:
        logging.getLogger("langgraph").error("checkpoint write failed\nTraceback (most recent call last): ...")
    finally:
        configure_logging(debug=False)
    assert json_lines(capsys.readouterr().err) == [
        {"type": "log", "level": "error", "logger": "langgraph", "message": "checkpoint write failed"}
    ]


def test_a_reader_that_closes_the_output_ends_the_command_quietly_with_sigpipes_code(tmp_path):
    """`gatedloop ... | head -1`: once the reader is gone, nothing is printed and nothing says "unexpected
    BrokenPipeError"; the exit code is a SIGPIPE's (141), as shells expect. A real process: the pipe is the point."""
    db = str(tmp_path / "runs.sqlite")
    command = [sys.executable, "-m", "gatedloop.cli.main", "--db", db, "demo"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(), text=True)
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.readline().startswith("gatedloop demo")  # it has started writing
    child.stdout.close()  # the reader goes away, as `head -1` does after its line
    stderr = child.stderr.read()
    assert child.wait(timeout=120) == 141, stderr
    assert "BrokenPipeError" not in stderr and "unexpected" not in stderr, stderr
