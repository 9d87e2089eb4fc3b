"""Real Aegra server processes for tests/test_aegra.py and bench/aegra_kills.py: one fresh Postgres database and
one Redis (a private queue key per run), several server processes on them, each started and stopped for real.

`GATEDLOOP_AEGRA` names the `aegra` executable of a Python 3.12+ virtualenv where gatedloop is installed (Aegra
needs 3.12; the tests drive it from any Python with `langgraph-sdk`). `.ci/run` makes one and sets it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

AEGRA_ENV = "GATEDLOOP_AEGRA"
REDIS_ENV = "GATEDLOOP_TEST_REDIS_URL"
APP = Path(__file__).parent / "aegra_app" / "aegra.json"
TOKENS = {
    "ana": "ana-token-aegra-0001",
    "bo": "bo-token-aegra-00002",
    "cy": "cy-token-aegra-00003",
    "dee": "dee-token-aegra-0004",
}
AUTH = {
    "supervisor_roles": ["finance"],
    "tokens": {
        TOKENS["ana"]: {"user_id": "ana", "roles": ["staff"], "workspace": "north"},
        TOKENS["bo"]: {"user_id": "bo", "roles": ["finance"], "workspace": "north"},
        TOKENS["cy"]: {"user_id": "cy", "roles": ["staff"], "workspace": "north"},
        TOKENS["dee"]: {"user_id": "dee", "roles": ["finance"], "workspace": "south"},
    },
}
"""Two workspaces: in `north` ana and cy ask (staff), bo reviews (finance, a supervisor); dee reviews `south`."""
LEASE = {"LEASE_DURATION_SECONDS": "6", "HEARTBEAT_INTERVAL_SECONDS": "2", "REAPER_INTERVAL_SECONDS": "1"}
"""A dead worker's run is handed on within about 7 s (Aegra's defaults: 30 s lease, 15 s reaper)."""


def live_members(group: int) -> list[int]:
    """The processes of a process group that are not zombies (Linux /proc): a zombie runs nothing."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def fresh_database(pg_url: str) -> Iterator[str]:
    """A database of its own on the test server (Aegra's tables and migrations; gatedloop's ledger joins them)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = f"gatedloop_aegra_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    params = conninfo_to_dict(pg_url)
    url = f"postgresql://{params['user']}:{params['password']}@{params['host']}:{params['port']}/{name}"
    try:
        yield url
    finally:
        with contextlib.suppress(Exception), psycopg.connect(make_conninfo(pg_url), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def serve_command(aegra: str, config: Path, host: str, port: int) -> tuple[list[str], dict[str, str]]:
    """How docs/deploying.md starts Aegra: its app under the venv's uvicorn, the config in `AEGRA_CONFIG`, which is
    what `aegra serve` does, in one process. `aegra serve` runs uvicorn as a child (`subprocess.run`, aegra-cli
    0.11.0) and forwards no signal: a SIGKILL (or a SIGTERM) of the CLI alone left uvicorn serving, its workers
    taking runs from the queue."""
    uvicorn = str(Path(aegra).parent / "uvicorn")
    return [uvicorn, "aegra_api.main:app", "--host", host, "--port", str(port)], {"AEGRA_CONFIG": str(config)}


@dataclass
class AegraServer:
    """One Aegra server process (uvicorn running Aegra's API and its worker loops), started as `serve_command`."""

    name: str
    executable: str
    config: Path
    env: dict[str, str]
    workdir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def start(self, timeout_s: float = 180.0) -> None:
        assert self.process is None or self.process.poll() is not None, f"{self.name} is running"
        command, config_env = serve_command(self.executable, self.config, "127.0.0.1", self.port)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                command,
                cwd=self.workdir,
                env={**self.env, **config_env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Aegra {self.name} exited {self.process.returncode}: {self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"Aegra {self.name} did not become healthy in {timeout_s} s: {self.tail()}")

    def server_pid(self) -> int:
        """The uvicorn process: where runs execute."""
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM the process group (Aegra drains its workers), SIGKILL what is left after 30 s. Waits for every
        process of the group: until the server is gone its workers still take runs from the queue."""
        if self.process is None:
            return
        self._signal_group(signal.SIGTERM)
        if not self._group_gone(30):
            self._signal_group(signal.SIGKILL)
            self._group_gone(10)

    def kill_hard(self) -> None:
        """SIGKILL the whole process group: the server dies mid-run, as on a lost machine."""
        if self.process is None:
            return
        self._signal_group(signal.SIGKILL)
        self._group_gone(10)

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def _group_gone(self, timeout_s: float) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout_s)
        while time.monotonic() < deadline:
            if not live_members(self.process.pid):
                return True
            time.sleep(0.1)
        return False

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Deployment:
    """Two (or more) server processes on one database and one Redis queue, the effects file and the control
    folder the served graph (tests/support/aegra_payments.py) uses."""

    servers: list[AegraServer]
    database_url: str
    effects: Path
    control: Path

    def __getitem__(self, index: int) -> AegraServer:
        return self.servers[index]

    def ensure_running(self) -> None:
        for server in self.servers:
            if not server.alive():
                server.start()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def server_env(database_url: str, redis_url: str, tag: str, **extra: str) -> dict[str, str]:
    """What an Aegra server of the tests gets: the database, Redis with a queue key of its own (`tag`), the short
    lease, gatedloop's test tokens, tests/support on the path; `extra` adds or replaces."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "DATABASE_URL": database_url,
        "REDIS_BROKER_ENABLED": "true",
        "REDIS_URL": redis_url,
        "WORKER_QUEUE_KEY": f"aegra:jobs:{tag}",
        "REDIS_CHANNEL_PREFIX": f"aegra:run:{tag}:",
        "WORKER_COUNT": "2",
        "N_JOBS_PER_WORKER": "4",
        "CRON_ENABLED": "false",
        "LOG_LEVEL": "INFO",
        "GATEDLOOP_AUTH_TOKENS": json.dumps(AUTH),
        "PYTHONPATH": str(Path(__file__).parent),
        **LEASE,
        **extra,
    }


@contextlib.contextmanager
def deployment(
    executable: str,
    pg_url: str,
    redis_url: str,
    workdir: Path,
    count: int = 2,
    env: dict[str, str] | None = None,
    config: Path = APP,
) -> Iterator[Deployment]:
    """`count` Aegra server processes of `config` (tests/support/aegra_app) on a fresh database, started one after the
    other (the first runs Aegra's migrations), stopped at the end. `env` adds to or replaces `server_env`'s."""
    tag = uuid.uuid4().hex[:10]
    control = workdir / "control"
    control.mkdir(parents=True, exist_ok=True)
    effects = workdir / "effects.sqlite"
    with fresh_database(pg_url) as database_url:
        files = {"AEGRA_TEST_EFFECTS": str(effects), "AEGRA_TEST_CONTROL": str(control)}
        served = server_env(database_url, redis_url, tag, **files, **(env or {}))
        servers = [AegraServer(chr(ord("A") + i), executable, config, served, workdir) for i in range(count)]
        found = Deployment(servers, database_url, effects, control)
        try:
            for server in servers:
                server.start()
            yield found
        finally:
            for server in servers:
                server.stop()


def wait_until(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
