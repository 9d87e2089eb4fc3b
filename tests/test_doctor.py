"""`gatedloop doctor` (issue 54): one line per check of what a first afternoon trips on, exit 1 when any fails;
driven through the CLI, in a folder of the test's own with an environment of its own."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from backends import Backend, isolated
from cli_in_process import run_cli

from gatedloop.checkpoints import open_sqlite

AGENT = '''
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel
from gatedloop.tools import ToolPolicy
from langchain_core.tools import tool


@tool
def refund(order_id: str) -> str:
    """Refund an order."""
    return "refunded"


graph = build_graph(ScriptedChatModel(), [refund], policies={"refund": ToolPolicy(effect="write", approval="always")})
'''
TOKENS = {"tokens": {"bo-api-token-7a3d6e1c4f": {"user_id": "bo", "roles": ["finance"]}}}


def doctor(folder: Path, *args: str, **env: str) -> tuple[int, dict[str, dict[str, Any]], dict[str, Any]]:
    """Exit code, each check by name, and the closing `doctor` record, from `doctor --json` in `folder`."""
    for name in [m for m in sys.modules if m == "agent" or m.startswith("gatedloop_user_graph_")]:
        del sys.modules[name]
    base = {key: value for key, value in os.environ.items() if not key.startswith(("GATEDLOOP_", "SLACK_"))}
    done = run_cli(["--json", *args, "doctor"], {**base, **env}, cwd=folder)
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert records and all(r["type"] == "check" for r in records[:-1]), done.stdout + done.stderr
    assert records[-1]["type"] == "doctor", done.stdout
    return done.returncode, {r["check"]: r for r in records[:-1]}, records[-1]


def statuses(checks: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: check["status"] for name, check in checks.items() if not name.startswith("package ")}


def test_a_healthy_setup_is_all_ok_one_line_per_check(tmp_path: Path):
    with open_sqlite(tmp_path / "runs.sqlite"):
        pass
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "langgraph.json").write_text(json.dumps({"graphs": {"shop": "agent:graph"}}))
    code, checks, summary = doctor(tmp_path, "--db", "runs.sqlite")
    assert (code, summary["ok"], summary["failed"]) == (0, True, [])
    assert statuses(checks) == dict.fromkeys(["python", "database", "auth", "webhooks", "slack", "graph"], "ok")
    packages = {name: c for name, c in checks.items() if name.startswith("package ")}
    assert "package langgraph" in packages and all(c["status"] == "ok" for c in packages.values())
    assert packages["package langgraph"]["detail"].split()[0].count(".") >= 1  # its installed version
    assert "every checkpoint and ledger table is there" in checks["database"]["detail"]
    assert checks["graph"]["detail"] == "shop imports; tools: refund"
    human = run_cli(["--db", "runs.sqlite", "doctor"], {}, cwd=tmp_path)
    lines = human.stdout.splitlines()
    assert len(lines) == len(checks) and all(line.startswith("ok ") for line in lines), human.stdout


def test_each_broken_setting_fails_its_own_line_and_the_exit(tmp_path: Path):
    (tmp_path / "auth.json").write_text(json.dumps(TOKENS))
    env = {
        "GATEDLOOP_AUTH_FILE": str(tmp_path / "auth.json"),
        "GATEDLOOP_NOTIFY_URLS": "https://hooks.example.com/approvals",  # no GATEDLOOP_NOTIFY_SECRET to sign with
        "SLACK_BOT_TOKEN": "xoxb-test-token",
        "SLACK_SIGNING_SECRET": "s3cret",
        "GATEDLOOP_SLACK_USERS": json.dumps({"U1": {"token": "not-one-of-the-auth-files-tokens"}}),
    }
    code, checks, summary = doctor(tmp_path, "--db", "missing/runs.sqlite", "--graph", "nowhere:graph", **env)
    assert code == 1 and summary["failed"] == ["database", "webhooks", "slack", "graph"]
    assert statuses(checks)["auth"] == "ok" and checks["auth"]["detail"] == "1 token(s) for 1 user(s)"
    assert "GATEDLOOP_NOTIFY_SECRET is not set" in checks["webhooks"]["detail"]
    assert "not one of the auth configuration's" in checks["slack"]["detail"]
    assert "cannot import nowhere" in checks["graph"]["detail"]
    assert "missing" in checks["database"]["detail"]

    (tmp_path / "auth.json").write_text('{"tokens": {"short": {"user_id": "bo"}}}')
    code, checks, summary = doctor(tmp_path, **{"GATEDLOOP_AUTH_FILE": str(tmp_path / "auth.json")})
    assert code == 1 and summary["failed"] == ["auth"] and "at least" in checks["auth"]["detail"]


def test_settings_that_work_but_not_as_meant_are_warnings(tmp_path: Path):
    code, checks, _ = doctor(tmp_path, "--db", "new.sqlite", SLACK_BOT_TOKEN="xoxb-test-token")
    assert code == 0
    assert statuses(checks)["slack"] == "warn" and "SLACK_SIGNING_SECRET is not" in checks["slack"]["detail"]
    assert statuses(checks)["database"] == "warn" and "first run creates it" in checks["database"]["detail"]


def test_the_database_check_reads_each_backend_and_its_schema(backend: Backend, tmp_path: Path):
    with isolated(backend) as store:
        code, checks, _ = doctor(tmp_path, "--db", store.db)
        assert code == 0 and statuses(checks)["database"] == "warn", checks["database"]  # nothing created yet
        with store.open():
            pass
        code, checks, _ = doctor(tmp_path, "--db", store.db)
    assert code == 0 and statuses(checks)["database"] == "ok", checks["database"]
    if backend.name == "postgres":
        assert "LangGraph checkpoint migration" in checks["database"]["detail"]
        assert ":***@" in checks["database"]["detail"]  # the password is not printed
