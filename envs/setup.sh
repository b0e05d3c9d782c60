#!/usr/bin/env bash
# Set up pretrain-planner in ./.venv (idempotent).
#   bash envs/setup.sh          runtime: the package, torch, transformers, snakemake, submitit, polars
#   bash envs/setup.sh test     + test tools, DeepSpeed (CPU ops prebuilt), the Debian packages of the
#                               single-host SLURM testbed, Debian's chromium (envs/browser.sh)
# DeepSpeed (test mode) is built from its sdist against the installed torch with its two CPU ops compiled
# in (shm_comm, cpu_adam for ZeRO-Offload), so no run JIT-compiles them (about 90 s per machine).
# The build takes about 3 min on 2 cores; its wheel is kept in DS_WHEEL_CACHE (default
# ~/.cache/pretrain-planner/wheels), keyed by DeepSpeed, torch and Python versions, so a new venv on the
# same machine (or a CI cache of that folder) installs it in seconds. DS_VERSION overrides the version.
# TORCH_SPEC overrides the torch requirement: the default pins the CPU build that this project's
# machines carry (a plain `torch` may pull a multi-GB CUDA build); on GPU nodes use e.g.
#   TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu130" bash envs/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-run}
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
t0=$(date +%s)
say() { echo "[setup +$(( $(date +%s) - t0 ))s] $*"; }

[ -x .venv/bin/python ] || { say "creating .venv"; "$PY" -m venv .venv; }
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  say "installing $TORCH_SPEC"
  # shellcheck disable=SC2086  # TORCH_SPEC may carry pip options
  "${PIP[@]}" $TORCH_SPEC
fi

DS_VERSION=${DS_VERSION:-0.19.8}
# DeepSpeed's runtime requirements (`pip show deepspeed`: Requires), installed before it so that its build
# can run with --no-deps; packaging stays below 26 for snakemake.
DS_DEPS=(einops hjson msgpack ninja numpy "packaging>=20,<26" psutil py-cpuinfo "pydantic>=2" tqdm)

# Exit 0 when DeepSpeed $DS_VERSION is installed with both CPU ops built for this torch (without importing
# it: its import takes seconds and picks an accelerator).
ds_ready() {
  .venv/bin/python - "$DS_VERSION" <<'PY'
import importlib.util, pathlib, sys
from importlib import metadata
spec = importlib.util.find_spec("deepspeed")
if spec is None:
    sys.exit(1)
root = pathlib.Path(spec.submodule_search_locations[0])
info = {}
try:
    exec((root / "git_version_info_installed.py").read_text(), info)
except OSError:
    sys.exit(1)
torch = ".".join(metadata.version("torch").split("+")[0].split(".")[:2])
ops = info.get("installed_ops", {})
ok = (
    info.get("version") == sys.argv[1]
    and ops.get("cpu_adam") and ops.get("deepspeed_shm_comm")
    and info.get("torch_info", {}).get("version") == torch
    and list(root.glob("ops/adam/cpu_adam_op*.so")) and list(root.glob("ops/comm/deepspeed_shm_comm_op*.so"))
)
sys.exit(0 if ok else 1)
PY
}

install_deepspeed() {
  if ds_ready; then say "DeepSpeed $DS_VERSION with its CPU ops is installed"; return; fi
  say "installing DeepSpeed's requirements"; "${PIP[@]}" "${DS_DEPS[@]}"
  local tag cache wheel
  tag=$(.venv/bin/python -c 'import sys, torch; print(f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}")')
  cache="${DS_WHEEL_CACHE:-$HOME/.cache/pretrain-planner/wheels}/deepspeed-$DS_VERSION-$tag"
  wheel=$(ls "$cache"/deepspeed-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$wheel" ]; then
    say "building DeepSpeed $DS_VERSION with its CPU ops (shm_comm, cpu_adam): about 3 min"
    mkdir -p "$cache.tmp"
    # --no-build-isolation: the build must see this venv's torch to compile the ops against it
    DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 DS_BUILD_CPU_ADAM=1 .venv/bin/python -m pip wheel -q \
      --disable-pip-version-check --no-cache-dir --no-build-isolation --no-deps -w "$cache.tmp" "deepspeed==$DS_VERSION"
    rm -rf "$cache" && mv "$cache.tmp" "$cache"
    wheel=$(ls "$cache"/deepspeed-*.whl | head -n 1)
  else
    say "installing DeepSpeed from the cached wheel $wheel"
  fi
  "${PIP[@]}" --no-deps --force-reinstall "$wheel"
  ds_ready || { echo "setup: DeepSpeed installed without its CPU ops (see $cache)" >&2; exit 1; }
  say "DeepSpeed $DS_VERSION installed with its CPU ops"
}

case "$MODE" in
  run) say "installing the package"; "${PIP[@]}" -e . ;;
  test)
    say "installing the package with test extras"; "${PIP[@]}" -e ".[test]"
    install_deepspeed
    if [ -x cluster/testbed/install.sh ] || [ -f cluster/testbed/install.sh ]; then
      say "installing the SLURM testbed packages"; bash cluster/testbed/install.sh
    fi
    say "installing Chromium for the HTML report's browser test"; bash envs/browser.sh ;;
  *) echo "usage: bash envs/setup.sh [run|test]" >&2; exit 2 ;;
esac
# An older setup put a hook line in site-packages for the --configfile check; the check now ships in the package
# (a Snakemake logger plugin: workflow/pretrain_planner/configfiles.py), so the line goes
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -f "$site/pretrain_planner_snakemake.pth"
say "done: $(.venv/bin/python -c 'import torch, transformers, snakemake; print("torch", torch.__version__, "transformers", transformers.__version__, "snakemake", snakemake.__version__)')"
