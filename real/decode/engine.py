"""Plain autoregressive and speculative generation of a batch of images through ``real.protocol`` models.

``generate`` is the one loop: it splits the images into batches; per batch, round 0 (``real.decode.round.
prefill_round``: the target's prefill alone; or, for an independent draft's chain, a speculative round verified by
the prefill itself), then ``real.decode.round.speculative_round`` until every image has its T tokens. It does not
know which drafting mode it runs (``real.decode.modes``: ``Plain``, ``Chain``, ``StaticTree``, ``DynamicTree``,
``Jacobi``, or any ``real.protocol.Drafting``); every image follows the law of the batch-1 round whatever the batch
(ragged rounds are cut by the verification's depth cap), so greedy output is the same for every batch size.

Every uniform an image uses (draft sampling, acceptance, the final draw) comes from its own counter-based stream
(``real.decode.rng.Streams``), keyed by (seed, the image's index in the call, its round, the draw), so image k of a
call depends only on (seed, k): not on the batch size nor on the other images of its batch. Probabilities are float32
(or float64) whatever the model dtype. Greedy decoding = temperature 0 (one-hot rows, ``Processing.greedy``) with
``theory.rules.greedy()``; greedy trees draft each node's top-m tokens (as EAGLE does).

``speculative_generate`` and ``ar_generate`` generate one image (batch 1). What a run returns (``Generation``, its
``RoundRecord`` s) and the figures over it (``summarize``, ``records_to_arrays``) live in ``real.decode.records``.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from real.nn.devpath import force, host_path, host_verification
from real.nn.layers import inference_weights
from theory.tree import Tree
from .chain import Chain, Plain
from .memory import MAX_BATCH, default_batch_size, device_of, return_freed
from .records import Generation, RoundRecord, generations, records_to_arrays, summarize
from .rng import Streams
from .round import OnDevice, Run, prefill_round, speculative_round, sync
from .sampling import Processing
from .tree import StaticTree

__all__ = ["RoundRecord", "Generation", "generate", "speculative_generate", "ar_generate", "summarize",
           "records_to_arrays", "drop_rows", "default_batch_size", "MAX_BATCH", "as_drafting"]


def as_drafting(x):
    """``generate``'s ``drafting`` argument as a mode: None -> ``Plain()``, an int L -> ``Chain(L)``, a
    ``theory.tree.Tree`` -> ``StaticTree(tree)``, a mode (anything with ``propose``) -> itself; else TypeError."""
    if x is None:
        return Plain()
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return Chain(int(x))
    if isinstance(x, Tree):
        return StaticTree(x)
    if all(callable(getattr(x, m, None)) for m in ("propose", "advance", "start", "check")) and hasattr(x, "max_depth"):
        return x
    raise TypeError(f"drafting must be None (plain AR), an int L (chain), a theory.tree.Tree (static tree) or a "
                    f"real.protocol.Drafting mode, got {type(x).__name__}")


def generate(target, draft, conds, *, num_tokens: int, verifier=None, drafting=None,
             processing: Processing = Processing(), seed: int = 0, batch_size: int | None = None,
             generator: torch.Generator | None = None, record_rows: bool = False,
             progress: bool | None = False, device_path: bool | None = None, compile: str | None = None,
             compile_backend: str = "inductor", compile_static: bool | None = None,
             features: bool = False, on_batch=None) -> list[Generation]:
    """Generate ``num_tokens`` image tokens for each condition in ``conds`` (a list: one image each; or one
    condition), in batches of ``batch_size`` images (None: ``default_batch_size``). Returns one ``Generation`` per
    image, in order, its ``tokens`` (num_tokens,) int64.

    ``drafting``: the drafting mode (``real.decode.modes``; None: plain AR, ``verifier`` unused; an int L: ``Chain(L)``;
    a ``theory.tree.Tree``: ``StaticTree(tree)``). ``target``: an ``ARModel``; ``draft``: an ``ARModel`` (independent
    small model, prefilled with the same conditions) or a ``FeatureDrafter`` (EAGLE), or None for drafter-free modes.
    ``verifier``: a ``theory.rules.Verifier``; ``processing`` is applied identically to draft and target logits. A
    model without per-row cache lengths (``batched`` false: the transformers adapters) runs at batch size 1.

    Records: per image, one ``RoundRecord`` per round it took part in (chain: drafted L'; tree: nodes, depth, accepted
    nodes), the batch's wall times shared equally among its unfinished images, and with ``record_rows`` the processed
    rows along the round (``theory.likelihood.recorded`` predictions use them).

    Randomness: image k's draws depend only on (``seed``, k) (``real.decode.rng``); with ``generator`` (a
    ``torch.Generator``, for callers that loop over calls) this call's seed is one draw from it.

    ``device_path``: True runs the code CUDA tensors run (torch verification, device-side draws, the models' plain
    kernels) whatever the device, False the decision by device whatever ``COOLSD_DEVICE_PATH``; None: as the
    environment says (``real.nn.devpath``). Greedy tokens are the same either way.

    ``compile``: a ``torch.compile`` mode ("default", "reduce-overhead" for CUDA graphs, ...) to run the target's and
    the draft's decoder layers compiled for this call (``real.nn.blocks.compiled``; ``compile_backend`` "inductor", or
    e.g. "eager" for dynamo alone), refused before any work when the compiler is missing or a model has no compilable
    layers; None: eager. ``compile_static`` (default: on for "reduce-overhead"): static shapes, the KV caches read
    whole and graphs compiled per shape (``real.nn.blocks.compiled(static=...)``). Greedy tokens are the same either
    way (tests/test_compiled_paths.py).

    ``features`` (plain AR only): keep the target's last hidden states along each image, the ones its forwards compute
    anyway: ``Generation.features`` (rows, P + T - 1, D) float32 on the CPU at the positions [prefix; x_0 .. x_{T-2}]
    (rows: the image's row, or with CFG its [cond; null] pair): what an EAGLE drafter trains on
    (``real.drafter.features``), at no extra target forward.

    ``on_batch(first, gens)``: called after each batch with the index of its first image and its ``Generation`` s,
    before the next batch starts; a recording caller streams the batch's rows to disk there and drops them
    (``drop_rows``), so the rows of one batch at most are held (``coolsd.npzstream``)."""
    from real.nn.blocks import compiled
    from real.nn.devpath import forced

    forced()          # COOLSD_DEVICE_PATH's spelling checked now, before any work (a misspelling is refused)
    mode = as_drafting(drafting)
    with force(device_path), compiled((target, draft), compile, backend=compile_backend, device=device_of(target),
                                      static=compile_static):
        from tqdm import tqdm

        from .checks import generate_args

        # every argument checked in one place before any model call (issue 26); the conditions and models read once,
        # as the decoder takes them; the batch sized from the models as given (which of them runs one image at a time)
        conds, target, draft, verifier, bs = generate_args(
            target, draft, conds, num_tokens=num_tokens, verifier=verifier, mode=mode, seed=seed,
            batch_size=batch_size, processing=processing, features=features, record_rows=record_rows)
        T = int(num_tokens)
        dev = device_of(target)
        if generator is not None:        # callers that loop over calls: each call's seed is one draw from their generator
            seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
        bar = tqdm(total=len(conds) * T, disable=not progress if progress is not None else None, leave=False,
                   desc=f"{type(mode).__name__.lower()} decode")
        gens: list[Generation] = []
        # packed / fused weight copies for this call only (real.nn.layers.linear); inference mode: no autograd
        # bookkeeping on any of a round's ~1,000 small operations (4-6% of a batch-1 tree round on CPU)
        with inference_weights(), torch.inference_mode():
            for a in range(0, len(conds), bs):   # a loop over batches
                B = min(bs, len(conds) - a)
                run = Run(target, draft, processing, Streams(seed, np.arange(a, a + B), dev), T, np.zeros(B, np.int64),
                          torch.zeros((B, T + 2 + mode.max_depth), dtype=torch.long, device=dev), conds[a:a + B],
                          feat=features or (draft is not None and draft.needs_features),
                          host=host_verification(dev, verifier),
                          record=record_rows)
                if not host_path(dev):       # the device path keeps its own copy of n on the device
                    run.on_device = OnDevice(torch.zeros(B, dtype=torch.long, device=dev))
                sync(dev)
                t0 = time.perf_counter()
                drafts_first = mode.max_depth > 0 and T > 1 and mode.from_prefill(run)
                steps = [speculative_round(run, mode, verifier) if drafts_first else prefill_round(run, mode)]
                actives = [np.ones(B, bool)]
                bar.update(int(run.n.sum()))
                while run.active.any():
                    act, n0 = run.active, run.n.copy()
                    steps.append(speculative_round(run, mode, verifier))
                    actives.append(act)
                    bar.update(int((run.n - n0).sum()))
                run.side.check_unchecked()       # the device path: prefill rows no round came to check (T = 1)
                sync(dev)
                info = {"method": getattr(verifier, "name", "custom") if mode.max_depth else "ar", **processing.params(),
                        "batch_size": B, "batch_seconds": time.perf_counter() - t0, **mode.params()}
                batch = generations(run, steps, actives, info, record_rows, mode.trees)
                del run, steps                   # the batch's rows live in its records alone from here
                if on_batch is not None:
                    on_batch(a, batch)
                gens += batch
        bar.close()
        return gens


def drop_rows(gens: list[Generation]) -> None:
    """Release the recorded rows (p, q, drafts) of ``gens``' rounds, once written (``generate(on_batch=...)``); the
    rounds keep their counts, times and tree structure. The freed pages go back to the system
    (``real.decode.memory.return_freed``)."""
    for g in gens:
        for r in g.rounds:
            r.p = r.q = r.drafts = None
    return_freed()


def speculative_generate(target, draft, cond, *, num_tokens: int, verifier, drafting=None,
                         processing: Processing = Processing(), seed: int = 0, generator: torch.Generator | None = None,
                         record_rows: bool = False, progress: bool | None = False,
                         device_path: bool | None = None) -> Generation:
    """One image with speculative decoding (``generate`` at batch size 1; ``drafting``, ``device_path`` as there);
    the ``Generation`` holds tokens (num_tokens,) int64."""
    return generate(target, draft, [cond], num_tokens=num_tokens, verifier=verifier, drafting=drafting,
                    processing=processing, seed=seed, batch_size=1, generator=generator, record_rows=record_rows,
                    progress=progress, device_path=device_path)[0]


def ar_generate(model, cond, *, num_tokens: int, processing: Processing = Processing(), seed: int = 0,
                generator: torch.Generator | None = None, progress: bool | None = False) -> Generation:
    """One image by plain autoregressive sampling through the same protocol and processing (the baseline); the
    ``Generation`` holds tokens (num_tokens,) int64."""
    return generate(model, None, [cond], num_tokens=num_tokens, processing=processing, seed=seed, batch_size=1,
                    generator=generator, progress=progress)[0]
