"""`gatedloop doctor`: one line per check of the environment a first afternoon trips on, and a non-zero exit when
any fails. Nothing is changed: the database is opened read-only, settings are parsed as the commands parse them.

Each check says `ok`, `warn` (works, but probably not as meant) or `FAIL` (a command that needs it will fail), with
what it found and, when not ok, what to do.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import platform
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from gatedloop.checkpoints.schema import SchemaReport, postgres_schema, sqlite_schema
from gatedloop.cli.app import EXIT_COMPLETED, EXIT_FAILED, CliError, is_postgres, require_reachable_roles, shown_db
from gatedloop.cli.output import Output
from gatedloop.graph.load import GraphNotFound, choose_graph
from gatedloop.graph.parts_of import parts_of

Status = Literal["ok", "warn", "fail"]
DISTRIBUTION = "gatedloop"
SHOWN = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str


def python_check() -> Iterator[Check]:
    needed = importlib.metadata.metadata(DISTRIBUTION)["Requires-Python"] or ""
    running = platform.python_version()
    fits = SpecifierSet(needed).contains(running, prereleases=True)
    yield Check("python", "ok" if fits else "fail", f"{running} ({DISTRIBUTION} needs {needed or 'any'})")


def top_packages(distribution: importlib.metadata.Distribution) -> list[str]:
    """The shallowest public packages (or, for a single-module distribution, modules) a distribution installs:
    what importing it means (`langgraph-checkpoint-sqlite` installs `langgraph.checkpoint.sqlite` into a namespace
    package); read from its file list, not from every installed distribution's."""
    files = [f for f in distribution.files or [] if f.parts and not f.parts[0].endswith((".dist-info", ".data"))]
    packages = [
        f.parts[:-1] for f in files if f.name == "__init__.py" and not any(p.startswith("_") for p in f.parts[:-1])
    ]
    if not packages:
        return sorted(f.stem for f in files if len(f.parts) == 1 and f.suffix == ".py")
    depth = min(len(parts) for parts in packages)
    return sorted({".".join(parts) for parts in packages if len(parts) == depth})


def package_checks() -> Iterator[Check]:
    """Each requirement of the installed gatedloop (not its extras): installed in a version it accepts, importable."""
    for text in importlib.metadata.requires(DISTRIBUTION) or []:
        needed = Requirement(text)
        if needed.marker is not None and not needed.marker.evaluate({"extra": ""}):
            continue
        name = f"package {needed.name}"
        try:
            distribution = importlib.metadata.distribution(needed.name)
        except importlib.metadata.PackageNotFoundError:
            yield Check(name, "fail", f"not installed (needs {needed.specifier}): pip install '{needed}'")
            continue
        version = distribution.version
        if not needed.specifier.contains(version, prereleases=True):
            yield Check(name, "fail", f"{version} installed, {DISTRIBUTION} needs {needed.specifier}")
            continue
        problem = _import_problem(top_packages(distribution))
        yield Check(name, "fail" if problem else "ok", problem or f"{version} ({needed.specifier or 'any'})")


def _import_problem(modules: list[str]) -> str | None:
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # an installed package that does not import: say which, and why
            return f"installed, but import {module} fails: {type(exc).__name__}: {exc}"
    return None


def database_check(db: str) -> Iterator[Check]:
    shown = shown_db(db)
    try:
        if is_postgres(db):
            report = postgres_schema(db)
        elif not Path(db).is_file():
            folder = Path(db).parent
            writable = folder.is_dir() and os.access(folder, os.W_OK)
            yield Check(
                "database",
                "warn" if writable else "fail",
                f"no database at {shown} yet: the first run creates it"
                if writable
                else f"no database at {shown}, and its folder {folder} is missing or not writable",
            )
            return
        else:
            report = sqlite_schema(db)
    except ImportError as exc:
        yield Check("database", "fail", f"{shown} needs the postgres extra: pip install 'gatedloop[postgres]' ({exc})")
        return
    except (sqlite3.Error, OSError) as exc:
        yield Check("database", "fail", f"cannot read {shown}: {exc}")
        return
    except Exception as exc:  # psycopg's errors: the server's own message
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        yield Check("database", "fail", f"cannot reach {shown}: {first}")
        return
    yield _schema_check(shown, report)


def _schema_check(shown: str, report: SchemaReport) -> Check:
    where = f"{shown}: {report.engine}"
    if report.migration is not None and report.latest_migration is not None:
        where += f", LangGraph checkpoint migration {report.migration} of {report.latest_migration}"
        if report.migration > report.latest_migration:
            return Check(
                "database",
                "fail",
                f"{where}: written by a newer langgraph-checkpoint-postgres; upgrade it before using this database",
            )
    if report.fresh:
        return Check("database", "warn", f"{where}: no gatedloop tables yet (the first run creates them)")
    missing = report.missing_checkpoint_tables + report.missing_ledger_tables
    behind = report.migration is not None and report.migration < (report.latest_migration or 0)
    if missing or behind:
        named = f"missing {', '.join(missing)}" if missing else "older checkpoint tables"
        return Check(
            "database", "warn", f"{where}; {named}: made by an older release, brought up to date when next opened"
        )
    return Check("database", "ok", f"{where}; every checkpoint and ledger table is there")


