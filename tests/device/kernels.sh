#!/usr/bin/env bash
# Where drover's GPU step time goes, kernel by kernel (issue 9's speed work), on the GPU
# machine: Nsight Compute times every kernel of a few training steps of GPT-2 at T=1024 in
# bf16 (gpu__time_duration only: one pass per kernel, no replay of its memory), then this
# prints the kernels by their share of the GPU time per step. Unlike `drover train
# --profile-ops`, start-up (cuBLASLt's heuristics, lazy module loads) is not in it, and
# cuBLAS's own kernels are named, so a GEMM that took a slow algorithm shows.
#
#   tests/device/kernels.sh PACK|BIN_DIR [MODEL [BATCH [STEPS]]]     MODEL: tiny | 124m | 350m | 774m
#
# The CSV of every kernel goes to $OUT/kernels.csv when $OUT is set. DROVER_SPEED_DEVICE is
# not read: this needs a GPU and ncu (on gVisor ncu cannot read the counters: it says so).
set -uo pipefail
bin=${1:?PACK or BIN_DIR}
model=${2:-124m}
batch=${3:-32}
steps=${4:-2}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$here/pack_env.sh"
if [[ -f $bin ]]; then
  unpack_device_pack "$bin" "$work" || exit 1
fi
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -n $ncu ]] || { echo "kernels: ncu is not installed"; exit 0; }
gpt2_shape "$model" || exit 2
T=1024
echo "==== kernels: GPT-2 $model, T=$T, bf16, batch $batch, $steps steps under ncu"
python3 "$here/../bench/random_shard.py" "$work/train.bin" 2000000
gpt2_job "kernels-$model" "$work/out" "$work/train.bin" "$steps" "$batch" cuda > "$work/kernels.yaml"
csv=${OUT:-$work}/kernels.csv
"$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  "$bin/drover" train "$work/kernels.yaml" > "$csv" 2> "$work/ncu.err"
rc=$?
grep -v '^"' "$csv" | grep -v '^==PROF==' | tail -5
tail -3 "$work/ncu.err"
[[ $rc -eq 0 ]] || echo "ncu exited $rc"
# Over the whole run, divided by the steps: initialisation's few kernels are in it too.
python3 - "$csv" "$steps" <<'PY'
import csv, collections, sys
path, steps = sys.argv[1], int(sys.argv[2])
rows = []
with open(path, newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    try:
        ns = float(r["Metric Value"].replace(",", ""))
    except ValueError:
        continue
    rows.append((r["Kernel Name"], r.get("Grid Size", ""), r.get("Block Size", ""), ns))
if not rows:
    print("kernels: ncu recorded no kernel"); sys.exit(0)
total = sum(r[3] for r in rows)
by_name = collections.defaultdict(lambda: [0, 0.0])
for name, grid, block, ns in rows:
    key = name if len(name) <= 110 else name[:107] + "..."
    by_name[key][0] += 1
    by_name[key][1] += ns
print(f"{len(rows)} kernels, {total / 1e6:.1f} ms of GPU time in all, "
      f"{total / 1e6 / steps:.1f} ms per step (start-up included)")
print(f"{'ms/step':>8} {'share':>6} {'calls':>6}  kernel")
for key, (n, ns) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:40]:
    print(f"{ns / 1e6 / steps:8.2f} {ns / total:6.1%} {n:6d}  {key}")
print("the 15 longest launches (name, grid, block, ms):")
for name, grid, block, ns in sorted(rows, key=lambda r: -r[3])[:15]:
    print(f"  {ns / 1e6:8.3f}  {grid:>16} {block:>12}  {name[:110]}")
PY
