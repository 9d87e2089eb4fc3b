#!/usr/bin/env bash
# A Python 3.12 virtualenv with Aegra and this checkout of gatedloop, for tests/test_aegra.py and bench/aegra_kills.py
# (Aegra needs Python >= 3.12; gatedloop's own venv stays on 3.11).
#
#   line=$(.ci/aegra_venv.sh) && export "$line"
#
# Prints one line, GATEDLOOP_AEGRA=<venv>/bin/aegra. The venv is GATEDLOOP_AEGRA_VENV (default .aegra-venv in the
# checkout), made anew each time so it holds exactly this checkout. Python 3.12 is found under pyenv
# ($(pyenv root)/versions/3.12.*) or on PATH (python3.12); GATEDLOOP_PYTHON312 chooses one. Fails with the reason if none.
# gatedloop is installed with the extras a served graph needs (GATEDLOOP_AEGRA_EXTRAS, default postgres,inbox,middleware:
# a graph with LangChain middleware needs `langchain`, and Aegra exits at start when a graph module fails to import).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="${GATEDLOOP_AEGRA_VENV:-$ROOT/.aegra-venv}"
EXTRAS="${GATEDLOOP_AEGRA_EXTRAS:-postgres,inbox,middleware}"
AEGRA_VERSION=0.11.0  # tests/test_aegra.py pins its auth: identity scopes threads, filters only list/get/delete

die() { echo "aegra_venv: $*" >&2; exit 1; }

runs() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 12))' >/dev/null 2>&1; }

find_python() {
    local candidate
    if [[ -n "${GATEDLOOP_PYTHON312:-}" ]]; then echo "$GATEDLOOP_PYTHON312"; return; fi
    if command -v pyenv >/dev/null 2>&1; then  # its versions, not its shims (a shim fails unless the version is active)
        candidate=$(ls -d "$(pyenv root)"/versions/3.12.*/bin/python 2>/dev/null | sort -V | tail -n 1)
        if [[ -n "$candidate" ]] && runs "$candidate"; then echo "$candidate"; return; fi
    fi
    candidate=$(command -v python3.12 || true)
    if [[ -n "$candidate" ]] && runs "$candidate"; then echo "$candidate"; return; fi
}

PY=$(find_python)
[[ -n "$PY" && -x "$PY" ]] || die "no Python 3.12 (python3.12 on PATH, pyenv's 3.12.*, or GATEDLOOP_PYTHON312)"
runs "$PY" || die "$PY does not run as Python 3.12 or later"

rm -rf "$VENV"
"$PY" -m venv "$VENV" || die "could not make a venv with $PY"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$VENV/bin/pip" install -q "aegra-cli==$AEGRA_VERSION" "aegra-api==$AEGRA_VERSION" "$ROOT[$EXTRAS]" >&2 \
    || die "pip install aegra-cli gatedloop failed"
"$VENV/bin/pip" install -q --no-deps "$ROOT/examples/bookings" >&2 || die "pip install examples/bookings failed"
"$VENV/bin/aegra" version >/dev/null || die "the aegra CLI does not run"
echo "GATEDLOOP_AEGRA=$VENV/bin/aegra"
