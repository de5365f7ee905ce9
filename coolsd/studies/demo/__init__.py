"""The main job (``coolsd demo``): predicted vs measured trade-offs of relaxed speculative decoding on the
shipped MNIST models (never trains). Modules by concern: ``settings`` (what runs: ``Settings``, ``Spec``,
``specs``, the image geometry and trees), ``predict`` (T10/T11 per recorded round, the renewal recursion,
predicted speed-ups and sweeps; also used by ``coolsd sweep``), ``quality`` (FD, NLL, floors), ``generation``
(every run on the same digits, split over worker processes: ``coolsd.workers``), ``fidelity`` (the exact
TV and KL to the target), ``run`` (``run_demo``: measurement, report.json), ``report`` (report.md and the figures).

The names below are re-exported so that ``from coolsd.studies import demo`` gives the whole job."""
from .predict import (SWEEPS, chain_arrays, chain_prediction, expected_rounds, predict_chain, predicted_speedup,
                      round_positions, survival_by_row, sweep_predictions, time_verifier, tree_prediction,
                      tree_records, unit_costs)
from .quality import fd_with_se, manifest_floor, nll_with_se, per_image_nll, real_floor
from .generation import load_models
from .run import Result, run_demo
from .settings import ROWS, SMALL_TREE, T_IMAGE, Settings, Spec, specs

__all__ = ["ROWS", "SMALL_TREE", "SWEEPS", "T_IMAGE", "Result", "Settings", "Spec", "chain_arrays",
           "chain_prediction", "expected_rounds", "fd_with_se", "load_models", "manifest_floor", "nll_with_se",
           "per_image_nll",
           "predict_chain", "predicted_speedup", "real_floor", "round_positions", "run_demo", "specs",
           "survival_by_row", "sweep_predictions", "time_verifier", "tree_prediction", "tree_records", "unit_costs"]
