"""The Postgres the tests run against, and a real child process that drives a thread on it.

The server comes from `GATEDLOOP_TEST_PG_URL` (`.ci/start_postgres.sh` starts one and prints the line). With
no URL, or without the `postgres` extra installed, the Postgres tests are skipped on a developer's machine
and FAIL under CI (`CI=true`): a skip must not hide a missing server there.

Run as a script (`python tests/pg_server.py --db env --effects ... --thread ...`, tests/ on PYTHONPATH) it is
`crash_child.py` on Postgres: the same options, markers and driving (its `child_main`), with the
checkpointer from `open_postgres`. `--db env` reads the URL from `GATEDLOOP_TEST_PG_URL`, so the password
stays out of the process list. `python tests/pg_server.py claim ...` races ledger claims instead, and
`python tests/pg_server.py open ...` races the first opening of a fresh database.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

URL_ENV = "GATEDLOOP_TEST_PG_URL"
TESTS = Path(__file__).resolve().parent


class PostgresUnavailable(RuntimeError):
    pass


def in_ci(environ: dict[str, str] | None = None) -> bool:
    value = (environ if environ is not None else os.environ).get("CI", "")
    return value.strip().lower() in ("true", "1", "yes")


def find_postgres(environ: dict[str, str] | None = None) -> str:
    """The test server's URL; PostgresUnavailable (with the reason) if there is none or the extra is missing."""
    env = environ if environ is not None else os.environ
    url = env.get(URL_ENV, "").strip()
    if not url:
        raise PostgresUnavailable(f"{URL_ENV} is not set (start a server with .ci/start_postgres.sh)")
    try:
        import gatedloop.checkpoints.postgres  # noqa: F401
    except ImportError as exc:
        raise PostgresUnavailable(f"the postgres extra is not installed ({exc})") from exc
    return url


def require_postgres(environ: dict[str, str] | None = None) -> str:
    """`find_postgres`, or skip the test; under CI, fail it instead."""
    import pytest

    try:
        return find_postgres(environ)
    except PostgresUnavailable as exc:
        if in_ci(environ):
            pytest.fail(f"CI=true but no Postgres to test against: {exc}", pytrace=False)
        pytest.skip(str(exc))


def new_thread_id(prefix: str) -> str:
    """A thread id no other test (or earlier run on the same database) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def pg_child_command(effects: str, thread: str, *extra: str) -> list[str]:
    script = str(TESTS / "pg_server.py")
    return [sys.executable, script, "--db", "env", "--effects", effects, "--thread", thread, *extra]


def claim_command(thread: str, calls: int, barrier: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(TESTS / "pg_server.py"),
        "claim",
        "--thread",
        thread,
        "--calls",
        str(calls),
        "--barrier",
        barrier,
        *extra,
    ]


# ---------------------------------------------------------------------------------------------- child side


def _resolve_url(value: str) -> str:
    return os.environ[URL_ENV] if value == "env" else value


def child_main(argv: list[str]) -> int:
    """crash_child's child, on Postgres: its `child_main` as it is, with `open_sqlite` opening Postgres.

    Reusing the whole child (rather than its private helpers) keeps every option and marker it has, and
    keeps working when those helpers change."""
    import crash_child

    import gatedloop.checkpoints
    from gatedloop.checkpoints.postgres import open_postgres

    def open_test_postgres(db: str) -> Any:
        return open_postgres(_resolve_url(db))

    gatedloop.checkpoints.open_sqlite = open_test_postgres  # type: ignore[assignment]
    return int(crash_child.child_main(argv))


def _wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.005)


def claim_main(argv: list[str]) -> int:
    """Wait at the barrier, then claim calls c0..c{n-1} of a thread (or reclaim them at `--reclaim N`
    attempts seen), printing `won <call>` for each one this process got."""
    import crash_child

    from gatedloop.checkpoints.postgres import PostgresLedger

    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default="env")
    parser.add_argument("--thread", required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--barrier", required=True)
    parser.add_argument("--reclaim", type=int, default=None)
    args = parser.parse_args(argv)
    ledger = PostgresLedger(_resolve_url(args.db))
    try:
        crash_child.mark("ready", os.getpid())
        Path(args.barrier, f"ready.{os.getpid()}").touch()
        _wait_for(os.path.join(args.barrier, "go"))
        for index in range(args.calls):
            call_id = f"c{index}"
            if args.reclaim is None:
                won, _ = ledger.claim(args.thread, call_id, "book", "digest")
            else:
                won = ledger.reclaim(args.thread, call_id, args.reclaim)
            if won:
                crash_child.mark("won", call_id)
        crash_child.mark("finished")
    finally:
        ledger.close()
    return 0


def open_main(argv: list[str]) -> int:
    """Wait at the barrier, then `open_postgres` on database `--database` of the test server (tables are
    created by whichever process gets there first); print `opened`."""
    import crash_child
    from psycopg.conninfo import make_conninfo

    from gatedloop.checkpoints.postgres import open_postgres

    parser = argparse.ArgumentParser()
    parser.add_argument("--database", required=True)
    parser.add_argument("--barrier", required=True)
    args = parser.parse_args(argv)
    url = make_conninfo(os.environ[URL_ENV], dbname=args.database)
    crash_child.mark("ready", os.getpid())
    Path(args.barrier, f"ready.{os.getpid()}").touch()
    _wait_for(os.path.join(args.barrier, "go"))
    with open_postgres(url) as saver:
        saver.ledger.claim("t", "c", "book", "digest")
    crash_child.mark("opened")
    return 0


def main(argv: list[str]) -> Any:
    if argv[:1] == ["claim"]:
        return claim_main(argv[1:])
    if argv[:1] == ["open"]:
        return open_main(argv[1:])
    return child_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
