#!/usr/bin/env bash
# A GPU cluster on this machine: a coordinator, agents with --device cuda on GPUs a stand-in
# driver lists (tests/unit/worker/fake_cuda_driver.cc), and their trainers on the kernel
# emulator's CUDA plugin (tests/cuda_emu/), each on its slot's GPU (CUDA_VISIBLE_DEVICES),
# their groups through the emulated NCCL. A two-rank bf16 job is submitted and, once it has a
# checkpoint, something dies; the job must resume from that checkpoint and succeed:
#   trainer: one agent with two GPUs, one of its trainers killed: the job resumes on the same
#            two GPUs (still through NCCL);
#   node:    two agents with a GPU each (world_size 1 to 2), one agent killed: the job
#            resumes on the other's GPU alone, one rank, the global batch kept by
#            accumulation.
#   gpu:     one agent with two GPUs (world_size 1 to 2), one GPU fails (the emulator's
#            DROVER_EMU_GPU_FAULT: an uncorrectable ECC error): its trainer exits with code 3,
#            the coordinator cordons that slot alone, and the job resumes on the node's other
#            GPU, while the node stays in use.
#   health:  as gpu, but the GPU's failure is found by the agent's health check (the stand-in
#            NVML of fake_cuda_driver.cc reports an uncorrectable ECC error): the coordinator
#            cordons the slot and stops the attempt on it before any trainer meets the fault;
#            the slot stays out while the check fails, and is back once it passes. Then
#            NVML stops answering about the other GPU (a wedged driver): the agent goes on
#            heartbeating, and reports that slot unfit once its query is overdue. Then a
#            critical Xid keeps a GPU out after its checks pass again, until an operator's
#            drover uncordon puts it back, with the agent still running.
# The path from `drover submit` to CUDA training and back after a failure, which the device
# check (tests/device/check.sh step 4) runs only when a GPU is lent, and without a failure.
#
#   emulated_gpu_cluster_test.sh BIN_DIR EMULATED_PLUGIN FAKE_DRIVER trainer|node|gpu|health
set -euo pipefail
bin=$1
plugin=$2
driver=$(realpath "$3")
scenario=$4
work=$(mktemp -d)
cleanup() {
  jobs -p | xargs -r kill 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir "$work/bin" "$work/driver"
cp "$bin/drover" "$bin/drover-coordinator" "$bin/drover-worker" "$bin/drover-trainer" "$plugin" \
  "$work/bin/"
ln -s "$driver" "$work/driver/libcuda.so.1"
# The same stand-in is the node's NVML, for the agent's GPU health check (health only: the
# other scenarios' agents run without one, as on a node without NVML).
[[ $scenario == health ]] && ln -s "$driver" "$work/driver/libnvidia-ml.so.1"
export LD_LIBRARY_PATH=$work/driver${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export DROVER_EMU_NCCL_TIMEOUT_MS=60000
tests=$(cd "$(dirname "$0")/.." && pwd)
python3 "$tests/bench/random_shard.py" "$work/train.bin" 50000

port=$((20000 + RANDOM % 20000))
addr=127.0.0.1:$port
drover() { "$work/bin/drover" --coordinator "$addr" "$@"; }
"$work/bin/drover-coordinator" --listen "$addr" --state-dir "$work/state" \
  > "$work/coordinator.log" 2>&1 &
agent() {  # agent NAME GPUS [VISIBLE [FLAGS...]]: an agent on the GPUs DROVER_FAKE_GPUS lists
  DROVER_FAKE_GPUS=$2 CUDA_VISIBLE_DEVICES=${3:-} "$work/bin/drover-worker" \
    --coordinator "$addr" --name "$1" --device cuda --work-dir "$work/$1" "${@:4}" \
    > "$work/$1.log" 2>&1 &
}
h200="NVIDIA H200,141,90"
if [[ $scenario == trainer ]]; then
  agent gpu0 "$h200;$h200"
  world="{min: 2, max: 2}"
elif [[ $scenario == gpu ]]; then
  # The machine's GPUs 1 and 2: slot 1's trainer gets GPU 2, which fails once the file exists.
  export DROVER_EMU_GPU_FAULT="2@$work/gpu-fault"
  agent gpu0 "$h200;$h200" 1,2
  world="{min: 1, max: 2}"
elif [[ $scenario == health ]]; then
  # What NVML says of the GPUs: nothing wrong until the file says otherwise. Slot 1 is the
  # stand-in driver's device 1, bus id 00000000:01:00.0.
  export DROVER_FAKE_NVML=$work/nvml
  : > "$DROVER_FAKE_NVML"
  health_agent() { agent gpu0 "$h200;$h200" 1,2 --gpu-health-interval-ms 200 --gpu-health-timeout-ms 1000; }
  health_agent
  world="{min: 1, max: 2}"
else
  # Each node's GPU is its device 1 and 2 of the machine (as CUDA_VISIBLE_DEVICES gives an
  # agent its share), so that the two ranks are on GPUs of their own.
  agent gpu0 "$h200" 1
  agent gpu1 "$h200" 2
  victim=$!
  world="{min: 1, max: 2}"
fi

cat > "$work/job.yaml" <<YAML
name: emulated-gpu-cluster
output_dir: $work/out
model: {n_layer: 2, n_head: 2, n_embd: 64, block_size: 32, vocab_size: 256}
data: {train: "$work/train.bin"}
train: {steps: 30, global_batch: 4, micro_batch: 2, seq_len: 32, eval_every: 0}
precision: {dtype: bf16}
parallel: {timeout_s: 30}
resources: {device: cuda, world_size: $world}
checkpoint: {dir: $work/ckpt, every_steps: 5, keep_last: 2}
fault_tolerance: {max_restarts: 3}
YAML
show() {
  drover status "$id" || true
  tail -20 "$work"/gpu*.log "$work/coordinator.log"
}
# Both GPUs registered first: a job submitted earlier starts on what there is and grows at
# its first checkpoint (elastic), which is not what this test is about.
slots=0
for _ in $(seq 1 200); do
  slots=$(drover workers --json 2>/dev/null | grep -c '"cuda:[0-9] NVIDIA H200' || true)
  [[ $slots -ge 2 ]] && break
  sleep 0.1
done
[[ $slots -ge 2 ]] || { echo "FAIL: the two GPUs did not register"; tail "$work"/gpu*.log; exit 1; }
id=$(drover submit "$work/job.yaml") || { echo "FAIL: submit"; exit 1; }

# Once a checkpoint is complete (its step_N renamed from step_N.tmp) and both ranks are
# training, kill a trainer or a whole node.
killed=""
for _ in $(seq 1 600); do
  if compgen -G "$work/ckpt/step_[0-9]*" | grep -vq "\.tmp$" &&
    [[ $(pgrep -fc "$work/bin/drover-trainer" || true) -ge 2 ]]; then
    if [[ $scenario == gpu ]]; then
      touch "$work/gpu-fault"
      killed="GPU 2"
      echo "failed GPU 2 (slot 1's) after a checkpoint"
      break
    fi
    if [[ $scenario == health ]]; then
      echo "00000000:01:00.0 ecc=1" > "$DROVER_FAKE_NVML"
      killed="slot 1's GPU"
      echo "NVML reports an uncorrectable ECC error on slot 1's GPU after a checkpoint"
      break
    fi
    if [[ $scenario == trainer ]]; then
      killed=$(pgrep -f "$work/bin/drover-trainer" | head -1)
    else
      killed=$victim
    fi
    kill -9 "$killed"
    break
  fi
  sleep 0.1
done
[[ -n $killed ]] || { echo "FAIL: no checkpoint with both ranks training"; show; exit 1; }
[[ $scenario == gpu || $scenario == health ]] || echo "killed the $scenario ($killed) after a checkpoint"

rc=0
timeout 240 "$work/bin/drover" --coordinator "$addr" wait "$id" || rc=$?
drover status "$id" | tee "$work/status.txt"
[[ $rc -eq 0 ]] || { echo "FAIL: the job did not succeed (wait exited $rc)"; show; exit 1; }
if [[ $scenario != gpu && $scenario != health ]]; then
  grep -q "restarts: [1-9]" "$work/status.txt" || { echo "FAIL: no restart recorded"; exit 1; }
fi
grep -q '"step":30' "$work/out/metrics.jsonl" || { echo "FAIL: step 30 not reached"; exit 1; }
# On the CUDA table (its steps report device allocations).
grep -q '"device_allocations"' "$work/out/metrics.jsonl" ||
  { echo "FAIL: the steps did not run on the CUDA table"; exit 1; }
# Their MFU, against the datasheet peak of the GPU the (stand-in) driver names, an H200.
grep -q '"mfu":' "$work/out/metrics.jsonl" ||
  { echo "FAIL: the steps carry no MFU on an H200"; tail -1 "$work/out/metrics.jsonl"; exit 1; }
finished_on_one_gpu() {  # the last attempt, on one GPU, resumed from a checkpoint
  tail -1 "$work/out/metrics.jsonl" | grep -q '"world_size":1' ||
    { echo "FAIL: the job did not finish on one GPU"; tail -1 "$work/out/metrics.jsonl"; exit 1; }
  grep -Eq "^ *[2-9] +1 +[0-9]+ .*succeeded" "$work/status.txt" ||
    { echo "FAIL: no attempt resumed on one GPU from a checkpoint"; exit 1; }
}
if [[ $scenario == trainer ]]; then
  # Attempt 2: both GPUs again, from a checkpoint, the ranks through NCCL.
  grep -Eq "^ *2 +2 +[0-9]+ " "$work/status.txt" ||
    { echo "FAIL: attempt 2 did not resume on both GPUs from a checkpoint"; exit 1; }
  drover logs "$id" --rank 0 > "$work/rank0.log"
  grep -q "ranks connected through NCCL (every rank has a GPU of its own" "$work/rank0.log" ||
    { echo "FAIL: the ranks did not connect through NCCL"; cat "$work/rank0.log"; exit 1; }
  echo "the job recovered on its two GPUs and succeeded"
elif [[ $scenario == gpu ]]; then
  # The failed GPU's trainer exited with code 3, naming the error; its slot alone is
  # cordoned (the node alive, one slot free of two once the job is done), and the job went
  # on on the other GPU from a checkpoint.
  drover workers | tee "$work/workers.txt"
  grep -Eq "^gpu0 +ALIVE +CUDA .* 2 +1 +0 " "$work/workers.txt" ||
    { echo "FAIL: gpu0 is not alive with one of its two slots free"; exit 1; }
  grep -Eq "^gpu0 slot 1 cordoned for [0-9]+m[0-9]+s \(1 failure\): job $id attempt [0-9]+: rank 1 on gpu0 exited with code 3: .*the GPU failed: .*cudaErrorECCUncorrectable" \
    "$work/workers.txt" || { echo "FAIL: slot 1 is not cordoned for its GPU's failure"; exit 1; }
  grep -q "node gpu0 slot 1 cordoned" "$work/coordinator.log" ||
    { echo "FAIL: the coordinator did not log the slot's cordon"; exit 1; }
  finished_on_one_gpu
  # Repaired, the GPU is put back in service by an operator: both slots free again.
  drover uncordon gpu0 --slot 1 | grep -qx "gpu0 slot 1 is back in service" ||
    { echo "FAIL: drover uncordon gpu0 --slot 1"; exit 1; }
  drover workers > "$work/workers.txt"
  grep -Eq "^gpu0 +ALIVE +CUDA .* 2 +2 +0 " "$work/workers.txt" && ! grep -q cordoned "$work/workers.txt" ||
    { echo "FAIL: slot 1 is not back in service"; cat "$work/workers.txt"; exit 1; }
  rc=0
  drover uncordon gpu0 --slot 7 2> "$work/uncordon.err" || rc=$?
  [[ $rc -ne 0 ]] && grep -q "node gpu0 has no slot 7" "$work/uncordon.err" ||
    { echo "FAIL: an unknown slot was not refused by name"; cat "$work/uncordon.err"; exit 1; }
  echo "a GPU failed: its slot was cordoned and the job finished on the node's other GPU"
elif [[ $scenario == health ]]; then
  # The agent's check found the GPU unfit: the coordinator cordoned slot 1 and stopped the
  # attempt on it (its trainer never met the fault: no exit 3), the job went on on the other
  # GPU from a checkpoint, and the slot stays out while the check fails, past any uncordon.
  grep -q "checking the health of 2 of 2 GPU(s) through NVML every 200 ms; watching their Xid events" "$work/gpu0.log" ||
    { echo "FAIL: the agent did not check its GPUs"; cat "$work/gpu0.log"; exit 1; }
  grep -Eq "its GPU failed the node's health check: GPU 00000000:01:00.0: 1 uncorrectable ECC error" \
    "$work/status.txt" || { echo "FAIL: no attempt ended for the health check"; exit 1; }
  grep -q "restarts: 0" "$work/status.txt" || { echo "FAIL: the restart was counted"; exit 1; }
  ! grep -q "exited with code 3" "$work/status.txt" ||
    { echo "FAIL: a trainer met the fault"; exit 1; }
  drover workers | tee "$work/workers.txt"
  grep -Eq "^gpu0 +ALIVE +CUDA .* 2 +1 +0 " "$work/workers.txt" ||
    { echo "FAIL: gpu0 is not alive with one of its two slots free"; exit 1; }
  # One line says both what keeps the slot out: the finding and the cordon it caused.
  grep -q "^gpu0 slot 1 out until its GPU passes the health check, and cordoned for .* (1 failure): GPU 00000000:01:00.0: 1 uncorrectable ECC error since its last reset (NVML): reset the GPU (nvidia-smi -r)$" \
    "$work/workers.txt" && ! grep -q "^gpu0 slot 1 cordoned" "$work/workers.txt" ||
    { echo "FAIL: slot 1 is not shown out for its health check, once"; exit 1; }
  finished_on_one_gpu
  rc=0
  drover uncordon gpu0 --slot 1 2> "$work/uncordon.err" || rc=$?
  [[ $rc -ne 0 ]] && grep -q "stays out of use while its agent's health check reports its GPU unfit" \
    "$work/uncordon.err" || { echo "FAIL: uncordon of an unfit GPU"; cat "$work/uncordon.err"; exit 1; }
  # NVML reports nothing wrong any more: within 10 s no slot is listed as failing the check.
  nvml_mended() {  # nvml_mended SLOT
    : > "$DROVER_FAKE_NVML"
    for _ in $(seq 1 100); do
      drover workers > "$work/workers.txt"
      grep -q "passes the health check" "$work/workers.txt" || break
      sleep 0.1
    done
    ! grep -q "passes the health check" "$work/workers.txt" ||
      { echo "FAIL: slot $1 is still reported unfit"; cat "$work/workers.txt"; exit 1; }
  }
  back_in_service() {  # back_in_service SLOT AFTER: an operator ends its cordon; both slots free
    drover uncordon gpu0 --slot "$1" | grep -qx "gpu0 slot $1 is back in service" ||
      { echo "FAIL: drover uncordon gpu0 --slot $1 after $2"; exit 1; }
    drover workers > "$work/workers.txt"
    grep -Eq "^gpu0 +ALIVE +CUDA .* 2 +2 +0 " "$work/workers.txt" ||
      { echo "FAIL: slot $1 is not back in service after $2"; cat "$work/workers.txt"; exit 1; }
  }
  # Reset: the check passes, the slot is out only for its cordon, which an operator ends.
  nvml_mended 1
  grep -q "its GPU passes the health check again" "$work/gpu0.log" ||
    { echo "FAIL: the agent did not say the GPU passes again"; exit 1; }
  back_in_service 1 "the reset"
  echo "the health check found a GPU unfit: its slot was taken out under the job, which finished on the other GPU"
  # NVML's queries about slot 0's GPU stop returning. The agent's heartbeats go on (its node
  # is never dead), and it reports the slot once the query is a second overdue.
  echo "00000000:00:00.0 hang" > "$DROVER_FAKE_NVML"
  for _ in $(seq 1 100); do
    drover workers > "$work/workers.txt"
    grep -q "^gpu0 slot 0 out until" "$work/workers.txt" && break
    sleep 0.1
  done
  grep -q "^gpu0 slot 0 out until its GPU passes the health check.*: GPU 00000000:00:00.0: NVML has not answered a query about it within 1 s (a wedged driver or GPU)" \
    "$work/workers.txt" || { echo "FAIL: the overdue NVML query was not reported"; cat "$work/workers.txt"; exit 1; }
  sleep 3.5  # past the coordinator's heartbeat timeout (3 s)
  drover workers > "$work/workers.txt"
  grep -Eq "^gpu0 +ALIVE " "$work/workers.txt" && ! grep -q "node gpu0 is dead" "$work/coordinator.log" ||
    { echo "FAIL: the node went silent while NVML hung"; cat "$work/workers.txt"; exit 1; }
  nvml_mended 0  # the query returns
  back_in_service 0 "NVML answered again"
  echo "NVML hung on a GPU: the agent went on heartbeating and reported that GPU unfit"
  # Xid events on slot 1's GPU. An application's (13) leaves it in service; a critical one (79)
  # takes it out, and it stays out once NVML has nothing more to say, until an operator puts
  # it back: drover uncordon ends the finding (its latch), without restarting the agent.
  until_logged() {  # until_logged PATTERN: waits up to 10 s for the agent's log to say it
    for _ in $(seq 1 100); do grep -q "$1" "$work/gpu0.log" && return 0; sleep 0.1; done
    echo "FAIL: the agent never logged: $1"; tail "$work/gpu0.log"; exit 1
  }
  echo "00000000:01:00.0 xid=13" > "$DROVER_FAKE_NVML"
  until_logged "Xid 13 on GPU 00000000:01:00.0 (an NVML event): an application's fault"
  drover workers > "$work/workers.txt"
  grep -Eq "^gpu0 +ALIVE +CUDA .* 2 +2 +0 " "$work/workers.txt" ||
    { echo "FAIL: Xid 13 took a slot out"; cat "$work/workers.txt"; exit 1; }
  echo "00000000:01:00.0 xid=13,79" > "$DROVER_FAKE_NVML"
  until_logged "Xid 79 (fallen off the bus)"
  : > "$DROVER_FAKE_NVML"
  for _ in $(seq 1 100); do
    drover workers > "$work/workers.txt"
    grep -q "^gpu0 slot 1 out until" "$work/workers.txt" && break
    sleep 0.1
  done
  sleep 1  # five checks of the GPU, each finding nothing wrong
  drover workers > "$work/workers.txt"
  grep -q "^gpu0 slot 1 out until an operator puts it back (drover uncordon gpu0 --slot 1).*: GPU 00000000:01:00.0: Xid 79 (fallen off the bus) at .* UTC (an NVML event): its slot stays out of use until an operator puts it back" \
    "$work/workers.txt" || { echo "FAIL: Xid 79 did not keep slot 1 out"; cat "$work/workers.txt"; exit 1; }
  # The GPU reset, the operator puts the slot back; the agent hears of it with its next
  # heartbeat's reply, and its reports leave the slot out from then on.
  agent_starts=$(grep -c "checking the health of 2 of 2 GPU(s)" "$work/gpu0.log")
  back_in_service 1 "an operator's uncordon after an Xid"
  until_logged "GPU 00000000:01:00.0: back in use, an operator having put its slot back (drover uncordon): .*Xid 79"
  sleep 1  # heartbeats after the agent heard
  drover workers > "$work/workers.txt"
  grep -Eq "^gpu0 +ALIVE +CUDA .* 2 +2 +0 " "$work/workers.txt" && ! grep -q "^gpu0 slot 1 out" "$work/workers.txt" ||
    { echo "FAIL: slot 1 is out again after its uncordon"; cat "$work/workers.txt"; exit 1; }
  [[ $(grep -c "checking the health of 2 of 2 GPU(s)" "$work/gpu0.log") == "$agent_starts" ]] ||
    { echo "FAIL: the agent restarted"; exit 1; }
  echo "a critical Xid kept its GPU out until an operator's uncordon, with the agent running; an application's Xid did not"
  # What NVML reads of the GPUs reaches drover workers: a GPU held back by its temperature is
  # named under the table, and --gpus shows every reading ("-" where NVML gives none).
  echo "00000000:00:00.0 util=97 used=61 temp=91 power=512 reasons=72" > "$DROVER_FAKE_NVML"
  for _ in $(seq 1 100); do
    drover workers --gpus > "$work/workers.txt"
    grep -q "slowed down" "$work/workers.txt" && break
    sleep 0.1
  done
  grep -q "^gpu0 slot 0: its GPU is slowed down (thermal (hardware), at 91 C): every rank of its job waits for it at each step$" \
    "$work/workers.txt" &&
    grep -Eq "^gpu0 +0 +97% +61.0/141.0 GiB +91 C +512 W +thermal \(hardware\)$" "$work/workers.txt" &&
    grep -Eq "^gpu0 +1 +- +0.0/141.0 GiB +- +- +-$" "$work/workers.txt" ||
    { echo "FAIL: drover workers --gpus does not show what NVML read"; cat "$work/workers.txt"; exit 1; }
  echo "drover workers --gpus showed each GPU's readings, and named the one slowed down"
else
  # An attempt on both nodes ended with gpu1's death; the last one, on gpu0's GPU alone,
  # resumed from a checkpoint.
  grep -Eq "^ *[0-9]+ +2 +.*node gpu1 is dead" "$work/status.txt" ||
    { echo "FAIL: no attempt on two GPUs ended with the node's death"; exit 1; }
  finished_on_one_gpu
  echo "the job lost a node, went on on the other's GPU and succeeded"
fi
