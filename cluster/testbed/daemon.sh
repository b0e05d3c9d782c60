#!/usr/bin/env bash
# Stop or start one daemon of the running testbed, for fault drills (tests/test_slurm_faults.py):
#   bash cluster/testbed/daemon.sh stop  slurmdbd|slurmctld
#   bash cluster/testbed/daemon.sh start slurmdbd|slurmctld
# Stops by PID file only (never by name). slurmctld keeps its jobs in StateSaveLocation: a restarted
# controller knows every queued and running job again. Needs root, like slurm-up.sh.
set -euo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
ROOT=${SLURM_TESTBED_ROOT:-/var/tmp/pp-slurm}
action=${1:?usage: daemon.sh stop|start slurmdbd|slurmctld}
name=${2:?usage: daemon.sh stop|start slurmdbd|slurmctld}
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
