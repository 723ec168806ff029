#!/usr/bin/env bash
# A cluster on a network of its own, rather than processes on loopback: the coordinator and
# three worker nodes, each in a network namespace with its own address on one bridge
# (10.77.0.0/24; 1 ms each way on every link where the kernel has netem), as machines on a switch. It checks what
# loopback cannot show:
#
#   1. Trainers on different machines find each other. No agent is given --address: each
#      trainer accepts its peers on the address of its interface toward the coordinator
#      (common/net.h). The host name resolves to loopback here, as it does on most Debian
#      machines (127.0.1.1), and a trainer bound to it would be dialled by no one.
#   2. One of two failures of the node that runs rank 0 (the SCENARIO argument):
#      partition: the node is cut off from the switch. Its processes run on and its link
#         stays up, but nothing reaches it and nothing it sends arrives: no FIN, no RST, as
#         when a switch port or a cable fails. The coordinator declares the node dead, stops
#         the survivors and resumes the job at world size 2 from its newest complete
#         checkpoint. The cut-off trainer, rank 0, stops publishing: its lease lapses before
#         the next attempt can start.
#      dataplane: the node can no longer reach its peers (blackhole routes to the other two
#         workers) but still reaches the coordinator, as when a node's training network
#         fails and its management network does not. Its heartbeats go on, so nothing says
#         it is dead: the collectives time out, and the next attempt's peer check
#         (worker/engine/parallel/peer_check.h) finds the node cut off from its peers,
#         whichever rank reports it; the coordinator cordons it and runs the job at world
#         size 2 on the other nodes.
#      coordinator: the coordinator's machine is cut off from the switch instead: every node
#         is dead to it after 1 s and the attempt fails, while all three trainers, which
#         still reach each other, train on without publishing once their leases lapse: no
#         metrics line, and the next checkpoint's commit waits for a confirmation that their
#         attempt is current, which never comes.
#      lossy: nothing fails, but every machine drops 2% of the packets that reach it, as a
#         congested or flaky network does (nftables). TCP resends what is lost, so
#         heartbeats, leases, checkpoint commits and collectives arrive late, never not at
#         all: the job must finish in its first attempt, with the coordinator's default
#         heartbeat timing, and its losses must equal, step for step, those of the same job
#         run as three processes on loopback (`drover train --nproc 3`).
#   3. The node is whole again (the partition heals and the agent reconnects, its
#      superseded trainer exiting; or the routes come back and the cordon ends): the job
#      grows back to 3 ranks at a checkpoint and finishes. With the coordinator back, every
#      agent registers again, learns its trainer's attempt is superseded, and the job
#      resumes on all three from its newest complete checkpoint.
#
# The cluster runs as it must beyond loopback: the coordinator serves TLS only (a
# certificate for its address, 10.77.0.1) and wants a client certificate of the cluster CA
# from agents and trainers and a token from the CLI; nobody is given --insecure.
#
# Afterwards, metrics.jsonl holds every attempt's lines in attempt order (the cut-off rank 0
# never wrote after its successor began), each attempt resumed at the step after its
# checkpoint, and every complete checkpoint is whole.
#
#   tests/integration/netns_cluster_test.sh BUILD/bin SOURCE_DIR [partition|dataplane|coordinator|lossy]
#
# Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) for `ip netns`; where namespaces cannot be made
# the test says so and exits 77 (skipped). Every namespace and process it makes is removed
# on every exit path; the files stay in a temporary directory when it fails.
set -euo pipefail

bin=$(cd "${1:?usage: netns_cluster_test.sh BUILD/bin SOURCE_DIR [SCENARIO]}" && pwd)
src=$(cd "${2:?usage: netns_cluster_test.sh BUILD/bin SOURCE_DIR [SCENARIO]}" && pwd)
scenario=${3:-partition}
case $scenario in
  partition | dataplane | coordinator | lossy) ;;
  *)
    echo "netns_cluster_test: unknown scenario '$scenario' (partition, dataplane, coordinator or lossy)" >&2
    exit 2
    ;;
