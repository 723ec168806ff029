#!/usr/bin/env bash
# Runs drover's CPU training benchmark and the PyTorch eager baseline one after the other
# on the same threads and shapes, then prints drover / PyTorch for tokens/s and peak RSS.
#
#   tests/bench/run_all.sh BUILD_DIR [bench flags...]     (what `make bench` runs)
#
# Flags after BUILD_DIR go to both programs (e.g. --steps 10 --threads 2; see
# tests/bench/README.md). Exit status: 0 when both ran, 1 when one failed, 2 on usage.
set -euo pipefail

if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: $0 BUILD_DIR [--threads N --steps N --warmup N --batch B --seq T ...]" >&2
  exit 2
fi
build=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
bench="$build/bin/bench_gpt_cpu_bench"
if [[ ! -x "$bench" ]]; then
  echo "run_all.sh: $bench not found; build it: cmake --build $build --target benchmarks" >&2
  exit 2
fi

# Debian's python3-torch lives under /usr/bin/python3; a python3 earlier on PATH may lack it.
torch_python=""
for py in /usr/bin/python3 python3; do
  if command -v "$py" >/dev/null && "$py" -c "import torch" 2>/dev/null; then
    torch_python=$py
    break
  fi
done

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== drover ($bench $*)"
"$bench" "$@" | tee "$out/drover.txt"
echo
if [[ -z "$torch_python" ]]; then
  echo "== pytorch: skipped (no python3 with torch; install Debian's python3-torch)"
  exit 0
fi
echo "== pytorch eager ($torch_python tests/bench/torch_gpt_bench.py $*)"
"$torch_python" "$here/torch_gpt_bench.py" "$@" | tee "$out/torch.txt"
echo

"$torch_python" - "$out/drover.txt" "$out/torch.txt" <<'EOF'
import json, sys
d, t = (json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[1:3])
speed = d["tokens_per_s"] / t["tokens_per_s"]
mem = d["peak_rss_mib"] / t["peak_rss_mib"]
print("== summary")
print(f"tokens/s      drover {d['tokens_per_s']:10.1f}   pytorch {t['tokens_per_s']:10.1f}"
      f"   ratio drover/pytorch {speed:.2f}x  (goal >= 1.2x, target 1.5x)")
print(f"ms/step       drover {d['ms_per_step']:10.1f}   pytorch {t['ms_per_step']:10.1f}")
for k in ("forward_ms", "backward_ms", "optimizer_ms"):
    print(f"  {k:<11} drover {d[k]:10.1f}   pytorch {t[k]:10.1f}")
print(f"peak RSS MiB  drover {d['peak_rss_mib']:10.1f}   pytorch {t['peak_rss_mib']:10.1f}"
      f"   ratio drover/pytorch {mem:.2f}  (goal <= 1.0)")
print(f"MFU (drover, vs its measured sgemm {d['sgemm_gflops']:.0f} GFLOP/s): {100 * d['mfu']:.1f}%")
print(f"GEMM time timed in isolation: {d['gemm_ms_isolated']:.1f} ms of drover's "
      f"{d['forward_ms'] + d['backward_ms']:.1f} ms forward+backward")
EOF
