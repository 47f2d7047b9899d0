#!/usr/bin/env bash
# Make sure the services the test suite talks to answer on loopback, starting local ones that are installed
# but stopped. Fails loudly (non-zero, with the reason) if one cannot be reached: tests never skip for that.
#   PostgreSQL 127.0.0.1:5432 (trust auth, database `test`)     Redis 127.0.0.1:6379
set -euo pipefail
PG_HOST=127.0.0.1 PG_PORT=5432 REDIS_PORT=6379

say() { echo "[services] $*"; }
die() { echo "[services] ERROR: $*" >&2; exit 1; }

wait_for() {  # wait_for <description> <command...>
    local what=$1; shift
    for _ in $(seq 1 100); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
    die "$what did not come up"
}

# ---------------------------------------------------------------------------------------------- PostgreSQL
if pg_isready -q -h "$PG_HOST" -p "$PG_PORT" 2>/dev/null; then
    say "postgresql answering on $PG_HOST:$PG_PORT"
else
    command -v pg_ctlcluster >/dev/null || die "PostgreSQL is not running and pg_ctlcluster is not installed (apt-get install postgresql)"
    version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n1)
    [ -n "$version" ] || die "no PostgreSQL cluster under /etc/postgresql"
    say "starting postgresql $version/main"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || die "could not start PostgreSQL $version/main"
    wait_for "PostgreSQL" pg_isready -q -h "$PG_HOST" -p "$PG_PORT"
fi
psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -d test -qtAc "SELECT 1" >/dev/null 2>&1 \
    || psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -qc "CREATE DATABASE test" \
    || die "cannot reach database 'test' as postgres on $PG_HOST:$PG_PORT"

# --------------------------------------------------------------------------------------------------- Redis
if redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; then
    say "redis answering on 127.0.0.1:$REDIS_PORT"
else
    command -v redis-server >/dev/null || die "Redis is not running and redis-server is not installed (apt-get install redis-server)"
    say "starting redis-server on 127.0.0.1:$REDIS_PORT"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log || die "could not start redis-server"
    wait_for "Redis" sh -c "redis-cli -h 127.0.0.1 -p $REDIS_PORT ping | grep -q PONG"
fi
say "ready"
