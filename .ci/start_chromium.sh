#!/usr/bin/env bash
# Make sure a Chromium for the inbox's browser tests (tests/test_inbox.py) is installed: Debian's `chromium`,
# driven by Playwright with executable_path (Playwright's own browser download is not used). Installs only if
# missing, like start_postgres.sh; prints the browser's path.
#
#   .ci/start_chromium.sh            # -> /usr/bin/chromium
#
# Settings: GATEDLOOP_CHROMIUM (default /usr/bin/chromium), the path the tests use.
set -euo pipefail

BROWSER="${GATEDLOOP_CHROMIUM:-/usr/bin/chromium}"

die() {
    echo "start_chromium: $*" >&2
    exit 1
}

if [[ ! -x "$BROWSER" ]]; then
    [[ $(id -u) -eq 0 ]] || die "$BROWSER is missing and only root can install it (apt-get install chromium)"
    export DEBIAN_FRONTEND=noninteractive
    err=$(mktemp)
    apt-get update -qq >/dev/null || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>"$err" \
        || { cat "$err" >&2; die "apt-get install chromium failed"; }
    rm -f "$err"
    [[ -x "$BROWSER" ]] || die "chromium installed but $BROWSER is not there; set GATEDLOOP_CHROMIUM"
fi
"$BROWSER" --headless --no-sandbox --version >/dev/null 2>&1 || die "$BROWSER does not start"
echo "$BROWSER"
