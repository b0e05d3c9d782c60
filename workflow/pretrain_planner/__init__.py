"""pretrain-planner: measure how long pre-training takes on your GPUs, pick the fastest setting, run it.

Planning modules (catalog, methods, grid, launch, results, aggregate, report) never import torch, so a dry
run on a login node is instant; the trainer imports it lazily on the compute side.
"""

__version__ = "0.1.0"
