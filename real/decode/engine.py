"""Plain autoregressive and speculative generation of a batch of images through ``real.protocol`` models.

``generate`` is the one loop: it splits the images into batches, runs round 0 (the target's prefill
alone, ``real.decode.steps.prefill_step``) and then one step function per round until every image has its T
tokens -- ``ar_step`` (plain AR), ``chain_step`` (chain drafts of length L, docs/theory.md section 1)
or ``tree_step`` (static draft tree, section 9) or ``jacobi_step`` (drafter-free Jacobi drafts, section 12,
``real.decode.jacobi``) -- and turns the steps into per-image records. The rules
of a round and the ragged-batch conventions are in ``real.decode.steps``; every image follows the law of the
batch-1 round whatever the batch (rows that drafted past their own L' are cut by ``n_drafted`` /
``max_depth`` in the shared verifiers), so greedy output is the same for every batch size.

Every uniform an image uses (draft sampling, acceptance, the final draw) comes from its own counter-based
stream (``real.decode.rng.Streams``), keyed by (seed, the image's index in the call, its round, the draw), so
image k of a call depends only on (seed, k): not on the batch size nor on the other images of its batch.
Probabilities are float32 (or float64) whatever the model dtype. Greedy decoding = temperature 0 (one-hot rows) with
``theory.rules.greedy()``; greedy static trees draft each node's top-m tokens (as EAGLE does).

``speculative_generate``, ``tree_generate`` and ``ar_generate`` generate one image (batch 1).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from theory.tree import Tree

from real.nn.layers import inference_weights
from real.protocol import as_batched, as_conds, check_pair
from .rng import Streams
from .sampling import Processing
from .steps import RoundRecord, Run, Step, ar_step, chain_step, host_verification, prefill_step, sync
from .tree_steps import tree_step
from .dynamic_tree import DynamicTree, check_dynamic, dynamic_tree_step
from .jacobi import Jacobi, check_jacobi, jacobi_step

__all__ = ["RoundRecord", "Generation", "generate", "speculative_generate", "tree_generate", "ar_generate",
           "summarize", "records_to_arrays", "default_batch_size", "MAX_BATCH"]

MAX_BATCH = 64          # default images per batch (``generate(batch_size=None)``), lowered to fit memory


@dataclass
class Generation:
    """One image's generation: ``tokens`` (T,) int64, one record per round, wall-clock ``seconds``, the target's
    and the draft's forward counts, and ``info``."""
    tokens: torch.Tensor                 # (T,) int64 image tokens
    rounds: list[RoundRecord]
    seconds: float
    target_forwards: int
    draft_forwards: int
    info: dict = field(default_factory=dict)

    def stats(self) -> dict:
        """``summarize([self])``: this generation's acceptance and speed figures."""
        return summarize([self])


def _device_of(model) -> torch.device:
    d = getattr(model, "device", None)
    return torch.device(d) if d is not None else torch.device("cpu")


