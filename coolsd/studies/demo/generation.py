"""The generation phase of ``coolsd demo``: plain AR and every run of ``specs`` on the same digits, split over
``Settings.workers`` processes.

Digit i has class i mod 10; batch k (digits kB .. kB + B - 1) has seed ``Settings.seed + k``. A worker generates
its batches round robin (batch k by plain AR and by every run before batch k + 1), so slow drifts of the machine's
speed hit every method alike. Batch k goes to worker k mod W: worker 0 is the calling process, the others are
spawned (``coolsd.workers``), each with ``Settings.threads`` torch threads. A batch's tokens, rounds
and recorded rows depend on its classes and seed alone (the engine's generator is seeded per batch), so the split
changes none of them, only the wall clock; each method's times are then taken with the other workers busy, plain
AR's alike, so the measured speed-ups compare like with like.
"""
from __future__ import annotations

import torch

from theory import rules

from .settings import T_IMAGE, Settings, Spec, specs
from coolsd.workers import Spawned

__all__ = ["load_models", "models_and_runs", "digit_classes", "batch_plan", "generate_batches",
           "generate_all"]

WARMUP_SEED = 10**6


def load_models(s: Settings):
    """The shipped target and the drafts ``s`` needs, on ``s.device``: (target, {draft kind: model})."""
    if not isinstance(s, Settings):
        raise TypeError(f"load_models: s must be coolsd.studies.demo.Settings, got {type(s).__name__}")
    from real.zoo import gpt

    dev = torch.device(s.device)
    target = gpt.load_target().to(dev)
    drafts = {}
    for kind in {s.chain_draft, s.tree_draft} | ({s.extra_draft} if s.extra_draft else set()):
        if kind == "small":
            drafts[kind] = gpt.load_draft().to(dev)
        elif kind == "eagle":
            drafts[kind] = gpt.load_eagle(target).to(dev)
        else:
            raise ValueError(f"unknown draft kind {kind!r}; choose small or eagle")
    return target, drafts


def models_and_runs(s: Settings):
    """(target, drafts, runs): ``load_models`` and the runs of ``specs`` with LANTERN's table of the raw codebook
    vectors (as released), k + 1 columns."""
    from real.zoo import vq

    target, drafts = load_models(s)
    neighbors = rules.lantern_neighbors(vq.raw_codebook().numpy(), s.lantern_k + 1)
    return target, drafts, specs(s, neighbors)


def digit_classes(s: Settings) -> list[int]:
    """The class of every digit: digit i has class i mod 10."""
    from real.zoo import gpt

    return [i % gpt.NUM_CLASSES for i in range(s.n_images)]


def batch_plan(s: Settings) -> list[tuple[list[int], int]]:
    """Per batch k: (its digits' classes, its seed ``s.seed + k``); B = min(batch_size, n_images)."""
    classes, B = digit_classes(s), min(s.batch_size, s.n_images)
    return [(classes[a:a + B], s.seed + k) for k, a in enumerate(range(0, s.n_images, B))]


def _generate(engine, target, draft, sp: Spec, classes: list, seed: int, proc, tree, L: int, B: int):
    """One batch of run ``sp`` (``tree``: the tree runs' ``StaticTree`` mode)."""
    return engine.generate(target, draft, classes, num_tokens=T_IMAGE, verifier=sp.verifier, processing=proc,
                           drafting=tree if sp.tree_drafted else L, seed=seed, batch_size=min(B, len(classes)),
                           record_rows=sp.record)


def generate_batches(s: Settings, ks: list[int], models=None, tick=None) -> dict[str, dict[int, list]]:
    """Batches ``ks`` of ``batch_plan(s)``, round robin, after one warm-up batch per (drafting, draft) (first calls
    allocate caches and build plans): {"ar" or a run's ``Spec.key``: {k: batch k's generations}}. ``models``:
    ``models_and_runs(s)`` when already loaded; ``tick(n)`` is told of every n digits done."""
    from real.decode import engine
    from real.decode.sampling import Processing

    target, drafts, runs = models if models is not None else models_and_runs(s)
    tick = tick or (lambda n: None)
    plan, B = batch_plan(s), min(s.batch_size, s.n_images)
    proc, mode = Processing(temperature=s.temperature, cfg_scale=s.cfg_scale), s.tree_mode()
    warm = plan[0][0]
    engine.generate(target, None, warm, num_tokens=T_IMAGE, processing=proc, seed=WARMUP_SEED, batch_size=B)
    for sp in {(sp.drafting, sp.draft): sp for sp in runs}.values():
        _generate(engine, target, drafts[sp.draft], sp, warm, WARMUP_SEED, proc, mode, s.L, B)
    out: dict[str, dict[int, list]] = {"ar": {}} | {sp.key: {} for sp in runs}
    for k in ks:
        cls, seed = plan[k]
        out["ar"][k] = engine.generate(target, None, cls, num_tokens=T_IMAGE, processing=proc, seed=seed, batch_size=B)
        tick(len(cls))
        for sp in runs:
            out[sp.key][k] = _generate(engine, target, drafts[sp.draft], sp, cls, seed, proc, mode, s.L, B)
            tick(len(cls))
    return out


def _worker(s: Settings, ks: list[int], tick) -> dict:
    """A spawned worker: ``generate_batches`` with ``s.threads`` torch threads."""
    torch.set_num_threads(s.threads)
    return generate_batches(s, ks, tick=tick)


def generate_all(s: Settings, models, progress: bool = True) -> dict[str, list]:
    """Every batch of ``batch_plan(s)`` over ``s.workers`` workers, each with ``s.threads`` torch threads (this
    process is worker 0 and uses ``models``, ``models_and_runs(s)``): {"ar" or run key: the generations of digits
    0 .. N-1 in order}."""
    from tqdm import tqdm

    n_batches = len(batch_plan(s))
    W = max(1, min(s.workers, n_batches))
    bar = tqdm(total=s.n_images * (len(models[2]) + 1), desc="coolsd demo", disable=not progress, unit="img")
    others = [Spawned(_worker, s, list(range(w, n_batches, W))) for w in range(1, W)]
    threads = torch.get_num_threads()
    torch.set_num_threads(s.threads)      # as in the workers: the thread count can move a row's last bits
    try:
        def tick(n: int):
            bar.update(n + sum(o.ticks() for o in others))

        parts = [generate_batches(s, list(range(0, n_batches, W)), models, tick)]
        parts += [o.result(on_tick=bar.update) for o in others]
    finally:
        torch.set_num_threads(threads)
        for o in others:
            o.close()
        bar.close()
    return {key: [g for k in range(n_batches) for part in parts if k in part[key] for g in part[key][k]]
            for key in parts[0]}
