#!/usr/bin/env bash
# Prepare .whl/gpu-deps (git-ignored) for a GPU machine without a registry: the packages its image lacks, for its
# Python (default 3.12), unpacked so that PYTHONPATH=.whl/gpu-deps imports them (benchmarks/gpu_all.sh does):
#   - the planner's: jsonschema (+ jsonschema-specifications, referencing, rpds-py), submitit
#   - liger-kernel 0.8.5 (Liger's Triton kernels and fused linear + cross-entropy head; needs torch + triton)
#   - DeepSpeed's requirements the image lacks: hjson, and pydantic with the ONE pydantic-core it requires (read
#     from its metadata: a mismatched pair makes `import deepspeed` raise SystemError), annotated-types,
#     typing-inspection
#   - DeepSpeed itself from the wheel envs/setup.sh caches (${DS_WHEEL_CACHE:-~/.cache/pretrain-planner/wheels}/
#     deepspeed-<version>-torch<torch>-py<python>/), unpacked without its prebuilt ops (they are for this machine's
#     Python and CPU torch; ZeRO without offload needs none, `+off` JIT-builds cpu_adam there or is `unsupported`).
#     No cached wheel: a warning, and every ZeRO cell reports `unsupported` there.
# Not carried: flash-attn (no wheel for the image's Python 3.12 / torch 2.11+cu130: `fa2` reports unsupported);
# what the image already has (torch, triton, numpy, packaging, psutil, msgpack, ninja, py-cpuinfo, einops, tqdm,
# nvidia-ml-py, cloudpickle, typing-extensions, attrs, pyyaml: the device image's package list).
#
#   bash benchmarks/prepare_gpu_deps.sh           download (any python3 with pip: no venv needed), unpack, check
#   bash benchmarks/prepare_gpu_deps.sh --check   download nothing: what would be carried, what is there, its size,
#                                                 whether the pydantic pair matches and the carry fits
# The device tool carries at most 64 MiB with the working tree; exit status 1 if the carry would not fit, 2 if
# the pydantic pair does not match.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-prepare}"
PY="${PYTHON:-python3}"
PYVER="${GPU_PYTHON_VERSION:-3.12}"
TARGET="${GPU_DEPS_DIR:-.whl/gpu-deps}"
CARRY_LIMIT_MIB="${CARRY_LIMIT_MIB:-64}"
LIGER_VERSION=0.8.5
# the pydantic DeepSpeed runs with here (envs/setup.sh's venv), else this one
PYDANTIC_VERSION="${PYDANTIC_VERSION:-$({ [ -x .venv/bin/python ] && .venv/bin/python -c \
  'from importlib.metadata import version; print(version("pydantic"))' 2>/dev/null; } || echo 2.14.4)}"
PLANNER=(jsonschema jsonschema-specifications referencing rpds-py submitit)
DS_REQS=(hjson "pydantic==$PYDANTIC_VERSION" annotated-types typing-inspection)
CACHE="${DS_WHEEL_CACHE:-$HOME/.cache/pretrain-planner/wheels}"
say() { echo "[prepare_gpu_deps] $*"; }

ds_wheel() { ls "$CACHE"/deepspeed-*/deepspeed-*.whl 2>/dev/null | head -n 1 || true; }

# check: the pydantic pair in TARGET, the DeepSpeed wheel, the sizes of the carry and the working tree
check() {
  "$PY" - "$TARGET" "$CARRY_LIMIT_MIB" "$(ds_wheel)" "$PYDANTIC_VERSION" "$LIGER_VERSION" "${PLANNER[@]}" "${DS_REQS[@]}" <<'EOF'
import pathlib, re, subprocess, sys
target, limit, wheel, pyd_want, liger = pathlib.Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
wanted = [re.split("[=<>]", p)[0] for p in sys.argv[6:]] + ["liger-kernel", "pydantic-core", "deepspeed"]
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
have = {}
for d in target.glob("*.dist-info") if target.is_dir() else []:
    m = re.match(r"(.+)-([^-]+)\.dist-info$", d.name)
    if m:
        have[norm(m.group(1))] = m.group(2)
print(f"would carry {target} for Python of the GPU image:")
for name in wanted:
    print(f"  {name:28s} {have.get(norm(name), '-- not there yet')}")
status = 0
pyd, core = have.get("pydantic"), have.get("pydantic_core")
if pyd:
    meta = (target / f"pydantic-{pyd}.dist-info" / "METADATA").read_text()
    need = re.search(r"^Requires-Dist: pydantic-core==(\S+)", meta, re.M)
    need = need.group(1) if need else None
    ok = need is not None and core == need
    print(f"pydantic {pyd} requires pydantic-core {need}; carried: {core} -> {'a matching pair' if ok else 'MISMATCH'}")
    status = status or (0 if ok else 2)
    if pyd != pyd_want:
        print(f"note: pydantic {pyd} carried, {pyd_want} wanted (the version DeepSpeed runs with here)")
if have.get("liger_kernel") not in (None, liger):
    print(f"liger-kernel {have['liger_kernel']} carried, {liger} wanted")
print(f"DeepSpeed wheel: {wheel or 'none cached: ZeRO cells will be unsupported there (run bash envs/setup.sh test)'}")
size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file()) if target.is_dir() else 0
files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, text=True).stdout
tree = sum(pathlib.Path(p).stat().st_size for p in files.split("\0") if p and pathlib.Path(p).is_file())
total = (size + tree) / 2**20
print(f"carry {size / 2**20:.1f} MiB + working tree {tree / 2**20:.1f} MiB = {total:.1f} MiB of {limit:.0f} MiB")
if total > limit:
    print("TOO BIG for the device tool's carry")
    status = status or 1
sys.exit(status)
EOF
}

if [ "$MODE" = "--check" ]; then
  check
  exit $?
fi

PIP=("$PY" -m pip install -q --disable-pip-version-check --target "$TARGET" --no-deps --only-binary=:all:
  --python-version "$PYVER" --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux_2_28_x86_64 --upgrade)
mkdir -p "$TARGET"
say "the planner's packages: ${PLANNER[*]}"
"${PIP[@]}" "${PLANNER[@]}"
say "liger-kernel $LIGER_VERSION"
"${PIP[@]}" "liger-kernel==$LIGER_VERSION"
say "DeepSpeed's requirements: ${DS_REQS[*]}"
"${PIP[@]}" "${DS_REQS[@]}"
CORE=$("$PY" - "$TARGET" "$PYDANTIC_VERSION" <<'EOF'
import pathlib, re, sys
meta = (pathlib.Path(sys.argv[1]) / f"pydantic-{sys.argv[2]}.dist-info" / "METADATA").read_text()
print(re.search(r"^Requires-Dist: pydantic-core==(\S+)", meta, re.M).group(1))
EOF
)
say "pydantic-core $CORE (the one pydantic $PYDANTIC_VERSION requires)"
"${PIP[@]}" "pydantic-core==$CORE"
wheel=$(ds_wheel)
if [ -z "$wheel" ]; then
  say "WARNING: no cached DeepSpeed wheel in $CACHE: every ZeRO cell will report unsupported on the GPU machine" \
    "(bash envs/setup.sh test builds and caches one)" >&2
else
  "$PY" - "$wheel" "$TARGET" <<'EOF'
import sys, zipfile
wheel, target = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extractall(target, [n for n in z.namelist() if not n.endswith(".so")])  # the ops are for another Python
print(f"[prepare_gpu_deps] unpacked {wheel} into {target} (without its prebuilt ops)")
EOF
fi
find "$TARGET" -name __pycache__ -type d -prune -exec rm -rf {} +
check
