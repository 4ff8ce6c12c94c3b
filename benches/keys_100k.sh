#!/usr/bin/env bash
# Three `ratemesh node` processes on loopback under 100,000 distinct API keys, as fast as wrk
# drives them, then quiet: resident memory during and after, latency, and the CPU the nodes
# still burn once the load stops. See docs/benchmarks.md, "100,000 keys on three nodes".
#
#   benches/keys_100k.sh
#
# Environment: KEYS (100000), DURATION (60s), AFTER (30, seconds of quiet measured after),
# CONNS (32 per node), DELAY_MS (each connection pauses this long between requests: a load
# below what the nodes can take; unset: as fast as wrk drives them), BACKEND (mesh; local
# for the same load on each node's own limiter), FIRST_CREDIT (the nodes'
# mesh_first_credit, default theirs), SKIP_BUILD=1 to use the binary as it is, RATEMESH_BIN
# to name another.
# Needs wrk and curl. Every process it starts is stopped on exit.
#
# Each node gets one wrk (1 thread) whose requests carry `x-api-key: k<n>`, n drawn at random
# from KEYS keys, so every key is used on every node about every KEYS / (requests per second)
# seconds; the policy is a mesh fixed window of 100 per second per key (nothing is denied:
# each key sees a few requests a second at most).
set -euo pipefail

KEYS=${KEYS:-100000}
DURATION=${DURATION:-60s}
AFTER=${AFTER:-30}
CONNS=${CONNS:-32}

cd "$(dirname "$0")/.."
for tool in wrk curl; do
  command -v "$tool" >/dev/null || { echo "keys_100k: needs $tool" >&2; exit 2; }
done
if [ -z "${RATEMESH_BIN:-}" ]; then
  [ -n "${SKIP_BUILD:-}" ] || cargo build --release --quiet --bin ratemesh
  RATEMESH_BIN="${CARGO_TARGET_DIR:-target}/release/ratemesh"
fi

