#!/usr/bin/env bash
# Install Debian's Chromium for the test that opens the HTML report in a real browser
# (tests/test_report_browser.py). Called by `bash envs/setup.sh test`.
#
# Idempotent: when the package is installed this is a fast no-op (no apt-get update, no apt-get install).
# Not root and not installed: says so and exits 0 (the browser test then skips with the command to run).
set -euo pipefail
PKGS=(chromium)

missing=()
for p in "${PKGS[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)  # "ii" only: not "config-files"
  [[ $status == ii* ]] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "[browser] already installed: ${PKGS[*]} ($(command -v chromium))"
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "[browser] ${missing[*]} not installed and this is not a root Debian host: the browser test will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
APT_OPTS=(-o DPkg::Lock::Timeout=300)  # wait for another apt (the SLURM testbed's install) instead of failing
echo "[browser] installing ${missing[*]}"
apt-get "${APT_OPTS[@]}" update -qq
apt-get "${APT_OPTS[@]}" install -y -qq --no-install-recommends "${missing[@]}"
echo "[browser] installed: $(chromium --version 2>/dev/null || echo '?')"
