#!/usr/bin/env bash
# Make sure the PostgreSQL and Redis that the tests use answer on 127.0.0.1 (installed as root
# when missing, started when down) and create the test database; install openssh-server for the
# SSH tests and nginx for the front-door tests (as root; otherwise say how, and those tests are
# skipped). Idempotent; one line each.
set -euo pipefail

PG_HOST=127.0.0.1
PG_PORT="${TRAINHUB_PG_PORT:-5432}"
PG_USER="${TRAINHUB_PG_USER:-postgres}"
PG_DB="${TRAINHUB_PG_DB:-trainhub}"
REDIS_HOST=127.0.0.1
REDIS_PORT="${TRAINHUB_REDIS_PORT:-6379}"
WAIT_S=30

die() {
    echo "ensure_services: $*" >&2
    exit 1
}

can_install() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

apt_install() { # apt_install <package>: quietly, refreshing the lists only when needed
    local package="$1" log
    log="$(mktemp -t trainhub-apt.XXXXXX.log)"
    install() {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "$package" >>"$log" 2>&1
    }
    if ! apt-cache show "$package" >/dev/null 2>&1 || ! install; then
        apt-get update -qq >>"$log" 2>&1 && install \
            || { tail -n 30 "$log" >&2; die "installing $package failed (log above, in full: $log)"; }
    fi
    rm -f "$log"
    echo "$package: installed"
}

pg_up() { pg_isready -q -h "$PG_HOST" -p "$PG_PORT" >/dev/null 2>&1; }
redis_up() { [ "$(redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = "PONG" ]; }

wait_for() { # wait_for <name> <check-function>
    local name="$1" check="$2" i
    for ((i = 0; i < WAIT_S; i++)); do
        if "$check"; then
            return 0
        fi
        sleep 1
    done
    die "$name was started but did not answer within ${WAIT_S}s; check its log (PostgreSQL: /var/log/postgresql/, Redis: stderr of redis-server)."
}

# --- PostgreSQL ---------------------------------------------------------------------------------
if ! command -v pg_ctlcluster >/dev/null 2>&1 && ! pg_up && can_install; then
    apt_install postgresql
    # A fresh Debian cluster asks for passwords over TCP; the tests connect as postgres without
    # one (the throwaway local setup README describes), so trust loopback connections.
    for hba in /etc/postgresql/*/main/pg_hba.conf; do
        sed -i -E 's#^(host\s+all\s+all\s+(127\.0\.0\.1/32|::1/128)\s+)\S+#\1trust#' "$hba"
    done
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n 1)" main \
        restart >/dev/null 2>&1 || true
fi
if ! command -v pg_isready >/dev/null 2>&1 || ! command -v psql >/dev/null 2>&1; then
    die "PostgreSQL client tools not found (pg_isready, psql). Install PostgreSQL: apt-get install -y postgresql"
fi
if pg_up; then
    echo "postgresql: answering on $PG_HOST:$PG_PORT"
else
    if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ ! -d /etc/postgresql ] \
        || [ -z "$(ls -A /etc/postgresql 2>/dev/null)" ]; then
        die "PostgreSQL is not running on $PG_HOST:$PG_PORT and no server is installed. Install it: apt-get install -y postgresql"
    fi
    pg_version="$(ls /etc/postgresql | sort -V | tail -n 1)"
    pg_ctlcluster --skip-systemctl-redirect "$pg_version" main start >/dev/null 2>&1 \
        || echo "ensure_services: pg_ctlcluster $pg_version main start returned non-zero; waiting anyway" >&2
    wait_for "PostgreSQL $pg_version" pg_up
    echo "postgresql: started cluster $pg_version/main, answering on $PG_HOST:$PG_PORT"
fi

# --- Redis --------------------------------------------------------------------------------------
if redis_up; then
    echo "redis: answering on $REDIS_HOST:$REDIS_PORT"
else
    if ! command -v redis-server >/dev/null 2>&1 && can_install; then
        apt_install redis-server
    fi
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        die "Redis is not running on $REDIS_HOST:$REDIS_PORT and redis-server is not installed. Install it: apt-get install -y redis-server"
    fi
    # No persistence: the tests only need a throwaway broker.
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" \
        --save "" --appendonly no >/dev/null
    wait_for "Redis" redis_up
    echo "redis: started, answering on $REDIS_HOST:$REDIS_PORT"
fi

# --- test database ------------------------------------------------------------------------------
case "$PG_DB" in
    *[!A-Za-z0-9_]* | "") die "TRAINHUB_PG_DB='$PG_DB' must be letters, digits and underscores only." ;;
esac
exists="$(psql -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname='$PG_DB'")" \
    || die "cannot query PostgreSQL as user '$PG_USER' on $PG_HOST:$PG_PORT (is local trust auth enabled?)."
if [ "$exists" = "1" ]; then
    echo "postgresql: database '$PG_DB' exists"
else
    createdb -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" "$PG_DB"
    echo "postgresql: created database '$PG_DB'"
fi

# --- binaries some tests run themselves on loopback ---------------------------------------------
# ensure_binary <path> <package> <which tests>: installed as root when missing (INSTALLED=yes);
# otherwise those tests are skipped, and this says how to install it.
ensure_binary() {
    local binary="$1" package="$2" tests="$3"
    INSTALLED=no
    if [ -x "$binary" ]; then
        echo "$package: $binary present"
    elif ! can_install; then
        echo "$package: $binary missing, so the $tests tests will be skipped; install it: sudo apt-get install -y $package"
    else
        apt_install "$package"
        [ -x "$binary" ] || die "$package installed but $binary is missing"
        INSTALLED=yes
    fi
}

ensure_binary /usr/sbin/sshd openssh-server SSH # a real sshd (tests/providers, e2e)
# tests/deploy starts its own nginx with the shipped deploy/nginx.conf: only the binary is used.
# Just installed, the package may have started its default site where init scripts run: stopped.
ensure_binary /usr/sbin/nginx nginx front-door
if [ "$INSTALLED" = yes ] && [ -s /run/nginx.pid ]; then
    /usr/sbin/nginx -s quit 2>/dev/null || true
fi
