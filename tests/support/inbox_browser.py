"""What the inbox's browser tests share: a free port, an inbox app served by uvicorn in a child process (until
its page answers), and a reviewer signed in on a fresh browser context."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SUPPORT = Path(__file__).resolve().parent
CHROMIUM = os.environ.get("GATEDLOOP_CHROMIUM", "/usr/bin/chromium")
SHOTS = os.environ.get("GATEDLOOP_SCREENSHOTS")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the inbox exited: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the inbox did not answer: {log.read_text()[-3000:]}")


@contextmanager
def served_inbox(
    script: str, db: str, folder: Path, users: Mapping[str, tuple[str, Sequence[str]]], supervisor_roles: Sequence[str]
) -> Iterator[str]:
    """`tests/support/<script> DB PORT AUTH_JSON` in a child process, its reviewers `users` (user -> token,
    roles); the inbox's base URL once it answers."""
    reviewers = folder / "reviewers.json"
    tokens = {token: {"user_id": user, "roles": list(roles)} for user, (token, roles) in users.items()}
    reviewers.write_text(json.dumps({"supervisor_roles": list(supervisor_roles), "tokens": tokens}))
    port = free_port()
    log = folder / "inbox.log"
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(SUPPORT / script), db, str(port), str(reviewers)], env=env, stdout=out, stderr=out
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(f"{url}/inbox", proc, log)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def sign_in(browser: Any, url: str, user: str, token: str) -> Any:
    page = browser.new_context(viewport={"width": 1000, "height": 900}).new_page()
    page.set_default_timeout(20_000)
    page.goto(f"{url}/inbox")
    page.fill("input[name=token]", token)
    page.click("button:has-text('Sign in')")
    page.wait_for_selector(f"header >> text={user}")
    return page


def shot(page: Any, name: str) -> None:
    """With GATEDLOOP_SCREENSHOTS=DIR, the page as DIR/name.png (the screenshots the docs show)."""
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)
