#!/usr/bin/env bash
# One `ratemesh node` against nginx `limit_req` on the same machine, with the same load tool
# (wrk), in alternating runs. See docs/benchmarks.md, "One node against nginx".
#
#   benches/vs_nginx.sh              # every mode: decide, proxy, then deny-heavy
#   benches/vs_nginx.sh decide       # the node answers itself / nginx serves a small file
#   benches/vs_nginx.sh proxy        # both in front of the same upstream (an nginx `return 200`)
#   benches/vs_nginx.sh deny-heavy   # decide under a bucket of 100/s, burst 20: nearly every
#                                    # answer a 429, as under an attack
#
# Environment: ROUNDS (5), DURATION (10s), THREADS (wrk threads, 2), CONNS (64),
# WORKERS (nginx worker processes and the node's runtime threads, 2), WARMUP (3s),
# PIN (a taskset CPU list for all processes, empty: none), SKIP_BUILD=1 to use the binary
# as it is, RATEMESH_BIN to name another one, TOP_POLL=1 to give the node an `[admin]` port
# and run `ratemesh ctl top --policy bench` against it every 100 ms while it serves. The node is the production build
# (`cargo build --profile dist`, target/dist/ratemesh), as nginx is Debian's optimised one. Needs nginx and wrk (Debian: nginx-light, wrk).
#
# Both limiters key the requests by the same header (`x-api-key`, one hot key) and run a
# token bucket of the same rate and burst: nginx `limit_req zone=… burst=B nodelay`, the node
# `algorithm = "token-bucket"`. Each mode first runs a check at a low rate (100/s, burst 100)
# where both must deny nearly everything and admit about the same count, then the measured
# runs at a rate and burst no load reaches (1,000,000/s, burst 1,000,000), where both admit
# every request. With a burst of 1000 the node denied a few requests in 200k: a check whose
# thread is preempted between reading the clock and charging the bucket finds the bucket
# charged up to the other threads' later clock, so a burst shorter than such a pause
# (1000 tokens at 1M/s is 1 ms) can look empty.
set -euo pipefail

MODES=${1:-all}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
THREADS=${THREADS:-2}
CONNS=${CONNS:-64}
WORKERS=${WORKERS:-2}
WARMUP=${WARMUP:-3s}
PIN=${PIN:-}
TOP_POLL=${TOP_POLL:-}
TOKEN=bench-admin-token-0123456789abcdef0123456789
KEY=bench-client
HIGH_RATE=1000000
HIGH_BURST=1000000
LOW_RATE=100
LOW_BURST=100

cd "$(dirname "$0")/.."
for tool in nginx wrk python3 curl; do
  command -v "$tool" >/dev/null || { echo "vs_nginx: needs $tool" >&2; exit 2; }
done
if [ -z "${RATEMESH_BIN:-}" ]; then
  [ -n "${SKIP_BUILD:-}" ] || cargo build --profile dist --quiet --bin ratemesh
  RATEMESH_BIN="${CARGO_TARGET_DIR:-target}/dist/ratemesh"
fi

WORK=$(mktemp -d /tmp/ratemesh-vs-nginx.XXXXXX)
chmod 755 "$WORK" # nginx's workers read www/ok
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# Run a command (pinned with PIN); `exec`, so that `pin … &` leaves the command's own pid in $!.
pin() { if [ -n "$PIN" ]; then exec taskset -c "$PIN" "$@"; else exec "$@"; fi; }

# Free loopback ports (bound then released).
ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

wait_http() {
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "$1" && return 0
    sleep 0.05
  done
  echo "vs_nginx: $1 does not answer" >&2
  exit 1
}

"$RATEMESH_BIN" certs --out "$WORK/certs" --nodes 1 >/dev/null
mkdir -p "$WORK/www"
printf 'ok\n' >"$WORK/www/ok"

