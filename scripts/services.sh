#!/usr/bin/env bash
# The services the scale-out tests and benchmarks use, on loopback only, each in its own folder.
#
#   bash scripts/services.sh install                 # Debian packages: postgresql, redis-server, chromium
#   bash scripts/services.sh start postgres DIR PORT  # initdb DIR (first time), start, create database `dagster`
#   bash scripts/services.sh start redis DIR PORT
#   bash scripts/services.sh start s3 DIR PORT        # moto in server mode (from the venv): a loopback S3
#   bash scripts/services.sh stop  postgres|redis|s3 DIR
#   bash scripts/services.sh restart postgres DIR     # stop and start again (the restart-mid-backfill test)
#
# Nothing listens beyond 127.0.0.1; every process writes its pid and log under DIR, and `stop`
# ends exactly that pid. Tests start and stop these through fugu_pipeline_tests/services.py.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:?usage: services.sh install|start|stop|restart ...}

pg_bin() {  # Debian keeps the server binaries out of PATH
  local d
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/pg_ctl" ] && { echo "$d"; return; }; done
  command -v pg_ctl >/dev/null && { dirname "$(command -v pg_ctl)"; return; }
  echo "postgresql is not installed (bash scripts/services.sh install)" >&2; exit 3
}

run_as_pg() {  # postgres refuses to run as root: run it as the `postgres` user (created by the package)
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "$cmd" in
install)
  need=()
  command -v redis-server >/dev/null || need+=(redis-server)
  ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || need+=(postgresql)
  command -v chromium >/dev/null || need+=(chromium chromium-driver)
  if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    t0=$(date +%s)
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    echo "services: installed ${need[*]} in $(( $(date +%s) - t0 )) s"
  else
    echo "services: postgresql, redis-server and chromium already installed"
  fi
  ;;
start)
  svc=${2:?service}; dir=${3:?folder}; port=${4:?port}
  mkdir -p "$dir"; dir=$(cd "$dir" && pwd)
  case "$svc" in
  postgres)
    bin=$(pg_bin)
    [ "$(id -u)" = 0 ] && chown -R postgres "$dir"
    if [ ! -f "$dir/data/PG_VERSION" ]; then
      run_as_pg "$bin/initdb" -D "$dir/data" -U dagster --auth=trust -E UTF8 >"$dir/initdb.log"
      printf "listen_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nfsync = on\n" "$dir" >>"$dir/data/postgresql.conf"
    fi
    echo "$port" >"$dir/port"
    run_as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -o "-p $port" -w -t 30 start >/dev/null
    "$bin/psql" -h 127.0.0.1 -p "$port" -U dagster -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='dagster'" | grep -q 1 \
      || "$bin/createdb" -h 127.0.0.1 -p "$port" -U dagster dagster
    echo "postgres: 127.0.0.1:$port, data in $dir/data"
    ;;
  redis)
    command -v redis-server >/dev/null || { echo "redis-server is not installed (bash scripts/services.sh install)" >&2; exit 3; }
    redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" --save '' --appendonly no \
      --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
    for _ in $(seq 50); do redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
    echo "redis: 127.0.0.1:$port"
    ;;
  s3)
    [ -x .venv/bin/moto_server ] || { echo "moto is not installed in .venv (pip install -e '.[dev]')" >&2; exit 3; }
    nohup .venv/bin/moto_server -H 127.0.0.1 -p "$port" >"$dir/moto.log" 2>&1 &
    echo $! >"$dir/moto.pid"
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/moto-api/" >/dev/null 2>&1 && break; sleep 0.1; done
    echo "s3 (moto): http://127.0.0.1:$port"
    ;;
  *) echo "unknown service $svc" >&2; exit 2 ;;
  esac
  ;;
stop|restart)
  svc=${2:?service}; dir=${3:?folder}
  case "$svc" in
  postgres)
    bin=$(pg_bin)
    if [ "$cmd" = restart ]; then
      run_as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop >/dev/null
      sleep "${FUGU_PG_DOWN_S:-0}"
      run_as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -o "-p $(cat "$dir/port")" -w -t 30 start >/dev/null
      echo "postgres: restarted"
    else
      [ -f "$dir/data/postmaster.pid" ] && run_as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop >/dev/null || true
    fi
    ;;
  redis|s3)
    f="$dir/$([ "$svc" = redis ] && echo redis || echo moto).pid"
    if [ -f "$f" ]; then pid=$(cat "$f"); kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done; rm -f "$f"; fi
    ;;
  esac
  ;;
*) echo "usage: services.sh install|start|stop|restart ..." >&2; exit 2 ;;
esac
