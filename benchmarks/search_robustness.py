"""How the adaptive search's replay holds up when the hardware differs from its time model's priors.

tests/test_search.py replays the search on lattices from a simulator whose interconnect, CPU-optimizer and
PCIe speeds and small-batch slowdown equal the search's priors (search.PRIOR_*). Here the same lattices are
simulated with other speeds; per lattice it prints the GPU-hours spent vs exhaustive and any setting whose
pick is more than 2% slower than the exhaustive optimum. Writes a markdown table (default
benchmarks/results/search_robustness.md). No training, no torch; about a minute on 2 cores.

    .venv/bin/python benchmarks/search_robustness.py [--margin 0.15] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import inspect
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "workflow")]

import yaml  # noqa: E402
from pretrain_planner import search  # noqa: E402
from pretrain_planner.pipeline import load  # noqa: E402
from snakemake.utils import update_config  # noqa: E402

import tests.test_search as lattices  # noqa: E402  (the simulator and the five lattices of the tests)

# (all-reduce bus B/s, CPU Adam B/s, PCIe B/s, small-batch exponent); the first row = the search's priors
HARDWARE = [
    (100e9, 5e9, 25e9, 0.5),
    (60e9, 3e9, 16e9, 0.5),
    (160e9, 8e9, 32e9, 0.5),
    (60e9, 8e9, 16e9, 0.6),
    (160e9, 3e9, 32e9, 0.4),
    (50e9, 2.5e9, 12e9, 0.5),
]


SIMULATE_SOURCE = inspect.getsource(lattices.simulate)  # read once: the loop swaps lattices.simulate


def simulator(bus: float, cpu: float, pcie: float, expo: float):
    """tests/test_search.simulate with other hardware constants."""
    src = SIMULATE_SOURCE
    for old, new in (("100e9", repr(bus)), ("/ 5e9", f"/ {cpu!r}"), ("25e9", repr(pcie)), ("** 0.5", f"** {expo}")):
        assert old in src, f"tests/test_search.simulate changed: {old!r} not found"
        src = src.replace(old, new)
    namespace = dict(lattices.__dict__)
    exec(src, namespace)  # noqa: S102 - our own test code, with numbers swapped
    return namespace["simulate"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--margin", type=float, default=search.DEFAULT_MARGIN)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/search_robustness.md"))
    args = ap.parse_args()
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    update_config(config, yaml.safe_load((REPO / "config/paper.yaml").read_text()))
    config["search"] = {"strategy": "adaptive", "saturated_tokens": lattices.SAT * 2048, "margin": args.margin}
    paper = load(config, REPO, "config/paper.yaml")
    names = list(lattices.CASES)
    rows = []
    for hw in HARDWARE:
        lattices.simulate = simulator(*hw)
        cells = []
        for name in names:
            model, gpu, counts, capacity, *_ = lattices.CASES[name]
            spent = total = 0.0
            wrong = []
            for st, table in lattices.lattice(paper, model, gpu, counts, capacity):
                rep = search.replay(st, table)
                want, want_days = lattices.fastest(st, table)
                got, got_days = lattices.fastest(st, {m: table[m] for m in rep.ran})
                if (want is None) != (got is None) or (want is not None and got_days > want_days * 1.02):
                    wrong.append(f"{st.folder}: {got} {100 * (got_days / want_days - 1):+.1f}% vs {want}")
                spent += rep.gpu_hours
                total += rep.gpu_hours_exhaustive
            cells.append(f"{spent / total:.3f}" + (f" **wrong**: {'; '.join(wrong)}" if wrong else ""))
        bus, cpu, pcie, expo = hw
        rows.append(f"| {bus / 1e9:g} | {cpu / 1e9:g} | {pcie / 1e9:g} | {expo:g} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    text = "\n".join(
        [
            "# Adaptive search: replay under other hardware than the time model's priors\n",
            f"{dt.date.today()}, margin {args.margin}; `{' '.join(sys.argv)}`. GPU-hours spent / exhaustive per "
            "lattice (tests/test_search.py's simulator with the speeds below; first row = the search's priors); "
            "**wrong** = the pick is more than 2% slower than the exhaustive optimum.\n",
            "| bus GB/s | CPU Adam GB/s | PCIe GB/s | small-batch exp. | " + " | ".join(names) + " |",
            "|---" * (4 + len(names)) + "|",
            *rows,
            "",
        ]
    )
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
