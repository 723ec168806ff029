#!/usr/bin/env bash
# The device check's speed step (issue 9): drover and PyTorch (eager and torch.compile) train
# the same GPT-2 shapes at T=1024 in bf16 with the same batch on the same GPU, one after the
# other. Prints, for each: tokens/s, step time, MFU against the bf16 GEMM rate the PyTorch
# script measures first on this GPU, and peak GPU memory (what each one's allocations held
# at most: drover's device_peak_mib, PyTorch's max_memory_allocated; and for drover the whole
# GPU's as nvidia-smi saw it). Information, not a pass/fail.
#
#   tests/device/speed.sh PACK|BIN_DIR [MODEL [BATCH [STEPS]]]     MODEL: 124m | 350m | 774m
#
# BATCH max: the largest batch that fits, as the issue asks for. drover is tried at each of
# DROVER_SPEED_BATCHES (default 128,96,64,48,32,24,16,8), largest first, for two steps; the
# first that trains is its largest, and drover is timed there. PyTorch is then given the
# candidates from that one down, and takes the largest that fits it (eager; torch.compile
# from there down); where that is smaller, drover is timed at PyTorch's batch as well, so
# that one row of each compares the same shapes and batch.
#
# check.sh runs it for 124m at batch 32 with the programs it unpacked (BIN_DIR, environment
# set); as a device call of its own, give it the pack (carry build/device-pack.tar.xz):
#   tests/device/speed.sh build/device-pack.tar.xz 124m max
#   tests/device/speed.sh build/device-pack.tar.xz 350m 16
# (350m at batch 16 fits drover's storage, fp32 residual stream and bf16 operand buffers,
# easily on an H200). DROVER_SPEED_RECOMPUTE=all (or a count of layers) trains drover with
# train.recompute so: a larger batch or model in the same memory, for a forward more.
# DROVER_SPEED_TILES=forward=..,dq=..,dkv=.. trains a second time with those fused attention
# tiles (DROVER_CUDA_ATTENTION_TILES) instead of the fastest that bench_attention_tiles names.
# drover also trains with cuDNN's fused attention (DROVER_CUDA_ATTENTION=cudnn) unless
# DROVER_SPEED_CUDNN=0. Last, sampling on the GPU against the CPU (DROVER_SPEED_SAMPLE=0: not).
set -uo pipefail
bin=${1:?PACK or BIN_DIR}
model=${2:-124m}
batch=${3:-32}
steps=${4:-12}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
source "$here/pack_env.sh"
if [[ -f $bin ]]; then
  unpack_device_pack "$bin" "$work" || exit 1
fi

# DROVER_SPEED_DEVICE=cpu is a dry run of this script on a machine without a GPU (at T=64;
# e.g. `DROVER_SPEED_DEVICE=cpu tests/device/speed.sh build/bin tiny 4 3`): its numbers
# mean nothing, but every command and parser in it runs. DROVER_SPEED_T sets T for a dry run
# on the kernel emulator's CUDA plugin.
device=${DROVER_SPEED_DEVICE:-cuda}
T=${DROVER_SPEED_T:-1024}
torch_args=()
if [[ $device == cpu ]]; then
  T=${DROVER_SPEED_T:-64}
  torch_args=(--device cpu --T "$T" --peak-tflops 1)
fi
gpt2_shape "$model" || exit 2
echo "==== speed (information): GPT-2 $model, T=$T, bf16, batch $batch, on $device"

# Random tokens (the data does not change the speed).
python3 "$here/../bench/random_shard.py" "$work/train.bin" 2000000
gpt2_job "speed-$model" "$work/out" "$work/train.bin" "$steps" 1 "$device" \
  "${DROVER_SPEED_RECOMPUTE:-none}" > "$work/speed.yaml"

