"""Plain AR and chains (``real.decode.chain``): ``plain`` (no drafting, one target forward per token: ``--method
ar``) and ``chain`` (``--mode chain``, the default: L drafts per round from the draft model, ``--L``).

Record: the chain format (``coolsd-record/1``: p, q, drafts, n_drafted, image, accepted, start, stamp), read back by
``theory.likelihood.recorded.load_rows``. Likelihood: exact (``real.decode.score``: teacher-forced rows, T8)."""
from __future__ import annotations

from ..chain import DEFAULT_L, Chain, Plain
from .base import ModeDef, Option

__all__ = ["PLAIN", "CHAIN"]


class PlainDef(ModeDef):
    """No drafting (``--method ar``; not a ``--mode`` choice: AR is a method without a verifier)."""
    name, label, cli = "plain", "ar", False
    no_likelihood = None

    def build(self, opts, facts=None):
        return Plain()

    def likelihood(self, mode, verifier, V, processing):
        return None                          # scored as the target itself (no draft)


class ChainDef(ModeDef):
    """Chains of ``L`` drafts per round (the default mode)."""
    name, label, describes, needs_draft, chain = "chain", "chain", "chain drafting", True, True
    options = (Option("L", int, f"chain drafts per round (default {DEFAULT_L})", lo=1, image_bound=True),)
    no_likelihood = None

    def build(self, opts, facts=None):
        return Chain(int(opts.get("L", DEFAULT_L)))

    def max_depth(self, opts):
        return int(opts.get("L", DEFAULT_L))

    def identity(self, opts):
        return {**super().identity({}), "L": int(opts.get("L", DEFAULT_L))}

    def report(self, mode, opts):
        return {}

    def record(self, gens, mode, stamp, chain_arrays):
        return chain_arrays(gens, int(mode.max_depth), stamp)

    def likelihood(self, mode, verifier, V, processing):
        return mode                          # real.decode.score: chains of mode.L


PLAIN, CHAIN = PlainDef(), ChainDef()
