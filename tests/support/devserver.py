"""Test harness: run the real ``langgraph dev`` server (in-memory runtime) in a subprocess.

Usage::

    from devserver import run_dev_server

    with run_dev_server(project_dir) as url:
        client = langgraph_sdk.get_sync_client(url=url, api_key=None)
        ...

Behaviour (all checked against langgraph-cli 0.4.40 / langgraph-api 0.16.7):

* The server's working directory is a scratch dir, never the project: the in-memory runtime
  writes its pickled state to ``./.langgraph_api`` relative to its cwd (hard-coded), and
  ``langgraph dev`` resolves path-style specs (``"./agent.py:graph"``, ``checkpointer.path``,
  ``dependencies``, an ``env`` file) relative to its cwd as well.  So the harness writes a copy
  of ``<project_dir>/langgraph.json`` into the scratch dir with those paths made absolute
  (relative to ``project_dir``) and passes that copy with ``--config``.  Module-style specs
  (``"gatedloop.demo.studio:graph"``) are passed through unchanged.
* Outbound network is switched off: CLI analytics (``LANGGRAPH_CLI_NO_ANALYTICS=1``), the PyPI
  version check (``LANGGRAPH_NO_VERSION_CHECK=true``), LangSmith tracing (``LANGSMITH_TRACING=false``
  and friends) and the LangSmith metadata loop / tracing auto-enable, which start when a
  LangSmith API key is in the environment (the keys are removed from the child's env).
* Readiness: ``GET /ok`` answers 200 *and* the server's own banner names our port.  ``langgraph
  dev`` silently moves to another port when the requested one is taken, so the banner check
  makes sure ``/ok`` came from our process; on a port clash the harness retries on a new port.
* ``config_overrides`` replaces top-level keys of that copy (``None`` removes one), e.g.
  ``{"env": None}`` so a developer's local ``.env`` (whose values langgraph dev lets override
  the process environment) cannot leak into a test.
* The server's run queue looks for new runs every 0.05 s when idle, not 0.5 s (``devserver_site/sitecustomize.py``,
  on the child's PYTHONPATH; ``GATEDLOOP_TEST_FAST_QUEUE=0`` leaves it as shipped).
* Teardown: SIGTERM to the whole process group (graceful: the in-memory runtime flushes its
  pickles on shutdown), then SIGKILL after ``stop_timeout_s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["STUDIO_CHECKPOINTER", "DevServerError", "gated_project", "offline_env", "run_dev_server"]

HOST = "127.0.0.1"
LOG_NAME = "langgraph-dev.log"
CONFIG_NAME = "langgraph.dev.json"
SITE = Path(__file__).resolve().parent / "devserver_site"
STUDIO_CHECKPOINTER = "gatedloop.checkpoints.devserver.studio_checkpointer"
"""gatedloop's SQLite saver as a `langgraph.json` checkpointer (the file named by GATEDLOOP_DB)."""

# Variables forced in the child's environment.
OFFLINE_ENV: dict[str, str] = {
    # langgraph_cli.analytics.log_command: otherwise a (non-daemon) thread POSTs to supabase.
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    # langgraph_api.cli._check_newer_version: otherwise a thread GETs pypi.org/pypi/langgraph-api/json.
    "LANGGRAPH_NO_VERSION_CHECK": "true",
    # langgraph_api.config.TRACING / langsmith.utils.tracing_is_enabled: no LangSmith tracing.
    "LANGSMITH_TRACING": "false",
    "LANGSMITH_TRACING_V2": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGCHAIN_TRACING": "false",
    # Plain-text log file (structlog ConsoleRenderer colours otherwise) and unbuffered output.
    "LOG_COLOR": "false",
    "PYTHONUNBUFFERED": "1",
}

