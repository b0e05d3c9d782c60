#!/usr/bin/env bash
# The one GPU run (issue 28): benchmarks/gpu_all.py with the carried packages; four files into $OUT
# (summary.md, summary.json, reports.tgz, gpu_all.log), rewritten after every part. See benchmarks/README.md.
#
#   OUT=$OUT bash benchmarks/gpu_all.sh                   on the GPU machine (carry .whl/gpu-deps, made here by
#                                                         bash benchmarks/prepare_gpu_deps.sh), at most TOTAL_S=540 s
#   SMOKE=1 OUT=/tmp/x bash benchmarks/gpu_all.sh         the same parts on a CPU with tiny models (checks the script)
#   OUT=$OUT bash benchmarks/gpu_all.sh --parts p4_status,p4_probes --total-s 200     a second, shorter command
#
# Arguments go to gpu_all.py. The time plan is printed first; each part runs in its own processes with its own
# budget. Exit status: gpu_all.py's (0: no problems; 1: a part had problems; 2: no GPU; 3: the planner's
# packages are missing), 124 if the hard stop below had to end it.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/gpu_all-$(date -u +%Y%m%dT%H%M)}"
mkdir -p "$OUT"
SMOKE="${SMOKE:-0}"
# the project's venv when it has torch (with CUDA, unless SMOKE=1), else the image's python3
PY="${PYTHON:-$(command -v python3)}"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && .venv/bin/python -c \
  "import sys, torch; sys.exit(0 if '$SMOKE' == '1' or torch.cuda.is_available() else 1)" 2>/dev/null; then
  PY=.venv/bin/python
fi
# carried packages first (a matching pydantic / pydantic-core pair must win over any other copy); they are built
# for the GPU image's Python, so a smoke run on this machine's venv leaves them out
if [ -d .whl/gpu-deps ] && [ "$SMOKE" != 1 ]; then
  export PYTHONPATH="$PWD/.whl/gpu-deps${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export GPU_ALL_COMMAND="SMOKE=$SMOKE OUT=$OUT bash benchmarks/gpu_all.sh${*:+ $*} (python: $PY)"
if ! missing=$("$PY" - <<'EOF'
import importlib.util, sys
gone = [m for m in ("yaml", "jsonschema", "submitit", "torch", "transformers") if importlib.util.find_spec(m) is None]
print(" ".join(gone))
sys.exit(1 if gone else 0)
EOF
); then
  msg="gpu_all: $PY lacks $missing: carry them (bash benchmarks/prepare_gpu_deps.sh makes .whl/gpu-deps; carry: [\".whl/gpu-deps\"])"
  echo "$msg" | tee "$OUT/gpu_all.log" >&2
  exit 3
fi
SMOKE_ARG=()
[ "$SMOKE" = 1 ] && SMOKE_ARG=(--smoke)
# a hard stop a little after the script's own TOTAL_S (the device tool ends a command at 600 s)
HARD_S=$(( ${TOTAL_S:-540} * $([ "$SMOKE" = 1 ] && echo 3 || echo 1) + 40 ))
timeout --signal=TERM --kill-after=10 "$HARD_S" "$PY" benchmarks/gpu_all.py "${SMOKE_ARG[@]}" --out "$OUT" "$@"
