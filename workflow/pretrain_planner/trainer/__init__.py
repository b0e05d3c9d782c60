"""The per-cell trainer (compute side): builds the model, applies the method, measures whole steps.

Pieces, torchtitan-style: `config` (one dataclass tree per run), `models` (building from config values
and synthetic batches of the real shapes), `parallel` (devices, process groups, the method), `fsdp` (FSDP2
sharding and offload), `zero` (DeepSpeed ZeRO 1/2/3 and offload), `step` (one optimizer step), `oom`
(out-of-memory agreement across ranks), `watch` (one rank's failure ends every rank), `evidence` (proof a
method is in effect), `kernels` (flash-attn, Liger, and which attention kernel actually ran), `heads` (the
fused linear + cross-entropy head, `flce`), `measure` (micro-batch search and honest timing), `run` (the
job's entry point).
"""
