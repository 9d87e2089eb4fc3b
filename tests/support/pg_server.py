"""The Postgres the tests run against, and a real child process that drives a thread on it.

The server comes from `GATEDLOOP_TEST_PG_URL` (`.ci/start_postgres.sh` starts one and prints the line). With
no URL, or without the `postgres` extra installed, the Postgres tests are skipped on a developer's machine
and FAIL under CI (`CI=true`): a skip must not hide a missing server there.

Run as a script, `python tests/support/pg_server.py open ...` (tests/ on PYTHONPATH) races the first opening of a
fresh database. A child driving a thread on Postgres is `crash_child.py --db env` (see `backends`).
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
SUPPORT = Path(__file__).resolve().parent


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


def url_in_schema(url: str, schema: str) -> str:
    """The server's URL with `schema` first on the search path: a postgresql:// URL still (a key=value string
    would be taken for a SQLite path)."""
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"


# ---------------------------------------------------------------------------------------------- child side


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
    while not os.path.exists(os.path.join(args.barrier, "go")):
        time.sleep(0.005)
    with open_postgres(url) as saver:
        saver.ledger.claim("t", "c", "book", "digest")
    crash_child.mark("opened")
    return 0


def main(argv: list[str]) -> Any:
    if argv[:1] != ["open"]:
        return "usage: pg_server.py open --database NAME --barrier DIR"
    return open_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
