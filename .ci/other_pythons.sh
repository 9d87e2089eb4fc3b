#!/usr/bin/env bash
# The package on Python 3.12 and 3.13 (issue 31): each installs gatedloop with its test extra in a venv of its own
# and runs the fast suite (`-m "not slow"`: no servers, browsers or multi-process trials; the README command runs
# everything on 3.11). Each Python is found under pyenv ($(pyenv root)/versions/3.X.*) or on PATH (python3.X);
# a missing one fails with the reason, as CI must not pass by skipping it.
#
#   .ci/other_pythons.sh [3.12 3.13]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export PIP_DISABLE_PIP_VERSION_CHECK=1

find_python() {  # the newest 3.X under pyenv, else python3.X on PATH
    local version=$1 candidate=""
    if command -v pyenv >/dev/null 2>&1; then
        candidate=$(ls -d "$(pyenv root)"/versions/"$version".*/bin/python 2>/dev/null | sort -V | tail -n 1)
    fi
    [[ -n "$candidate" ]] || candidate=$(command -v "python$version" || true)
    echo "$candidate"
}

versions=("$@")
[[ ${#versions[@]} -gt 0 ]] || versions=(3.12 3.13)
for v in "${versions[@]}"; do
    py=$(find_python "$v")
    [[ -n "$py" && -x "$py" ]] || { echo "other_pythons: no Python $v (pyenv's $v.* or python$v on PATH)" >&2; exit 1; }
    venv="$ROOT/.venv-$v"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/pip" install -q "$ROOT[test]"
    echo "== Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())'): the fast suite"
    "$venv/bin/pytest" -q -m "not slow" -p no:cacheprovider
done
