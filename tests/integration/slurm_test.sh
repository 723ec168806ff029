#!/usr/bin/env bash
# deploy/slurm/drover.sbatch run for real: a one-node Slurm cluster (munged, slurmctld and
# slurmd from Debian's slurm-wlm, all in the foreground as children of this script, with a
# slurm.conf generated in a temporary directory) takes the batch script, which starts a
# coordinator and a worker with srun, submits deploy/examples/tiny.yaml on byte-level
# shards made from the demo corpus, and waits for it. The test passes when the Slurm job
# completes with exit code 0, `drover status` in its output says SUCCEEDED, and the
# trainer wrote every step's metrics. Then a long job gets the signal Slurm sends before a
# time limit (SIGUSR1 to the batch shell), and its drover job saves a checkpoint at once.
#
#   tests/integration/slurm_test.sh BUILD/bin SOURCE_DIR
#
# No systemd and no system-wide configuration: private ports, a private munge socket and
# key, SLURM_CONF pointing at the generated file, so it runs in a container. The daemons run
# as the user running the test (tested as root), beside any real Slurm on the machine.
# Every daemon it starts is stopped on every exit path, and when anything fails the
# daemons' logs are printed: a Slurm that cannot start here is a failure, never a skip.
set -euo pipefail

bin=$(cd "${1:?usage: slurm_test.sh BUILD/bin SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: slurm_test.sh BUILD/bin SOURCE_DIR}" && pwd)

fail() {
  echo "slurm_test: FAIL: $*" >&2
  exit 1
}

for exe in munged mungekey slurmctld slurmd sbatch scontrol sinfo squeue scancel srun; do
  command -v "$exe" >/dev/null ||
    fail "$exe not found: install munge and slurm-wlm (deploy/install-deps.sh slurm)"
done
for exe in drover drover-coordinator drover-worker drover-trainer; do
  [ -x "$bin/$exe" ] || fail "$bin/$exe is missing: build it first"
done

root=$(mktemp -d "${TMPDIR:-/tmp}/drover-slurm.XXXXXX")
chmod 755 "$root"  # munged wants every directory above its socket searchable by all
declare -A daemon_pids=()  # name -> pid, every daemon this script started
job=""

