"""The train stage: run an exported plan (`results/optimal/{model}/{gpu}/{N}x{G}/plan.json`) for real, for every
family of the catalog, on the shared training loop (trainer/loop.py), and hold its sustained throughput against
the benchmark's prediction.

`run` (every rank: the plan's method through the trainer's pieces, the data, the loop's hooks, result.json and the
throughput table), `data` (a generated corpus or local text, a tokenizer from a file or trained locally, packing to
the recipe's sequence length; MLM through budget/data.py; a local image folder or synthetic images), `record` (no
torch: sustained throughput and its comparison, throughput.{md,csv}), `jobs` / `job` (no torch: the launchers),
`__main__` (`torchrun -m pretrain_planner.train PLAN.json ...`).
"""
