"""The GPU check of the trainer, split by job (benchmarks/gpu_check.py and benchmarks/gpu_all.py are the commands):

- plans.py     what runs: the cells (model x method, their caps and overrides), in the order of their value
- cells.py     one cell in this process, through the trainer's own entry point (trainer.run.run_rank)
- checks.py    what must hold for a cell if the trainer's path works
- honesty.py   the "$100K" benchmark's unsynchronised timer against our synchronised steps
- sustain.py   a sustained run of a measured cell's setting (the prediction's accuracy)
- worker.py    a process that runs a list of plans, one row per cell the moment it ends
- runner.py    the processes: each group of plans in its own, a time cap per cell and per part, restarts
- timeplan.py  the predicted seconds of each cell and part
- report.py    the Markdown reports (tables through pretrain_planner.tables.markdown: no polars)
- envinfo.py   the machine: date, GPU, driver, library versions

Nothing here imports torch at module level except cells / checks' callers in a worker: the parent process that
plans, caps and packs never does, so a CUDA fault can only end a worker.
"""