# Variables removed from the child's environment.  A LangSmith API key makes langgraph-api
# auto-enable tracing (when no *_TRACING var is set) and start the metadata loop that POSTs
# usage to LangSmith; a license key or OTLP endpoint also lead to outbound calls.
STRIPPED_ENV: tuple[str, ...] = (
    "LANGSMITH_API_KEY",
    "LANGCHAIN_API_KEY",
    "LANGSMITH_CONTROL_PLANE_API_KEY",
    "LANGGRAPH_CLOUD_LICENSE_KEY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)

_PORT_CLASH = re.compile(r"Port \d+ is already in use")


class DevServerError(RuntimeError):
    """The dev server died, never became ready, or could not be configured."""


def gated_project(folder: Path, graphs: Mapping[str, str]) -> Path:
    """`folder/project` with a `langgraph.json` serving `graphs` (name -> "path.py:attr") on gatedloop's saver."""
    project = folder / "project"
    project.mkdir()
    config = {"dependencies": ["."], "graphs": dict(graphs), "checkpointer": {"path": STUDIO_CHECKPOINTER}}
    (project / "langgraph.json").write_text(json.dumps(config))
    return project


def offline_env(extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """The child environment: ours, minus network-triggering keys, plus OFFLINE_ENV and ``extra``.

    A ``None`` value in ``extra`` removes that variable.
    """
    env = {k: v for k, v in os.environ.items() if k not in STRIPPED_ENV}
    env.update(OFFLINE_ENV)
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _abs_spec(spec: str, base: Path, *, bare_py: bool = False) -> str:
    """``"./agent.py:graph"`` -> ``"/abs/project/agent.py:graph"``; module specs unchanged.

    Mirrors langgraph-api's rule for loading a file rather than importing a module: the part
    before the last ``:`` contains ``/`` (graphs, auth, http); for ``checkpointer.path`` a bare
    ``"x.py:fn"`` also counts (``bare_py``).
    """
    target, sep, attr = spec.rpartition(":")
    if not sep:
        target, attr = spec, ""
    is_path = "/" in target or (bare_py and sep and target.endswith(".py"))
    if not is_path or Path(target).is_absolute():
        return spec
    resolved = str((base / target).resolve())
    return f"{resolved}:{attr}" if sep else resolved


def _absolutize_config(config: dict[str, Any], base: Path) -> dict[str, Any]:
    cfg = dict(config)
    deps = []
    for dep in cfg.get("dependencies", []):
        if isinstance(dep, str) and not Path(dep).is_absolute() and (base / dep).exists():
            dep = str((base / dep).resolve())
        deps.append(dep)
    if "dependencies" in cfg:
        cfg["dependencies"] = deps

    graphs = {}
    for name, spec in cfg.get("graphs", {}).items():
        if isinstance(spec, str):
            spec = _abs_spec(spec, base)
        elif isinstance(spec, dict) and isinstance(spec.get("path"), str):
            spec = {**spec, "path": _abs_spec(spec["path"], base)}
        graphs[name] = spec
    if "graphs" in cfg:
        cfg["graphs"] = graphs

    for key, sub in (("checkpointer", "path"), ("auth", "path"), ("http", "app")):
        block = cfg.get(key)
        if isinstance(block, dict) and isinstance(block.get(sub), str):
            cfg[key] = {**block, sub: _abs_spec(block[sub], base, bare_py=key == "checkpointer")}

    if isinstance(cfg.get("env"), str) and not Path(cfg["env"]).is_absolute():
        cfg["env"] = str((base / cfg["env"]).resolve())
    return cfg


def _read_log(log_path: Path, max_chars: int = 20_000) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError as e:
        return f"<could not read {log_path}: {e}>"
    if len(text) > max_chars:
        text = "...<truncated>...\n" + text[-max_chars:]
    return text


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/ok", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM the process group, then SIGKILL it if it is still alive after ``timeout_s``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)
    # Kill any stragglers in the group even if the leader already exited.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _start(config_path: Path, workdir: Path, env: dict[str, str], log_path: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "langgraph_cli",
        "dev",
        "--no-browser",
        "--no-reload",
        "--host",
        HOST,
        "--port",
        str(port),
        "--config",
        str(config_path),
    ]
    with log_path.open("ab") as log:
        log.write(f"$ (cwd={workdir}) {' '.join(cmd)}\n".encode())
        log.flush()
        return subprocess.Popen(
            cmd,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@contextlib.contextmanager
def run_dev_server(
    project_dir: Path,
    *,
    env: Mapping[str, str | None] | None = None,
    timeout_s: float = 60,
    workdir: Path | None = None,
    config_name: str = "langgraph.json",
    stop_timeout_s: float = 10,
    config_overrides: Mapping[str, Any] | None = None,
) -> Iterator[str]:
    """Start ``langgraph dev`` for ``project_dir/config_name``; yield its base URL; stop it.

    ``env``: extra variables for the server (``None`` value = unset), applied after the offline ones.
    ``workdir``: the server's cwd, where ``.langgraph_api`` state and ``langgraph-dev.log`` go.
    Default: a fresh temp dir removed on exit.  Pass the same dir to two successive servers to
    test that threads survive a restart.  A given ``workdir`` is left in place.
    ``config_overrides``: top-level keys to set in the served copy of the config (``None`` = remove);
    path-style values are made absolute like the original's.
    """
    project_dir = Path(project_dir).resolve()
    source = project_dir / config_name
    if not source.is_file():
        raise DevServerError(f"no {config_name} in {project_dir}")

    own_workdir = workdir is None
    wd = Path(tempfile.mkdtemp(prefix="lg-dev-")) if workdir is None else Path(workdir).resolve()
    wd.mkdir(parents=True, exist_ok=True)
    log_path = wd / LOG_NAME
    config_path = wd / CONFIG_NAME
    config = json.loads(source.read_text())
    for key, value in (config_overrides or {}).items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    config_path.write_text(json.dumps(_absolutize_config(config, project_dir)))
    child_env = offline_env(env)
    if os.environ.get("GATEDLOOP_TEST_FAST_QUEUE", "1") != "0":  # devserver_site/sitecustomize.py: poll runs faster
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), child_env.get("PYTHONPATH")) if p)

    proc: subprocess.Popen[bytes] | None = None
    try:
        url = ""
        for _attempt in range(3):
            port = _free_port()
            url = f"http://{HOST}:{port}"
            log_start = log_path.stat().st_size if log_path.exists() else 0
            proc = _start(config_path, wd, child_env, log_path, port)
            deadline = time.monotonic() + timeout_s
            clash = False
            while True:
                log_text = log_path.read_bytes()[log_start:].decode(errors="replace")
                if _PORT_CLASH.search(log_text):
                    clash = True
                    break
                if proc.poll() is not None:
                    raise DevServerError(
                        f"langgraph dev exited with code {proc.returncode} before becoming ready"
                        f"\n--- {log_path} ---\n{_read_log(log_path)}"
                    )
                if f"http://{HOST}:{port}" in log_text and _ok(url):
                    break
                if time.monotonic() > deadline:
                    raise DevServerError(
                        f"langgraph dev not ready at {url}/ok after {timeout_s:.0f}s"
                        f"\n--- {log_path} ---\n{_read_log(log_path)}"
                    )
                time.sleep(0.1)
            if not clash:
                break
            _stop(proc, stop_timeout_s)
            proc = None
        else:
            raise DevServerError(f"could not get a free port\n--- {log_path} ---\n{_read_log(log_path)}")

        try:
            yield url
        except BaseException as e:
            e.add_note(f"--- dev server log {log_path} ---\n{_read_log(log_path, 8_000)}")
            raise
    finally:
        if proc is not None:
            _stop(proc, stop_timeout_s)
        if own_workdir:
            shutil.rmtree(wd, ignore_errors=True)
