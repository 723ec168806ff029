#!/usr/bin/env bash
# Hybrid sharding (parallel.dp_shard) against plain ZeRO over every dp rank, on two machines
# joined by a slower link than the one inside each: two network namespaces (nodes), each an
# agent with 2 slots, joined by a veth pair shaped to RATE (tc tbf) with DELAY each way
# (netem, where the kernel has it), while the ranks on one node talk over its loopback,
# unshaped. The same 4-rank job runs three ways, in one run:
#   - zero3:        ZeRO-3 over all 4 dp ranks (every layer gathered across the link, every
#                   micro-batch's gradient reduce-scattered across it);
#   - zero3_hybrid: ZeRO-3 in shard groups of 2 (a node each), the 2 replicas averaging
#                   their gradient shards once a step across the link;
#   - zero2 and zero2_hybrid, zero1 and zero1_hybrid: the same at ZeRO-2 and ZeRO-1.
# It prints each run's median step time (steps after the first two), the bytes one rank
# sends across the link per step as ZeRO's formulas give them, and hybrid's speed-up.
#
#   tests/bench/hybrid_shard_bench.sh BUILD_DIR
#
# Environment: RATE (200mbit), DELAY (1ms), STEPS (8), LAYERS (4), CHANNELS (256), HEADS (4),
# SEQ (64), MICRO_BATCH (1), GLOBAL_BATCH (8). Needs root for `ip netns` and tc. Exit 0 when
# every run finished, 1 when one failed, 2 on usage, 77 where namespaces cannot be made.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
bin=$(cd "$1/bin" && pwd)
for exe in drover drover-coordinator drover-worker drover-trainer; do
  [[ -x "$bin/$exe" ]] || { echo "hybrid_shard_bench: $bin/$exe is not built" >&2; exit 2; }
done
rate=${RATE:-200mbit}
delay=${DELAY:-1ms}
steps=${STEPS:-8}

p="hsb$$"
if ! ip netns add "$p-a" 2>/dev/null; then
  echo "hybrid_shard_bench: SKIP: cannot create network namespaces (needs root)" >&2
  exit 77
fi
ip netns add "$p-b"
out=$(mktemp -d "${TMPDIR:-/tmp}/drover-hsb.XXXXXX")
declare -a pids=()
cleanup() {
  set +e
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  ip netns del "$p-a" 2>/dev/null
  ip netns del "$p-b" 2>/dev/null
  rm -rf "$out"
}
trap cleanup EXIT

# The link between the nodes: 10.78.0.1 (a) <-> 10.78.0.2 (b), shaped on both ends.
ip link add "$p-va" type veth peer name "$p-vb"
ip link set "$p-va" netns "$p-a"
ip link set "$p-vb" netns "$p-b"
ip -n "$p-a" addr add 10.78.0.1/24 dev "$p-va"
ip -n "$p-b" addr add 10.78.0.2/24 dev "$p-vb"
shaped="rate $rate"
for end in a b; do
  ip -n "$p-$end" link set lo up
  ip -n "$p-$end" link set "$p-v$end" up
  if ip netns exec "$p-$end" tc qdisc add dev "$p-v$end" root handle 1: netem delay "$delay" \
      2>/dev/null; then
    ip netns exec "$p-$end" tc qdisc add dev "$p-v$end" parent 1: handle 2: \
      tbf rate "$rate" burst 64kb latency 100ms
    [[ $end == b ]] && shaped="$shaped, $delay each way"
  else
    ip netns exec "$p-$end" tc qdisc add dev "$p-v$end" root tbf rate "$rate" burst 64kb \
      latency 100ms
  fi
done

ip netns exec "$p-a" "$bin/drover-coordinator" --listen 10.78.0.1:7600 --insecure \
  --state-dir "$out/state" > "$out/coordinator.log" 2>&1 &
pids+=($!)
for end in a b; do
  ip netns exec "$p-$end" "$bin/drover-worker" --coordinator 10.78.0.1:7600 --insecure \
    --name "node-$end" --slots 2 --work-dir "$out/work-$end" > "$out/worker-$end.log" 2>&1 &
  pids+=($!)
done
cli() { ip netns exec "$p-a" "$bin/drover" --coordinator 10.78.0.1:7600 "$@"; }
for _ in $(seq 100); do
  [[ $(cli workers 2>/dev/null | grep -c 'node-') -ge 2 ]] && break
  sleep 0.2
