"""Running a sweep: work units, their seeds, one process or several under torchrun (torch.distributed).

A *unit* is (setting, image block): ``unit_images`` consecutive images of one setting (plain AR is a
setting too: the baseline). Every unit's conditions and seed depend only on (base seed, setting key,
block index), never on the rank or the number of ranks, so the same command gives the same images in
one process or under ``torchrun --nproc-per-node K``. Units are listed block by block (every setting's
block 0, then block 1, ...), the ones already in the store are skipped, and the rest are dealt
round-robin to the ranks; each rank writes its own unit files (``store.Store``); after a barrier rank 0
merges (``analysis``, ``report``). Backends: gloo on CPU, nccl on CUDA (control messages always over a
gloo group). Multi-node runs use torchrun's rendezvous (``--nnodes``, ``--rdzv-endpoint``).
"""
from __future__ import annotations

import datetime
import hashlib
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from real.decode.engine import generate
from real.decode.sampling import Processing

from coolsd.options import DraftingSpec
from .grid import Setting
from .store import Store

__all__ = ["SweepConfig", "Unit", "unit_seed", "plan_units", "run_units", "Dist"]

AR = "ar"




@dataclass(frozen=True)
class SweepConfig:
    model: str
    settings: tuple            # (Setting, ...)
    images: int
    model_options: tuple = ()  # ((BuildOptions field, value), ...): checkpoints, prompts, dtype
    unit_images: int = 8
    seed: int = 0
    drafting: DraftingSpec = DraftingSpec()   # coolsd.options: chains of 4 by default
    draft: str | None = None   # draft kind (None: the model's default; a drafter-free mode's name: no draft model)
    batch_size: int | None = None
    record_images: int = 256   # vanilla images whose P/Q rows are kept for the predictions
    temperature: float = 1.0
    cfg_scale: float | None = None
    device: str = "cpu"
    threads: int = 1
    grid_items: tuple = ()     # as given (for the report)
    vanilla_added: bool = False
    quality: object = None     # coolsd.quality.QualitySpec (--quality ...) or None; not part of the identity:
                               # quality is computed at the merge from the stored codes
    predict: bool = False      # --predict: only the AR and recorded vanilla units, the frontier predicted (predict.py);
                               # not part of the identity: a predicted and a measured sweep share their units
    measured: str | None = None   # --predict --measured: a measured sweep's report.json to compare with

    def identity(self) -> dict:
        """What must match for stored units to be reused (not ``images``: more images add blocks)."""
        return {"model": self.model, "model_options": [list(kv) for kv in self.model_options],
                "grid": [s.key for s in self.settings], "seed": self.seed, "unit_images": self.unit_images,
                "drafting": self.drafting.identity(), "draft": self.draft, "batch_size": self.batch_size,
                "record_images": self.record_images, "temperature": self.temperature, "cfg_scale": self.cfg_scale}

    @property
    def drafting_kind(self) -> str:
        """The mode's report label (``ModeDef.label``: chain, tree, dynamic-tree, jacobi, ...)."""
        return self.drafting.mode.label

    @property
    def L(self) -> int:
        """The most drafted levels per round (the verifiers' L)."""
        return self.drafting.max_depth

    @property
    def tree(self) -> str | None:
        """The static tree (--tree text), or None."""
        return self.drafting.opts.get("tree") if self.drafting.mode.static_tree else None

    @property
    def dynamic(self) -> tuple | None:
        """The dynamic tree's (total, depth, topk, sampling), or None."""
        d = self.drafting.identity().get("dynamic")
        return None if d is None else tuple(d)

    @property
    def n_blocks(self) -> int:
        return -(-self.images // self.unit_images)


@dataclass(frozen=True)
class Unit:
    setting: Setting | None    # None: plain AR
    index: int                 # image block: images index * unit_images ... + unit_images - 1

    @property
    def key(self) -> str:
        return AR if self.setting is None else self.setting.key

    @property
    def slug(self) -> str:
        return AR if self.setting is None else self.setting.slug


def identity_digest(cfg: "SweepConfig") -> str:
    """A short SHA-256 of the store identity (``SweepConfig.identity``): every unit carries it."""
    import json

    return hashlib.sha256(json.dumps(cfg.identity(), sort_keys=True).encode()).hexdigest()[:16]


def unit_expectation(cfg: "SweepConfig", unit: "Unit") -> dict:
    """What a stored unit of ``unit`` must carry (``Store.check_units`` compares it before any new unit is made): its
    setting, block, seed, the base seed, the image range [lo, hi) and the identity digest of this sweep."""
    from real.specs import spec

    lo = unit.index * cfg.unit_images
    T = dict(cfg.model_options).get("num_tokens") or spec(cfg.model).tokens      # the model's image tokens, if known
    return {"key": unit.key, "index": unit.index, "seed": unit_seed(cfg.seed, unit.key, unit.index),
            "base_seed": cfg.seed, "images": [lo, lo + cfg.unit_images], "identity": identity_digest(cfg),
            "tokens": None if T is None else int(T)}


def unit_seed(base: int, key: str, index: int) -> int:
    """Seed of a unit from (base seed, setting key, block index) only (63 bits of a SHA-256)."""
    h = hashlib.sha256(f"{base}|{key}|{index}".encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


def plan_units(cfg: SweepConfig) -> list[Unit]:
    """Every unit, block by block (AR first in each block) so partial runs cover all settings evenly; a predicted
    sweep (``--predict``) only every plain-AR block and the vanilla blocks that record rows."""
    from theory.core import checks

    checks.instance("plan_units: cfg", cfg, SweepConfig, "a SweepConfig")
    units = [Unit(s, j) for j in range(cfg.n_blocks) for s in (None, *cfg.settings)]
    if cfg.predict:
        rec_blocks = -(-cfg.record_images // cfg.unit_images)
        units = [u for u in units if u.setting is None or (u.setting.method == "vanilla" and u.index < rec_blocks)]
    return units


@dataclass
class Dist:
    """torch.distributed state: rank, world size, and the gloo group for control messages."""
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    group: object = None
    _init: bool = field(default=False, repr=False)

    @classmethod
    def from_env(cls, device: str) -> "Dist":
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = str(device).startswith("cuda")
        if cuda:
            torch.cuda.set_device(local)
        # long timeout: a barrier waits for the slowest rank's units
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(hours=24))
        group = dist.new_group(backend="gloo") if cuda else None
        return cls(dist.get_rank(), dist.get_world_size(), local, group, True)

    def barrier(self) -> None:
        if self._init:
            import torch.distributed as dist

            dist.barrier(group=self.group)

    def broadcast(self, obj):
        """rank 0's ``obj`` on every rank."""
        if not self._init:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def close(self) -> None:
        if self._init:
            import torch.distributed as dist

            dist.destroy_process_group()
            self._init = False


class Context:
    """The models and everything a unit needs, loaded once per rank."""

    def __init__(self, cfg: SweepConfig, dist: Dist):
        from real.specs import model_facts
        from real.protocol import NO_DRAFT
        from real.registry import BuildOptions, build

        self.cfg = cfg
        self.rank = dist.rank
        dev = cfg.device
        if str(dev).startswith("cuda") and dist.world > 1:
            dev = f"cuda:{dist.local_rank}"
        self.device = dev
        n_cond = cfg.images
        mdef = cfg.drafting.mode                  # the mode's declaration: its capabilities
        draft = cfg.draft if mdef.needs_draft else NO_DRAFT         # a drafter-free mode: no draft model
        b = build(cfg.model, BuildOptions(device=dev, draft=draft, seed=cfg.seed, num_images=n_cond),
                  **dict(cfg.model_options))
        self.bundle = b
        self.mode = cfg.drafting.build(model_facts(b, cfg.model))
        self.L = self.mode.max_depth
        self.tree = self.mode.tree if mdef.static_tree else None
        self.dynamic = self.mode if mdef.grown_tree else None
        self.jacobi = None if mdef.needs_draft else self.mode
        self.proc = Processing(temperature=cfg.temperature, top_k=b.top_k,
                               cfg_scale=b.cfg_scale if cfg.cfg_scale is None else cfg.cfg_scale)
        ncls = getattr(getattr(b.target, "config", None), "num_classes", None)
        # class-conditional models: class i mod C (balanced); others: the bundle's conditions in turn
        self.classes = ncls if (ncls and all(isinstance(c, int) for c in b.conds)) else None
        self._verifiers: dict = {}
        from .store import code_version

        self.code_version = code_version()

    def conds(self, index: int) -> list:
        i0 = index * self.cfg.unit_images
        idx = range(i0, i0 + self.cfg.unit_images)
        if self.classes:
            return [i % self.classes for i in idx]
        return [self.bundle.conds[i % len(self.bundle.conds)] for i in idx]

    def verifier(self, s: Setting):
        from real.decode.embeddings import gsd_vectors
        from real.decode.methods import make_verifier

        if s.key not in self._verifiers:
            self._verifiers[s.key] = make_verifier(s.method, self.L, neighbors=self.bundle.neighbors,
                                                   device=getattr(self.bundle.target, "device", None),
                                                   embeddings=gsd_vectors(self.bundle)[0],   # as released
                                                   **s.params_dict)
        return self._verifiers[s.key]


def host_tables(ctx: Context):
    """The bundle's LANTERN neighbour table (V, K) and GSD codebook vectors (V, d) as host numpy arrays (None where
    the model has none): the float64 theory code (predictions, exact likelihoods) reads them on the host."""
    import torch

    nb = None if ctx.bundle.neighbors is None else np.asarray(ctx.bundle.neighbors)
    cb = getattr(ctx.bundle, "codebook", None)
    return nb, None if cb is None else torch.as_tensor(cb).detach().cpu().double().numpy()


def run_unit(ctx: Context, unit: Unit) -> tuple[dict, dict]:
    """Generate one unit; returns (arrays, meta) for the store."""
    from real.decode.methods import method_processing
    from coolsd.studies.demo.predict import chain_arrays, tree_records

    cfg, b = ctx.cfg, ctx.bundle
    conds = ctx.conds(unit.index)
    seed = unit_seed(cfg.seed, unit.key, unit.index)
    record = (unit.setting is not None and unit.setting.method == "vanilla"
              and unit.index * cfg.unit_images < cfg.record_images
              and ctx.dynamic is None)   # dynamic trees: per-round trees are not stored (no sweep predictions yet)
    dev = torch.device(ctx.device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    started = time.time()
    t0 = time.perf_counter()
    if unit.setting is None:
        gens = generate(b.target, None, conds, num_tokens=b.num_tokens, processing=ctx.proc, seed=seed,
                        batch_size=cfg.batch_size)
    else:
        gens = generate(b.target, b.draft if ctx.mode.needs_draft else None, conds, num_tokens=b.num_tokens,
                        verifier=ctx.verifier(unit.setting), drafting=ctx.mode,
                        processing=method_processing(unit.setting.method, ctx.proc),
                        seed=seed, batch_size=cfg.batch_size, record_rows=record)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    wall = time.perf_counter() - t0
    rounds = [(i, r) for i, g in enumerate(gens) for r in g.rounds]
    arrays = {
        "tokens": np.stack([g.tokens.cpu().numpy() for g in gens]).astype(np.int64),
        "image_index": np.arange(len(gens)) + unit.index * cfg.unit_images,
        "image_seconds": np.array([g.seconds for g in gens], np.float64),
        "image_rounds": np.array([len(g.rounds) for g in gens], np.int64),
        "image_target_forwards": np.array([g.target_forwards for g in gens], np.int64),
        "image_draft_forwards": np.array([g.draft_forwards for g in gens], np.int64),
        "round_image": np.array([i for i, _ in rounds], np.int64),
        "round_drafted": np.array([r.drafted for _, r in rounds], np.int64),
        "round_accepted": np.array([r.accepted for _, r in rounds], np.int64),
        "round_depth": np.array([-1 if r.depth is None else r.depth for _, r in rounds], np.int64),
        "round_t_draft": np.array([r.t_draft for _, r in rounds], np.float64),
        "round_t_target": np.array([r.t_target for _, r in rounds], np.float64),
        "round_t_verify": np.array([r.t_verify for _, r in rounds], np.float64),
    }
    if all(isinstance(c, int) for c in conds):
        arrays["classes"] = np.array(conds, np.int64)
    if record and ctx.tree is None and any(r.drafted > 0 for _, r in rounds):
        p, q, d, nd, start = chain_arrays(gens, ctx.L)
        arrays |= {"rec_p": p.astype(np.float32), "rec_q": q.astype(np.float32), "rec_drafts": d,
                   "rec_n_drafted": nd, "rec_start": start}
    elif record and ctx.tree is not None:
        for dep, (p, q, toks, start) in tree_records(gens).items():
            arrays |= {f"rect{dep}_p": p.astype(np.float32), f"rect{dep}_q": q.astype(np.float32),
                       f"rect{dep}_tokens": toks, f"rect{dep}_start": start}
    meta = {**unit_expectation(cfg, unit), "wall_seconds": wall, "started": started,
            "finished": time.time(), "rank": ctx.rank,
            "batch_size": cfg.batch_size, "device": str(ctx.device), "code_version": ctx.code_version}
    return arrays, meta


def run_units(cfg: SweepConfig, store: Store, dist: Dist, *, max_units: int | None = None,
              progress: bool = False, after_unit=None, ctx: Context | None = None) -> dict:
    """Run this rank's share of the units not yet in ``store``. ``max_units`` stops after that many units
    of this rank (a run in chunks); ``after_unit(unit)`` is called after each unit is written (tests); ``ctx``
    this rank's Context when already built.
    Returns {"done_here", "remaining_before", "stopped_early"}."""
    units = plan_units(cfg)
    remaining = [u for u in units if not store.done(u.slug, u.index)]
    dist.barrier()                              # every rank listed the store before anyone writes to it
    mine = remaining[dist.rank::dist.world]
    stopped = max_units is not None and len(mine) > max_units
    if max_units is not None:
        mine = mine[:max_units]
    done = 0
    if mine:
        torch.set_num_threads(cfg.threads)
        ctx = ctx if ctx is not None else Context(cfg, dist)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(mine), desc=f"sweep rank {dist.rank}", unit="unit")
        for u in mine:
            arrays, meta = run_unit(ctx, u)
            try:
                store.write_unit(u.slug, u.index, arrays, meta)
            except OSError as e:   # disk full, read-only: the stored units stay valid, the rerun resumes
                raise ValueError(f"cannot write {store.unit_path(u.slug, u.index)}: {e.strerror or e}; the units "
                                 "already stored are kept: free space / fix permissions and rerun") from None
            done += 1
            if bar is not None:
                bar.update(1)
            if after_unit is not None:
                after_unit(u)
        if bar is not None:
            bar.close()
    return {"done_here": done, "remaining_before": len(remaining), "stopped_early": stopped}
