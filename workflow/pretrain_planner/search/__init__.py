"""Adaptive search: measure only the cells of a setting that can still be its fastest method (rules.py says
how). Its pieces: `lattice` (methods, settings, observations), `calibration` (the memory side), `timemodel`
(the time side), `rules` (pruning and what to measure next), `replay` (the search without training), `rounds`
(its Snakemake checkpoints on disk). This package's API is what the workflow and the tables use."""

from pretrain_planner.search.lattice import (
    DEFAULT_MODEL_ERROR,
    DEFAULT_TOLERANCE,
    Observation,
    Setting,
    Shape,
    covers,
    settings,
    shape,
)
from pretrain_planner.search.replay import Replay, predicted_table, replay
from pretrain_planner.search.rounds import (
    latest_rounds,
    read_round,
    read_searches,
    round_results,
    write_round,
    write_search,
)
from pretrain_planner.search.rules import Decision, decide

__all__ = [
    "DEFAULT_MODEL_ERROR", "DEFAULT_TOLERANCE", "Decision", "Observation", "Replay", "Setting", "Shape", "covers",
    "decide", "latest_rounds", "predicted_table", "read_round", "read_searches", "replay", "round_results",
    "settings", "shape", "write_round", "write_search",
]  # fmt: skip
