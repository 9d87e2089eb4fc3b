"""`gatedloop ARGS` run in this process the way a fresh process runs it: its own environment, working folder, stdin
(empty), stdout and stderr, and exit code (an uncaught exception prints its traceback and exits 1, as the
interpreter does). Starting Python and importing LangChain for each command cost over a second; the tests that need
a real process (signals, terminals, locks held by another process, crashes) start one."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path

from gatedloop.cli.main import main


def run_cli(argv: list[str], env: Mapping[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_env, saved_path, saved_cwd, saved_stdin = dict(os.environ), list(sys.path), Path.cwd(), sys.stdin
    saved_bytecode = sys.dont_write_bytecode
    # No .pyc for the user's module: a test that rewrites it within the same second at the same size (a policy typo
    # fixed: "finanse" -> "finance") would otherwise import the old code from it, as its mtime and size still match.
    sys.dont_write_bytecode = True
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    sys.stdin = io.StringIO("")
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse: --help, usage errors
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
            except BaseException:  # what the interpreter does with an uncaught exception (--debug re-raises)
                traceback.print_exc()
                code = 1
    finally:
        sys.stdin = saved_stdin
        sys.dont_write_bytecode = saved_bytecode
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
    return subprocess.CompletedProcess(["gatedloop", *argv], code, stdout.getvalue(), stderr.getvalue())