# The upstream of proxy mode: one nginx worker answering `200 ok` to everything.
start_upstream() {
  mkdir -p "$WORK/upstream"
  cat >"$WORK/upstream/nginx.conf" <<EOF
worker_processes 1;
pid $WORK/upstream/nginx.pid;
error_log $WORK/upstream/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path $WORK/upstream;
  server {
    listen 127.0.0.1:$UPSTREAM_PORT reuseport backlog=4096;
    location / { return 200 "ok\n"; }
  }
}
EOF
  pin nginx -e "$WORK/upstream/error.log" -p "$WORK/upstream" -c "$WORK/upstream/nginx.conf" -g 'daemon off;' &
  PIDS+=($!)
  wait_http "http://127.0.0.1:$UPSTREAM_PORT/"
}

# nginx with limit_req: rate $1/s, burst $2; mode decide (a small file) or proxy.
start_nginx() {
  local rate=$1 burst=$2 mode=$3 dir="$WORK/nginx-$1-$3"
  mkdir -p "$dir"
  local content
  if [ "$mode" = proxy ]; then
    content="proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;"
  else
    content="default_type text/plain; root $WORK/www;"
  fi
  cat >"$dir/nginx.conf" <<EOF
worker_processes $WORKERS;
pid $dir/nginx.pid;
error_log $dir/error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  open_file_cache max=16 inactive=1h;
  open_file_cache_valid 1h;
  client_body_temp_path $dir;
  proxy_temp_path $dir;
  limit_req_zone \$http_x_api_key zone=bench:10m rate=${rate}r/s;
  limit_req_status 429;
  limit_req_log_level info;
  upstream up { server 127.0.0.1:$UPSTREAM_PORT; keepalive 128; }
  server {
    listen 127.0.0.1:$NGINX_PORT reuseport backlog=4096;
    location / {
      limit_req zone=bench burst=$burst nodelay;
      $content
    }
  }
}
EOF
  pin nginx -e "$dir/error.log" -p "$dir" -c "$dir/nginx.conf" -g 'daemon off;' &
  NGINX_PID=$!
  PIDS+=($NGINX_PID)
  wait_http "http://127.0.0.1:$NGINX_PORT/ok"
}

# A node with a token bucket: rate $1/s, burst $2; mode decide (answers itself) or proxy.
start_node() {
  local rate=$1 burst=$2 mode=$3 dir="$WORK/node-$1-$3"
  mkdir -p "$dir"
  cat >"$dir/policies.toml" <<EOF
env = "bench"
default_tier = "all"
[identity]
order = ["api_key"]
api_key_header = "x-api-key"
[policies.bench]
algorithm = "token-bucket"
rate = $rate
period = "1s"
burst = $burst
[tiers.all]
policies = ["bench"]
EOF
  local quic
  quic=$(ports 1)
  cat >"$dir/node.toml" <<EOF
id = 1
listen = "127.0.0.1:$quic"
http = "127.0.0.1:$NODE_PORT"
policy_file = "policies.toml"
drain_grace = "0s"
drain = "1s"
[tls]
ca = "$WORK/certs/ca.pem"
cert = "$WORK/certs/node-1.pem"
key = "$WORK/certs/node-1.key"
EOF
  local admin_port=""
  if [ -n "$TOP_POLL" ]; then
    admin_port=$(ports 1)
    printf 'bench %s\n' "$TOKEN" >"$dir/admin-tokens"
    printf '[admin]\nlisten = "127.0.0.1:%s"\ntoken_file = "admin-tokens"\n' "$admin_port" >>"$dir/node.toml"
  fi
  if [ "$mode" = proxy ]; then
    # The same forwarding field as nginx's `proxy_set_header X-Forwarded-For` (a route's
    # default also writes Forwarded, X-Forwarded-Proto and X-Forwarded-Host).
    printf '[[proxy]]\npath_prefix = "/"\nupstream = "http://127.0.0.1:%s"\nforwarded = ["x-forwarded-for"]\n' \
      "$UPSTREAM_PORT" >>"$dir/node.toml"
  fi
  RUST_LOG=warn TOKIO_WORKER_THREADS=$WORKERS pin "$RATEMESH_BIN" node --config "$dir/node.toml" \
    >"$dir/stdout" 2>"$dir/stderr" &
  NODE_PID=$!
  PIDS+=($NODE_PID)
  wait_http "http://127.0.0.1:$NODE_PORT/health"
  if [ -n "$admin_port" ]; then
    (
      while true; do
        RATEMESH_TOKEN=$TOKEN "$RATEMESH_BIN" ctl --admin "127.0.0.1:$admin_port" top --policy bench >/dev/null 2>&1 || true
        sleep 0.1
      done
    ) &
    POLL_PID=$!
    PIDS+=($POLL_PID)
  fi
}

