"""Child processes that start without paying for the third-party imports: a fork server for the suite's scripts.

A fresh interpreter spends about a second of CPU importing langchain_core, langgraph and pydantic before a child
script (`crash_child.py`, `backends.py claim`) prints its first marker, and the crash and concurrency tests start
well over a hundred such children. `spawn` asks a server process (one per test process, started on first use) that
has imported those libraries, and no gatedloop module, to fork the child instead: each child is still a process
of its own, with its own pid, stdout and stderr, run from the script's `__main__`, importing gatedloop for itself,
and SIGKILLed for real. What it does not get is a fresh interpreter: a test that needs one (an import order, a
process left unreaped) starts a plain `subprocess.Popen`. `GATEDLOOP_TEST_PRELOAD=0` turns the server off.

Run as a script, it is the server: `python preloaded.py SOCKET` (it ends when its stdin closes, with the test
process). Each request on the socket is one child: its argv, environment and working directory as JSON, with its
stdout and stderr passed as file descriptors. A monitor process forks the child, sends `pid N`, waits for it and
sends `status N` (Popen's return code: the exit status, or minus the signal that ended it).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

PRELOAD = (
    "langchain_core.language_models",
    "langchain_core.messages",
    "langchain_core.tools",
    "langchain_core.runnables",
    "langgraph.graph",
    "langgraph.types",
    "langgraph.prebuilt",
    "langgraph.checkpoint.sqlite",
    "pydantic",
    "jsonschema",
    "sqlite3",
)
"""What the children build on; never a gatedloop module (each child imports gatedloop, and its own state, itself)."""

# ---------------------------------------------------------------------------------------------- server side


def _run_child(request: dict[str, Any], out: int, err: int) -> None:
    """In the forked child: become `python SCRIPT ARGS...` with the request's environment, and never return."""
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in {devnull, out, err} - {0, 1, 2}:
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        script = request["argv"][1]
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.path.dirname(os.path.abspath(script)), *extra, *sys.path[1:]]
        sys.argv = request["argv"][1:]
        import runpy

        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int | None):
                print(exc.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def _monitor(conn: socket.socket, request: dict[str, Any], out: int, err: int) -> None:
    """In the forked monitor: fork the child, report its pid and then its return code, and never return."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        pid = os.fork()
        if pid == 0:
            conn.close()
            _run_child(request, out, err)
        os.close(out)
        os.close(err)
        conn.sendall(f"pid {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        conn.sendall(f"status {os.waitstatus_to_exitcode(status)}\n".encode())
    finally:
        os._exit(0)


def serve(path: str) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    assert not [name for name in sys.modules if name.startswith("gatedloop")], "the server must not import gatedloop"
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the monitors reap themselves
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("listening\n")
    sys.stdout.flush()
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            return  # the test process is gone
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        with conn:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
            while not data.endswith(b"\n"):
                data += conn.recv(1 << 20)
            request = json.loads(data)
            out, err = fds
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                listener.close()
                _monitor(conn, request, out, err)
            os.close(out)
            os.close(err)


# ---------------------------------------------------------------------------------------------- client side

_lock = threading.Lock()
_server: dict[str, Any] = {}


def _socket_path() -> str | None:
    """The server's socket, started on first use in this process; None if it cannot run here."""
    with _lock:
        if _server.get("pid") != os.getpid():
            _server.clear()
            folder = tempfile.mkdtemp(prefix="gl-preload-")
            path = os.path.join(folder, "s")
            proc = subprocess.Popen(
                [sys.executable, __file__, path],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                cwd=folder,
            )
            assert proc.stdout is not None
            if proc.stdout.readline() != b"listening\n":
                proc.kill()
                raise RuntimeError("the preloaded fork server did not start")

            def stop() -> None:
                if proc.stdin:
                    proc.stdin.close()
                proc.wait()

            atexit.register(stop)
            _server.update(pid=os.getpid(), path=path, proc=proc)
        return _server["path"]


class Spawned:
    """A forked child, with the part of `subprocess.Popen`'s interface the suite uses."""

    def __init__(self, argv: list[str], env: dict[str, str], stderr: Any, cwd: str | None = None):
        read, write = os.pipe()
        err = stderr.fileno() if stderr is not None else os.open(os.devnull, os.O_WRONLY)
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.connect(_socket_path())
            request = json.dumps({"argv": argv, "env": env, "cwd": cwd or os.getcwd()}).encode() + b"\n"
            socket.send_fds(self._conn, [request], [write, err])
        finally:
            os.close(write)
            if stderr is None:
                os.close(err)
        self.stdout = open(read, encoding="utf-8", errors="replace")  # noqa: SIM115 - closed by its reader
        self._buffer = b""
        self.pid = int(self._reply("pid"))
        self.returncode: int | None = None
        self.args = argv

    def _reply(self, key: str) -> str:
        while b"\n" not in self._buffer:
            chunk = self._conn.recv(4096)
            if not chunk:
                break
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\n")
        line = raw.decode()
        if not line.startswith(key + " "):
            raise RuntimeError(f"the preloaded fork server said {line!r}, not {key}")
        return line.split(" ", 1)[1].strip()

    def _answered(self, timeout: float | None) -> bool:
        return b"\n" in self._buffer or bool(select.select([self._conn], [], [], timeout)[0])

    def poll(self) -> int | None:
        if self.returncode is None and self._answered(0):
            self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self._answered(timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._finish()
        assert self.returncode is not None
        return self.returncode

    def _finish(self) -> None:
        self.returncode = int(self._reply("status"))
        self._conn.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            # It may end, and the fork server reap it, after `poll`: nothing left to signal (as Popen ignores it).
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def enabled() -> bool:
    return os.environ.get("GATEDLOOP_TEST_PRELOAD", "1") != "0" and hasattr(socket, "send_fds") and os.name == "posix"


def spawn(argv: list[str], env: dict[str, str], stderr: Any) -> Any:
    """`python SCRIPT ...` forked from the preloaded server (stdout a text pipe), or a plain Popen if it is off."""
    if enabled() and argv[0] == sys.executable and Path(argv[1]).suffix == ".py":
        return Spawned(argv, env, stderr)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1, env=env)


def run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`spawn` to the end, as `subprocess.run(..., capture_output=True, text=True)` reports it."""
    with tempfile.TemporaryFile("w+") as stderr:
        child = spawn(argv, env, stderr)
        assert child.stdout is not None
        stdout = child.stdout.read()
        code = child.wait(timeout=timeout)
        stderr.seek(0)
        return subprocess.CompletedProcess(argv, code, stdout, stderr.read())


if __name__ == "__main__":
    serve(sys.argv[1])
