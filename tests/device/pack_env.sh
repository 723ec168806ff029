# Sourced by check.sh, speed.sh and sanitize.sh on the GPU machine:
#
#   unpack_device_pack PACK.tar.xz DIR    unpacks the pack of pack.sh into DIR and sets
#       bin        DIR/pack/bin, drover's programs, the CUDA plugin, cuda_tests and nccl_tests;
#       pack_lib   DIR/pack/lib, the Debian libraries they need;
#     and exports LD_LIBRARY_PATH = pack_lib, then the CUDA libraries of the machine's
#     PyTorch environment (cudart, cuBLAS, NCCL: pack.sh leaves them out), then what it was.
#   without_pack_libs COMMAND...          runs COMMAND (python3 with PyTorch) without pack_lib on
#                                         its library path.
#   gpt2_shape MODEL                      sets L, NH and C of tiny | 124m | 350m | 774m (speed.sh,
#                                         kernels.sh, attention_profile.sh); fails on another name.
#   gpt2_job NAME OUT_DIR TRAIN STEPS BATCH DEVICE [RECOMPUTE]
#                                         prints the job those scripts time: GPT-2 of L, NH and C
#                                         at T (set by the caller), bf16, on the token file TRAIN.
#
# Why without_pack_libs: the pack's libraries are Debian 12's (zlib, OpenSSL, SQLite, libgomp,
# ...), and the device image's Python and its extension modules were built against their
# own, possibly newer ones; loading ours into PyTorch's process is a failure nobody could
# debug in a 15-minute lease. The drover programs a Python script starts get the pack back
# through DROVER_PACK_LIB (tests/tools/safetensors_check.py's run()).

unpack_device_pack() {
  local pack=$1 dir=$2
  tar -C "$dir" -xJf "$pack" || { echo "FAIL cannot unpack $pack"; return 1; }
  bin=$dir/pack/bin
  pack_lib=$dir/pack/lib
  local nvlibs
  nvlibs=$(python3 - <<'PY' 2>/dev/null
import glob, os, sys
print(':'.join(sorted({d for p in sys.path for d in glob.glob(os.path.join(p, 'nvidia', '*', 'lib'))})))
PY
)
  export LD_LIBRARY_PATH=$pack_lib:${nvlibs}:${LD_LIBRARY_PATH:-}
  export DROVER_PACK_LIB=$pack_lib
}

without_pack_libs() {
  # Unset when the programs were not unpacked from a pack (a BIN_DIR dry run): under set -u
  # the bare expansion ended the calling script, silently, before PyTorch's part.
  local path=${LD_LIBRARY_PATH:-}
  LD_LIBRARY_PATH=${path#"${DROVER_PACK_LIB:-}:"} "$@"
}

gpt2_shape() {
  case $1 in
    tiny) L=2 NH=2 C=64 ;;
    124m) L=12 NH=12 C=768 ;;
    350m) L=24 NH=16 C=1024 ;;
    774m) L=36 NH=20 C=1280 ;;
    *) echo "unknown model $1 (tiny, 124m, 350m, 774m)"; return 2 ;;
  esac
}

gpt2_job() {
  cat <<YAML
name: $1
output_dir: $2
model: {n_layer: $L, n_head: $NH, n_embd: $C, block_size: $T, vocab_size: 50257}
data: {train: "$3"}
train: {steps: $4, global_batch: $5, micro_batch: $5, seq_len: $T, eval_every: 0, log_every: 1,
        recompute: ${7:-none}}
precision: {dtype: bf16}
resources: {device: $6}
checkpoint: {every_steps: 0}
YAML
}
