#!/usr/bin/env bash
# Stop or start one daemon of the running testbed, for fault drills (tests/test_slurm_faults.py):
#   bash cluster/testbed/daemon.sh stop  slurmdbd|slurmctld
#   bash cluster/testbed/daemon.sh start slurmdbd|slurmctld
#   bash cluster/testbed/daemon.sh conf KEY VALUE [KEY VALUE ...]   (one restart for all), KEY VALUE among
#       TaskPlugin task/affinity|task/none   EnforcePartLimits NO|ALL   JobRequeue 0|1
#       AccountingStorageEnforce limits,qos|none
#   bash cluster/testbed/daemon.sh profile restrictive|permissive   (the restrictive site's four values, or the
#       testbed's own: what tests/conftest.restrictive_site and benchmarks/chaos_soak.py --restrictive use)
# conf: slurm.conf settings changed and the controller and every slurmd restarted with them, their state kept
# (jobs, ids, accounting): a restrictive site's for a drill (task/affinity binds each task to its CPUs: the
# preflight's test; EnforcePartLimits=NO, SLURM's default, accepts a job over a partition's limits, which then pends
# for ever: the pending-reason watchdog's test; JobRequeue=0: a job is requeued only if it asked --requeue;
# AccountingStorageEnforce=limits,qos: the QOS pp-cap's cap of 2 submitted jobs per user is enforced, the
# restrictive profile of tests/conftest.py). Put the testbed's values back after (slurm-up.sh's: TaskPlugin
# task/none, EnforcePartLimits ALL, JobRequeue 1, AccountingStorageEnforce none): slurm-up.sh rebuilds otherwise.
# Stops by PID file only (never by name). slurmctld keeps its jobs in StateSaveLocation: a restarted
# controller knows every queued and running job again. Needs root, like slurm-up.sh.
set -euo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
# shellcheck source=instance.sh
. "$(dirname "${BASH_SOURCE[0]}")/instance.sh"   # which cluster (SLURM_TESTBED_INSTANCE): its ROOT and CONF_DIR
usage="usage: daemon.sh stop|start slurmdbd|slurmctld, daemon.sh conf KEY VALUE [KEY VALUE ...],"
usage+=" or daemon.sh profile restrictive|permissive"
action=${1:?$usage}
name=${2:?$usage}
if [ "$action" = profile ]; then
  case "$name" in
    restrictive) exec bash "$0" conf AccountingStorageEnforce limits,qos JobRequeue 0 EnforcePartLimits NO \
                   TaskPlugin task/affinity ;;
    permissive) exec bash "$0" conf AccountingStorageEnforce none JobRequeue 1 EnforcePartLimits ALL TaskPlugin task/none ;;
    *) echo "daemon.sh: profile $name: restrictive|permissive" >&2; exit 2 ;;
  esac
fi
if [ "$action" = conf ]; then
  shift
  conf=$CONF_DIR/slurm.conf
  while [ $# -gt 0 ]; do
    name=$1; value=${2:?$usage}; shift 2
    case "$name=$value" in
      TaskPlugin=task/affinity|TaskPlugin=task/none|EnforcePartLimits=NO|EnforcePartLimits=ALL) ;;
      JobRequeue=0|JobRequeue=1|AccountingStorageEnforce=limits,qos|AccountingStorageEnforce=none) ;;
      *) echo "daemon.sh: conf $name $value: TaskPlugin task/affinity|task/none, EnforcePartLimits NO|ALL," \
           "JobRequeue 0|1, AccountingStorageEnforce limits,qos|none" >&2; exit 2 ;;
    esac
    # in place (the file stays slurm-up.sh's once the values are back); `none`: the line removed (SLURM's default)
    if [ "$value" = none ]; then sed -i "/^$name=/d" "$conf"
    elif grep -q "^$name=" "$conf"; then sed -i "s#^$name=.*#$name=$value#" "$conf"
    else echo "$name=$value" >> "$conf"; fi
  done
  bash "$0" stop slurmctld
  nodes=$(sed -n 's/^NodeName=\([^ ]*\).*/\1/p' "$conf")
  for n in $nodes; do
    pid=$(cat "$ROOT/run/slurmd-$n.pid" 2>/dev/null || true)
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
  done
  for n in $nodes; do
    for _ in $(seq 1 100); do [ -e "/proc/$(cat "$ROOT/run/slurmd-$n.pid" 2>/dev/null || echo 0)/stat" ] || break; sleep 0.1; done
    slurmd -N "$n" </dev/null >>"$ROOT/log/slurmd-$n.out" 2>&1 9>&-
  done
  bash "$0" start slurmctld
  for _ in $(seq 1 300); do
    [ "$(sinfo -h -o '%t' 2>/dev/null | grep -cv '^idle$\|^mix$\|^alloc$')" = 0 ] && break; sleep 0.1
  done
  echo "daemon.sh: slurm.conf changed, controller and slurmd restarted"
  exit 0
fi
case "$name" in slurmdbd|slurmctld) ;; *) echo "daemon.sh: $name is not slurmdbd or slurmctld" >&2; exit 2 ;; esac
pidfile="$ROOT/run/$name.pid"

alive() {
  local pid=$1 state
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]
}
wait_for() {  # seconds, command...
  local n=$(( $1 * 10 )) i; shift
  for ((i = 0; i < n; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}

case "$action" in
  stop)
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [ -n "$pid" ] && alive "$pid"; then
      kill "$pid"
      for _ in $(seq 1 150); do alive "$pid" || break; sleep 0.1; done
      alive "$pid" && kill -9 "$pid"
    fi
    rm -f "$pidfile"
    echo "daemon.sh: $name stopped" ;;
  start)
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [ -n "$pid" ] && alive "$pid"; then echo "daemon.sh: $name already running"; exit 0; fi
    # stdio detached and fd 9 closed, as slurm-up.sh's `daemon` does (a caller's pipe must not stay open)
    "$name" </dev/null >>"$ROOT/log/$name.out" 2>&1 9>&-
    if [ "$name" = slurmctld ]; then
      wait_for 30 bash -c 'scontrol ping | grep -q "is UP"' || { echo "daemon.sh: slurmctld not UP" >&2; exit 1; }
    else
      wait_for 60 bash -c 'sacct -n -X -o JobID -S now-1minutes' || { echo "daemon.sh: slurmdbd not answering" >&2; exit 1; }
    fi
    echo "daemon.sh: $name started" ;;
  *) echo "usage: daemon.sh stop|start slurmdbd|slurmctld" >&2; exit 2 ;;
esac
