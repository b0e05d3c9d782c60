"""The time-budgeted BERT recipe of Izsak et al. 2021 as a pipeline stage.

`config` (no torch: the Snakefile imports it at parse time), `data` (tokenizer, samples, static masking,
shards), `schedule` (time-based learning rate, validation and checkpoint timing), `pretrain` (the
time-budgeted loop with checkpoint/resume), `glue` (fine-tuning and the results table).
"""
