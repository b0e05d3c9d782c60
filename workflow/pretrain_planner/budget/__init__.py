"""The time-budgeted BERT recipe of Izsak et al. 2021 as a pipeline stage.

`config` (no torch: the Snakefile imports it at parse time; resolves the training setting from the benchmark
plan or the config, and the launcher), `jobs` (no torch: hands pre-training and
fine-tuning to the pipeline's launcher), `pretrain` (the data-parallel time-budgeted loop with
checkpoint/resume), `glue` (fine-tuning and the results table). Its data is the masked-LM task's
(trainer/data/mlm.py), its time-based schedules trainer/schedule.py's.
"""
