#!/usr/bin/env bash
# Bring up a real single-host SLURM test cluster (Debian 12 slurm-wlm 22.05, as root,
# no systemd needed): munge + MariaDB + slurmdbd + slurmctld + four virtual slurmd nodes with fake
# typed GPUs: node-a100 and node-h100 (a partition each, and `cpu` over both; node-h100 also in `short`, MaxTime
# 2 min, for trainings in requeued segments), and node-mn0 / node-mn1 (partition `multi`: two nodes x 2 l40s, the
# multi-node cells' layout). docs/cluster.md draws it.
#
# Idempotent: if the cluster from an earlier run is healthy this exits 0 in well under a
# second; if its slurm.conf differs only in its partitions, the new one is applied with `scontrol reconfigure`
# (jobs kept); if it is only partly up (or another part of its config is stale) it is torn down and rebuilt.
#
# Env:
#   SLURM_TESTBED_INSTANCE 0 (default) or 1: a second, independent cluster beside the first (instance.sh)
#   SLURM_TESTBED_ROOT     state/logs/pid files        (default /var/tmp/pp-slurm, /var/tmp/pp-slurm-1)
#   SLURM_TESTBED_DB_PORT  MariaDB TCP port, 127.0.0.1 (default 3306, 3307)
set -euo pipefail

# Daemons live in /usr/sbin; CI shells do not always have it on PATH.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=instance.sh
. "$HERE/instance.sh"   # INSTANCE, CLUSTER, ROOT, CONF_DIR, the ports; SLURM_CONF for instance 1
HOST=$(hostname -s)
NODES=(node-a100 node-h100 node-mn0 node-mn1)
PORTS=("$CTLD_PORT" "$DBD_PORT" "$NODE_PORT0" $((NODE_PORT0 + 1)) $((NODE_PORT0 + 2)) $((NODE_PORT0 + 3)) "$DB_PORT")

T0=$(date +%s%N)
log() { echo "[slurm-up +$(( ($(date +%s%N) - T0) / 1000000 ))ms] $*"; }
die() { echo "[slurm-up] ERROR: $*" >&2; exit 1; }

