"""`python read_only_cli.py FOLDER ARGS...`: `python -m gatedloop.cli.main ARGS` with FOLDER read-only, for root
(which ignores file modes): the process moves to a mount namespace of its own (unshare(2)), makes every mount in it
private (so nothing it mounts reaches the test's namespace), and bind-mounts FOLDER read-only over itself, as
`unshare -m sh -c "mount --bind -o ro FOLDER FOLDER && exec ..."` does. It exits 3 if FOLDER is then not
read-only, before gatedloop is imported.

Doing it in the process rather than with unshare(1) and mount(8) in front of a new interpreter lets the test fork
it from the preloaded server (support/preloaded.py): each command is still a process of its own, with its own exit
code, stdout and stderr, without a second of third-party imports first.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import sys

CLONE_NEWNS = 0x00020000  # linux/sched.h, linux/mount.h
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18


def read_only_here(folder: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            raise OSError(ctypes.get_errno(), what)

    check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    path = os.fsencode(folder)
    check(libc.mount(path, path, None, MS_BIND, None), "mount --bind")
    check(libc.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None), "mount -o remount,bind,ro")


if __name__ == "__main__":
    folder, args = sys.argv[1], sys.argv[2:]
    read_only_here(folder)
    if not os.statvfs(folder).f_flag & os.ST_RDONLY:
        print(f"{folder} is not read-only", file=sys.stderr)
        sys.exit(3)
    sys.argv = ["gatedloop", *args]
    runpy.run_module("gatedloop.cli.main", run_name="__main__", alter_sys=True)
