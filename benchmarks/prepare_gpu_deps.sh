#!/usr/bin/env bash
# Prepare .whl/gpu-deps (git-ignored) for a GPU machine without a registry: the planner's pure-Python
# dependencies the bare GPU image lacks (jsonschema, submitit) and DeepSpeed with its runtime
# requirements, for the image's Python (default 3.12). Run here, then carry `.whl/gpu-deps`.
#
# DeepSpeed: envs/setup.sh caches a built wheel in ${DS_WHEEL_CACHE:-~/.cache/pretrain-planner/wheels}/
# deepspeed-<version>-torch<torch>-py<python>/. Its Python code runs on any Python 3; its prebuilt CPU ops
# (cpu_adam, shm_comm) are for this venv's Python and CPU torch, so on the GPU image they do not load:
# ZeRO without offload needs none; `+off` cells JIT-build cpu_adam there or report `unsupported`.
# The wheel is unpacked (not pip-installed: its tag is this venv's Python).
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${GPU_PYTHON_VERSION:-3.12}"
TARGET=.whl/gpu-deps
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check --target "$TARGET" --no-deps
  --only-binary=:all: --python-version "$PYVER" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux_2_28_x86_64 --implementation cp --upgrade)
mkdir -p "$TARGET"
# the planner's imports (launch -> submitit, schema -> jsonschema)
"${PIP[@]}" jsonschema jsonschema-specifications referencing rpds-py submitit cloudpickle typing-extensions attrs
# DeepSpeed's requirements (`pip show deepspeed`: Requires), minus torch and numpy (the image has them)
"${PIP[@]}" hjson msgpack ninja py-cpuinfo psutil einops pydantic pydantic-core annotated-types \
  typing-inspection nvidia-ml-py packaging tqdm
wheel=$(ls "${DS_WHEEL_CACHE:-$HOME/.cache/pretrain-planner/wheels}"/deepspeed-*/deepspeed-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  echo "no cached DeepSpeed wheel: run 'bash envs/setup.sh test' first (it builds and caches one)" >&2
  exit 1
fi
.venv/bin/python - "$wheel" "$TARGET" <<'EOF'
import sys, zipfile
wheel, target = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extractall(target, [n for n in z.namelist() if not n.endswith(".so")])  # the ops are for another Python
print(f"unpacked {wheel} into {target} (without its prebuilt ops)")
EOF
du -sh "$TARGET"
