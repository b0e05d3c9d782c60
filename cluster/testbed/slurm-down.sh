#!/usr/bin/env bash
# Stop the single-host SLURM testbed started by slurm-up.sh.
#
# Daemons are stopped by their PID files only, never by name (pkill/killall could hit
# another user's or another test's daemons). Idempotent: safe with nothing running;
# always exits 0. State, logs and /etc/slurm configs are left for post-mortems
# (slurm-up.sh wipes state itself).
#
# Env:
#   SLURM_TESTBED_INSTANCE    which cluster, as for slurm-up.sh (instance.sh: 0, the default, or 1)
#   SLURM_TESTBED_ROOT        state root, as for slurm-up.sh (default /var/tmp/pp-slurm, /var/tmp/pp-slurm-1)
#   SLURM_TESTBED_STOP_MUNGE  1 (default) also stops munged via /run/munge/munged.pid, unless the other
#                             instance's controller still runs (munged is shared)
set -euo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH

# shellcheck source=instance.sh
. "$(dirname "${BASH_SOURCE[0]}")/instance.sh"
T0=$(date +%s%N)
log() { echo "[slurm-down +$(( ($(date +%s%N) - T0) / 1000000 ))ms] $*"; }

# Alive = exists and not a zombie. PID 1 on these hosts does not reap orphans, so a
# killed daemon can stay <defunct> for a while; `kill -0` alone would wait on it.
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

if [ ! -d "$ROOT" ]; then
  log "nothing to stop ($ROOT does not exist)"
  exit 0
fi
# Same lock as slurm-up.sh, unless slurm-up.sh (which holds it) is calling us.
if [ "${SLURM_TESTBED_LOCK_HELD:-0}" != 1 ]; then
  exec 9>"$ROOT/.lock"
  # Bounded wait: better a noisy teardown than a CI job hanging on a stuck lock holder.
  flock -w 300 9 || log "WARNING: $ROOT/.lock still held after 300 s; stopping anyway"
fi

# Cancel jobs first so their slurmstepd/job processes don't outlive slurmd. Only when
# our slurmctld is alive: otherwise scancel just waits on a dead controller.
ctld_pid=$(cat "$ROOT/run/slurmctld.pid" 2>/dev/null || true)
if [ -n "$ctld_pid" ] && alive "$ctld_pid"; then
  if [ -n "$(timeout 10 squeue -h -o %i 2>/dev/null || true)" ]; then
    timeout 10 scancel --full --quiet -u "$(id -un)" 2>/dev/null || true
    for _ in $(seq 1 100); do   # up to 10 s for running/completing jobs to go away
      [ -z "$(timeout 5 squeue -h -t R,CG -o %i 2>/dev/null || true)" ] && break
      sleep 0.1
    done
    log "jobs cancelled"
  fi
fi

# PID file -> the process name it must have. The name check guards against a stale
# PID file whose PID was reused by an unrelated process; it never selects by name.
declare -A expect=()
for f in "$ROOT"/run/slurmd-*.pid; do [ -e "$f" ] && expect[$f]=slurmd; done
expect[$ROOT/run/slurmctld.pid]=slurmctld
expect[$ROOT/run/slurmdbd.pid]=slurmdbd
expect[$ROOT/mysql/mariadbd.pid]=mariadbd
others=0
for r in "${OTHER_ROOTS[@]}"; do
  p=$(cat "$r/run/slurmctld.pid" 2>/dev/null || true)
  [[ $p =~ ^[0-9]+$ ]] && alive "$p" && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = slurmctld ] && others=1
done
[ "${SLURM_TESTBED_STOP_MUNGE:-1}" = 1 ] && [ "$others" = 0 ] && expect[/run/munge/munged.pid]=munged

pids=()
for f in "${!expect[@]}"; do
  [ -s "$f" ] || continue
  pid=$(cat "$f")
  if [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" &&
     [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${expect[$f]}" ]; then
    kill "$pid" 2>/dev/null && pids+=("$pid")
  fi
  rm -f "$f"
done

alive_pids=()
for _ in $(seq 1 150); do          # up to 15 s for a clean exit, then SIGKILL
  alive_pids=()
  for p in "${pids[@]}"; do alive "$p" && alive_pids+=("$p"); done
  [ ${#alive_pids[@]} -eq 0 ] && break
  sleep 0.1
done
for p in "${alive_pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
log "stopped ${#pids[@]} daemons${alive_pids[*]:+ (SIGKILLed: ${alive_pids[*]})}"
exit 0
