#!/usr/bin/env bash
# Set up pretrain-planner in ./.venv (idempotent).
#   bash envs/setup.sh          runtime: the package, torch, transformers, snakemake, submitit, polars
#   bash envs/setup.sh test     + test tools, and the Debian packages of the single-host SLURM testbed
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
case "$MODE" in
  run) say "installing the package"; "${PIP[@]}" -e . ;;
  test)
    say "installing the package with test extras"; "${PIP[@]}" -e ".[test]"
    if [ -x cluster/testbed/install.sh ] || [ -f cluster/testbed/install.sh ]; then
      say "installing the SLURM testbed packages"; bash cluster/testbed/install.sh
    fi ;;
  *) echo "usage: bash envs/setup.sh [run|test]" >&2; exit 2 ;;
esac
say "done: $(.venv/bin/python -c 'import torch, transformers, snakemake; print("torch", torch.__version__, "transformers", transformers.__version__, "snakemake", snakemake.__version__)')"