stop() {
  if [ "$1" = "${NODE_PID:-}" ] && [ -n "${POLL_PID:-}" ]; then
    kill "$POLL_PID" 2>/dev/null || true
    wait "$POLL_PID" 2>/dev/null || true
    POLL_PID=""
  fi
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# wrk against $1 for $2; prints "requests/s total non2xx".
load() {
  local out
  out=$(pin wrk -t"$THREADS" -c"$CONNS" -d"$2" -H "x-api-key: $KEY" "$1")
  local rps total non2xx
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  total=$(awk '/requests in/ {print $1}' <<<"$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
  echo "$rps $total ${non2xx:-0}"
}

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# Low rate: both must deny nearly all and admit about the same number.
check_low() {
  local mode=$1
  start_node "$LOW_RATE" "$LOW_BURST" "$mode"
  start_nginx "$LOW_RATE" "$LOW_BURST" "$mode"
  local expect r n
  expect=$(awk -v d="${DURATION%s}" -v r="$LOW_RATE" -v b="$LOW_BURST" 'BEGIN {print b + r * d}')
  read -r _ total non2xx <<<"$(load "http://127.0.0.1:$NODE_PORT/ok" "$DURATION")"
  r=$((total - non2xx))
  read -r _ total non2xx <<<"$(load "http://127.0.0.1:$NGINX_PORT/ok" "$DURATION")"
  n=$((total - non2xx))
  echo "$mode, rate $LOW_RATE/s burst $LOW_BURST for $DURATION: admitted ratemesh $r, nginx $n (about $expect expected), the rest 429"
  for admitted in "$r" "$n"; do
    if [ "$admitted" -lt $((expect * 8 / 10)) ] || [ "$admitted" -gt $((expect * 12 / 10)) ]; then
      echo "vs_nginx: admitted $admitted, expected about $expect" >&2
      exit 1
    fi
  done
  stop "$NODE_PID"
  stop "$NGINX_PID"
}

run_mode() {
  local mode=$1
  read -r NODE_PORT NGINX_PORT UPSTREAM_PORT <<<"$(ports 3)"
  if [ "$mode" = proxy ]; then
    start_upstream
  fi
  check_low "$mode"
  start_node "$HIGH_RATE" "$HIGH_BURST" "$mode"
  start_nginx "$HIGH_RATE" "$HIGH_BURST" "$mode"
  local node_url="http://127.0.0.1:$NODE_PORT/ok" nginx_url="http://127.0.0.1:$NGINX_PORT/ok"
  load "$node_url" "$WARMUP" >/dev/null
  load "$nginx_url" "$WARMUP" >/dev/null
  local ours=() theirs=() ratios=() direct=()
  for i in $(seq 1 "$ROUNDS"); do
    local a b
    # Alternate which side goes first.
    if [ $((i % 2)) = 1 ]; then
      read -r a total non2xx <<<"$(load "$node_url" "$DURATION")"
      [ "$non2xx" = 0 ] || { echo "vs_nginx: ratemesh denied $non2xx of $total" >&2; exit 1; }
      read -r b total non2xx <<<"$(load "$nginx_url" "$DURATION")"
      [ "$non2xx" = 0 ] || { echo "vs_nginx: nginx denied $non2xx of $total" >&2; exit 1; }
    else
      read -r b total non2xx <<<"$(load "$nginx_url" "$DURATION")"
      [ "$non2xx" = 0 ] || { echo "vs_nginx: nginx denied $non2xx of $total" >&2; exit 1; }
      read -r a total non2xx <<<"$(load "$node_url" "$DURATION")"
      [ "$non2xx" = 0 ] || { echo "vs_nginx: ratemesh denied $non2xx of $total" >&2; exit 1; }
    fi
    ours+=("$a")
    theirs+=("$b")
    ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", a / b}')")
    printf '%s round %d: ratemesh %.0f req/s, nginx %.0f req/s, ratio %s\n' \
      "$mode" "$i" "$a" "$b" "${ratios[-1]}"
    if [ "$mode" = proxy ]; then
      read -r c _ _ <<<"$(load "http://127.0.0.1:$UPSTREAM_PORT/ok" "$DURATION")"
      direct+=("$c")
    fi
  done
  printf '%s: median ratemesh %.0f req/s, nginx %.0f req/s; median of the ratios %s (%s rounds of %s, wrk -t%s -c%s)\n' \
    "$mode" "$(echo "${ours[*]}" | median)" "$(echo "${theirs[*]}" | median)" \
    "$(echo "${ratios[*]}" | median)" "$ROUNDS" "$DURATION" "$THREADS" "$CONNS"
  if [ "$mode" = proxy ]; then
    printf 'proxy: the upstream alone, median %.0f req/s\n' "$(echo "${direct[*]}" | median)"
  fi
  stop "$NODE_PID"
  stop "$NGINX_PID"
}

# Deny-heavy: a bucket of 100/s with a burst of 20 under the same load, so that nearly every
# answer is a 429; both must admit about rate × duration + burst each round. Answers per
# second (429s included) compared, in alternating rounds.
run_deny_heavy() {
  local rate=100 burst=20
  read -r NODE_PORT NGINX_PORT UPSTREAM_PORT <<<"$(ports 3)"
  start_node "$rate" "$burst" decide
  start_nginx "$rate" "$burst" decide
  local node_url="http://127.0.0.1:$NODE_PORT/ok" nginx_url="http://127.0.0.1:$NGINX_PORT/ok"
  load "$node_url" "$WARMUP" >/dev/null
  load "$nginx_url" "$WARMUP" >/dev/null
  local expect
  expect=$(awk -v d="${DURATION%s}" -v r="$rate" -v b="$burst" 'BEGIN {print b + r * d}')
  local ours=() theirs=() ratios=()
  for i in $(seq 1 "$ROUNDS"); do
    local a b ra rb
    if [ $((i % 2)) = 1 ]; then
      read -r a total non2xx <<<"$(load "$node_url" "$DURATION")"; ra=$((total - non2xx))
      read -r b total non2xx <<<"$(load "$nginx_url" "$DURATION")"; rb=$((total - non2xx))
    else
      read -r b total non2xx <<<"$(load "$nginx_url" "$DURATION")"; rb=$((total - non2xx))
      read -r a total non2xx <<<"$(load "$node_url" "$DURATION")"; ra=$((total - non2xx))
    fi
    for admitted in "$ra" "$rb"; do
      if [ "$admitted" -lt $((expect * 8 / 10)) ] || [ "$admitted" -gt $((expect * 12 / 10)) ]; then
        echo "vs_nginx: deny-heavy admitted $admitted, expected about $expect" >&2
        exit 1
      fi
    done
    ours+=("$a")
    theirs+=("$b")
    ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", a / b}')")
    printf 'deny-heavy round %d: ratemesh %.0f answers/s (%d admitted), nginx %.0f answers/s (%d admitted), ratio %s\n' \
      "$i" "$a" "$ra" "$b" "$rb" "${ratios[-1]}"
  done
  printf 'deny-heavy: median ratemesh %.0f answers/s, nginx %.0f answers/s; median of the ratios %s (%s rounds of %s, wrk -t%s -c%s, %s/s burst %s)\n' \
    "$(echo "${ours[*]}" | median)" "$(echo "${theirs[*]}" | median)" \
    "$(echo "${ratios[*]}" | median)" "$ROUNDS" "$DURATION" "$THREADS" "$CONNS" "$rate" "$burst"
  stop "$NODE_PID"
  stop "$NGINX_PID"
}

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(nginx -v 2>&1); $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)"
case "$MODES" in
  all) run_mode decide; run_mode proxy; run_deny_heavy ;;
  decide | proxy) run_mode "$MODES" ;;
  deny-heavy) run_deny_heavy ;;
  *) echo "usage: benches/vs_nginx.sh [all|decide|proxy|deny-heavy]" >&2; exit 2 ;;
esac
