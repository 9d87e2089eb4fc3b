#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the tests, from Debian's packages, on 127.0.0.1.
#
#   line=$(.ci/start_postgres.sh [ENV_FILE]) && export "$line"
#
# Prints one line, GATEDLOOP_TEST_PG_URL=postgresql://..., and writes the same line to ENV_FILE if given
# (and always to $GATEDLOOP_PG_HOME/env). Idempotent: a server already running on the port is reused, a
# stopped one is started again, a half-made data directory is made anew. Works as root (the server runs as
# the `postgres` user) or as an ordinary user who owns GATEDLOOP_PG_HOME. Anything that goes wrong ends
# the script non-zero with the reason and the server log on stderr.
#
# Settings: GATEDLOOP_PG_PORT (default 54329), GATEDLOOP_PG_HOME (default /tmp/gatedloop-pg-$PORT).
# The server is for tests: fsync is off (a crash of the test *clients* is what the tests exercise, never
# one of the server). Stop it with: pg_ctl stop -D "$GATEDLOOP_PG_HOME/data" (as the postgres user).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # runuser lives there; a minimal PATH (env -i, some CI runners) lacks it

PORT="${GATEDLOOP_PG_PORT:-54329}"
HOME_DIR="${GATEDLOOP_PG_HOME:-/tmp/gatedloop-pg-$PORT}"
DATA="$HOME_DIR/data"
LOG="$HOME_DIR/server.log"
DB_NAME=gatedloop
DB_USER=gatedloop
ENV_OUT="${1:-}"

die() {
    echo "start_postgres: $*" >&2
    if [[ -s "$LOG" ]]; then
        echo "--- last lines of $LOG ---" >&2
        tail -n 30 "$LOG" >&2
    fi
    exit 1
}

find_bindir() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [[ -n "$dir" && -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then
        echo "$dir"
    fi
}

mkdir -p "$HOME_DIR"
chmod 0711 "$HOME_DIR"
PASSWORD_FILE="$HOME_DIR/password"

BIN=$(find_bindir)
if [[ -z "$BIN" ]]; then
    [[ $(id -u) -eq 0 ]] || die "PostgreSQL is not installed and only root can install it (apt-get install postgresql)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null 2>"$HOME_DIR/apt.err" \
        || { cat "$HOME_DIR/apt.err" >&2; die "apt-get install postgresql failed"; }
    BIN=$(find_bindir)
    [[ -n "$BIN" ]] || die "postgresql installed but no initdb under /usr/lib/postgresql/*/bin"
fi

# The server never runs as root: as root, run its commands as `postgres`; otherwise as ourselves.
if [[ $(id -u) -eq 0 ]]; then
    id postgres >/dev/null 2>&1 || die "no 'postgres' user to run the server as"
    OWNER=postgres
    as_owner() { runuser -u postgres -- "$@"; }
else
    OWNER=$(id -un)
    as_owner() { "$@"; }
fi

ready() { "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 1 >/dev/null 2>&1; }
ours_running() { as_owner "$BIN/pg_ctl" status -D "$DATA" >/dev/null 2>&1; }

# A server that was SIGKILLed leaves postmaster.pid behind; if its pid is gone, a zombie (nobody reaps it
# when PID 1 does not) or some other program, pg_ctl and postgres would both take it for a live server.
clear_stale_pid() {
    local pidfile="$DATA/postmaster.pid" pid state comm
    [[ -f "$pidfile" ]] || return 0
    pid=$(head -n 1 "$pidfile")
    state=$(sed -E 's/^.*\) ([A-Za-z]).*$/\1/' "/proc/$pid/stat" 2>/dev/null || true)
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    if [[ -z "$state" || "$state" == Z || "$comm" != postgres* ]]; then
        rm -f "$pidfile"
    fi
}

clear_stale_pid
if ! ours_running; then
    if ready; then
        die "port $PORT on 127.0.0.1 is taken by a server that is not ours ($DATA); set GATEDLOOP_PG_PORT"
    fi
    if [[ ! -s "$DATA/PG_VERSION" || ! -s "$DATA/postgresql.auto.conf" || ! -s "$PASSWORD_FILE" ]]; then
        rm -rf "$DATA"
        install -d -m 0700 -o "$OWNER" "$DATA"
        head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PASSWORD_FILE.new"
        chmod 0600 "$PASSWORD_FILE.new"
        pwfile="$HOME_DIR/initdb-password"
        install -m 0600 -o "$OWNER" "$PASSWORD_FILE.new" "$pwfile"
        as_owner "$BIN/initdb" -D "$DATA" -U "$DB_USER" --pwfile="$pwfile" --auth-host=scram-sha-256 \
            --auth-local=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$HOME_DIR/initdb.log" 2>&1 \
            || { cat "$HOME_DIR/initdb.log" >&2; die "initdb failed"; }
        rm -f "$pwfile"
        as_owner tee -a "$DATA/postgresql.auto.conf" >/dev/null <<EOF
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = ''
max_connections = 200
fsync = off
synchronous_commit = on
full_page_writes = off
EOF
        mv "$PASSWORD_FILE.new" "$PASSWORD_FILE"
    fi
    touch "$LOG"
    chown "$OWNER" "$LOG"
    # a second try: backends orphaned by a killed server hold its shared memory until they notice and exit
    as_owner "$BIN/pg_ctl" start -D "$DATA" -l "$LOG" -w -t 60 -s >/dev/null 2>&1 \
        || { sleep 2 && as_owner "$BIN/pg_ctl" start -D "$DATA" -l "$LOG" -w -t 60 -s >/dev/null; } \
        || die "the server did not start"
fi

for _ in $(seq 1 100); do
    ready && break
    sleep 0.1
done
ready || die "the server on 127.0.0.1:$PORT does not accept connections"
[[ -s "$PASSWORD_FILE" ]] || die "the server runs but its password file $PASSWORD_FILE is gone; stop it and rerun"

PASSWORD=$(cat "$PASSWORD_FILE")
export PGPASSWORD="$PASSWORD"
psql_admin() { "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U "$DB_USER" -d postgres "$@"; }
if [[ $(psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'") != 1 ]]; then
    psql_admin -c "CREATE DATABASE $DB_NAME" >/dev/null || die "could not create database $DB_NAME"
fi

LINE="GATEDLOOP_TEST_PG_URL=postgresql://$DB_USER:$PASSWORD@127.0.0.1:$PORT/$DB_NAME"
printf '%s\n' "$LINE" >"$HOME_DIR/env"
chmod 0600 "$HOME_DIR/env"
if [[ -n "$ENV_OUT" ]]; then
    printf '%s\n' "$LINE" >"$ENV_OUT"
fi
printf '%s\n' "$LINE"
