"""The train stage: run an exported plan (`results/optimal/{model}/{gpu}/{N}x{G}/plan.json`) for real, for every
family of the catalog, on the shared training loop (trainer/loop.py), and hold its sustained throughput against
the benchmark's prediction.

`run` (every rank: the plan's method through the trainer's pieces, the task's data from the task registry
(trainer/tasks.py), the loop's hooks, result.json and the throughput table), `record` (no torch: sustained
throughput and its comparison, throughput.{md,csv}), `jobs` / `job` (no torch: the launchers),
`__main__` (`torchrun -m pretrain_planner.train PLAN.json ...`).
"""