esac

fail() {
  echo "netns_cluster_test: FAIL: $*" >&2
  exit 1
}

for exe in drover drover-coordinator drover-worker drover-trainer; do
  [ -x "$bin/$exe" ] || fail "$bin/$exe is missing: build it first"
done
command -v ip >/dev/null || fail "ip (iproute2) not found"

# Namespace names are global: the pid keeps two runs apart.
p="drv$$"
sw="$p-sw"
nodes=(c n1 n2 n3)
declare -A addr=([c]=10.77.0.1 [n1]=10.77.0.11 [n2]=10.77.0.12 [n3]=10.77.0.13)
coordinator="${addr[c]}:7600"

if ! ip netns add "$sw" 2>/tmp/"$p".err; then
  echo "netns_cluster_test: SKIP: cannot create a network namespace here ($(cat /tmp/"$p".err));" \
    "it needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN" >&2
  rm -f /tmp/"$p".err
  exit 77
fi
rm -f /tmp/"$p".err
# Namespaces alone are not enough: the network is veth pairs on a bridge.
if ! ip -n "$sw" link add probe0 type veth peer name probe1 2>/dev/null ||
  ! ip -n "$sw" link add probe2 type bridge 2>/dev/null; then
  echo "netns_cluster_test: SKIP: this kernel or container cannot make veth pairs or bridges" >&2
  ip netns del "$sw"
  exit 77
fi
ip -n "$sw" link del probe0
ip -n "$sw" link del probe2

root=$(mktemp -d "${TMPDIR:-/tmp}/drover-netns.XXXXXX")
declare -A pids=()  # name -> pid of every long-running process this script started
job=""

dump_logs() {
  for f in "$root"/*.log "$root"/n*/logs/*/attempt-*/rank-*.log; do
    [ -f "$f" ] || continue
    echo "---- $f (last 40 lines) ----" >&2
    tail -n 40 "$f" >&2
  done
}

cleanup() {
  local rc=$?
  set +e
  # Workers first: each stops its trainers (SIGTERM, then SIGKILL after its grace).
  for name in n1 n2 n3 c; do
    local pid=${pids[$name]:-}
    [ -n "$pid" ] || continue
    kill -TERM "$pid" 2>/dev/null
  done
  for name in n1 n2 n3 c; do
    local pid=${pids[$name]:-}
    [ -n "$pid" ] || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  # Anything still running in a namespace (a trainer whose agent was killed) goes too:
  # a namespace is only freed once its last process has left it.
  for ns in "${nodes[@]}"; do
    ip netns pids "$p-$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  done
  for ns in "${nodes[@]}"; do ip netns del "$p-$ns" 2>/dev/null; done
  ip netns del "$sw" 2>/dev/null
  if [ "$rc" -ne 0 ]; then
    dump_logs
    echo "netns_cluster_test: files kept in $root" >&2
  elif [ -n "${DROVER_KEEP_TEST_DIRS:-}" ]; then
    echo "netns_cluster_test: files kept in $root (DROVER_KEEP_TEST_DIRS)"
  else
    rm -rf "$root"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

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

# ---- the network: a bridge in a namespace of its own, a veth from it to each machine ----
ip -n "$sw" link set lo up
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
for n in "${nodes[@]}"; do
  ns="$p-$n"
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip link add eth0 netns "$ns" type veth peer name "$n" netns "$sw"
  ip -n "$ns" addr add "${addr[$n]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$sw" link set "$n" master br0
  ip -n "$sw" link set "$n" up
  # 1 ms each way, a switch's latency rather than loopback's, where the kernel has netem.
  if [ -z "${no_netem:-}" ] && ! tc -n "$ns" qdisc add dev eth0 root netem delay 1ms 2>/dev/null; then
    no_netem=1
    echo "netns_cluster_test: no netem in this kernel: the links have no added latency"
  fi
  # lossy: each machine drops 2% of what arrives, at random. With nftables rather than
  # netem's loss, which some kernels lack (this machine's among them). A sender learns of
  # a drop as on a real network: from an acknowledgement that does not come.
  if [ "$scenario" = lossy ]; then
    if ! ip netns exec "$ns" nft list ruleset >/dev/null 2>"$root/nft.err"; then
      echo "netns_cluster_test: SKIP: no nftables here to drop packets with: $(cat "$root/nft.err")" >&2
      exit 77
    fi
    ip netns exec "$ns" nft -f - <<<'table inet lossy { chain input {
        type filter hook input priority 0; numgen random mod 100 < 2 counter drop; }; }' ||
      fail "nft could not make $n drop packets"
  fi
