"""The per-cell trainer (compute side): builds the model, applies the method, measures whole steps.

Pieces, torchtitan-style: `config` (one dataclass tree per run), `models` (building from config values
and synthetic batches of the real shapes), `parallel` (devices, process groups, the method), `step` (one
optimizer step), `measure` (micro-batch search and honest timing), `run` (the job's entry point).
"""
