"""Whether this host's CPU computes bf16 natively: the `cpu` stand-in's precision support. Imports no torch.

On a CPU without bf16 instructions, torch's bf16 autocast is emulated (converted to fp32 and back around every
kernel): a tiny GPT-NeoX step measured 6.8x slower than the same step in fp32 (0.463 s vs 0.068 s, one thread,
oneDNN capped at AVX2; 0.574 s vs 0.075 s on an AMD EPYC without AVX-512). A bf16 cell there measures the
emulation, not the model, so the `cpu` GPU type declares `bf16: host` and the catalog asks here: the grid then
marks bf16 cells on such a host invalid with the reason below, as it does for bf16 on a pre-Ampere GPU.

Native means the instructions that oneDNN (torch's CPU matmul and convolution back-end) uses for bf16: on x86
AVX512_BF16 or AMX-BF16 (`avx512_bf16`, `amx_bf16` in /proc/cpuinfo), on ARM FEAT_BF16 (`bf16` in the
Features line, `hw.optional.arm.FEAT_BF16` on macOS). A cap on oneDNN's instruction set (`ONEDNN_MAX_CPU_ISA`
or `DNNL_MAX_CPU_ISA` below AVX512_CORE_BF16) makes it emulate even where the CPU could do better, so the cap
counts too. `PRETRAIN_PLANNER_CPU_BF16=native|emulated` overrides the detection (for a host whose compute nodes
differ from the login node, and to rehearse one kind of CPU on the other).
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pretrain_planner.schema import ConfigError

OVERRIDE_ENV = "PRETRAIN_PLANNER_CPU_BF16"
ISA_ENVS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
X86_FLAGS = ("avx512_bf16", "amx_bf16")
# oneDNN's instruction-set caps that stop below its bf16 kernels (dnnl::cpu_isa); higher ones and ALL keep them
ISA_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI"}


@dataclass(frozen=True)
class Bf16Support:
    native: bool
    why: str  # how it was decided, for the grid's reason and the cell's record


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def _flags(cpuinfo: str) -> set[str]:
    """Every flag of the first processor (x86 `flags`, ARM `Features`)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return set(value.split())
    return set()


def _macos_bf16() -> bool | None:
    try:
        out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() == "1" if out.returncode == 0 else None


def detect(env: dict[str, str] | None = None, cpuinfo: str | None = None, machine: str | None = None) -> Bf16Support:
    """Decide from the override, oneDNN's cap and the CPU's flags (arguments: for tests; default this host)."""
    env = os.environ if env is None else env
    forced = env.get(OVERRIDE_ENV, "").strip().lower()
    if forced in ("native", "emulated"):
        return Bf16Support(forced == "native", f"{OVERRIDE_ENV}={forced}")
    if forced:
        raise ConfigError(f"{OVERRIDE_ENV}={forced!r}: allowed values are native, emulated (or unset: detect)")
    for var in ISA_ENVS:
        cap = env.get(var, "").strip().upper()
        if cap in ISA_WITHOUT_BF16:
            return Bf16Support(False, f"{var}={cap} caps oneDNN below its bf16 kernels (AVX512_CORE_BF16)")
    machine = (machine or platform.machine()).lower()
    if machine in ("arm64", "aarch64") and cpuinfo is None and platform.system() == "Darwin":
        mac = _macos_bf16()
        if mac is not None:
            return Bf16Support(mac, f"sysctl hw.optional.arm.FEAT_BF16 = {int(mac)}")
    flags = _flags(_cpuinfo() if cpuinfo is None else cpuinfo)
    if machine in ("arm64", "aarch64"):
        return Bf16Support("bf16" in flags, f"/proc/cpuinfo Features {'has' if 'bf16' in flags else 'lacks'} bf16")
    found = [f for f in X86_FLAGS if f in flags]
    if found:
        return Bf16Support(True, f"/proc/cpuinfo flags have {', '.join(found)}")
    return Bf16Support(False, f"/proc/cpuinfo flags have neither {' nor '.join(X86_FLAGS)}")


@functools.lru_cache(maxsize=1)
def host_bf16() -> Bf16Support:
    """This host's answer, decided once per process."""
    return detect()