done

# partition: cut `node` off the switch (and reconnect it): the port leaves the bridge, both
# ends of its cable stay up, and frames to and from the node go nowhere.
# dataplane: `node` drops what it sends to the other workers (and sends it again); the
# coordinator it still reaches.
break_node() {
  if [ "$scenario" = coordinator ]; then
    ip -n "$sw" link set c nomaster
  elif [ "$scenario" = partition ]; then
    ip -n "$sw" link set "$1" nomaster
  else
    for other in n1 n2 n3; do
      [ "$other" = "$1" ] || ip -n "$p-$1" route add blackhole "${addr[$other]}/32"
    done
  fi
}
mend_node() {
  if [ "$scenario" = coordinator ]; then
    ip -n "$sw" link set c master br0
  elif [ "$scenario" = partition ]; then
    ip -n "$sw" link set "$1" master br0
  else
    for other in n1 n2 n3; do
      [ "$other" = "$1" ] || ip -n "$p-$1" route del blackhole "${addr[$other]}/32"
    done
  fi
}

# ---- TLS: a cluster CA, the coordinator's certificate for its address, one for the agents
# (and their trainers), and an admin token for the CLI ------------------------------------
tls="$root/tls"
mkdir -p "$tls"
(
  cd "$tls"
  key="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
  openssl req -x509 $key -keyout ca.key -out ca.pem -days 2 -subj /CN=netns-test-ca
  printf 'subjectAltName=IP:%s\nextendedKeyUsage=serverAuth\n' "${addr[c]}" >server.ext
  printf 'extendedKeyUsage=clientAuth\n' >client.ext
  openssl req $key -keyout server.key -out server.csr -subj /CN=drover-coordinator
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -extfile server.ext -out server.pem
  openssl req $key -keyout agent.key -out agent.csr -subj /CN=drover-agent
  openssl x509 -req -in agent.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -extfile client.ext -out agent.pem
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >token
  echo "$(cat token) admin netns-test" >tokens
) >"$root/openssl.log" 2>&1 || fail "openssl: $(cat "$root/openssl.log")"

in_ns() {
  local n=$1
  shift
  ip netns exec "$p-$n" "$@"
}
cli() {
  in_ns c "$bin/drover" --coordinator "$coordinator" --retry-for 2 --tls-ca "$tls/ca.pem" \
    --token-file "$tls/token" "$@"
}

# ---- the cluster --------------------------------------------------------------------------
# Failures are found within 1 s; on the lossy network, the defaults (1 s, 3 s) are under test.
timing=(--heartbeat-interval-ms 200 --heartbeat-timeout-ms 1000)
[ "$scenario" = lossy ] && timing=()
in_ns c "$bin/drover-coordinator" --listen "$coordinator" --state-dir "$root/coord" \
  --tls-cert "$tls/server.pem" --tls-key "$tls/server.key" --tls-ca "$tls/ca.pem" \
  --tokens "$tls/tokens" --cordon-ms 3000 "${timing[@]}" --stop-grace-ms 500 \
  >"$root/coordinator.log" 2>&1 &
pids[c]=$!
for n in n1 n2 n3; do
  # No --address: the default is what is under test.
  in_ns "$n" "$bin/drover-worker" --coordinator "$coordinator" --name "$n" --slots 1 \
    --tls-cert "$tls/agent.pem" --tls-key "$tls/agent.key" --tls-ca "$tls/ca.pem" \
    --work-dir "$root/$n" --stop-grace-ms 500 >"$root/$n.log" 2>&1 &
  pids[$n]=$!
