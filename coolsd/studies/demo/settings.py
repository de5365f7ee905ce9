"""What ``coolsd demo`` runs: image geometry (``T_IMAGE`` tokens in rows of ``ROWS``), the static trees,
the ``Settings`` dataclass and the list of runs (``Spec``, ``specs``; each a method of ``real.decode.methods``)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from theory import rules
from theory.tree import EAGLE_25, Tree

T_IMAGE = 49
ROWS = 7

# a 10-node static tree of depth 4: three candidates after the root, two after the first, then a spine
SMALL_TREE = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (1, 0, 0), (0, 0, 0, 0))


@dataclass
class Settings:
    """What the demo runs. ``quick`` only shrinks the sample counts (tests)."""
    n_images: int = 500                # per method, balanced over the 10 classes (class = i mod 10)
    batch_size: int = 50               # digits generated together (real.decode.engine.generate); AR at the same size
    L: int = 4                         # chain draft length
    cfg_scale: float = 2.0
    temperature: float = 1.0
    seed: int = 0
    chain_draft: str = "eagle"         # "eagle" (EAGLE-1 drafter on the target's features) or "small"
    tree_draft: str = "eagle"
    extra_draft: str | None = None     # e.g. "small": one more vanilla chain run with this draft (reported apart)
    tree: str = "eagle25"              # "eagle25" (EAGLE-1's 25 nodes, depth 5) or "small" (SMALL_TREE)
    tree_candidates: str = "sampled"   # "sampled" (without replacement, the engine's default) or "topk" (the releases')
    tree_mc: bool = False              # score sampled-candidate tree runs by Monte Carlo (T14, docs/theory.md 11c):
    #                                    about 600 s more on 2 cores, so off by default (the demo's 5-minute budget)
    deltas: tuple = (3.0, 4.0, 8.0)    # Cool-SD relaxation budgets (w_1 = delta, nu = 0.7, rules.COOL_SD_NORM)
    nu: float = 0.7
    tree_deltas: tuple = (4.0, 8.0)    # Cool-SD runs with tree drafting (each also run with chains)
    tree_rules: tuple = ("lantern", "lantern++")  # also run with tree drafting (any of uniform-rsd, lantern,
    #                                               lantern++, lantern+G*; LANTERN++ is the paper's tree setting)
    uniform_c: float = 1.5
    lantern_k: int = 32                # neighbours (V/16 of the 512 codes, as LANTERN's 1000 of 16384)
    lantern_delta: float = 0.2
    lam: float = 2.0
    device: str = "cpu"
    threads: int = 1
    workers: int = 2                   # processes generating side by side (batch k on worker k mod workers; the
    #                                    exact fidelity pass beside the predictions when > 1): the same report
    quick: bool = False

    def tree_obj(self) -> Tree:
        return Tree(EAGLE_25 if self.tree == "eagle25" else SMALL_TREE)

    def tree_mode(self):
        """The tree runs' drafting mode: ``StaticTree(tree_obj(), tree_candidates)``."""
        from real.decode.modes import StaticTree

        return StaticTree(self.tree_obj(), self.tree_candidates)


@dataclass
class Spec:
    name: str                 # contract name
    params: dict
    drafting: str             # a mode's name (real.decode.modes): chain or tree
    verifier: object          # for the engine (LANTERN tables as torch tensors on the device)
    draft: str
    record: bool = False
    theory_verifier: object = None   # the same rule on numpy rows (predictions); None: ``verifier``
    extra: bool = False              # reported under "other_drafts", not in "methods"

    @property
    def tree_drafted(self) -> bool:
        """Whether the run drafts a static tree (its mode's declaration, ``ModeDef.static_tree``)."""
        return tree_drafted(self.drafting)

    @property
    def rule(self):
        return self.theory_verifier if self.theory_verifier is not None else self.verifier

    @property
    def key(self) -> str:
        p = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.name}({p}) {self.drafting} {self.draft}" + (" extra" if self.extra else "")


def specs(s: Settings, neighbors) -> list[Spec]:
    """The runs of the demo (besides plain AR), in order; the first chain and tree runs are vanilla and
    record rows for the predictions. ``neighbors`` (V, >= k+1) the codebook neighbour table."""
    if not isinstance(s, Settings):
        raise TypeError(f"specs: s must be coolsd.studies.demo.Settings, got {type(s).__name__}")
    from real.decode.methods import make_verifier

    nb = np.asarray(neighbors)
    nb_dev = torch.as_tensor(nb, device=s.device)     # no host-to-device copy of the table per round

    def spec(name: str, params: dict, drafting: str, draft: str, **kw) -> Spec:
        """The run of method ``name`` (theory.rules.methods) with ``params``; LANTERN rules get the table on the
        device for the engine and on the host for the predictions."""
        v = make_verifier(name, s.L, neighbors=nb_dev, **params)
        tv = make_verifier(name, s.L, neighbors=nb, **params) if isinstance(v.accept, rules.Lantern) else None
        return Spec(name, params, drafting, v, draft, theory_verifier=tv, **kw)

    def others(drafting: str, draft: str) -> dict:
        """The non-Cool-SD relaxed rules, by contract name."""
        return {
            "uniform-rsd": spec("uniform-rsd", {"c": s.uniform_c}, drafting, draft),
            "lantern": spec("lantern", {"k": s.lantern_k, "delta": s.lantern_delta}, drafting, draft),
            "lantern++": spec("lantern++", {"k": s.lantern_k, "lambda": s.lam}, drafting, draft),
            "lantern+G*": spec("lantern+G*", {"k": s.lantern_k, "delta": s.lantern_delta}, drafting, draft),
        }

    tree_others = others("tree", s.tree_draft)
    unknown = set(s.tree_rules) - set(tree_others)
    if unknown:
        raise ValueError(f"tree_rules: unknown rule(s) {sorted(unknown)}; choose among uniform-rsd, lantern, "
                         "lantern++, lantern+G* (vanilla and Cool-SD trees are always run)")
    out = [spec("vanilla", {}, "chain", s.chain_draft, record=True)]
    out += [spec("cool-sd", {"delta": d, "nu": s.nu}, "chain", s.chain_draft) for d in s.deltas]
    out += list(others("chain", s.chain_draft).values())
    out += [spec("vanilla", {}, "tree", s.tree_draft, record=True),
            *[spec("cool-sd", {"delta": d, "nu": s.nu}, "tree", s.tree_draft) for d in s.tree_deltas]]
    out += [tree_others[name] for name in s.tree_rules]
    if s.extra_draft:
        out.append(spec("vanilla", {}, "chain", s.extra_draft, record=True, extra=True))
    return out


def tree_drafted(drafting: str) -> bool:
    """Whether ``drafting`` (a mode's name or report label) drafts a static tree (``ModeDef.static_tree``)."""
    from real.decode.modes import lookup

    return lookup(drafting).static_tree


def chain_drafted(drafting: str) -> bool:
    """Whether ``drafting`` (a mode's name or report label) drafts chains from a draft model (``ModeDef.chain``)."""
    from real.decode.modes import lookup

    return lookup(drafting).chain
