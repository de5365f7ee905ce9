"""theory.rules: the verifiers. Acceptance rules f_i (``acceptance``), resampling rules G_i (``resampling``),
weight schedules (``schedules``), LANTERN / LANTERN++ (``lantern``) and GSD (``gsd``) as released, the
``Verifier`` pairing and its constructors (``verifiers``), the method registry of the command line (``methods``:
imported on use), one chain round's verification (``chain``: ``verify_chain``, T0-T1, T5) and the per-position
discrepancy of a rule (``discrepancy``, T3/T6). Every rule is array-API code (numpy, JAX, torch).

May import: ``theory.core``.
"""
from .acceptance import (ROW_FEATURES, Acceptance, Greedy, Level, RELEASE_ENTROPY_EPS, Resampling, RowScaled, Scaled,
                         Typical, Vanilla, accept_at, reads_f, row_feature)
from .chain import ChainVerdict, verify_chain
from .discrepancy import discrepancy, optimal_discrepancy
from .gsd import GSD_D_THRESHOLD, GSD_P_THRESHOLD, GSD_WINDOW, Grouped, gsd_close
from .lantern import LANTERN_LAWS, Lantern, LanternResample, check_neighbors, lantern_neighbors
from .resampling import Argmax, Optimal, Residual, Target
from .schedules import (COOL_SD_NORM, COOL_SD_NORMS, Explicit, Exponential, Floored, Linear, Offset, Schedule, Uniform,
                        Vector, cool_sd_schedule)
from .verifiers import (GSD_RESAMPLERS, LANTERN_RESAMPLERS, TYPICAL_RESAMPLERS, Verifier, cool_sd, greedy, gsd, lantern,
                        lantern_pp, level, linear_rsd, row_scaled, scaled, typical, uniform_rsd, vanilla)

__all__ = [
    "Acceptance", "Resampling", "Schedule", "Verifier", "accept_at", "reads_f",
    "Vanilla", "Scaled", "RowScaled", "ROW_FEATURES", "row_feature", "row_scaled", "Lantern", "Typical", "Greedy", "Level",
    "RELEASE_ENTROPY_EPS",
    "Residual", "Optimal", "Target", "LanternResample", "Argmax",
    "Uniform", "Exponential", "Linear", "Explicit", "Offset", "Floored", "Vector",
    "COOL_SD_NORMS", "COOL_SD_NORM", "cool_sd_schedule", "level",
    "vanilla", "cool_sd", "uniform_rsd", "linear_rsd", "scaled", "lantern", "lantern_pp",
    "typical", "greedy", "lantern_neighbors", "check_neighbors", "LANTERN_RESAMPLERS", "TYPICAL_RESAMPLERS", "LANTERN_LAWS",
    "Grouped", "gsd", "gsd_close", "GSD_RESAMPLERS", "GSD_WINDOW", "GSD_P_THRESHOLD", "GSD_D_THRESHOLD",
    "ChainVerdict", "verify_chain", "discrepancy", "optimal_discrepancy",
]
