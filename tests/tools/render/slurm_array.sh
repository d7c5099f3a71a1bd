#!/usr/bin/env bash
# infill-render-slurm on a real one-node Slurm cluster that this test starts: munged with its
# own key and socket, slurmctld -D and slurmd -D from a generated slurm.conf, ports on
# loopback. A six-item job runs as a three-task array; the third task (two long items) is
# killed with scancel once its progress shows; the submitter resubmits it; then every item's
# output is checked: up to date for a local infill-render run of the same job (its job hash),
# and the resubmitted task's outputs equal a local rendering byte for byte.
#
# usage: slurm_array.sh SOURCE_DIR INFILL_RENDER
# Exit 4 (skipped, said loudly) only where Slurm or MUNGE is not installed.
set -euo pipefail
src=$1
render=$2
submitter="$src/tools/render/infill-render-slurm"

skip() {
  echo "*** SKIPPED: the Slurm test did not run: $* ***"
  exit 4
}
for tool in munged munge slurmctld slurmd sbatch scancel sinfo; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (Debian: slurm-wlm munge; scripts/setup.sh installs them)"
done

dir=$(mktemp -d /tmp/infill-slurm-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for f in "$dir"/slurmctld.pid "$dir"/slurmd.pid "$dir"/munged.pid; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*"
  for f in "$dir"/submit.log "$dir"/state/task-*.out "$dir"/slurmctld.log "$dir"/slurmd.log; do
    [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }
  done
  exit 1
}

# A free loopback port: nothing answers a connect there.
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$(( 20000 + RANDOM % 20000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  fail "no free port"
}

# MUNGE with its own key, socket, pid, seed and log (--force: the test may run as root).
dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge.key"
munged --force --socket="$dir/munge.sock" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
  --seed-file="$dir/munged.seed" --log-file="$dir/munged.log" || fail "munged did not start"

node=$(hostname -s)
user=$(id -un)
mkdir -p "$dir/state" "$dir/spool" "$dir/ctld-state"
cat > "$dir/slurm.conf" <<EOF
ClusterName=infilltest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
SlurmUser=$user
SlurmdUser=$user
StateSaveLocation=$dir/ctld-state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=5
NodeName=$node NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -D -i -f "$SLURM_CONF" > "$dir/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$node" > "$dir/slurmd.out" 2>&1 &
pids+=($!)
# The node reports in: wait for it to be idle (a state, not a guess of how long it takes).
for _ in $(seq 1 600); do
  [ "$(sinfo -h -o %T 2>/dev/null | head -1)" = "idle" ] && break
  sleep 0.1
done
[ "$(sinfo -h -o %T | head -1)" = "idle" ] || fail "the node did not come up: $(sinfo 2>&1)"

# Six items: four quick ones (tasks 0 and 1), then two long ones (task 2, the one killed).
jobs="$src/resources/jobs"
cat > "$dir/job.json" <<EOF
{
  "format": "infill-job/1",
  "defaults": {"output": "out/{name}_{seed:02}.png", "prompt": "green"},
  "edits": [
    {"name": "quick", "template": "$jobs/dusk_256.png", "mask": "$jobs/dusk_256_mask.png", "steps": 4,
     "seeds": {"first": 1, "count": 4}},
    {"name": "long", "template": "$jobs/hills_256.png", "mask": "$jobs/hills_256_mask.png", "steps": 200,
     "seeds": [1, 2]}
  ]
}
EOF
render_opts=(--threads 1 --cache-dir "$dir/cache")
"$submitter" "$dir/job.json" --items-per-task 2 --retries 2 --render "$render" --state-dir "$dir/state" \
  -- "${render_opts[@]}" > "$dir/submit.log" 2>&1 &
submit_pid=$!

# Kill task 2 once it has made progress on its first long item.
for _ in $(seq 1 3000); do
  grep -qE "^Progress: ([1-9]|[1-9][0-9])%" "$dir/state/task-2.out" 2>/dev/null && break
  kill -0 "$submit_pid" 2>/dev/null || fail "the submitter ended before task 2 made progress"
  sleep 0.1
done
grep -qE "^Progress: ([1-9]|[1-9][0-9])%" "$dir/state/task-2.out" || fail "task 2 showed no progress"
array=$(sed -n 's/^infill-render-slurm: task 2 of array job \([0-9]*\) .*/\1/p' "$dir/state/task-2.out" | head -1)
[ -n "$array" ] || fail "task 2's output names no array job"
scancel "${array}_2" || fail "scancel ${array}_2"
echo "killed task 2 of array job $array"

rc=0
wait "$submit_pid" || rc=$?
[ "$rc" -eq 0 ] || fail "the submitter exited $rc"
cat "$dir/submit.log"
grep -q "task 2 (items 5-6) of array job $array ended with" "$dir/submit.log" || fail "the kill of task 2 was not seen"
grep -q "attempt 2: .* running tasks 2$" "$dir/submit.log" || fail "task 2 was not resubmitted alone"
grep -q "done: all 6 items written or up to date" "$dir/submit.log" || fail "the submitter did not finish the job"
[ "$(grep -c '^infill-render-slurm: task 2 of array job' "$dir/state/task-2.out")" -eq 2 ] || fail "task 2 did not run twice"
[ "$(cat "$dir/state/task-2.rc")" = 0 ] || fail "task 2's second run did not end with 0"
# The first run of task 2 really was killed before it finished its items.
[ "$(grep -c '^Saved: ' "$dir/state/task-2.out")" -eq 2 ] || fail "task 2's items were not saved exactly once"

# Every item's output is there and up to date: a local run of the whole job skips all six.
local_run=$("$render" "$dir/job.json" "${render_opts[@]}") || fail "the local check run failed"
[ "$(printf '%s\n' "$local_run" | grep -c '^Skipped: ')" -eq 6 ] || fail "not every item is up to date: $local_run"
! printf '%s\n' "$local_run" | grep -q '^Saved: ' || fail "the local run had to render: $local_run"
# The resubmitted items equal a local rendering of the same items byte for byte.
sed 's|"output": "out/|"output": "local/|' "$dir/job.json" > "$dir/job-local.json"
"$render" "$dir/job-local.json" --items 5-6 "${render_opts[@]}" > /dev/null || fail "the local rendering failed"
for seed in 01 02; do
  cmp "$dir/out/long_$seed.png" "$dir/local/long_$seed.png" || fail "long_$seed.png differs from a local rendering"
done
echo "slurm_array: ok: 6 items in 3 array tasks, task 2 killed and recovered, outputs checked"
