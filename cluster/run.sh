#!/usr/bin/env bash
# The cluster demo by hand: certificates, three `ratemesh node` processes on loopback,
# requests through their gateways, /health and /metrics, a crash and a restart.
#   cluster/run.sh          run the steps and stop every node at the end
#   cluster/run.sh --keep   leave the nodes running until Ctrl-C
# Needs curl. Every node this script starts is stopped on exit, error or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")"
BIN=${RATEMESH_BIN:-../target/release/ratemesh}
command -v curl >/dev/null || { echo "this script needs curl" >&2; exit 1; }
[ -x "$BIN" ] || (cd .. && cargo build --release)
[ -f certs/ca.pem ] || "$BIN" certs --out certs --nodes 3
mkdir -p logs

declare -A pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start() {  # start node $1; its log goes to logs/node-$1.log
  "$BIN" node --config "node-$1.toml" >"logs/node-$1.out" 2>"logs/node-$1.log" &
  pids[$1]=$!
}
healthy() {  # wait until node $1 admits (its /health answers 200)
  for _ in $(seq 1 200); do
    curl -sf "http://127.0.0.1:810$1/health" >/dev/null && return 0
    sleep 0.05
  done
  echo "node $1 is not healthy; see cluster/logs/node-$1.log" >&2
  return 1
}
burst() {  # send $1 requests of one client, round-robin over the running nodes, 32 at a time
  local nodes=$2 started=$SECONDS
  seq 1 "$1" | xargs -P 32 -I{} sh -c \
    "curl -s -o /dev/null -w '%{http_code}\n' -H 'x-api-key: tenant-1' http://127.0.0.1:810\$(( {} % $nodes + 1 ))/api/orders" |
    sort | uniq -c | sed 's/^/    /'
  echo "    (in about $((SECONDS - started + 1)) s; 200 = admitted, 429 = limited)"
}

echo "== starting nodes 1-3 (QUIC on 7101-7103, HTTP on 8101-8103)"
for i in 1 2 3; do start "$i"; done
for i in 1 2 3; do healthy "$i"; done
curl -s http://127.0.0.1:8101/health; echo

echo "== one request: the RateLimit fields"
curl -si -H 'x-api-key: tenant-1' http://127.0.0.1:8102/api/orders | grep -i '^ratelimit\|^HTTP'

echo "== 1500 requests of one client over the 3 nodes (the limit is 100 per second, cluster-wide)"
burst 1500 3

echo "== node 1's /metrics (excerpt)"
curl -s http://127.0.0.1:8101/metrics | grep -E '^ratemesh_(decisions_total|peers_up|gossip_bytes|overshoot)'

echo "== killing node 3 (SIGKILL)"
kill -KILL "${pids[3]}" && wait "${pids[3]}" 2>/dev/null || true
unset 'pids[3]'
sleep 1
curl -s http://127.0.0.1:8101/metrics | grep -E '^ratemesh_(peers_up|overshoot)'
burst 600 2

echo "== restarting node 3: it recovers its counts from the others before it admits"
start 3
healthy 3
curl -s http://127.0.0.1:8103/health; echo
burst 600 3

if [ "${1:-}" = "--keep" ]; then
  echo "== nodes running; Ctrl-C stops them"
  wait
fi
echo "== stopping (SIGTERM: each node drains and exits)"
