"""A CLI call prints no Python warning (issue 54): a first afternoon's commands, in a real interpreter started with
`-W error -X dev` (every warning an error, resource warnings on), one interpreter for all of them since starting
Python and importing LangChain costs a second each: run, resume, show, threads, stats, grant list, doctor, demo, on
the demo graph and on the tutorial's agent (`--graph`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parent.parent / "examples" / "tutorial"


def test_a_first_afternoon_of_cli_calls_prints_no_python_warning(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEDLOOP_", "PYTHONWARNINGS"))}
    env.update(GATEDLOOP_MODEL="demo", OPENAI_API_KEY="")
    script = tmp_path / "first_afternoon.py"
    script.write_text(FIRST_AFTERNOON)
    done = subprocess.run(
        [sys.executable, "-W", "error", "-X", "dev", str(script), str(tmp_path / "runs.sqlite"), str(TUTORIAL)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Warning" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"codes": EXPECTED}


EXPECTED = {
    "run": 3,
    "resume": 0,
    "show": 0,
    "threads": 0,
    "stats": 0,
    "grant list": 0,
    "doctor": 0,
    "demo": 0,
    "tutorial run": 3,
}

FIRST_AFTERNOON = r"""
import contextlib, io, json, os, sys
from gatedloop.cli.main import main

db, tutorial = sys.argv[1], sys.argv[2]
codes = {}

def gatedloop(name, *args, cwd=None):
    out = io.StringIO()
    here = os.getcwd()
    os.chdir(cwd or here)
    try:
        with contextlib.redirect_stdout(out):
            codes[name] = main(["--db", db, "--json", *args])
    finally:
        os.chdir(here)
    return [json.loads(line) for line in out.getvalue().splitlines()]

asked = gatedloop("run", "--graph", "demo", "run", "reserve a workshop seat for Alice", "--thread", "t1")
[request] = [r["request"] for r in asked if r["type"] == "request"]
gatedloop("resume", "--graph", "demo", "resume", "t1", "--request", request["request_id"], "--approve")
gatedloop("show", "--graph", "demo", "show", "t1")
gatedloop("threads", "--graph", "demo", "threads")
gatedloop("stats", "stats")
gatedloop("grant list", "grant", "list")
gatedloop("doctor", "doctor")
gatedloop("demo", "demo")
gatedloop("tutorial run", "--user", "ana", "run", "refund order A-1001", "--thread", "t2", cwd=tutorial)
print(json.dumps({"codes": codes}))
"""