def _auth_config(env: Mapping[str, str]) -> tuple[Any, Check]:
    """The reviewers' tokens (`GATEDLOOP_AUTH_FILE` / `GATEDLOOP_AUTH_TOKENS`) as the server and inbox load them."""
    if not (env.get("GATEDLOOP_AUTH_FILE") or env.get("GATEDLOOP_AUTH_TOKENS")):
        return None, Check("auth", "ok", "none configured (langgraph dev lets anyone in; the inbox needs --as)")
    try:
        from gatedloop.graph.auth import load_auth_config  # loads the environment's config on import, too

        config = load_auth_config(env)
    except ValueError as exc:  # AuthConfigError, raised while importing or loading
        return None, Check("auth", "fail", str(exc))
    assert config is not None
    users = {user.user_id for user in config.tokens.values()}
    return config, Check("auth", "ok", f"{len(config.tokens)} token(s) for {len(users)} user(s)")


def _inbox_module(name: str, extra: str) -> tuple[Any, str | None]:
    """`gatedloop.inbox.NAME`, or why it cannot be loaded: its extra is missing, or the auth configuration fails as
    the inbox loads it (`gatedloop.graph.auth` reads the environment when imported)."""
    try:
        return importlib.import_module(f"gatedloop.inbox.{name}"), None
    except ImportError as exc:
        return None, f"needs: pip install 'gatedloop[{extra}]' ({exc.name} is missing)"
    except ValueError as exc:
        return None, f"not checked: the inbox does not load ({exc})"


def webhook_check(env: Mapping[str, str]) -> Check:
    if not env.get("GATEDLOOP_NOTIFY_URLS"):
        return Check("webhooks", "ok", "none configured (GATEDLOOP_NOTIFY_URLS; or notify --webhook)")
    notify, problem = _inbox_module("notify", "inbox")
    if problem:
        return Check("webhooks", "fail", f"GATEDLOOP_NOTIFY_URLS is set; {problem}")
    try:
        config = notify.notify_config(env=env)
    except notify.NotifyConfigError as exc:
        return Check("webhooks", "fail", str(exc))
    return Check("webhooks", "ok", f"{len(config.webhooks)} webhook(s), signed, linking to {config.inbox_url}")


def slack_check(env: Mapping[str, str], auth: Any) -> Check:
    token, secret, users = (env.get(k) for k in ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "GATEDLOOP_SLACK_USERS"))
    if not (token or secret or users):
        return Check("slack", "ok", "not configured (SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET, GATEDLOOP_SLACK_USERS)")
    if not secret:
        given = "SLACK_BOT_TOKEN" if token else "GATEDLOOP_SLACK_USERS"
        return Check(
            "slack", "warn", f"{given} is set but SLACK_SIGNING_SECRET is not: Approve/Reject clicks cannot be verified"
        )
    slack, problem = _inbox_module("slack_actions", "slack")
    if problem:
        return Check("slack", "fail", f"SLACK_SIGNING_SECRET is set; {problem}")
    try:
        actions = slack.SlackActions.from_env(env, auth)
    except slack.SlackConfigError as exc:
        return Check("slack", "fail", str(exc))
    except ImportError as exc:  # slack_sdk, imported when the client is made
        return Check(
            "slack", "fail", f"SLACK_SIGNING_SECRET is set; needs: pip install 'gatedloop[slack]' ({exc.name})"
        )
    if not actions.users:
        return Check("slack", "warn", "GATEDLOOP_SLACK_USERS maps no Slack user: every click will be refused")
    return Check("slack", "ok", f"clicks verified, {len(actions.users)} Slack user(s) mapped to reviewers")


def graph_check(given: str | None, env: Mapping[str, str], folder: Path) -> Check:
    try:
        named = choose_graph(given, dict(env), folder)
    except GraphNotFound as exc:
        return Check("graph", "fail", str(exc))
    if named is None:
        return Check("graph", "ok", "none named (--graph, GATEDLOOP_GRAPH, or a langgraph.json here): the demo")
    try:
        require_reachable_roles(named)
    except CliError as exc:
        return Check("graph", "fail", str(exc))
    parts = parts_of(named.graph)
    tools = sorted(parts.registry.tools) if parts is not None else []
    return Check("graph", "ok", f"{named.reference} imports; tools: {', '.join(tools) or 'none'}")


def checks(args: argparse.Namespace) -> Iterator[Check]:
    env = os.environ
    yield from python_check()
    yield from package_checks()
    yield from database_check(args.db)
    auth, auth_check = _auth_config(env)
    yield auth_check
    yield webhook_check(env)
    yield slack_check(env, auth)
    yield graph_check(args.graph, env, Path.cwd())


def cmd_doctor(args: argparse.Namespace) -> int:
    out = Output(args.json)
    failed: list[str] = []
    for check in checks(args):
        out.record("check", check=check.name, status=check.status, detail=check.detail)
        out.say(f"{SHOWN[check.status]}  {check.name}: {check.detail}")
        if check.status == "fail":
            failed.append(check.name)
    out.record("doctor", ok=not failed, failed=failed)
    return EXIT_FAILED if failed else EXIT_COMPLETED


def add_command(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """`doctor`, on the main parser's `command` factory."""
    doctor = command("doctor", "check Python, packages, the database, auth, Slack and webhooks, and your graph")
    doctor.set_defaults(func=cmd_doctor)