done

workers_json() { cli workers --json 2>/dev/null; }
# Prints "name address state failures" per node.
workers_table() {
  workers_json | python3 -c '
import json, sys
for w in json.load(sys.stdin).get("workers", []):
    n = w["node"]
    print(n["name"], n.get("address", ""), n.get("state", ""), n.get("failures", 0))'
}
three_ready() { [ "$(workers_table | grep -c ' NODE_ALIVE ' || true)" -eq 3 ]; }
wait_for 30 three_ready || fail "three nodes did not register: $(workers_table)"
# Each node registered the address of its own interface, not its host name.
while read -r name address _; do
  [ "$address" = "${addr[$name]}" ] ||
    fail "node $name registered address '$address'; expected its interface's ${addr[$name]}"
done < <(workers_table)

# ---- the job --------------------------------------------------------------------------------
"$bin/drover" data prepare "$src/deploy/examples/data/shakespeare.txt" --out "$root/data" \
  >"$root/prepare.log" 2>&1 || fail "drover data prepare: $(cat "$root/prepare.log")"
steps=1500
[ "$scenario" = lossy ] && steps=150
cat >"$root/job.yaml" <<EOF
name: netns
output_dir: $root/out
model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 32, vocab_size: 256}
data: {train: "$root/data/train_*.bin", val: $root/data/val.bin}
train: {steps: $steps, global_batch: 12, micro_batch: 2, seq_len: 32, lr: 1.0e-3,
        min_lr: 1.0e-4, warmup_steps: 10, eval_every: 0}
parallel: {timeout_s: 5}
resources: {world_size: {min: 2, max: 3}, threads_per_rank: 1}
checkpoint: {dir: $root/out/ckpt, every_steps: 25, keep_last: 3}
fault_tolerance: {max_restarts: 5, hang_timeout_s: 60}
EOF
job=$(cli submit "$root/job.yaml") || fail "submit: $job"

status_json() { cli status "$job" --json 2>/dev/null; }
# One fact of the job's status, by a Python expression over `j` (the JobInfo as JSON).
fact() {
  status_json | python3 -c '
import json, sys
j = json.load(sys.stdin)
job = j["job"]
attempts = j.get("attempts", [])
trainers = [t for t in j.get("trainers", []) if int(t.get("attempt", 0)) == int(job.get("attempt", 0))]
placed = [p["node"] for p in job.get("placement", [])]
def step():
    return max([int(t.get("progress", {}).get("step", 0)) for t in trainers] or [0])
def ckpt():
    return max([int(t.get("progress", {}).get("last_checkpoint_step", 0)) for t in trainers] or [0])
print(eval("(" + sys.argv[1] + ")"))' "$1"
}
holds() { [ "$(fact "$1" 2>/dev/null)" = "True" ]; }

# 1. Three ranks, one per machine, train past a checkpoint.
wait_for 60 holds 'job["state"] == "RUNNING" and len(trainers) == 3 and ckpt() >= 50' ||
  fail "the job did not train on three nodes past a checkpoint: $(status_json)"
first_attempt=$(fact 'job["attempt"]')
rank0_node=$(fact '[p["node"] for p in job["placement"] if int(p.get("rank", 0)) == 0][0]')
old_trainer=$(fact '[t["pid"] for t in trainers if int(t.get("rank", 0)) == 0][0]')
if [ "$scenario" = lossy ]; then
  echo "netns_cluster_test: attempt $first_attempt trains on 3 nodes over links that drop 2% of the packets"
elif [ "$scenario" = coordinator ]; then
  echo "netns_cluster_test: attempt $first_attempt trains on 3 nodes; the coordinator is cut off"
else
  echo "netns_cluster_test: attempt $first_attempt trains on 3 nodes; $scenario of $rank0_node (rank 0)"
fi