def _available_bytes(device: torch.device) -> int:
    """Free memory on the device (CUDA: free GPU memory; CPU: available RAM)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):   # not Linux: assume the cap alone applies
        return 1 << 62


def _batch_bytes(target, draft, images: int, rows_per_image: int, V: int) -> int:
    """Estimated memory of a batch: both KV caches (``cache_bytes``: a feature drafter's sized by the target's
    ``prefix_len``) and the per-round probability rows (a few (rows, 64, V) float32 arrays). ``target`` and
    ``draft`` follow the batched protocol (``real.protocol.as_batched``)."""
    R = images * rows_per_image
    caches = int(target.cache_bytes(R))
    if draft is not None:
        caches += int(draft.cache_bytes(R, target.prefix_len) if draft.needs_features else draft.cache_bytes(R))
    return caches + 8 * R * 64 * V * 4



def default_batch_size(target, draft, n_images: int, processing: Processing = Processing()) -> int:
    """Images per batch when none is asked: all of them, at most ``MAX_BATCH``, and at most what half of
    the device's free memory holds (``_batch_bytes``)."""
    target, draft = as_batched(target), as_batched(draft)
    dev, V = _device_of(target), int(target.vocab_size)
    per = max(1, _batch_bytes(target, draft, 1, processing.batch, V))
    return int(max(1, min(n_images, MAX_BATCH, _available_bytes(dev) // 2 // per)))


def _check_batch(target, draft, n_images: int, batch_size, processing: Processing) -> int:
    if batch_size is None:
        bs = default_batch_size(target, draft, n_images, processing)
    else:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        bs = int(batch_size)
        if bs < 1:
            raise ValueError(f"batch_size must be >= 1, got {bs}")
        if bs > n_images:
            raise ValueError(f"batch_size {bs} is larger than the {n_images} images asked")
    for m in (target, draft):
        if m is not None and bs > 1 and not m.batched:
            raise ValueError(f"{type(m).__name__} generates one image at a time (its cache has no per-row lengths): "
                             f"use batch size 1, got {bs}")
    need = _batch_bytes(as_batched(target), as_batched(draft), bs, processing.batch, int(target.vocab_size))
    free = _available_bytes(_device_of(target))
    if need > free:
        raise ValueError(f"a batch of {bs} images needs about {need / 2**30:.2f} GiB (KV caches and rows), "
                         f"{free / 2**30:.2f} GiB is free: lower the batch size")
    return bs


def generate(target, draft, conds, *, num_tokens: int, verifier=None, L: int | None = None, tree: Tree | None = None,
             jacobi: Jacobi | None = None, processing: Processing = Processing(), seed: int = 0,
             batch_size: int | None = None,
             generator: torch.Generator | None = None, record_rows: bool = False,
             progress: bool | None = False) -> list[Generation]:
    """Generate ``num_tokens`` image tokens for each condition in ``conds`` (a list: one image each; or one
    condition), in batches of ``batch_size`` images (None: ``default_batch_size``). Returns one
    ``Generation`` per image, in order, its ``tokens`` (num_tokens,) int64.

    Modes: ``draft=None``: plain AR sampling (the baseline; ``verifier`` unused); ``tree`` (a
    ``theory.tree.Tree``): static-tree drafting; ``jacobi`` (a ``real.decode.jacobi.Jacobi``, ``draft=None``):
    drafter-free Speculative Jacobi Decoding over a window of W target rows; else chain drafting of ``L`` tokens
    per round.
    ``target``: an ``ARModel``; ``draft``: an ``ARModel`` (independent small model, prefilled with the same
    conditions) or a ``FeatureDrafter`` (EAGLE). ``verifier``: a ``theory.rules.Verifier``; ``processing``
    is applied identically to draft and target logits. A model without per-row cache lengths
    (``batched`` false: the transformers adapters) runs at batch size 1.

    Records: per image, one ``RoundRecord`` per round it took part in (chain: drafted L'; tree: nodes,
    depth, accepted nodes), the batch's wall times shared equally among its unfinished images, and with
    ``record_rows`` the processed rows along the round (``theory.likelihood.recorded`` predictions use them).

    Randomness: image k's draws depend only on (``seed``, k) (``real.decode.rng``); with ``generator`` (a
    ``torch.Generator``, for callers that loop over calls) this call's seed is one draw from it."""
    from tqdm import tqdm

    from .checks import generate_args

    generate_args(target, draft, conds, num_tokens=num_tokens, verifier=verifier, L=L, tree=tree, seed=seed,
                  batch_size=batch_size, jacobi=jacobi)      # types and ranges before any model call (issue 26)
    conds = as_conds(conds)
    T = int(num_tokens)
    if T < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if jacobi is not None:
        if draft is not None or tree is not None or L is not None:
            raise ValueError("jacobi drafting drafts from the target itself: give no draft model, L or tree")
        if verifier is None:
            raise ValueError("jacobi drafting needs a verifier (theory.rules)")
        check_jacobi(jacobi, T, verifier)
    if draft is not None:
        check_pair(target, draft)
        if tree is not None and L is not None:
            raise ValueError("give a chain length L or a tree, not both (the tree sets the depth)")
        if tree is None and L is None:
            raise ValueError("speculative decoding needs a draft length L (or a tree)")
        if verifier is None:
            raise ValueError("speculative decoding needs a verifier (theory.rules); plain AR: draft=None")
        if isinstance(tree, DynamicTree):
            check_dynamic(tree, target, draft, len(conds) if batch_size is None else int(batch_size))
        elif tree is not None:
            if not isinstance(tree, Tree):
                raise ValueError(f"tree must be a theory.tree.Tree or a DynamicTree, got {type(tree).__name__}")
            if tree.children.shape[1] > int(target.vocab_size):
                raise ValueError(f"the tree has a node with {tree.children.shape[1]} candidates but V = {target.vocab_size}")
        elif isinstance(L, bool) or not isinstance(L, (int, np.integer)) or L < 1:
            raise ValueError(f"L must be >= 1 (an int: drafts per round), got {L!r}")
    bs = _check_batch(target, draft, len(conds), batch_size, processing)
    target, draft = as_batched(target), as_batched(draft)
    dev = _device_of(target)
    if generator is not None:        # callers that loop over calls: each call's seed is one draw from their generator
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    bar = tqdm(total=len(conds) * T, disable=not progress if progress is not None else None,
               desc="jacobi decode" if jacobi is not None else "AR decode" if draft is None else
               "tree decode" if tree is not None else "spec decode", leave=False)
    gens: list[Generation] = []
    # packed / fused weight copies for this call only (real.nn.layers.linear); inference mode: no autograd
    # bookkeeping on any of a round's ~1,000 small operations (4-6% of a batch-1 tree round on CPU)
    with inference_weights(), torch.inference_mode():
        for a in range(0, len(conds), bs):   # a loop over batches
            rng = Streams(seed, np.arange(a, min(a + bs, len(conds))), dev)
            gens += _generate_batch(target, draft, conds[a:a + bs], T, verifier, L, tree, jacobi, processing, rng,
                                    record_rows, bar)
    bar.close()
    for g in gens:                       # outside inference mode: ordinary tensors the caller may write to
        g.tokens = g.tokens.clone()
    return gens


def _generate_batch(target, draft, conds, T, verifier, L, tree, jacobi, proc, rng, record, bar) -> list[Generation]:
    B = len(conds)
    dev = _device_of(target)
    slack = 2 + ((tree.max_depth if isinstance(tree, DynamicTree) else tree.depth) if tree is not None
                 else jacobi.window if jacobi is not None else (L or 0))
    run = Run(target, draft, proc, rng, dev, T, np.zeros(B, np.int64),
              torch.zeros((B, T + slack), dtype=torch.long, device=dev),
              feat=draft is not None and draft.needs_features, host=host_verification(dev, verifier))
    sync(dev)
    t_start = time.perf_counter()
    if draft is not None and tree is None and not run.feat:     # an independent draft drafts from round 0
        first = chain_step(run, L, verifier, record, conds)
    else:
        first = prefill_step(run, conds, record)
    steps, actives = [first.to_host() if record else first], [np.ones(B, bool)]
    bar.update(int(run.n.sum()))
    while run.active.any():
        act, n0 = run.active, run.n.copy()
        if jacobi is not None:
            st = jacobi_step(run, jacobi, verifier, record)
        elif draft is None:
            st = ar_step(run, record)
        elif isinstance(tree, DynamicTree):
            st = dynamic_tree_step(run, tree, verifier, record)
        elif tree is not None:
            st = tree_step(run, tree, verifier, record)
        else:
            st = chain_step(run, L, verifier, record)
        steps.append(st.to_host() if record else st)
        actives.append(act)
        bar.update(int((run.n - n0).sum()))
    sync(dev)
    seconds = time.perf_counter() - t_start
    tokens = run.out[:, :T].cpu()
    info = {"method": "ar" if draft is None and jacobi is None else getattr(verifier, "name", "custom"),
            **proc.params(), "batch_size": B, "batch_seconds": seconds}
    if jacobi is not None:
        info.update({"draft": "jacobi", "window": jacobi.window, "L": jacobi.slots, "init": jacobi.init,
                     "coupling": jacobi.coupling})
    if draft is not None:
        info.update(tree.params() if isinstance(tree, DynamicTree) else
                    {"tree_nodes": tree.n_nodes, "tree_depth": tree.depth} if tree is not None else {"L": L})
    recs = _records(steps, actives, tree is not None, record)
    return [Generation(tokens[b], recs[b], seconds / B, len(recs[b]),
                       sum(s.draft_forwards for s, a in zip(steps, actives) if a[b]), dict(info)) for b in range(B)]


def _records(steps: list[Step], actives: list[np.ndarray], tree_run: bool, record: bool) -> list[list[RoundRecord]]:
    """Per-image RoundRecords from the batch's steps, each kind of round making its own (``Step.record``); the
    batch's times are shared equally among the images that took part (a loop over rounds and images, once per
    batch)."""
    out: list[list[RoundRecord]] = [[] for _ in range(actives[0].shape[0])]
    for s, act in zip(steps, actives):
        share = 1.0 / max(1, int(act.sum()))
        for b in np.flatnonzero(act):
            out[b].append(s.record(int(b), share, record, tree_run))
    return out


def speculative_generate(target, draft, cond, *, num_tokens: int, verifier, L: int | None = None,
                         tree: Tree | None = None, processing: Processing = Processing(), seed: int = 0,
                         generator: torch.Generator | None = None, record_rows: bool = False,
                         progress: bool | None = False) -> Generation:
    """One image with speculative decoding: chain drafts of length L, or the static draft ``tree``
    (``generate`` at batch size 1); the ``Generation`` holds tokens (num_tokens,) int64."""
    return generate(target, draft, [cond], num_tokens=num_tokens, verifier=verifier, L=L, tree=tree,
                    processing=processing, seed=seed, batch_size=1, generator=generator, record_rows=record_rows,
                    progress=progress)[0]


def tree_generate(target, draft, cond, *, num_tokens: int, verifier, tree: Tree,
                  processing: Processing = Processing(), seed: int = 0, generator: torch.Generator | None = None,
                  record_rows: bool = False, progress: bool | None = False) -> Generation:
    """One image with static-tree speculative decoding (``generate`` at batch size 1); the ``Generation`` holds
    tokens (num_tokens,) int64."""
    if not isinstance(tree, Tree):
        raise ValueError(f"tree must be a theory.tree.Tree, got {type(tree).__name__}")
    return speculative_generate(target, draft, cond, num_tokens=num_tokens, verifier=verifier, tree=tree,
                                processing=processing, seed=seed, generator=generator, record_rows=record_rows,
                                progress=progress)


def ar_generate(model, cond, *, num_tokens: int, processing: Processing = Processing(), seed: int = 0,
                generator: torch.Generator | None = None, progress: bool | None = False) -> Generation:
    """One image by plain autoregressive sampling through the same protocol and processing (the baseline); the
    ``Generation`` holds tokens (num_tokens,) int64."""
    return generate(model, None, [cond], num_tokens=num_tokens, processing=processing, seed=seed, batch_size=1,
                    generator=generator, progress=progress)[0]


def summarize(gens: list[Generation]) -> dict:
    """Aggregate figures over generations: tokens per target call (= tokens per round, mean of tau + 1)
    with its standard error over rounds, accepted drafts tau, acceptance rate (accepted / drafted depth:
    the fraction of draft levels accepted; for chains the depth is L'), drafted tokens (tree nodes) per
    round, time split."""
    taus = np.array([r.accepted for g in gens for r in g.rounds], dtype=np.float64)
    drafted = np.array([r.drafted for g in gens for r in g.rounds], dtype=np.float64)
    depth = np.array([r.drafted if r.depth is None else r.depth for g in gens for r in g.rounds], dtype=np.float64)
    R = len(taus)
    tokens = int(sum(g.tokens.numel() for g in gens))
    secs = float(sum(g.seconds for g in gens))
    td = float(sum(r.t_draft for g in gens for r in g.rounds))
    tt = float(sum(r.t_target for g in gens for r in g.rounds))
    tv = float(sum(r.t_verify for g in gens for r in g.rounds))
    se = float(taus.std(ddof=1) / math.sqrt(R)) if R > 1 else float("nan")
    return {
        "tokens": tokens, "rounds": R, "images": len(gens),
        "target_forwards": int(sum(g.target_forwards for g in gens)),
        "draft_forwards": int(sum(g.draft_forwards for g in gens)),
        "tokens_per_target_call": tokens / R, "tokens_per_target_call_se": se,
        "accepted_mean": float(taus.mean()), "accepted_se": se,
        "drafted_mean": float(drafted.mean()), "depth_mean": float(depth.mean()),
        "acceptance_rate": float(taus.sum() / depth.sum()) if depth.sum() else float("nan"),
        "seconds": secs, "tokens_per_second": tokens / secs if secs > 0 else float("nan"),
        "time_draft_s": td, "time_target_s": tt, "time_verify_s": tv,
        "verify_share": tv / (td + tt + tv) if (td + tt + tv) > 0 else float("nan"),
    }


def records_to_arrays(records: list[RoundRecord], L: int):
    """Stack recorded rounds for ``theory.likelihood.recorded.predict_rounds``: p (R, L+1, V), q (R, L, V),
    drafts (R, L), n_drafted (R,). Rounds with L' < L are padded with uniform rows (f = 1, D = 0 there,
    and ``n_drafted`` masks them anyway) and token 0; L' = 0 rounds are dropped (nothing to predict)."""
    if any(r.depth is not None for r in records):
        raise ValueError("records_to_arrays stacks chain rounds; these are static-tree rounds (tree_generate)")
    recs = [r for r in records if r.drafted > 0]
    if not recs:
        raise ValueError("no drafted rounds recorded")
    if any(r.p is None for r in recs):
        raise ValueError("rounds were recorded without rows: run with record_rows=True")
    V = recs[0].p.shape[-1]
    R = len(recs)
    p = np.full((R, L + 1, V), 1.0 / V, dtype=np.float32)
    q = np.full((R, L, V), 1.0 / V, dtype=np.float32)
    d = np.zeros((R, L), dtype=np.int64)
    nd = np.array([r.drafted for r in recs], dtype=np.int64)
    for j, r in enumerate(recs):  # copying R recorded rounds into padded arrays, not a hot path
        k = r.drafted
        p[j, :k + 1], q[j, :k], d[j, :k] = r.p, r.q, r.drafts
    return p, q, d, nd
