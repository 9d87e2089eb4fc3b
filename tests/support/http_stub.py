"""What the scripted provider servers share: an HTTP/1.1 server on 127.0.0.1 at a free port, served from a daemon
thread for the `with` block, that records every error and fails the block with them so a test cannot pass while
the server was answering 500s. openai_stub.py and provider_wires.py
(beside this file) add the wire formats. Stdlib only.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self


class StubHandler(BaseHTTPRequestHandler):
    """Quiet, one request per connection; `self.server.owner` is the `StubServer` being served."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging on stderr."""

    def read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send_body(self, status: int, content_type: str, data: bytes, length: int | None = None) -> None:
        """`data` with its length (or a promised `length`, to send less than announced) and the connection closed."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: Any


class StubServer:
    """Serves `handler` while the `with` block runs; `errors` recorded by the handler fail the block on exit
    (with `label` in the message) when `strict`."""

    def __init__(self, handler: type[StubHandler], *, label: str, strict: bool = True) -> None:
        self.label, self.strict = label, strict
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), handler)
        self._httpd.owner = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, name=label, daemon=True
        )

    @property
    def origin(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self.strict and self.errors and exc_type is None:
            raise AssertionError(f"{self.label} recorded errors: {self.errors}")
