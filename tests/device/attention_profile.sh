#!/usr/bin/env bash
# Why drover's fused attention (kernels/cuda/attention_mma.cu) runs at the speed it does, on
# the GPU machine: Nsight Compute's speed-of-light, occupancy, scheduler and warp-stall
# sections for one launch of each attention kernel in a GPT-2 124M step (T=1024, bf16), and
# PyTorch's scaled_dot_product_attention on the same shape through each backend it has
# (flash, memory-efficient, cuDNN), forward and forward + backward, as the yardstick.
#
#   tests/device/attention_profile.sh PACK [BATCH]          (carry the pack)
#
# The sections go to $OUT/attention-KERNEL.txt when $OUT is set; the summary lines print.
set -uo pipefail
pack=${1:?PACK}
batch=${2:-32}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$here/pack_env.sh"
unpack_device_pack "$pack" "$work" || exit 1
gpt2_shape 124m
T=1024
echo "==== pytorch sdpa, B=$batch NH=$NH T=$T HS=$((C / NH)), bf16, causal"
without_pack_libs python3 - "$batch" "$NH" "$T" "$((C / NH))" <<'PY'
import sys, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
B, NH, T, HS = map(int, sys.argv[1:])
flops_fwd = 4 * B * NH * T * T * HS / 2  # causal: half of q k^T and of P v
q, k, v = (torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
dout = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16)
def timed(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n): fn()
    end.record(); torch.cuda.synchronize()
    return start.elapsed_time(end) / n
for name, backend in [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                      ("cudnn", SDPBackend.CUDNN_ATTENTION)]:
    try:
        with sdpa_kernel(backend):
            fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            def both():
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                o.backward(dout)
            total = timed(both)
        bwd = total - fwd
        print(f"{name:10s} forward {fwd:6.3f} ms ({flops_fwd / fwd / 1e9:5.0f} TFLOP/s)  "
              f"backward {bwd:6.3f} ms ({2.5 * flops_fwd / bwd / 1e9:5.0f} TFLOP/s)  per layer")
    except Exception as e:  # a backend this build or GPU lacks
        print(f"{name:10s} unavailable: {str(e).splitlines()[0][:100]}")
PY
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -n $ncu ]] || { echo "attention_profile: ncu is not installed"; exit 0; }
python3 "$here/../bench/random_shard.py" "$work/train.bin" 2000000
gpt2_job attention-profile "$work/out" "$work/train.bin" 1 "$batch" cuda > "$work/att.yaml"
for kernel in MmaForwardKernel MmaDqKernel MmaDkvKernel; do
  txt=${OUT:-$work}/attention-$kernel.txt
  "$ncu" --kernel-name "regex:$kernel" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
    --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    "$bin/drover" train "$work/att.yaml" > "$txt" 2>&1
  echo "==== $kernel"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Eligible Warps|No Eligible|Issued Warp|Warp Cycles Per Issued|Executed Ipc A|Shared Memory Throughput|L1/TEX Hit|Bank" "$txt" | sed 's/  */ /g' | head -30
  # The stall reasons, largest first (warps stalled per issued instruction).
  grep -E "issue_stalled_" "$txt" | awk '{print $NF, $1}' | sort -rn | head -6
done
