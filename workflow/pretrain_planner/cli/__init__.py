"""`pretrain-planner` (also `python -m pretrain_planner`): price a setting, look up the best measured one,
see where a sweep stands. Reads config files and results only; imports no torch.

  pretrain-planner cost --gpu a100 --count 4 --days 17.57
  pretrain-planner best --model pythia-1b --gpu a100 --count 4 [--results results]
  pretrain-planner predict --model pythia-1b --gpu h100 --count 4
  pretrain-planner fit --gpu a100 --count 4 --days 14   (or --by 2027-03-01)
  pretrain-planner when --model pythia-1b --gpu a100 --count 8
  pretrain-planner status [--results results] [--watch [--every 2]]
  pretrain-planner train --plan results/optimal/tiny-gptneox/cpu/1x1 [--launcher local|slurm|debug] [--steps N]
  pretrain-planner evidence export [--out FILE] | import FILE...

One module per command (cost.py, best.py, predict.py, fit.py, when.py, status.py, train.py, evidence.py), each with
`query` (the answer, computed) apart from `render_text` / `render_json` (the answer, written) and `run` (the two,
for the parser); config.py: the config an answer is given with and the catalog; sources.py: the sweep's tables, the
what-if's predictor and the calendar's site the commands query; parser.py: the parser and `main`.
"""

from pretrain_planner.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
