#!/usr/bin/env bash
# Install the Debian packages the single-host SLURM testbed needs (Debian 12, as root).
#
# Idempotent: when every package is already installed this is a fast no-op (no
# apt-get update, no apt-get install), so CI can call it unconditionally.
set -euo pipefail

# Debian's slurm-wlm daemons, client and accounting database for a cluster on one host. --no-install-recommends
# matters: with recommends, slurm-wlm drags in ~40 unneeded packages (rocm-smi, hdf5, ...).
PKGS=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server bindfs bubblewrap)  # bindfs: tests/test_bad_env.py (a second "host"'s view); bubblewrap: a container prefix (tests/conftest.py site_two_envs)

T0=$(date +%s%N)
log() { echo "[install +$(( ($(date +%s%N) - T0) / 1000000 ))ms] $*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: must run as root (apt-get)" >&2
  exit 1
fi

# dpkg-query rather than a bare `dpkg -s`: `dpkg -s` also exits 0 for packages that were
# removed but left their config files ("deinstall ok config-files"). Only "ii" counts.
missing=()
for p in "${PKGS[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
  [[ $status == ii* ]] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  log "all packages already installed: ${PKGS[*]}"
  exit 0
fi
log "missing: ${missing[*]}"

# Without systemd, package postinsts go through invoke-rc.d and sysv init scripts. If no
# policy-rc.d forbids it, they would start munged and a system MariaDB on port 3306 that
# slurm-up.sh does not manage (and which would clash with its own MariaDB). Docker-style
# images ship a policy-rc.d that exits 101; add a temporary one only if there is none.
POLICY=/usr/sbin/policy-rc.d
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$POLICY"
  chmod 0755 "$POLICY"
  trap 'rm -f "$POLICY"' EXIT
fi

export DEBIAN_FRONTEND=noninteractive
# Wait for the dpkg/apt lock instead of failing at once: other jobs on the same host
# (e.g. a concurrent CI step) may be running apt at the same time.
APT_OPTS=(-o DPkg::Lock::Timeout=300)

apt-get "${APT_OPTS[@]}" update -qq
log "apt-get update done"
apt-get "${APT_OPTS[@]}" install -y -qq --no-install-recommends "${PKGS[@]}"
log "apt-get install done"