wait_for() {  # wait_for SECONDS CMD... : poll CMD every 0.1 s until it succeeds
  local n=$(( $1 * 10 )) i; shift
  for ((i = 0; i < n; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "timeout waiting for: $*" >&2; return 1
}
tcp_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Start a daemon with stdio detached and the lock fd 9 closed:
# - a daemon holding our stdout keeps a caller's pipe open (out=$(slurm-up.sh) and
#   subprocess.run(capture_output=True) would never return);
# - munged, mariadbd and slurmdbd do not close inherited fds, so they would hold the
#   flock on $ROOT/.lock for their whole life and the next slurm-up/down would block.
daemon() {  # daemon NAME CMD...
  local name=$1; shift
  "$@" </dev/null >>"$ROOT/log/$name.out" 2>&1 9>&-
}

# A pid file counts only if its process exists and is not a zombie: PID 1 here is not
# an init that reaps, so killed daemons linger as <defunct> and `kill -0` still succeeds.
pid_alive() {
  local pid state
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  [ -r "/proc/$pid/stat" ] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# ---------------------------------------------------------------- config rendering
# Rendered by functions so the health check can compare them with what is on disk: a
# cluster running an older config counts as unhealthy and gets rebuilt (only new partitions: reconfigured).
render_slurmdbd_conf() {
  cat <<EOF
AuthType=auth/munge
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$ROOT/log/slurmdbd.log
PidFile=$ROOT/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
EOF
}

render_slurm_conf() {
  # SlurmctldHost=host(127.0.0.1) works even if the host name doesn't resolve.
  # AuthInfo=cred_expire=30: a requeued job becomes eligible after 31 s, not 121 s.
  # SlurmUser/SlurmdUser=root: avoids every ownership problem on state dirs.
  # linuxproc + task/none: no cgroup plugin needed (and nothing opens the fake GPUs).
  # config_overrides: each virtual node may claim CPUs=4 on a 2-core host.
  # EnforcePartLimits=ALL: impossible requests are rejected at submit instead of
  #   pending forever (Reason=PartitionConfig).
  # JobRequeue=1: batch jobs are requeueable by default (scontrol requeue, node failure).
  # MinJobAge=300: finished jobs stay in squeue/scontrol for 5 min (squeue-based polling).
  # MailProg=/bin/true: silences "Configured MailProg is invalid".
  # Partition short (node-h100, MaxTime=2 min): a training longer than its limit runs there as requeued segments,
  #   each warned (--signal) before the limit (tests/test_calendar_slurm.py); asking more than 2 min is refused.
  cat <<EOF
ClusterName=$CLUSTER
FirstJobId=$FIRST_JOB_ID
SlurmctldHost=$HOST(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=30
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
StateSaveLocation=$ROOT/state/ctld
SlurmdSpoolDir=$ROOT/state/d/%n
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd-%n.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
EnforcePartLimits=ALL
JobRequeue=1
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/gpu:h100,gres/gpu:l40s
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
Waittime=0
NodeName=node-a100 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((NODE_PORT0 + 0)) CPUs=4 RealMemory=8000 Features=a100 Gres=gpu:a100:2 State=UNKNOWN
NodeName=node-h100 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((NODE_PORT0 + 1)) CPUs=4 RealMemory=8000 Features=h100 Gres=gpu:h100:2 State=UNKNOWN
NodeName=node-mn0 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((NODE_PORT0 + 2)) CPUs=4 RealMemory=8000 Features=l40s Gres=gpu:l40s:2 State=UNKNOWN
NodeName=node-mn1 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((NODE_PORT0 + 3)) CPUs=4 RealMemory=8000 Features=l40s Gres=gpu:l40s:2 State=UNKNOWN
PartitionName=cpu  Nodes=node-a100,node-h100 Default=YES MaxTime=INFINITE State=UP
PartitionName=a100 Nodes=node-a100 MaxTime=INFINITE State=UP
PartitionName=h100 Nodes=node-h100 MaxTime=INFINITE State=UP
PartitionName=multi Nodes=node-mn0,node-mn1 MaxTime=INFINITE State=UP
PartitionName=short Nodes=node-h100 MaxTime=2 State=UP
EOF
}

render_gres_conf() {
  # GPU GRES needs File= pointing at *character devices* (22.05 drops file-less GPUs and
  # drains the node; regular files give "not a valid character or block device").
  cat <<EOF
AutoDetect=off
NodeName=node-a100 Name=gpu Type=a100 File=$ROOT/dev/nvidia[0-1]
NodeName=node-h100 Name=gpu Type=h100 File=$ROOT/dev/nvidia[2-3]
NodeName=node-mn0 Name=gpu Type=l40s File=$ROOT/dev/nvidia[4-5]
NodeName=node-mn1 Name=gpu Type=l40s File=$ROOT/dev/nvidia[6-7]
EOF
}

# ---------------------------------------------------------------- health check
healthy() {
  cmp -s <(render_slurm_conf) "$CONF_DIR/slurm.conf" && running_healthy
}

# Only the partitions differ between the running slurm.conf and this script's: `scontrol reconfigure` applies that
# to the running cluster (its jobs kept); anything else (nodes, GRES, auth, accounting) needs a fresh cluster.
only_partitions_differ() {
  cmp -s <(render_slurm_conf | grep -v '^PartitionName=') <(grep -v '^PartitionName=' "$CONF_DIR/slurm.conf")
}

# The partitions the controller runs with are the ones of render_slurm_conf (by name).
partitions_current() {
  [ "$(scontrol show partition -o 2>/dev/null | grep -o 'PartitionName=[^ ]*' | sort | tr '\n' ' ')" = \
    "$(render_slurm_conf | grep -o '^PartitionName=[^ ]*' | sort | tr '\n' ' ')" ]
}

# Everything but slurm.conf's text: the daemons alive, the other configs current, the controller and nodes usable.
running_healthy() {
  local f n states
  for f in "$ROOT/mysql/mariadbd.pid" "$ROOT/run/slurmdbd.pid" "$ROOT/run/slurmctld.pid"; do
    pid_alive "$f" || return 1
  done
  for n in "${NODES[@]}"; do pid_alive "$ROOT/run/slurmd-$n.pid" || return 1; done
  cmp -s <(render_gres_conf) "$CONF_DIR/gres.conf" || return 1
  cmp -s <(render_slurmdbd_conf) "$CONF_DIR/slurmdbd.conf" || return 1
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || return 1
  scontrol ping 2>/dev/null | grep -q 'is UP' || return 1
  # Every node usable. Busy nodes (mixed/allocated/completing) count as healthy too:
  # someone may be running jobs on the cluster, and rebuilding would kill them.
  states=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u) || return 1
  [ "$(awk '{print $1}' <<<"$states" | sort -u | tr '\n' ' ')" = "$(printf '%s\n' "${NODES[@]}" | sort | tr '\n' ' ')" ] || return 1
  awk '$2 !~ /^(idle|mixed|allocated|completing)$/ {bad=1} END {exit bad}' <<<"$states" || return 1
  sacct -n -X -o JobID -S now-1minutes >/dev/null 2>&1 || return 1
}

[ "$(id -u)" -eq 0 ] || die "must run as root (daemons run as root, mknod, /etc/hosts)"
for b in munged mariadbd mariadb-install-db slurmdbd slurmctld slurmd srun sacct; do
  command -v "$b" >/dev/null || die "$b not found; run cluster/testbed/install.sh first"
done

install -d "$ROOT"
# Serialise concurrent bring-ups/tear-downs (e.g. two CI steps on one host).
exec 9>"$ROOT/.lock"
flock -w 300 9 || die "could not get $ROOT/.lock within 300 s (another slurm-up/down running?)"
export SLURM_TESTBED_LOCK_HELD=1   # tells slurm-down.sh (called below) not to re-lock

# An account besides root's default one, root a member of it: a site file's `account` is then carried into the
# jobs and read back (tests/conftest.py site_two_envs); a name SLURM does not know is replaced by the default.
# Idempotent: on a running cluster too (one started before this account existed gets it here).
# A QOS capping a user's submitted jobs at 2 (pp-cap), root allowed to use it: enforced only where the restrictive
# profile sets AccountingStorageEnforce=limits,qos (cluster/testbed/daemon.sh profile restrictive).
has_account() {
  sacctmgr -n -P show assoc where account=pp-lab user=root format=user 2>/dev/null | grep -qx root &&
    sacctmgr -n -P show qos pp-cap format=maxsubmitpu 2>/dev/null | grep -qx 2 &&
    sacctmgr -n -P show assoc where user=root format=qos 2>/dev/null | grep -q pp-cap
}
accounts() {
  has_account && return 0
  sacctmgr -i -Q add account pp-lab Description=testbed Organization=testbed >/dev/null 2>&1 || true
  sacctmgr -i -Q add user root Account=pp-lab >/dev/null 2>&1 || true
  sacctmgr -i -Q add qos pp-cap MaxSubmitJobsPerUser=2 >/dev/null 2>&1 || true
  sacctmgr -i -Q modify user root set qos+=pp-cap >/dev/null 2>&1 || true
  has_account
}

if healthy; then
  accounts || die "could not add the testbed's account pp-lab and QOS pp-cap (sacctmgr)"
  log "cluster $CLUSTER already up and healthy; nothing to do"
  exit 0
fi
# A cluster that runs an older slurm.conf differing only in its partitions (e.g. one started before `short` was
# added): the new conf and `scontrol reconfigure` (slurmctld re-reads it and tells every slurmd), no rebuild, its
# jobs and accounting kept. If the controller then does not show the new partitions, rebuild below.
if [ -s "$CONF_DIR/slurm.conf" ] && only_partitions_differ && running_healthy; then
  render_slurm_conf > "$CONF_DIR/.slurm.conf.new" && mv "$CONF_DIR/.slurm.conf.new" "$CONF_DIR/slurm.conf"
  if scontrol reconfigure && wait_for 30 partitions_current && wait_for 30 healthy; then
    log "partitions changed: slurm.conf rewritten and applied with scontrol reconfigure (jobs kept)"
    sinfo
    exit 0
  fi
  log "scontrol reconfigure did not apply the new partitions: rebuilding"
fi
log "cluster not (fully) up: tearing down leftovers, then bringing up"
bash "$HERE/slurm-down.sh"
for p in "${PORTS[@]}"; do
  # Something we don't own (no pid file) holds a port: refuse rather than kill by name.
  ! tcp_open "$p" || die "port $p still in use after teardown (a daemon not started by this script?)"
done
log "teardown done"

# ---------------------------------------------------------------- bring-up
rm -rf "$ROOT/state" "$ROOT/mysql"      # fresh cluster every bring-up (jobs, DB)
# Keep the previous bring-up's logs (one generation) for post-mortems; start clean ones.
if [ -d "$ROOT/log" ]; then rm -rf "$ROOT/log.prev"; mv "$ROOT/log" "$ROOT/log.prev"; fi
# SlurmdSpoolDir must exist beforehand ("Domain socket directory ... No such file").
install -d "$ROOT"/{state/ctld,log,run,dev} "$CONF_DIR"
for n in "${NODES[@]}"; do install -d "$ROOT/state/d/$n"; done

# munge on its default socket /run/munge/munge.socket.2, so slurm needs no AuthInfo=socket
# (moving it would need AuthInfo in both confs *and* AccountingStoragePass=<socket>).
# /run/munge is not created by the package; munged insists on 0755 for the socket dir.
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 "$ROOT/munge"
if [ ! -s /etc/munge/munge.key ]; then   # Debian's postinst normally creates it
  install -d -o munge -g munge -m 0700 /etc/munge
  dd if=/dev/urandom of=/etc/munge/munge.key bs=128 count=1 status=none
  chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
fi
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  daemon munged runuser -u munge -- munged --log-file="$ROOT/munge/munged.log" \
    --seed-file="$ROOT/munge/munged.seed"
  wait_for 10 bash -c 'munge -n | unmunge'
fi
log "munge up"

# Virtual node names must resolve: torch/submitit use the first node of
# SLURM_JOB_NODELIST as MASTER_ADDR (gloo loops forever on an unresolvable name).
# Append (not rewrite): /etc/hosts is often a bind mount in containers.
for n in "${NODES[@]}"; do
  awk -v n="$n" '$1 == "127.0.0.1" { for (i = 2; i <= NF; i++) if ($i == n) f = 1 }
                 END { exit !f }' /etc/hosts || echo "127.0.0.1 $n" >> /etc/hosts
done

# Fake GPUs: char devices with NVIDIA's major 195. task/none means nothing opens them.
for i in 0 1 2 3 4 5 6 7; do
  [ -c "$ROOT/dev/nvidia$i" ] || { rm -f "$ROOT/dev/nvidia$i"; mknod "$ROOT/dev/nvidia$i" c 195 "$i"; }
done

# MariaDB, private instance: runs as mysql, so pid/log/socket go in a mysql-owned dir
# (in a root-owned dir it exits silently). TCP only on 127.0.0.1.
install -d -o mysql -g mysql "$ROOT/mysql"
mariadb-install-db --user=mysql --datadir="$ROOT/mysql/data" --skip-test-db \
  --auth-root-authentication-method=socket >"$ROOT/log/mariadb-install.log" 2>&1
daemon mariadbd setsid -f mariadbd --no-defaults --user=mysql --datadir="$ROOT/mysql/data" \
  --socket="$ROOT/mysql/mysqld.sock" --pid-file="$ROOT/mysql/mariadbd.pid" \
  --port="$DB_PORT" --bind-address=127.0.0.1 --log-error="$ROOT/mysql/mariadb.log" \
  --innodb-buffer-pool-size=64M
wait_for 30 mariadb-admin --socket="$ROOT/mysql/mysqld.sock" ping ||
  die "mariadbd did not start; see $ROOT/mysql/mariadb.log"
mariadb --socket="$ROOT/mysql/mysqld.sock" -u root <<'SQL'
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL
log "mariadb up (port $DB_PORT)"

render_slurmdbd_conf > "$CONF_DIR/slurmdbd.conf"
chmod 600 "$CONF_DIR/slurmdbd.conf"      # slurmdbd is fatal on 0644
render_slurm_conf > "$CONF_DIR/slurm.conf"
render_gres_conf > "$CONF_DIR/gres.conf"

daemon slurmdbd slurmdbd
wait_for 60 tcp_open "$DBD_PORT" || die "slurmdbd did not listen on $DBD_PORT; see $ROOT/log/slurmdbd.log"
log "slurmdbd up"

# slurmctld registers the cluster in the DB by itself (AccountingStorageEnforce is off).
daemon slurmctld slurmctld
wait_for 30 bash -c 'scontrol ping | grep -q "is UP"' ||
  die "slurmctld not UP; see $ROOT/log/slurmctld.log"
log "slurmctld up"

# Two slurmd on one host: Debian builds with MULTIPLE_SLURMD; -N picks the NodeName.
for n in "${NODES[@]}"; do
  daemon "slurmd-$n" slurmd -N "$n"
done
# shellcheck disable=SC2016  # expanded by the inner bash on every poll, on purpose
wait_for 60 bash -c '[ "$(sinfo -h -N -o %T | sort -u)" = idle ]' ||
  die "nodes not idle: $(sinfo -h -N -o '%N %T' | sort -u | tr '\n' ' '); see $ROOT/log/slurmd-*.log"
log "slurmd x${#NODES[@]} up, nodes idle"

# Smoke test: one srun per GPU partition, then wait until accounting has both as
# COMPLETED (the first job after start takes ~4 s to reach sacct).
jobs=()
for g in a100 h100; do
  jid=$(srun -Q -p "$g" --gres="gpu:$g:1" -t 1 printenv SLURM_JOB_ID)
  jobs+=("$jid")
done
jid=$(srun -Q -p multi -N 2 --ntasks-per-node=1 --gres=gpu:l40s:1 -t 1 printenv SLURM_JOB_ID | head -n 1)
jobs+=("$jid")
log "smoke srun done (jobs ${jobs[*]})"
joblist=$(IFS=,; echo "${jobs[*]}")
wait_for 60 bash -c "[ \"\$(sacct -X -n -P -j $joblist -o State | grep -c '^COMPLETED\$')\" -eq ${#jobs[@]} ]" ||
  die "smoke jobs not COMPLETED in sacct: $(sacct -X -n -P -j "$joblist" -o JobID,State | tr '\n' ' ')"
accounts || die "could not add the testbed's account pp-lab and QOS pp-cap (sacctmgr)"
log "smoke jobs COMPLETED in sacct; account pp-lab and QOS pp-cap added; cluster ready"
sinfo