# drover_train OUT BATCH [VAR=VALUE...] -- [ARG...]: drover trains the job at BATCH (global and
# micro) into OUT, its output in OUT.txt, with VAR=VALUE in its environment and ARG added.
drover_train() {
  local out=$1 b=$2
  shift 2
  local vars=()
  while [[ $# -gt 0 && $1 != -- ]]; do vars+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift
  env "${vars[@]}" timeout 150 "$bin/drover" train "$work/speed.yaml" --set output_dir="$out" \
    --set train.global_batch="$b" --set train.micro_batch="$b" "$@" > "$out.txt" 2>&1
}

# drover_run OUT BATCH [VAR=VALUE...]: drover_train with the GPU's memory sampled into
# OUT.mem; prints its last lines and the CUDA backend's messages.
drover_run() {
  local out=$1
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$out.mem" 2>/dev/null &
  local smi=$!
  drover_train "$@"
  local rc=$?
  kill "$smi" 2>/dev/null
  tail -4 "$out.txt"
  # The CUDA backend's messages (a GEMM that cuBLASLt had no algorithm for, say).
  grep 'drover cuda:' "$out.txt" | sort | uniq -c | head -10
  [[ $rc -eq 0 ]] || echo "drover train exited $rc"
}

torch_batches=$batch
largest=""
if [[ $batch == max ]]; then
  candidates=$(tr ', ' '\n\n' <<< "${DROVER_SPEED_BATCHES:-128,96,64,48,32,24,16,8}" | grep -E '^[0-9]+$' | sort -rnu)
  batch=""
  for b in $candidates; do
    if drover_train "$work/probe-$b" "$b" -- --set train.steps=2; then
      batch=$b
      break
    fi
    echo "batch $b: $(tail -1 "$work/probe-$b.txt")"
  done
  [[ -n $batch ]] || { echo "drover trained at none of the batches $(echo $candidates)"; exit 1; }
  largest=$batch
  torch_batches=$(awk -v most="$batch" '$1 <= most' <<< "$candidates" | paste -sd,)
  echo "---- the largest batch drover trains: $batch"
fi

# The fused attention at this shape in each tile shape and occupancy, kernel by kernel
# (tests/bench/attention_tiles_bench.cu; head size 64 only). Its last line names the fastest
# choice the table offers (DROVER_CUDA_ATTENTION_TILES), which drover trains with too below
# when it is not the table's default.
fastest=""
if [[ $device == cuda && -x $bin/bench_attention_tiles && $((C / NH)) -eq 64 ]]; then
  timeout 60 "$bin/bench_attention_tiles" "$batch" "$T" "$C" "$NH" "$L" > "$work/tiles.txt" 2>&1 ||
    echo "bench_attention_tiles exited $?"
  cat "$work/tiles.txt"
  # "fastest tiles: DROVER_CUDA_ATTENTION_TILES=CHOICE (... the table's defaults, DEFAULTS)"
  line='^fastest tiles: DROVER_CUDA_ATTENTION_TILES=\([^ ]*\) .* defaults, \([^ ]*\))$'
  fastest=$(sed -n "s/$line/\1/p" "$work/tiles.txt")
  defaults=$(sed -n "s/$line/\2/p" "$work/tiles.txt")
fi
[[ -n ${DROVER_SPEED_TILES:-} ]] && fastest=$DROVER_SPEED_TILES  # a choice to time, given
[[ $fastest == "${defaults:-}" ]] && fastest=""                   # the table's own

drover_run "$work/out" "$batch"
if [[ -n $fastest ]]; then
  echo "---- drover with the fastest tiles: DROVER_CUDA_ATTENTION_TILES=$fastest"
  drover_run "$work/out-tiles" "$batch" DROVER_CUDA_ATTENTION_TILES="$fastest"
fi
# Attention through cuDNN's fused attention (DROVER_CUDA_ATTENTION=cudnn, cudnn_attention.cu)
# instead of the table's own kernels; DROVER_SPEED_CUDNN=0 leaves it out.
if [[ $device == cuda && ${DROVER_SPEED_CUDNN:-1} == 1 ]]; then
  echo "---- drover with cuDNN's attention: DROVER_CUDA_ATTENTION=cudnn"
  drover_run "$work/out-cudnn" "$batch" DROVER_CUDA_ATTENTION=cudnn
fi
# DROVER_SPEED_PROFILE=0 leaves out the op profiles below, DROVER_SPEED_TORCH=0 PyTorch (the
# MFU is then against DROVER_SPEED_PEAK_TFLOPS, a GEMM rate measured earlier, if given).
if [[ ${DROVER_SPEED_PROFILE:-1} == 1 ]]; then
  # Where drover's step time goes, op by op (each op synchronised, so no overlap), with the
  # fused attention on mma.sync register tiles, then through cuDNN, then on wmma tiles, then
  # with the GEMM version (which keeps the T x T probabilities), then with fp32 operand buffers.
  for variant in "" DROVER_CUDA_ATTENTION=cudnn DROVER_CUDA_ATTENTION=wmma \
    DROVER_CUDA_ATTENTION=gemms DROVER_CUDA_GEMM_INPUTS=fp32; do
    [[ -n $variant ]] && echo "---- the same with $variant"
    drover_train "$work/out-profile${variant:+-${variant##*=}}" "$batch" $variant -- \
      --set train.steps=4 --profile-ops
    sed -n '/^ops profile/,$p' "$work/out-profile${variant:+-${variant##*=}}.txt"
  done
fi
# PyTorch after drover (drover's numbers matter more if time runs out); it measures the
# GEMM rate that both MFUs are against.
peak=${DROVER_SPEED_PEAK_TFLOPS:-}
torch_batch=""
if [[ ${DROVER_SPEED_TORCH:-1} == 1 ]]; then
  without_pack_libs timeout 300 python3 "$here/torch_gpt2_bench.py" --model "$model" \
    --batches "$torch_batches" --steps "$steps" "${torch_args[@]}" > "$work/torch.txt" 2>&1
  tail -8 "$work/torch.txt"
  read -r peak torch_batch < <(python3 -c 'import json,sys
peak, batch = "", ""
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    r = json.loads(l)
    if "bf16_gemm_tflops_measured" in r: peak = r["bf16_gemm_tflops_measured"]
    if "tokens_per_s" in r: batch = r["batch"]
print(peak or "-", batch or "-")' "$work/torch.txt" 2>/dev/null)
  [[ $peak == - ]] && peak=""
  [[ $torch_batch == - ]] && torch_batch=""
fi
if [[ -n $largest && -n $torch_batch && $torch_batch != "$batch" ]]; then
  echo "---- drover at PyTorch's largest batch, $torch_batch"
  drover_run "$work/out-torch-batch" "$torch_batch"
fi

# One JSON line a drover run (OUT BATCH MODE): its median steady tokens/s, step time, MFU and
# peak memory.
drover_summary() {
  python3 - "$1/metrics.jsonl" "$1.mem" "$L" "$C" "${peak:-0}" "$model" "$2" "$T" "$3" <<'PY'
import json, statistics, sys
metrics, mem, L, C, peak, model, batch, T, mode = sys.argv[1:]
L, C, peak, T, V = int(L), int(C), float(peak), int(T), 50257
try:
    rows = [json.loads(l) for l in open(metrics) if '"tokens_per_s"' in l]
except OSError:
    rows = []
steady = [r["tokens_per_s"] for r in rows[2:]] or [r["tokens_per_s"] for r in rows]
if not steady:
    print(mode + ": no steps recorded"); sys.exit(0)
tps = statistics.median(steady)
params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
tflops = (6 * params + 12 * L * C * T) * tps / 1e12
try:
    peak_mib = max(int(x) for x in open(mem) if x.strip().isdigit())
except (OSError, ValueError):
    peak_mib = 0
print(json.dumps({"model": model, "mode": mode, "batch": int(batch),
                  "activation_gib": round(rows[-1].get("activation_mib", 0) / 1024, 2),
                  "tokens_per_s": round(tps), "step_ms": round(int(batch) * T / tps * 1e3, 1),
                  "tflops": round(tflops, 1), "mfu": round(tflops / peak, 3) if peak else None,
                  # What drover's allocations held at most, as PyTorch's peak_mem_gib
                  # (max_memory_allocated) counts; nvidia-smi's adds the CUDA context, cuBLAS
                  # and everything else on the GPU.
                  "peak_mem_gib": round(rows[-1].get("device_peak_mib", 0) / 1024, 2),
                  "peak_mem_gib (nvidia-smi, whole gpu)": round(peak_mib / 1024, 2)}))
PY
}
drover_summary "$work/out" "$batch" drover
if [[ -n $fastest ]]; then drover_summary "$work/out-tiles" "$batch" "drover (tiles $fastest)"; fi
if [[ -d $work/out-cudnn ]]; then drover_summary "$work/out-cudnn" "$batch" "drover (cuDNN attention)"; fi
if [[ -d $work/out-torch-batch ]]; then
  drover_summary "$work/out-torch-batch" "$torch_batch" "drover (PyTorch's largest batch)"
fi
# Sampling on the GPU (`drover sample --device cuda`: GptDecoder's key/value cache,
# attention_decode.cu) against the CPU's decoder on this machine's cores, at the model's
# shapes, random weights (tests/bench/sample_bench.cc); DROVER_SPEED_SAMPLE=0 leaves it out.
if [[ $device == cuda && ${DROVER_SPEED_SAMPLE:-1} == 1 && -x $bin/bench_sample_bench ]]; then
  echo "---- sampling: GptDecoder on the GPU against the CPU's"
  timeout 120 "$bin/bench_sample_bench" --threads "$(nproc)" --prompt 64 --tokens 64 \
    --layers "$L" --heads "$NH" --channels "$C" --device cuda || echo "bench_sample_bench exited $?"
fi