if [ "$scenario" = lossy ]; then
  # Nothing fails: the job ends in its first attempt.
  wait_for 150 holds 'job["state"] == "SUCCEEDED"' || fail "the job did not succeed: $(status_json)"
  holds "len(attempts) == 1 and int(job['attempt']) == $first_attempt" ||
    fail "the lossy network cost an attempt: $(status_json)"
  echo "netns_cluster_test: the job finished in attempt $first_attempt; lost packets cost no attempt"
  # The same job as three processes on loopback: the same loss at every step.
  "$bin/drover" train "$root/job.yaml" --nproc 3 --set output_dir="$root/loopback" \
    --set checkpoint.dir="$root/loopback/ckpt" >"$root/loopback.log" 2>&1 ||
    fail "drover train --nproc 3: $(tail -n 20 "$root/loopback.log")"
  python3 - "$root/out/metrics.jsonl" "$root/loopback/metrics.jsonl" <<'EOF' ||
import json, sys
def losses(path):
    return {int(m["step"]): m["loss"] for m in map(json.loads, filter(str.strip, open(path)))
            if "loss" in m}
cluster, loopback = losses(sys.argv[1]), losses(sys.argv[2])
if cluster.keys() != loopback.keys():
    sys.exit(f"steps differ: {len(cluster)} in the cluster, {len(loopback)} on loopback")
differ = [s for s in cluster if cluster[s] != loopback[s]]
if differ:
    s = differ[0]
    sys.exit(f"{len(differ)} losses differ; step {s}: {cluster[s]} in the cluster, {loopback[s]} on loopback")
print(f"netns_cluster_test: all {len(cluster)} losses equal those of the loopback run")
EOF
    fail "losses over the lossy network differ from loopback's (above)"
else
  # 2. Rank 0's machine fails (SCENARIO).
  break_node "$rank0_node"
  if [ "$scenario" = coordinator ]; then
    # Every node is dead to the coordinator, which cannot reach anyone to stop the trainers:
    # they run on, and must have stopped publishing.
    wait_for 20 holds "int(job['attempt']) == $first_attempt and job['state'] != 'RUNNING' and
      'is dead' in attempts[-1].get('end_reason', '')" ||
      fail "the coordinator did not end the attempt of the nodes it lost: $(status_json)"
    lines_then=$(wc -l <"$root/out/metrics.jsonl")
    sleep 3
    lines_now=$(wc -l <"$root/out/metrics.jsonl")
    kill -0 "$old_trainer" 2>/dev/null || fail "rank 0's trainer died with the coordinator away"
    # The leases (2/3 of the 1 s node timeout) lapsed before the coordinator declared the
    # nodes dead: nothing more is published (a line already being written may land).
    ((lines_now - lines_then <= 1)) ||
      fail "the cut-off attempt appended $((lines_now - lines_then)) metrics lines after its lease lapsed"
    echo "netns_cluster_test: coordinator away: the attempt ended; its trainers run on and appended" \
      "$((lines_now - lines_then)) metrics lines in the 3 s after"
    mend_node "$rank0_node"
    old_gone() { ! kill -0 "$old_trainer" 2>/dev/null; }
    wait_for 30 old_gone || fail "the superseded trainer (pid $old_trainer) still runs"
  fi
  # dataplane: on two nodes after the peer check's verdict, not merely on the two nodes that
  # were free when attempt $first_attempt failed (its rank 0 still exiting).
  verdict=True
  [ "$scenario" = dataplane ] &&
    verdict="any('cut off: $rank0_node' in a.get('end_reason', '') for a in attempts[:-1])"
  [ "$scenario" = coordinator ] || wait_for 45 holds "int(job['attempt']) > $first_attempt and job['state'] == 'RUNNING' and
    len(trainers) == 2 and len(placed) == 2 and '$rank0_node' not in placed and
    step() > int(attempts[-1].get('resume_step', 0)) + 5 and $verdict" ||
    fail "the job did not resume on the two nodes left: $(status_json)"
  [ "$scenario" = coordinator ] || reasons=$(fact "' | '.join(a.get('end_reason', '') for a in attempts[:-1])")
  [ "$scenario" = coordinator ] || echo "netns_cluster_test: attempts ended: $reasons"
  if [ "$scenario" = coordinator ]; then
    :
  elif [ "$scenario" = partition ]; then
    reason=$(fact "[a.get('end_reason', '') for a in attempts if int(a['attempt']) == $first_attempt][0]")
    [[ "$reason" == *"node $rank0_node is dead"* ]] ||
      fail "attempt $first_attempt ended for '$reason', not for $rank0_node's death"
  else
    # The attempt that resumed on two nodes followed the peer check's verdict.
    [[ "$reasons" == *"cut off: $rank0_node"* ]] ||
      fail "no attempt ended with $rank0_node cut off: $reasons"
    # Cordoned, for a failure that is not a death (its 3 s may be over by now).
    grep -q "node $rank0_node cordoned" "$root/coordinator.log" ||
      fail "$rank0_node was not cordoned: $(workers_table)"
    [ "$(workers_table | awk -v n="$rank0_node" '$1 == n {print $4}')" -ge 1 ] ||
      fail "no failure counted against $rank0_node: $(workers_table)"
  fi

  # 3. The node is whole again; the job grows back to three ranks.
  [ "$scenario" = coordinator ] || mend_node "$rank0_node"
  if [ "$scenario" = partition ]; then
    # The agent reconnects and learns that its trainer's attempt is superseded.
    old_gone() { ! kill -0 "$old_trainer" 2>/dev/null; }
    wait_for 30 old_gone || fail "the cut-off trainer (pid $old_trainer) still runs after the heal"
  fi
  wait_for 60 holds "len(trainers) == 3 and '$rank0_node' in placed and
    step() > int(attempts[-1].get('resume_step', 0))" ||
    fail "the job did not grow back to three nodes: $(status_json)"
  wait_for 120 holds 'job["state"] == "SUCCEEDED"' || fail "the job did not succeed: $(status_json)"
  fact '"\n".join("netns_cluster_test: attempt %s: %d ranks on %s from step %s; %s" % (a["attempt"],
    a["world_size"], ",".join(p["node"] for p in a["placement"]), a["resume_step"], a["end_reason"])
    for a in attempts)'