dump_logs() {
  for f in "$root"/*.log "$root"/submit/slurm-*.out; do
    [ -f "$f" ] || continue
    echo "---- $f (last 60 lines) ----" >&2
    tail -n 60 "$f" >&2
  done
}

# Polls `cond` (a command) every 0.2 s until it succeeds or `secs` pass.
wait_for() {
  local secs=$1
  shift
  local deadline=$((SECONDS + secs))
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

cleanup() {
  local rc=$?
  set +e
  # The job first, so that slurmd can stop its steps (and the drover processes in them)
  # while it still runs.
  if [ -n "$job" ] && [ -n "${daemon_pids[slurmctld]:-}" ]; then
    scancel "$job" 2>/dev/null
    wait_for 20 job_gone || echo "slurm_test: job $job still listed after scancel" >&2
  fi
  for name in slurmd slurmctld munged; do
    local pid=${daemon_pids[$name]:-}
    [ -n "$pid" ] || continue
    kill -TERM "$pid" 2>/dev/null
    # A daemon that ignores SIGTERM for 10 s is killed.
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  if [ "$rc" -ne 0 ]; then
    dump_logs
    echo "slurm_test: files kept in $root" >&2
  else
    rm -rf "$root"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

job_gone() { [ -z "$(squeue -h -j "$job" 2>/dev/null)" ]; }

# A TCP port nobody listens on (connect refused), from a range away from the usual
# ephemeral ports.
free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 12000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  fail "no free TCP port found"
}

# Starts daemon `name` in the foreground as a child of this script, its output in
# $root/name.log, and remembers its pid for cleanup.
start_daemon() {
  local name=$1
  shift
  "$@" >"$root/$name.log" 2>&1 &
  daemon_pids[$name]=$!
}

alive() { kill -0 "${daemon_pids[$1]}" 2>/dev/null; }

host=$(hostname -s)
ctld_port=$(free_port)
slurmd_port=$(free_port)
drover_port=$(free_port)
while [ "$slurmd_port" = "$ctld_port" ]; do slurmd_port=$(free_port); done
while [ "$drover_port" = "$ctld_port" ] || [ "$drover_port" = "$slurmd_port" ]; do
  drover_port=$(free_port)
done
mkdir -p "$root/ctld" "$root/spool" "$root/submit"

# munge: the credentials Slurm's daemons and clients sign their messages with.
mungekey --create --keyfile="$root/munge.key" >/dev/null
start_daemon munged munged --foreground --socket="$root/munge.sock" \
  --key-file="$root/munge.key" --pid-file="$root/munged.pid" --seed-file="$root/munged.seed" \
  --log-file="$root/munged-file.log"
munge_ready() {
  alive munged || fail "munged exited"
  [ -S "$root/munge.sock" ]
}
wait_for 10 munge_ready || fail "munged made no socket in 10 s"

# proctrack/linuxproc and task/none: no cgroups, which a container may not delegate.
cat >"$root/slurm.conf" <<EOF
ClusterName=drovertest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$root/munge.sock
StateSaveLocation=$root/ctld
SlurmdSpoolDir=$root/spool
SlurmctldPidFile=$root/slurmctld.pid
SlurmdPidFile=$root/slurmd.pid
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=drover Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$root/slurm.conf  # for sbatch, and inherited by srun inside the job

start_daemon slurmctld slurmctld -D -f "$SLURM_CONF"
start_daemon slurmd slurmd -D -f "$SLURM_CONF" -N "$host"
node_idle() {
  alive slurmctld || fail "slurmctld exited"
  alive slurmd || fail "slurmd exited"
  [ "$(sinfo -h -n "$host" -o %t 2>/dev/null)" = idle ]
}
wait_for 30 node_idle || fail "node $host not idle in 30 s (sinfo: $(sinfo -h -o '%t %E' 2>&1))"

# The data tiny.yaml names (data/tiny/...), relative to the submit directory.
cd "$root/submit"
"$bin/drover" data prepare "$src/deploy/examples/data/shakespeare.txt" --out data/tiny >/dev/null

# DROVER_COORDINATOR_ARGS exercises the script's hook for extra coordinator flags.
job=$(DROVER_BIN=$bin DROVER_PORT=$drover_port DROVER_WORK_DIR=$root/work \
  DROVER_COORDINATOR_ARGS="--log-level info" \
  sbatch --parsable --nodes=1 --output="$root/submit/slurm-%j.out" \
  "$src/deploy/slurm/drover.sbatch" "$src/deploy/examples/tiny.yaml")
job=${job%%;*}
echo "slurm_test: Slurm job $job (slurmctld :$ctld_port, coordinator :$drover_port)"

job_state() { scontrol show job -o "$job" 2>/dev/null | grep -oE 'JobState=[A-Z_]+' | cut -d= -f2; }
job_finished() {
  alive slurmctld || fail "slurmctld exited"
  alive slurmd || fail "slurmd exited"
  case "$(job_state)" in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) return 0 ;;
    *) return 1 ;;
  esac
}
wait_for 120 job_finished || fail "Slurm job $job not finished in 120 s (state $(job_state))"

out=$root/submit/slurm-$job.out
state=$(job_state)
exit_code=$(scontrol show job -o "$job" | grep -oE ' ExitCode=[0-9:]+' | cut -d= -f2)
[ "$state" = COMPLETED ] && [ "$exit_code" = 0:0 ] ||
  fail "Slurm job $job ended $state with exit code $exit_code"
grep -q "drover: submitted" "$out" || fail "the batch script never submitted the drover job"
grep -qw SUCCEEDED "$out" || fail "drover status in $out does not say SUCCEEDED"
metrics=$root/submit/runs/tiny/metrics.jsonl
[ -f "$metrics" ] || fail "no $metrics"
steps=$(grep -c '"step"' "$metrics")
[ "$steps" -eq 20 ] || fail "$metrics has $steps steps, tiny.yaml trains 20"
echo "slurm_test: job $job COMPLETED, drover job SUCCEEDED, $steps steps in ${SECONDS} s"

# Before a time limit Slurm signals the batch shell (--signal=B:USR1@300): what
# `scancel --signal=USR1 --batch` does now, to a job whose checkpoint interval is never
# reached. The script asks the drover job for a checkpoint, which completes, and it goes on
# training until the Slurm job is cancelled.
job=$(DROVER_BIN=$bin DROVER_PORT=$(free_port) DROVER_WORK_DIR=$root/work-long \
  sbatch --parsable --nodes=1 --output="$root/submit/slurm-%j.out" \
  "$src/deploy/slurm/drover.sbatch" "$src/deploy/examples/tiny.yaml" --set train.steps=1000000 \
  --set checkpoint.every_steps=100000 --set output_dir=runs/long --set checkpoint.dir=runs/long/ckpt)
job=${job%%;*}
out=$root/submit/slurm-$job.out
long_metrics=$root/submit/runs/long/metrics.jsonl
training() {
  alive slurmd || fail "slurmd exited"
  [ -f "$long_metrics" ] && [ "$(grep -c '"step"' "$long_metrics")" -ge 3 ]
}
wait_for 60 training || fail "Slurm job $job: the long drover job did not train 3 steps in 60 s"
scancel --signal=USR1 --batch "$job"
checkpointed() { grep -qE 'checkpoint of step [0-9]+ complete' "$out"; }
wait_for 60 checkpointed || fail "Slurm job $job: no checkpoint completed after SIGUSR1"
ls "$root"/submit/runs/long/ckpt/step_*/manifest.json >/dev/null 2>&1 ||
  fail "no checkpoint in $root/submit/runs/long/ckpt"
[ "$(job_state)" = RUNNING ] || fail "Slurm job $job is $(job_state) after the checkpoint, not RUNNING"
scancel "$job"
wait_for 30 job_gone || fail "Slurm job $job still listed 30 s after scancel"
echo "slurm_test: PASS (SIGUSR1 to job $job: $(grep -oE 'checkpoint of step [0-9]+ complete' "$out"); ${SECONDS} s in all)"
