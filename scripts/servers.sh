#!/usr/bin/env bash
# Make sure RabbitMQ, Redis and PostgreSQL answer at the configured addresses, starting the local
# Debian-packaged servers when they are installed but stopped. Exits non-zero, saying which server
# is missing and how to get it, when one cannot be reached.
#
# What a restart of each server started here can lose (docs/operating.md, "What a server restart
# loses", says what vmsched then does):
# - Redis: started with the append-only file fsynced every second (appendonly yes, appendfsync
#   everysec) under $REDIS_DATA_DIR (default .redis/ in the checkout): a restart loses at most the
#   last second of writes. REDIS_PERSIST=no starts it without persistence (throwaway runs): a restart
#   then loses everything (locks, pending records, decisions, the cluster state).
# - RabbitMQ (the Debian package): durable queues and persistent messages are on disk in the
#   node's directory and survive a restart; on one node, losing the node's disk loses them.
# - PostgreSQL (the Debian package): policies are committed to disk; a restart loses nothing.
set -uo pipefail

amqp_url=${VMSCHED_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}
redis_url=${VMSCHED_REDIS_URL:-redis://127.0.0.1:6379/0}
pg_url=${VMSCHED_POSTGRES_URL:-postgresql://127.0.0.1:5432/vmsched}

hostport() { # url default-port -> "host port"
  python3 - "$1" "$2" <<'PY'
import sys
from urllib.parse import urlsplit
u = urlsplit(sys.argv[1])
print(u.hostname or "127.0.0.1", u.port or int(sys.argv[2]))
PY
}

answers() { # host port
  python3 - "$1" "$2" <<'PY'
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), 1).close()
except OSError:
    sys.exit(1)
PY
}

wait_for() { # name host port seconds
  local i
  for ((i = 0; i < $4 * 5; i++)); do
    answers "$2" "$3" && return 0
    sleep 0.2
  done
  return 1
}

ensure() { # name url default-port start-command...
  local name=$1 url=$2 port=$3; shift 3
  read -r host p < <(hostport "$url" "$port")
  if answers "$host" "$p"; then
    echo "servers: $name answers at $host:$p"
    return 0
  fi
  case $host in
    127.0.0.1|localhost|::1) ;;
    *) echo "servers: $name does not answer at $host:$p (not local: start it there)" >&2; return 1 ;;
  esac
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "servers: $name does not answer at $host:$p and '$1' is not installed." >&2
    echo "         Install it (Debian: apt-get install rabbitmq-server redis-server postgresql)," >&2
    echo "         or run: docker compose -f deploy/compose.yml up -d rabbitmq redis postgres" >&2
    return 1
  fi
  echo "servers: starting $name ($*)"
  "$@" >/dev/null 2>&1 || true
  if wait_for "$name" "$host" "$p" 90; then
    echo "servers: $name answers at $host:$p"
  else
    echo "servers: $name did not come up at $host:$p" >&2
    return 1
  fi
}

status=0
ensure RabbitMQ "$amqp_url" 5672 rabbitmq-server -detached || status=1
redis_dir=${REDIS_DATA_DIR:-$(cd "$(dirname "$0")/.." && pwd)/.redis}
if [[ ${REDIS_PERSIST:-yes} == no ]]; then
  redis_persist=(--save "" --appendonly no)
else
  mkdir -p "$redis_dir"
  redis_persist=(--save "" --appendonly yes --appendfsync everysec --dir "$redis_dir")
fi
ensure Redis "$redis_url" 6379 redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 "${redis_persist[@]}" || status=1
pg_start() { pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start; }
if command -v pg_ctlcluster >/dev/null 2>&1; then
  ensure PostgreSQL "$pg_url" 5432 pg_start || status=1
else
  ensure PostgreSQL "$pg_url" 5432 pg_ctlcluster || status=1
fi
exit $status
