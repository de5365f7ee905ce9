"""Drafter-free Jacobi windows (``real.decode.jacobi.Jacobi``: Speculative Jacobi Decoding and SCD): ``--mode
jacobi`` with ``--window``, ``--jacobi-init``, ``--coupling``; no draft model.

Record: the chain format, stamped ``draft: jacobi``. Likelihood: none (``JACOBI_REASON``)."""
from __future__ import annotations

from ..jacobi import DEFAULT_WINDOW, JACOBI_REASON, SCD_WINDOW, Jacobi
from .base import ModeDef, Option, window_facts

__all__ = ["JACOBI", "JACOBI_REASON", "window_facts"]


class JacobiDef(ModeDef):
    deprecated_by = "draft"                # the older --draft NAME
    name, label, describes = "jacobi", "jacobi", "Jacobi drafting"
    options = (
        Option("window", int, f"target rows per call W (jacobi: W - 1 Jacobi drafts; default {DEFAULT_WINDOW}, the SJD "
                              f"release's, or {SCD_WINDOW} with a --coupling, the SCD release's; W >= 2: W = 1 drafts nothing)", lo=2,
               image_bound=True),
        Option("jacobi_init", str, "initialisation of new window slots, as the SJD release's schemes (default random)",
               choices=("random", "repeat_horizon", "sample_horizon"), key="init"),
        Option("coupling", str, "couple consecutive iterations' drafts (SCD): scd-mc maximal coupling as released (not "
                                "lossless), scd-mc-p the same with the current rows as q (lossless), scd-gs Gumbel "
                                "coupling (default none: plain SJD)", choices=("none", "scd-mc", "scd-mc-p", "scd-gs")),
    )
    no_likelihood = JACOBI_REASON

    def build(self, opts, facts=None):
        return Jacobi(**opts, **self.from_facts(opts, facts or {}))

    def check(self, opts, num_tokens, processing) -> None:
        """Before the model is built its row width is not known (the model supplies it: ``model_facts``): the
        options are checked with a stand-in width, the real one at the build (issue 50: --jacobi-init repeat_horizon
        was refused on every model, naming a width of None)."""
        stand_in = {"width": 1} if opts.get("init", "random") != "random" else {}
        mode = self.build(opts, {}) if not stand_in else Jacobi(**opts, **stand_in)
        mode.check(None, None, num_tokens or 1 << 30, None, processing, 1)

    def from_facts(self, opts, facts):
        out = window_facts(opts, facts)
        if facts.get("plain_tail"):          # SJD / SCD on Lumina-mGPT: the last codes plainly (the model's schedule)
            out["plain_tail"] = int(facts["plain_tail"])
        return out


JACOBI = JacobiDef()
