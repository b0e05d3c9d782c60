# Sourced by slurm-up.sh, slurm-down.sh and daemon.sh: which testbed cluster they act on, and its places and ports.
# The test suite runs two independent clusters on one host so that its two long SLURM units (drills that restart
# daemons, take nodes down, reconfigure the site) run side by side instead of one after the other:
#   SLURM_TESTBED_INSTANCE=0 (default)  cluster `testbed`:  /etc/slurm (SLURM's default place: a user's shell finds it
#                                       with no SLURM_CONF), ports 6817/6819, slurmd 17001-17004, MariaDB 3306
#   SLURM_TESTBED_INSTANCE=1            cluster `testbed1`: /etc/slurm-1 (SLURM_CONF, exported here and by the tests:
#                                       every SLURM command and daemon reads it; sbatch carries it into the jobs),
#                                       ports 6827/6829, slurmd 17011-17014, MariaDB 3307, job ids from 100001
# Both share munged (one key, one socket). Env: SLURM_TESTBED_ROOT (state, logs, pid files; default
# /var/tmp/pp-slurm, or /var/tmp/pp-slurm-N), SLURM_TESTBED_DB_PORT (MariaDB's TCP port).
# shellcheck shell=bash
INSTANCE=${SLURM_TESTBED_INSTANCE:-0}
case "$INSTANCE" in
  0) CLUSTER=testbed; CONF_DIR=/etc/slurm; DEFAULT_ROOT=/var/tmp/pp-slurm ;;
  1) CLUSTER=testbed1; CONF_DIR=/etc/slurm-1; DEFAULT_ROOT=/var/tmp/pp-slurm-1 ;;
  *) echo "SLURM_TESTBED_INSTANCE=$INSTANCE: 0 or 1" >&2; exit 2 ;;
esac
ROOT=${SLURM_TESTBED_ROOT:-$DEFAULT_ROOT}
OFFSET=$((INSTANCE * 10))
CTLD_PORT=$((6817 + OFFSET))
DBD_PORT=$((6819 + OFFSET))
NODE_PORT0=$((17001 + OFFSET))       # node k listens on NODE_PORT0 + k
DB_PORT=${SLURM_TESTBED_DB_PORT:-$((3306 + INSTANCE))}
# Job ids of their own (1, 2, ... and 100001, 100002, ...): a process on this host is known by its job's id (tests find
# a job's ranks by SLURM_JOB_ID; a rank's rendezvous port is derived from it), so the two clusters' ids never meet.
FIRST_JOB_ID=$((1 + INSTANCE * 100000))
if [ "$INSTANCE" = 0 ]; then unset SLURM_CONF; else export SLURM_CONF=$CONF_DIR/slurm.conf; fi
# The other instance's root: munged is shared, so a teardown stops it only where no other cluster still runs.
OTHER_ROOTS=()
for i in 0 1; do
  [ "$i" = "$INSTANCE" ] && continue
  if [ "$i" = 0 ]; then OTHER_ROOTS+=(/var/tmp/pp-slurm); else OTHER_ROOTS+=("/var/tmp/pp-slurm-$i"); fi
done
