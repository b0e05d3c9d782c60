#!/usr/bin/env bash
# Every GPU check of the trainer in one command, at most TOTAL_S (570 s) on one H200, reports into $OUT
# (default benchmarks/results/gpu_all-<date>/). See benchmarks/README.md, "One command on a GPU".
#
#   1. gpu_check.py   every method on Pythia-160M and -410M (world size 1), the OOM back-off, timing honesty
#   2. accuracy.py    predicted vs 100 sustained steps, Pythia-160M / 410M / 1B, method fl (target +-3%)
#   3. trainer_vs_hf.py  our trainer vs transformers.Trainer, Pythia-410M
#
# Each part has its own time budget (it skips what is left, and still writes its report), and a failing
# part does not stop the next one. Extra Python packages (jsonschema, submitit, deepspeed, ...) carried as
# .whl/gpu-deps are put on PYTHONPATH when present. Exit status: the number of parts that failed.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/gpu_all-$(date -u +%Y%m%dT%H%M)}"
mkdir -p "$OUT"
# the project's venv when it has torch (with CUDA, unless SMOKE=1), else the image's python3
PY="${PYTHON:-$(command -v python3)}"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && .venv/bin/python -c \
  "import sys, torch; sys.exit(0 if '${SMOKE:-0}' == '1' or torch.cuda.is_available() else 1)" 2>/dev/null; then
  PY=.venv/bin/python
fi
# carried packages (benchmarks/prepare_gpu_deps.sh, built for the GPU image's Python) only where they are missing
if [ -d .whl/gpu-deps ] && ! "$PY" -c "import jsonschema, submitit, deepspeed" 2>/dev/null; then
  export PYTHONPATH=".whl/gpu-deps${PYTHONPATH:+:$PYTHONPATH}"
fi
: > "$OUT/gpu_all.log"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor-gpu-all}"  # shared by the parts
# Budgets in seconds. A part skips its remaining cells once its budget is used (a cell already started
# runs to its end); TOTAL_S is a hard stop for the whole command (the run tool allows 600 s a command):
# a part still running then is killed, and its report, rewritten after every cell, stays.
GPU_CHECK_S="${GPU_CHECK_S:-240}" ACCURACY_S="${ACCURACY_S:-150}" TOTAL_S="${TOTAL_S:-570}"
failed=0
part() {  # name, min seconds left to start it, command...
  local name=$1 need=$2; shift 2
  local left=$((TOTAL_S - SECONDS))
  if [ "$left" -lt "$need" ]; then
    echo "=== $name SKIPPED: ${left} s left of TOTAL_S=${TOTAL_S}" | tee -a "$OUT/gpu_all.log"; return
  fi
  echo "=== $name: $*" | tee -a "$OUT/gpu_all.log"
  local t0=$SECONDS rc=0
  timeout --signal=TERM --kill-after=10 "$left" "$@" 2>&1 | tee "$OUT/$name.log" || rc=$?
  [ "$rc" -ne 0 ] && { echo "=== $name FAILED (exit $rc; 124 = stopped at TOTAL_S)" | tee -a "$OUT/gpu_all.log"; failed=$((failed + 1)); }
  echo "=== $name took $((SECONDS - t0)) s" | tee -a "$OUT/gpu_all.log"
}
"$PY" - <<'EOF' 2>&1 | tee "$OUT/environment.txt"
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
for m in ("transformers", "deepspeed", "flash_attn", "liger_kernel", "jsonschema", "submitit", "yaml"):
    try:
        mod = importlib.import_module(m); print(m, getattr(mod, "__version__", "?"))
    except Exception as exc:
        print(m, "MISSING:", type(exc).__name__, exc)
EOF
if [ "${SMOKE:-0}" = 1 ]; then  # SMOKE=1: the same three parts on the CPU with tiny models (checks this script)
  SM=(--smoke) ACC=(--models tiny-gptneox --method naive --steps 4 --max-micro-batch 2)
else
  SM=() ACC=(--models pythia-160m,pythia-410m,pythia-1b --method fl --steps 100 --max-micro-batch 16)
fi
part gpu_check 60 "$PY" benchmarks/gpu_check.py "${SM[@]}" --out "$OUT/gpu_check.md" --budget-s "$GPU_CHECK_S" \
  --warmup-steps 1 --timed-steps 3 --accum-factor 2
part accuracy 90 "$PY" benchmarks/accuracy.py "${SM[@]}" "${ACC[@]}" --out "$OUT/accuracy.md" \
  --budget-s "$ACCURACY_S" --accum 2
part trainer_vs_hf 100 "$PY" benchmarks/trainer_vs_hf.py "${SM[@]}" --out "$OUT/trainer_vs_hf.md" \
  --model pythia-410m --micro-batch 16 --accum 2 --steps 8 --warmup 3
echo "=== done: $failed part(s) failed; reports in $OUT" | tee -a "$OUT/gpu_all.log"
exit "$failed"