WORK=$(mktemp -d /tmp/ratemesh-keys.XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

"$RATEMESH_BIN" certs --out "$WORK/certs" --nodes 3 >/dev/null
cat >"$WORK/policies.toml" <<EOF
env = "keys"
key_secret = "keys-secret"
default_tier = "api"

[policies.global]
algorithm = "fixed-window"
limit = 100
window = "1s"
backend = "${BACKEND:-mesh}"

[tiers.api]
policies = ["global"]
EOF
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
declare -a QUIC HTTP
for i in 1 2 3; do QUIC[$i]=$(free_port); HTTP[$i]=$(free_port); done
for i in 1 2 3; do
  {
    echo "id = $i"
    echo "listen = \"127.0.0.1:${QUIC[$i]}\""
    echo "http = \"127.0.0.1:${HTTP[$i]}\""
    echo "policy_file = \"policies.toml\""
    [ -n "${FIRST_CREDIT:-}" ] && echo "mesh_first_credit = $FIRST_CREDIT"
    echo "[tls]"
    echo "ca = \"certs/ca.pem\""
    echo "cert = \"certs/node-$i.pem\""
    echo "key = \"certs/node-$i.key\""
    for j in 1 2 3; do
      [ "$j" = "$i" ] && continue
      printf '[[peers]]\nid = %s\naddr = "127.0.0.1:%s"\n' "$j" "${QUIC[$j]}"
    done
  } >"$WORK/node-$i.toml"
  "$RATEMESH_BIN" node --config "$WORK/node-$i.toml" >"$WORK/node-$i.out" 2>"$WORK/node-$i.log" &
  PIDS+=($!)
  NODE[$i]=$!
done
for i in 1 2 3; do
  for _ in $(seq 1 200); do
    curl -sf "http://127.0.0.1:${HTTP[$i]}/health" >/dev/null && break
    sleep 0.05
  done
done

cat >"$WORK/keys.lua" <<EOF
math.randomseed(os.time() + tonumber(string.sub(tostring({}), 8), 16))
request = function()
  return wrk.format("GET", "/api/orders", { ["x-api-key"] = "k" .. math.random(1, $KEYS) })
end
EOF
if [ -n "${DELAY_MS:-}" ]; then
  printf 'delay = function()\n  return %s\nend\n' "$DELAY_MS" >>"$WORK/keys.lua"
fi

rss_mib() { awk '/VmRSS/ { printf "%d", $2 / 1024 }' "/proc/$1/status"; }
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

echo "100k keys: $KEYS keys, $DURATION, 3 nodes, wrk -t1 -c$CONNS per node${DELAY_MS:+, ${DELAY_MS} ms pause between requests on a connection} ($(date -u +%F), $(nproc) CPUs)"
for i in 1 2 3; do
  wrk -t1 -c"$CONNS" -d"$DURATION" --latency -s "$WORK/keys.lua" \
    "http://127.0.0.1:${HTTP[$i]}/" >"$WORK/wrk-$i.txt" 2>&1 &
  WRK[$i]=$!
done
declare -A PEAK
for i in 1 2 3; do PEAK[$i]=0; done
while kill -0 "${WRK[1]}" 2>/dev/null || kill -0 "${WRK[2]}" 2>/dev/null || kill -0 "${WRK[3]}" 2>/dev/null; do
  for i in 1 2 3; do
    r=$(rss_mib "${NODE[$i]}"); [ "$r" -gt "${PEAK[$i]}" ] && PEAK[$i]=$r
  done
  sleep 1
done
for i in 1 2 3; do wait "${WRK[$i]}" || true; done
declare -A T0
for i in 1 2 3; do T0[$i]=$(cpu_ticks "${NODE[$i]}"); done
sleep "$AFTER"
for i in 1 2 3; do
  ticks=$(( $(cpu_ticks "${NODE[$i]}") - T0[$i] ))
  reqs=$(awk '/Requests\/sec/ { print $2 }' "$WORK/wrk-$i.txt")
  p50=$(awk '$1 == "50%" { print $2 }' "$WORK/wrk-$i.txt")
  p99=$(awk '$1 == "99%" { print $2 }' "$WORK/wrk-$i.txt")
  codes=$(awk '/Non-2xx/ { print $NF }' "$WORK/wrk-$i.txt"); codes=${codes:-0}
  metrics=$(curl -s "http://127.0.0.1:${HTTP[$i]}/metrics")
  keys=$(awk '/^ratemesh_mesh_keys / { print $2 }' <<<"$metrics")
  waits=$(awk '/^ratemesh_mesh_waits_total / { print $2 }' <<<"$metrics")
  credited=$(awk '/^ratemesh_mesh_first_credit_total / { print $2 }' <<<"$metrics")
  shed=$(awk '/^ratemesh_mesh_shed_decisions_total / { print $2 }' <<<"$metrics")
  held=$(awk '/^ratemesh_gossip_held_back_items_total / { print $2 }' <<<"$metrics")
  dropped=$(awk '/^ratemesh_gossip_dropped_frames_total/ { n += $2 } END { print n + 0 }' <<<"$metrics")
  timeouts=$(awk '/^ratemesh_mesh_wait_timeouts_total / { print $2 }' <<<"$metrics")
  echo "node $i: ${reqs} req/s, latency p50 ${p50} p99 ${p99}; peak RSS ${PEAK[$i]} MiB, ${AFTER} s after: $(rss_mib "${NODE[$i]}") MiB, CPU over those ${AFTER} s: $(( ticks * 10 )) ms; mesh keys held then: ${keys}; requests that waited for an owner: ${waits:-0}, admitted on first-request credit: ${credited:-0}, decided by the node's share after queueing past max_wait: ${shed:-0}, waits past max_wait: ${timeouts:-0}; gossip items held back for a later round: ${held:-0}, frames dropped: ${dropped}; answers other than 200: ${codes}"
done
