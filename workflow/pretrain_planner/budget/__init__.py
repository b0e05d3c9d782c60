"""The time-budgeted BERT recipe of Izsak et al. 2021 as a pipeline stage.

`config` (no torch: the Snakefile imports it at parse time; resolves the training setting from the benchmark
plan or the config, and the launcher), `data` (tokenizer, samples, static masking, shards), `schedule`
(time-based learning rate, validation and checkpoint timing), `jobs` (no torch: hands pre-training and
fine-tuning to the pipeline's launcher), `pretrain` (the data-parallel time-budgeted loop with
checkpoint/resume), `glue` (fine-tuning and the results table).
"""
