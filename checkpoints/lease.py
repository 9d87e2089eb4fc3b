"""One resumer per thread: an OS file lock per thread id beside the database.

An advisory `flock` is released by the kernel when its holder exits, however it exits, so a thread whose
process was killed is resumable at once by the next process, with no expiry to wait out. Locks are per
open file, so two resumers in one process exclude each other too. This is the SQLite savers' lease (a one-host
database); the Postgres savers take a session advisory lock instead (`checkpoints/postgres.py`), which the server
releases when the session dies.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class ThreadBusy(RuntimeError):
    """Another process (or caller) is running this thread right now."""

    def __init__(self, thread_id: str):
        super().__init__(f"thread {thread_id!r} is being run by another process; try again when it pauses or ends")
        self.thread_id = thread_id


def lease_path(db_path: str, thread_id: str) -> Path:
    name = hashlib.sha256(thread_id.encode()).hexdigest()[:40]
    return Path(f"{db_path}.leases") / f"{name}.lock"


@contextmanager
def thread_lease(db_path: str | None, thread_id: str, *, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the thread's lease for the block; raise ThreadBusy if it is held for longer than `wait_s`."""
    if not db_path or db_path == ":memory:":
        yield
        return
    path = lease_path(db_path, thread_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ThreadBusy(thread_id) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