fi

# ---- what the files say ----------------------------------------------------------------------
expected_attempts=3
[ "$scenario" = coordinator ] && expected_attempts=2
[ "$scenario" = lossy ] && expected_attempts=1
python3 - "$root/out/metrics.jsonl" "$steps" "$expected_attempts" <<'EOF' || fail "metrics.jsonl (above)"
import json, sys
path, steps, expected = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
newest, last_step, starts = 0, 0, []
for line in open(path):
    if not line.strip():
        continue
    m = json.loads(line)
    if "loss" not in m:
        continue
    a, s = int(m["attempt"]), int(m["step"])
    if a < newest:
        sys.exit(f"an attempt-{a} line after attempt {newest}: {line.strip()}")
    if a > newest:
        starts.append((a, s, last_step))
        newest = a
    elif s != last_step + 1:
        sys.exit(f"attempt {a}: step {s} follows step {last_step}")
    last_step = s
if last_step != steps:
    sys.exit(f"the last logged step is {last_step}, not {steps}")
if len(starts) < expected:
    sys.exit(f"{len(starts)} attempts logged; expected {expected} or more: {starts}")
for a, s, before in starts[1:]:
    # A resumed attempt starts after a checkpoint at or before where the last one got to
    # (one of every 25 steps, or the one a resize asked for, at any step).
    if s - 1 > before:
        sys.exit(f"attempt {a} began at step {s} after step {before}")
print("netns_cluster_test: metrics.jsonl: attempts (attempt, first step, step before):", starts)
EOF
for d in "$root"/out/ckpt/step_*; do
  [[ "$d" == *.tmp ]] && continue
  [ -f "$d/manifest.json" ] || fail "checkpoint $d has no manifest"
done
"$bin/drover" ckpt verify "$root/out/ckpt" >"$root/verify.log" 2>&1 ||
  fail "drover ckpt verify: $(cat "$root/verify.log")"
echo "netns_cluster_test: PASS"
