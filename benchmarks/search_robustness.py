"""How the adaptive search's replay holds up on hardware other than the test lattices'.

tests/test_search.py replays the search on lattices from a simulator with one set of interconnect,
CPU-optimizer and PCIe speeds and one small-batch slowdown (tests.test_search.Hardware()); the search assumes
none of them (its time model ranges over wide grids, timemodel.py). Here the same lattices are simulated on
each of tests.test_search.OTHER_HARDWARE too; per lattice it prints the GPU-hours spent vs exhaustive and any
setting whose pick is more than 2% slower than the exhaustive optimum (tests assert there is none). Writes a
markdown table (default benchmarks/results/search_robustness.md). No training, no torch; seconds on 2 cores.

    .venv/bin/python benchmarks/search_robustness.py [--tolerance 0.02] [--model-error 0.03] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "workflow")]

import yaml  # noqa: E402
from pretrain_planner import search as search  # noqa: E402
from pretrain_planner.facade.pipeline import load  # noqa: E402
from pretrain_planner.tables import markdown  # noqa: E402
from snakemake.utils import update_config  # noqa: E402

import tests.test_search as lattices  # noqa: E402  (the simulator and the five lattices of the tests)

HARDWARE = [lattices.Hardware(), *lattices.OTHER_HARDWARE]  # the first row: the lattices of the tests


def _replay_all(settings) -> str:
    """GPU-hours spent / exhaustive over (setting, table) pairs; the worst pick vs the optimum; any over 2%."""
    spent = total = worst = 0.0
    wrong = []
    for st, table in settings:
        rep = search.replay(st, table)
        want, want_days = lattices.fastest(st, table)
        got, got_days = lattices.fastest(st, {m: table[m] for m in rep.ran})
        if (want is None) != (got is None):
            wrong.append(f"{st.folder}: {got} vs {want}")
        elif want is not None:
            worst = max(worst, got_days / want_days - 1)
            if got_days > want_days * 1.02:
                wrong.append(f"{st.folder}: {got} {100 * (got_days / want_days - 1):+.2f}% vs {want}")
        spent += rep.gpu_hours
        total += rep.gpu_hours_exhaustive
    return f"{spent / total:.3f} (worst {100 * worst:+.1f}%)" + (f" **wrong**: {'; '.join(wrong)}" if wrong else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tolerance", type=float, default=search.DEFAULT_TOLERANCE)
    ap.add_argument("--model-error", type=float, default=search.DEFAULT_MODEL_ERROR)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/search_robustness.md"))
    args = ap.parse_args()
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    update_config(config, yaml.safe_load((REPO / "config/paper.yaml").read_text()))
    config["search"] = {
        "strategy": "adaptive",
        "saturated_tokens": lattices.SAT * 2048,
        "tolerance": args.tolerance,
        "model_error": args.model_error,
    }
    paper = load(config, REPO, "config/paper.yaml")
    names = list(lattices.CASES)
    grid = [st for st in paper.settings.values() if st.memory.activation_est]  # the simulator needs activations
    rows = []
    for hw in HARDWARE:
        cells = []
        for name in names:
            model, gpu, counts, capacity, *_ = lattices.CASES[name]
            cells.append(_replay_all(lattices.lattice(paper, model, gpu, counts, capacity, hw)))
        cells.append(_replay_all((st, lattices.simulate(st, *lattices.model_and_peak(paper, st), hw)) for st in grid))
        bus, cpu, pcie, expo = hw.bus, hw.cpu_adam, hw.pcie, hw.small_batch_exponent
        rows.append([f"{bus / 1e9:g}", f"{cpu / 1e9:g}", f"{pcie / 1e9:g}", f"{expo:g}", *cells])
        print(" | ".join(rows[-1]), flush=True)
    names.append(f"study grid ({len(grid)} settings)")
    text = "\n".join(
        [
            "# Adaptive search: replay on other hardware than the test lattices'\n",
            f"{dt.date.today()}, tolerance {args.tolerance}, model error {args.model_error}; "
            f"`{' '.join(sys.argv)}`. GPU-hours spent / exhaustive per "
            "lattice (tests/test_search.py's simulator with the speeds below; first row = the lattices of the tests), "
            "and how much slower than the exhaustive optimum the worst pick is; **wrong** = more than 2% slower. "
            "The last column replays every setting of config/paper.yaml the simulator can model.\n",
            *markdown.plain(["bus GB/s", "CPU Adam GB/s", "PCIe GB/s", "small-batch exp.", *names], rows),
            "",
        ]
    )
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
