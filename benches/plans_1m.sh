#!/usr/bin/env bash
# A plans file of a million API keys on one `ratemesh node`: the time from start to
# `/health`, resident memory once started and at its peak during a SIGHUP reload, and the
# same node without the plans file beside it. See docs/benchmarks.md, "A million API keys".
#
#   benches/plans_1m.sh
#
# Environment: KEYS (1000000), ROUNDS (3: starts and reloads measured, medians printed),
# SKIP_BUILD=1 to use the binary as it is, RATEMESH_BIN to name another.
# Needs curl and python3. Every process it starts is stopped on exit.
set -euo pipefail

KEYS=${KEYS:-1000000}
ROUNDS=${ROUNDS:-3}

cd "$(dirname "$0")/.."
command -v curl >/dev/null || { echo "plans_1m: needs curl" >&2; exit 2; }
if [ -z "${RATEMESH_BIN:-}" ]; then
  [ -n "${SKIP_BUILD:-}" ] || cargo build --release --quiet --bin ratemesh
  RATEMESH_BIN="${CARGO_TARGET_DIR:-target}/release/ratemesh"
fi

WORK=$(mktemp -d /tmp/ratemesh-plans.XXXXXX)
PID=
cleanup() {
  [ -n "$PID" ] && { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; }
  rm -rf "$WORK"
}
trap cleanup EXIT

"$RATEMESH_BIN" certs --out "$WORK/certs" --nodes 1 >/dev/null
policies() {
  cat <<EOF
env = "plans"
key_secret = "plans-secret"
default_tier = "free"
$1

[policies.free_hourly]
algorithm = "fixed-window"
limit = 100
window = "1h"

[policies.pro_hourly]
algorithm = "fixed-window"
limit = 10000
window = "1h"

[tiers.free]
policies = ["free_hourly"]

[tiers.pro]
policies = ["pro_hourly"]
EOF
}
policies 'plans_file = "plans.csv"' >"$WORK/with.toml"
policies '' >"$WORK/without.toml"
# The export: KEY,TIER for every customer, every tenth on the pro plan; hashed as an
# operator would, by `ratemesh hash-key --plans`.
python3 - "$KEYS" >"$WORK/export.csv" <<'EOF'
import sys
for i in range(int(sys.argv[1])):
    print(f"sk_live_{i:09d},{'pro' if i % 10 == 0 else 'free'}")
EOF
start_s=$(date +%s.%N)
"$RATEMESH_BIN" hash-key --plans --config "$WORK/with.toml" <"$WORK/export.csv" >"$WORK/plans.csv"
hash_s=$(python3 -c "import time; print(f'{time.time() - $start_s:.2f}')")

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rss_kib() { awk '/VmRSS/ { print $2 }' "/proc/$1/status"; }
now_ms() { date +%s%3N; }
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# One start of a node with policy file $1: prints "start_ms rss_kib peak_reload_kib".
run() {
  local policy=$1 quic http t0 t1 rss peak reloads
  quic=$(free_port); http=$(free_port)
  cat >"$WORK/node.toml" <<EOF
id = 1
listen = "127.0.0.1:$quic"
http = "127.0.0.1:$http"
policy_file = "$policy"
[tls]
ca = "certs/ca.pem"
cert = "certs/node-1.pem"
key = "certs/node-1.key"
EOF
  t0=$(now_ms)
  "$RATEMESH_BIN" node --config "$WORK/node.toml" >"$WORK/node.out" 2>"$WORK/node.log" &
  PID=$!
  until curl -sf "http://127.0.0.1:$http/health" >/dev/null; do
    kill -0 "$PID" 2>/dev/null || { cat "$WORK/node.log" >&2; exit 1; }
    sleep 0.01
  done
  t1=$(now_ms)
  sleep 2
  rss=$(rss_kib "$PID")
  # A reload of the same files, RSS sampled until the node counts it applied.
  peak=$rss
  kill -HUP "$PID"
  for _ in $(seq 1 2000); do
    r=$(rss_kib "$PID"); [ "$r" -gt "$peak" ] && peak=$r
    reloads=$(curl -s "http://127.0.0.1:$http/metrics" \
      | awk '/^ratemesh_config_reloads_total\{result="applied"\}/ { print $2 }')
    [ "${reloads:-0}" = "1" ] && break
  done
  for _ in $(seq 1 50); do
    r=$(rss_kib "$PID"); [ "$r" -gt "$peak" ] && peak=$r
    sleep 0.01
  done
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
  echo "$((t1 - t0)) $rss $peak"
}

echo "plans_1m: $KEYS API keys, $ROUNDS starts each ($(date -u +%F), $(nproc) CPUs)"
echo "hash-key --plans: ${hash_s} s for $KEYS lines; plans file $(du -m "$WORK/plans.csv" | cut -f1) MB"
for which in without with; do
  : >"$WORK/$which.runs"
  for _ in $(seq 1 "$ROUNDS"); do run "$which.toml" >>"$WORK/$which.runs"; done
  printf '%-8s start to /health %5s ms   RSS %4s MiB   peak during a reload %4s MiB\n' \
    "$which" \
    "$(cut -d' ' -f1 "$WORK/$which.runs" | median)" \
    "$(( $(cut -d' ' -f2 "$WORK/$which.runs" | median) / 1024 ))" \
    "$(( $(cut -d' ' -f3 "$WORK/$which.runs" | median) / 1024 ))"
done
