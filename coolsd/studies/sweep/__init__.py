"""``coolsd sweep``: quality/speed frontiers of relaxed speculative decoding over a grid of settings,
sharded over processes / GPUs with torch.distributed, stored so that a rerun resumes.

Modules: ``grid`` (settings from ``--grid`` items / TOML, checked against ``theory.rules.methods``), ``store``
(results directory, manifest, atomic unit files), ``run`` (units, seeds, ranks; the one engine call),
``metrics`` (uncertainties, precision/recall, paired frontier comparison), ``analysis`` (merge,
predictions from the vanilla rows via ``coolsd.studies.demo``, the paper's claims), ``fidelity`` (TV / KL to the
target from exact likelihoods of the stored images), ``report`` (report.md,
PNGs). ``sweep`` below runs the whole thing on one rank or under torchrun.
"""
from __future__ import annotations

import json
import time

from .grid import DEFAULT_GRID, Setting, ensure_vanilla, grid_from_toml, parse_grid
from .store import Store, json_safe as _json_safe

_LAZY = ("Dist", "SweepConfig", "plan_units", "run_units")      # torch-side names, imported on use


def __getattr__(name):
    if name in _LAZY:
        from . import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["sweep", "SweepConfig", "Setting", "DEFAULT_GRID", "parse_grid", "grid_from_toml", "ensure_vanilla",
           "Store", "plan_units"]


def sweep(cfg, out, *, max_units: int | None = None, progress: bool = False,
          after_unit=None) -> dict:
    """Run the sweep ``cfg`` into directory ``out`` (this process's share under torchrun) and, on rank 0
    once every unit is stored, merge and write report.json / report.md / PNGs. Returns a status dict:
    {"complete", "units", "done_here", "report" (rank 0, complete only)}."""
    import torch

    from theory.core import checks

    from .run import SweepConfig

    checks.instance("sweep: cfg", cfg, SweepConfig, "a SweepConfig (coolsd sweep's config())")

    from .run import Dist, plan_units, run_units, unit_expectation

    from . import quality
    from .run import Context

    threads = torch.get_num_threads()
    t0 = time.perf_counter()
    dist = Dist.from_env(cfg.device)
    try:
        ctx = None
        if quality.spec_of(cfg) is not None:    # quality inputs checked before the store is made or anything generated
            torch.set_num_threads(max(cfg.threads, 1))
            ctx = Context(cfg, dist)
            quality.setup(cfg, ctx)
        store = Store(out, cfg.identity())
        err = None
        if dist.rank == 0:
            try:
                store.open(create=True)
            except ValueError as e:
                err = str(e)
        err = dist.broadcast(err)
        if err is None:
            if dist.rank == 0:
                try:                   # stored units opened now: a damaged one is named before any work
                    store.check_units(plan_units(cfg), lambda u: unit_expectation(cfg, u))
                except ValueError as e:
                    err = str(e)
            err = dist.broadcast(err)
        if err is not None:
            raise ValueError(err)
        if dist.rank != 0:
            store.open(create=False)
        status = run_units(cfg, store, dist, max_units=max_units, progress=progress, after_unit=after_unit, ctx=ctx)
        dist.barrier()
        units = plan_units(cfg)
        missing = [u for u in units if not store.done(u.slug, u.index)]
        result = {"complete": not missing, "units": len(units), "missing": len(missing), **status,
                  "rank": dist.rank, "world_size": dist.world}
        if not missing and cfg.predict:
            from . import analysis, predict

            torch.set_num_threads(max(cfg.threads, 1))
            result["report"] = predict.merge(cfg, store, dist, ctx if ctx is not None else Context(cfg, dist),
                                             analysis.load, cfg.measured, t0)
        elif not missing:
            result["report"] = merge(cfg, store, dist, ctx)
        dist.barrier()
        return result
    finally:
        dist.close()
        torch.set_num_threads(threads)


def merge(cfg, store: Store, dist, ctx=None) -> dict | None:
    """Every rank: its share of the per-setting image quality (``quality.quality_shard``, cached under
    DIR/quality/, so an interrupted merge resumes); then rank 0 analyses every stored unit and writes
    report.json, report.md and the figures atomically (other ranks return None). ``ctx``: this rank's
    ``run.Context`` when already built."""
    import torch

    from . import analysis, fidelity, quality, report
    from .run import Context

    t0 = time.perf_counter()
    torch.set_num_threads(max(cfg.threads, 1))
    ctx = ctx if ctx is not None else Context(cfg, dist)
    quality.quality_shard(store, cfg, ctx, dist.rank, dist.world, analysis.load)
    fidelity.shard(store, cfg, ctx, dist.rank, dist.world, analysis.load)
    dist.barrier()
    if dist.rank != 0:
        return None
    rep = analysis.analyse(store, cfg, ctx)
    rep["config"] = {"model": cfg.model, "grid_items": list(cfg.grid_items), "grid": [s.key for s in cfg.settings],
                     "vanilla_added": cfg.vanilla_added, "images": cfg.images, "unit_images": cfg.unit_images,
                     "seed": cfg.seed, "L": ctx.L, "tree": cfg.tree, "dynamic": cfg.dynamic,
                     "tree_candidates": cfg.drafting.identity()["candidates"] if cfg.tree is not None else None,
                     "num_tokens": int(ctx.bundle.num_tokens),
                     "drafting": cfg.drafting_kind,
                     "draft": ctx.bundle.info.get("draft"), "batch_size": cfg.batch_size, "device": cfg.device,
                     "threads": cfg.threads, "world_size": dist.world, "record_images": cfg.record_images,
                     "temperature": cfg.temperature, "cfg_scale": ctx.proc.cfg_scale,
                     "quality": None if cfg.quality is None else cfg.quality.identity()}
    rep["manifest"] = store.manifest()
    rep["figures"] = report.figures(store.root, rep)
    rep["merge_seconds"] = time.perf_counter() - t0
    rep = _json_safe(rep)
    store.write_text("report.json", json.dumps(rep, indent=1, allow_nan=False) + "\n")
    store.write_text("report.md", report.markdown(rep))
    return rep