done
[[ $(cli workers 2>/dev/null | grep -c 'node-') -ge 2 ]] ||
  { cat "$out"/*.log >&2; echo "hybrid_shard_bench: the agents did not register" >&2; exit 1; }

python3 "$(dirname "$0")/random_shard.py" "$out/train.bin"
echo "link between the nodes: $shaped; inside each: loopback"
echo "model: ${LAYERS:-4} layers, C=${CHANNELS:-256}, 4 ranks (2 a node), $steps steps"
failed=0
declare -A ms=()
run() {  # name zero_stage dp_shard
  local name=$1
  cat > "$out/$name.yaml" <<EOF
name: $name
output_dir: $out/$name
model: {n_layer: ${LAYERS:-4}, n_head: ${HEADS:-4}, n_embd: ${CHANNELS:-256}, block_size: 1024, vocab_size: 50257}
data: {train: $out/train.bin}
train: {steps: $steps, global_batch: ${GLOBAL_BATCH:-8}, micro_batch: ${MICRO_BATCH:-1}, seq_len: ${SEQ:-64}, lr: 1.0e-4, warmup_steps: 1, eval_every: 0, log_every: 1}
parallel: {zero_stage: $2, dp_shard: $3, timeout_s: 600}
resources: {world_size: 4, threads_per_rank: 1}
checkpoint: {every_steps: 0}
EOF
  local job
  job=$(cli submit "$out/$name.yaml")
  if ! cli wait "$job" --timeout 900 > /dev/null; then
    echo "== $name: FAILED"
    cli logs "$job" 2>&1 | tail -n 20
    failed=1
    return 0
  fi
  ms[$name]=$(python3 - "$out/$name/metrics.jsonl" <<'EOF'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{statistics.median(s['step_ms'] for s in steps[2:]):.0f}")
EOF
)
  echo "== $name (zero_stage $2, dp_shard $3): median step ${ms[$name]} ms"
}
run zero3 3 all
run zero3_hybrid 3 2
run zero2 2 all
run zero2_hybrid 2 2
run zero1 1 all
run zero1_hybrid 1 2

# What one rank sends across the link a step, for P parameters (fp32) and m micro-batches a
# rank (ring collectives, n ranks: a gather or reduce-scatter of P floats sends (n-1)/n P).
python3 - "${LAYERS:-4}" "${CHANNELS:-256}" "${GLOBAL_BATCH:-8}" "${MICRO_BATCH:-1}" <<'EOF'
import sys
L, C, G, B = map(int, sys.argv[1:])
P = 50304 * C + 1024 * C + L * 12 * C * C + 2 * C
m = G // (4 * B)
mib = lambda floats: floats * 4 / 2**20
# Plain ZeRO over 4 ranks on 2 nodes: a ring crosses the link in 2 of its 4 hops; every
# collective of P floats sends 3/4 P per rank, about half of it across.
print(f"ZeRO's traffic per rank and step, P = {P / 1e6:.1f}M parameters, {m} micro-batches"
      " (a node's 2 ranks share the link):")
print(f"  zero3:        gathers 2m x 3/4 P + reduce-scatters m x 3/4 P = {mib(3 * m * 0.75 * P):.0f} MiB, every ring half across the link")
print(f"  zero3_hybrid: the same inside the node over 2 ranks (1/2 P each), and across: one all-reduce of a P/2 shard = {mib(0.5 * P):.0f} MiB")
print(f"  zero2:        reduce-scatters m x 3/4 P + a gather 3/4 P = {mib((m + 1) * 0.75 * P):.0f} MiB")
print(f"  zero2_hybrid: across the link only the replicas' all-reduce of a P/2 shard = {mib(0.5 * P):.0f} MiB")
print(f"  zero1:        a reduce-scatter 3/4 P + a gather 3/4 P = {mib(1.5 * P):.0f} MiB")
print(f"  zero1_hybrid: across the link the same all-reduce of a P/2 shard = {mib(0.5 * P):.0f} MiB")
EOF
for mode in zero3 zero2 zero1; do
  if [[ -n ${ms[$mode]:-} && -n ${ms[${mode}_hybrid]:-} ]]; then
    python3 - "$mode" "${ms[$mode]}" "${ms[${mode}_hybrid]}" "$out/$mode/metrics.jsonl" \
      "$out/${mode}_hybrid/metrics.jsonl" <<'EOF'
import json, sys
mode, plain, hybrid = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
loss = lambda f: [json.loads(l)["loss"] for l in open(f) if l.strip()]
a, b = loss(sys.argv[4]), loss(sys.argv[5])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"{mode}: hybrid sharding {plain / hybrid:.2f}x the steps per second of sharding over all "
      f"4 ranks; losses of the {len(a)} steps within {worst:.1e} relative of each other")
EOF
  fi
done
exit $failed
