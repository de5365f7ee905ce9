"""Predictions of ``coolsd demo`` from the recorded vanilla rows alone (docs/theory.md section 8): per
round, T10 (accepted drafts) and T11 (TV-bound term) of each rule (``theory.likelihood.recorded.predict_rounds``;
trees: ``predict_tree_rounds``); tokens per target call and the draft work per image from a renewal
recursion over the token positions (``expected_rounds``: short end-of-image rounds draft
L' = min(L, T - n - 1) tokens, the first round of EAGLE / tree runs is the prefill alone, acceptance is
estimated per image row; unlike ``theory.markov.image.image_prediction``, which propagates the law of the last
token through exact (V, V) kernels, it propagates only the position with survival curves estimated from
the records); the speed-up from measured unit costs (``predicted_speedup``); the predicted trade-off
curves over each family's parameter (``sweep_predictions``). Also used by ``coolsd sweep``."""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from theory import rules
from theory.core import checks
from theory.likelihood import speed
from theory.likelihood.recorded import predict_rounds, predict_tree_rounds
from theory.tree import Tree

from .settings import ROWS, T_IMAGE, Settings


def _gens(who: str, gens, many: bool = True):
    """Generations (``real.decode.engine.Generation``: with ``rounds``), one or a list: TypeError naming ``who``."""
    items = gens if many else [gens]
    if (many and not isinstance(gens, (list, tuple))) or not all(hasattr(g, "rounds") for g in items):
        raise TypeError(f"{who}: expected {'a list of generations' if many else 'a generation'} "
                        f"(real.decode.engine.Generation), got {checks.brief(gens)}")
    return gens


def _array2(who: str, a) -> np.ndarray:
    a = checks.float_array(who, a, ndim=2)[0]
    checks.finite_nonneg(who, a)
    return a

def round_positions(gen) -> np.ndarray:
    """(rounds,) tokens generated before each round of one generation."""
    made = np.array([r.accepted + 1 for r in _gens("round_positions", gen, many=False).rounds])
    return np.concatenate([[0], np.cumsum(made)[:-1]])


def survival_by_row(acc: np.ndarray, live: np.ndarray, start: np.ndarray, min_count: int = 30, T: int = T_IMAGE,
                    per_row: int = ROWS) -> np.ndarray:
    """Pr(tau >= i) per image row of the round's start: acc (R, L) per-round estimates of
    Pr(all of drafts 1..i accepted | drafts) (T10's products, or a tree's summed reach per depth), live
    (R, L) where position i was drafted, start (R,) tokens generated before the round; images of T tokens
    in rows of ``per_row`` (MNIST: 7 x 7). Returns (rows, L), monotone in i; rows with fewer than
    ``min_count`` live rounds at i use the pooled estimate. ``theory.likelihood.speed.survival_by_row`` (the
    exact-law tuner's speed model is the same function)."""
    acc, live = _array2("survival_by_row: acc", acc), _array2("survival_by_row: live", live)
    return speed.survival_by_row(acc, live, checks.array("survival_by_row: start", start, ndim=1),
                                 min_count, T, per_row, np)


def expected_rounds(S: np.ndarray, depth: int, first_single: bool, T: int = T_IMAGE, per_row: int = ROWS) -> dict:
    """Renewal recursion over positions n = 0..T-1 (docs/theory.md section 7 with a position-dependent round law):
    a round started at n drafts L' = min(depth, T - n - 1) (0 for the first round when ``first_single``:
    EAGLE drafters and tree rounds start with the prefill alone) and yields tau + 1 tokens with
    Pr(tau >= i) = S[row(n), i-1] for i <= L'. Returns expected rounds (= target calls), draft steps
    (sum of L'), single target steps and tokens per target call T / rounds
    (``theory.likelihood.speed.expected_rounds``, float results)."""
    S, depth = _array2("expected_rounds: S", S), checks.integer("expected_rounds: depth", depth, lo=1)
    er = speed.expected_rounds(S, depth, first_single, T, per_row, np)
    return {k: float(v) for k, v in er.items()}


def chain_arrays(gens, L: int):
    """Stack the recorded chain rounds of several generations: p (R, L+1, V), q (R, L, V), drafts (R, L),
    n_drafted (R,), start (R,) (float64 for the theory)."""
    _gens("chain_arrays", gens)
    L = checks.integer("chain_arrays: L", L, lo=1)
    from real.decode.records import records_to_arrays

    recs, starts = [], []
    for g in gens:
        pos = round_positions(g)
        for r, n in zip(g.rounds, pos):
            if r.drafted > 0:
                recs.append(r)
                starts.append(n)
    p, q, d, nd = records_to_arrays(recs, L)
    return p.astype(np.float64), q.astype(np.float64), d, nd, np.array(starts)


CHUNK_ROUNDS = 256          # rounds per chunk of the predictions: on the demo's rows 64 -> 256 takes 17-28% off
CHUNK_ENTRIES = 1 << 22     # and at most this many row entries (rounds x rows x V) per chunk: 32 MiB per float64 array
COSTLY_CHUNK_ROUNDS = 64    # a costly resampler's chunks: a quarter (chains) or a 16th (trees) of this, its (V, V) laws


def _chunk(chunk: int | None, rows_per_round: int, V: int) -> int:
    """Rounds per chunk: ``chunk``, or by default ``CHUNK_ROUNDS`` capped by ``CHUNK_ENTRIES`` (chunking never
    changes a result: each round is computed on its own)."""
    if chunk is not None:
        return checks.integer("chunk", chunk, lo=1)
    return max(1, min(CHUNK_ROUNDS, CHUNK_ENTRIES // max(1, rows_per_round * V)))


def _costly_resampler(verifier) -> bool:
    """A resampler whose effective law (``rejected=None``, section 6) forms a (V, V) mixture per row, O(V^2) per
    round and position: our renormalised LANTERN++ variant (the released laws are neighbour sums, O(V k))."""
    return bool(getattr(verifier.resample, "dense_effective_law", False))


def predict_chain(arrays, verifier, chunk: int | None = None, max_bound_rounds: int = 400, seed: int = 0):
    """T10 / T11 per recorded round for ``verifier``: ``predict_chains`` of that rule alone."""
    return predict_chains(arrays, {0: verifier}, chunk, max_bound_rounds, seed)[0]


def predict_chains(arrays, verifiers: dict, chunk: int | None = None, max_bound_rounds: int = 400,
                   seed: int = 0) -> dict:
    """T10 / T11 per recorded round for every rule of ``verifiers`` ({key: verifier}; numpy float64, in
    chunks of rounds, every rule on a chunk in turn: the chunk converted and checked once, and LANTERN's acceptance
    rows shared by rules with equal ``memo_key``, ``predict_rounds``' memo).

    T10 depends only on the acceptance rule, so it is computed on every round with a cheap resampler in
    place of the rule's own; the bound uses the rule itself, on every round, except for a costly
    resampler (our renormalised LANTERN++ variant), whose bound is averaged over a seeded subsample of ``max_bound_rounds``
    rounds (an unbiased estimate of the same mean; its SE is reported). Returns {key: (accepted (R,), f (R, L),
    bound terms (R',))}."""
    p, q, d, nd, _ = arrays
    P, Q, D, ND = (x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in (p, q, d, nd))
    chunk = _chunk(chunk, P.shape[1], P.shape[-1])
    f64 = lambda x: np.asarray(x, np.float64)  # noqa: E731  (a chunk at a time: the rows may be float32)
    costly = {k: _costly_resampler(v) for k, v in verifiers.items()}
    first = {k: rules.Verifier(v.accept, rules.Optimal(), v.name) if costly[k] else v for k, v in verifiers.items()}
    acc, bound, f = ({k: [] for k in verifiers} for _ in range(3))
    for a in range(0, len(d), chunk):   # a loop over chunks of rounds: rows once, every rule
        pc, qc, memo = f64(P[a:a + chunk]), f64(Q[a:a + chunk]), {}
        for i, (k, v) in enumerate(first.items()):   # a loop over the rules on this chunk (checked at the first)
            r = predict_rounds(pc, qc, D[a:a + chunk], v, n_drafted=ND[a:a + chunk], check=i == 0, memo=memo)
            acc[k].append(np.asarray(r.accepted))
            f[k].append(np.asarray(r.f))
            if not costly[k]:
                bound[k].append(np.asarray(r.bound))
    for k in [k for k in verifiers if costly[k]]:   # a loop over the costly rules: their subsampled bounds
        idx = np.arange(len(d))
        if len(idx) > max_bound_rounds:
            idx = np.sort(np.random.default_rng(seed).choice(len(idx), max_bound_rounds, replace=False))
        c = max(1, min(chunk, COSTLY_CHUNK_ROUNDS) // 4)   # its (rounds, L + 1, V, V) mixtures: a quarter
        for a in range(0, len(idx), c):
            j = idx[a:a + c]
            bound[k].append(np.asarray(predict_rounds(f64(P[j]), f64(Q[j]), D[j], verifiers[k], n_drafted=ND[j]).bound))
    return {k: (np.concatenate(acc[k]), np.concatenate(f[k]), np.concatenate(bound[k])) for k in verifiers}


def chain_prediction(arrays, verifier, L: int, first_single: bool, max_bound_rounds: int = 400, T: int = T_IMAGE,
                     per_row: int = ROWS) -> dict:
    """Predicted tokens per target call, draft work and per-round TV bound of ``verifier`` from recorded
    chain rounds (``chain_arrays``) of images of T tokens in rows of ``per_row``: ``chain_predictions`` of it alone."""
    return chain_predictions(arrays, {0: verifier}, L, first_single, max_bound_rounds, T, per_row)[0]


def chain_predictions(arrays, verifiers: dict, L: int, first_single: bool, max_bound_rounds: int = 400,
                      T: int = T_IMAGE, per_row: int = ROWS) -> dict:
    """``chain_prediction`` of every rule of ``verifiers`` ({key: verifier}) -> {key: dict}, the recorded rounds
    read once for all of them (``predict_chains``)."""
    p, q, d, nd, start = arrays
    out = {}
    for k, (accepted, f, bound) in predict_chains(arrays, verifiers, max_bound_rounds=max_bound_rounds).items():
        live = (np.arange(1, L + 1)[None, :] <= nd[:, None]).astype(np.float64)
        S = survival_by_row(np.cumprod(f, axis=1), live, start, T=T, per_row=per_row)
        er = expected_rounds(S, L, first_single, T, per_row)
        out[k] = {**er, "per_round_accepted": float(accepted.mean()), "tv_bound": float(bound.mean()),
                  "tv_bound_se": float(bound.std(ddof=1) / math.sqrt(len(bound))) if len(bound) > 1 else float("nan"),
                  "tv_bound_rounds": int(len(bound)), "rounds_recorded": int(len(d))}
    return out


def tree_records(gens):
    """Group the drafted rounds of tree generations by their (possibly truncated) tree depth:
    {depth: (p (R, N+1, V), q, tokens (R, N+1), start (R,))}."""
    _gens("tree_records", gens)
    groups: dict = {}
    for g in gens:
        pos = round_positions(g)
        for r, n in zip(g.rounds, pos):
            if r.depth:
                groups.setdefault(r.depth, []).append((r, n))
    out = {}
    for dep, items in groups.items():
        out[dep] = (np.stack([r.p for r, _ in items]).astype(np.float64), np.stack([r.q for r, _ in items]).astype(np.float64),
                    np.stack([r.drafts for r, _ in items]), np.array([n for _, n in items]))
    return out


def tree_prediction(groups, verifier, tree: Tree, chunk: int | None = None, max_costly_rounds: int = 400,
                    seed: int = 0, T: int = T_IMAGE, per_row: int = ROWS, draft_law: str = "without_replacement") -> dict:
    """Predicted tokens per target call and per-round TV bound of ``verifier`` from recorded tree rounds
    (``tree_records``), by ``theory.likelihood.recorded.predict_tree_rounds`` in chunks of rounds (its bound term
    forms the resampler's effective law, (rounds, V) per node, or (rounds, V, V) for our renormalised LANTERN++
    resampler). With a costly resampler the rounds are a seeded subsample of ``max_costly_rounds`` (spread
    over the depth groups in proportion): unbiased for the same means, at a few times the SE. ``draft_law``: the
    candidates' law, as ``verify_tree``'s ("point" for top-k candidates: ``StaticTree(..., "topk")``)."""
    checks.instance("tree_prediction: groups", groups, dict, "a dict (tree_records)")
    checks.verifier(verifier, "tree_prediction: verifier")
    checks.instance("tree_prediction: tree", tree, Tree, "a theory.tree.Tree")
    from theory.tree import truncate_tree

    D = tree.depth
    costly = _costly_resampler(verifier)
    total = sum(len(g[2]) for g in groups.values())
    rng = np.random.default_rng(seed)
    if groups:
        p0 = next(iter(groups.values()))[0]
        chunk = _chunk(chunk, p0.shape[1], p0.shape[-1])
    if costly:
        chunk = max(1, min(chunk, COSTLY_CHUNK_ROUNDS) // 16)   # (rounds, N + 1, V, V) mixtures
    accs, lives, starts, bounds, per_round = [], [], [], [], []
    for dep, (p, q, toks, start) in sorted(groups.items()):
        t = truncate_tree(tree, dep)
        if costly and total > max_costly_rounds:
            m = max(1, math.ceil(max_costly_rounds * len(toks) / total))
            idx = np.sort(rng.choice(len(toks), min(m, len(toks)), replace=False))
            p, q, toks, start = p[idx], q[idx], toks[idx], start[idx]
        parts = [predict_tree_rounds(np.asarray(p[a:a + chunk], np.float64), np.asarray(q[a:a + chunk], np.float64),
                                     toks[a:a + chunk], t, verifier, draft_law=draft_law)
                 for a in range(0, len(toks), chunk)]     # float64 a chunk at a time (the rows may be float32)
        r = type(parts[0])(*[np.concatenate([np.asarray(getattr(x, k)) for x in parts]) for k in parts[0]._fields])
        reach = np.asarray(r.reach)
        by_depth = np.zeros((len(toks), D))
        for k in range(1, D + 1):  # Pr(tau >= k) given the drafts: reach summed over the nodes at depth k
            nodes = np.flatnonzero(t.node_depth == k)
            if nodes.size:
                by_depth[:, k - 1] = reach[:, nodes].sum(1)
        live = np.zeros((len(toks), D))
        live[:, :dep] = 1.0
        accs.append(by_depth)
        lives.append(live)
        starts.append(start)
        bounds.append(np.asarray(r.bound))
        per_round.append(np.asarray(r.accepted))
    acc, live, start = np.concatenate(accs), np.concatenate(lives), np.concatenate(starts)
    bound, per_round = np.concatenate(bounds), np.concatenate(per_round)
    S = survival_by_row(acc, live, start, T=T, per_row=per_row)
    er = expected_rounds(S, D, True, T, per_row)
    return {**er, "per_round_accepted": float(per_round.mean()), "tv_bound": float(bound.mean()),
            "tv_bound_se": float(bound.std(ddof=1) / math.sqrt(len(bound))) if len(bound) > 1 else float("nan")}


def unit_costs(stats: dict, ar_stats: dict) -> dict:
    """Measured unit costs (seconds) from summarized runs: AR step, draft step, target pass, verifier and
    bookkeeping per round (``stats`` of a speculative run, ``ar_stats`` of plain AR; ``real.decode.engine.summarize``)."""
    checks.instance("unit_costs: stats", stats, dict, "a dict (engine.summarize)")
    checks.instance("unit_costs: ar_stats", ar_stats, dict, "a dict (engine.summarize)")
    R = stats["rounds"]
    other = stats["seconds"] - stats["time_draft_s"] - stats["time_target_s"] - stats["time_verify_s"]
    return {"ar_step_s": ar_stats["seconds"] / ar_stats["tokens"],
            "draft_step_s": stats["time_draft_s"] / max(stats["draft_forwards"], 1),
            "target_per_round_s": stats["time_target_s"] / R,
            "verify_per_round_s": stats["time_verify_s"] / R,
            "other_per_round_s": other / R}


def predicted_speedup(er: dict, costs: dict, verify_s: float, T: int = T_IMAGE) -> float:
    """Speed-up over plain AR predicted from the expected work per image and measured unit costs (seconds):
    time = rounds (target pass + bookkeeping) + drafted rounds x verifier + draft steps x draft step, AR
    time = T x AR step. In units of the AR step this is ``theory.markov.image.ImagePrediction.speedup`` with
    cost_ratio = draft step / AR step and verify_cost = (target pass + verifier + bookkeeping) / AR step."""
    checks.instance("predicted_speedup: er", er, dict, "a dict (expected_rounds)")
    checks.instance("predicted_speedup: costs", costs, dict, "a dict (unit_costs)")
    checks.real("predicted_speedup: verify_s", verify_s, 0)
    drafted_rounds = er["rounds"] - er["single_steps"]
    t = er["rounds"] * (costs["target_per_round_s"] + costs["other_per_round_s"]) \
        + drafted_rounds * verify_s + er["draft_steps"] * costs["draft_step_s"]
    return T * costs["ar_step_s"] / t


def time_verifier(arrays_or_groups, verifier, tree: Tree | None, n: int = 100, device="cpu") -> float:
    """Seconds per round of the verifier alone, timed on recorded rows as the engine calls it
    (one round at a time, torch tensors): chain rows when ``tree`` is None, else tree groups."""
    from theory.tree import verify_tree
    from theory.rules.chain import verify_chain

    from theory.tree import truncate_tree

    g = torch.Generator(device=device).manual_seed(0)
    if tree is None:
        p, q, d, nd, _ = arrays_or_groups
        idx = np.flatnonzero(nd == nd.max())[:n]
        P = torch.as_tensor(p[idx], dtype=torch.float32, device=device)
        Q = torch.as_tensor(q[idx], dtype=torch.float32, device=device)
        D = torch.as_tensor(d[idx], device=device)
        L = D.shape[1]
        t0 = time.perf_counter()
        for j in range(len(idx)):  # one round per call, as in the engine
            u = torch.rand(L, generator=g, device=device)
            v = verify_chain(P[j][None], Q[j][None], D[j][None], u[None], torch.rand((), generator=g, device=device)[None],
                             verifier)
            int(v.accepted[0])
        return (time.perf_counter() - t0) / max(len(idx), 1)
    dep = max(arrays_or_groups)
    p, q, toks, _ = arrays_or_groups[dep]
    t = truncate_tree(tree, dep)
    m = min(n, len(toks))
    P = torch.as_tensor(p[:m], dtype=torch.float32, device=device)
    Q = torch.as_tensor(q[:m], dtype=torch.float32, device=device)
    K = torch.as_tensor(toks[:m], device=device)
    t0 = time.perf_counter()
    for j in range(m):
        u = torch.rand(t.n_nodes + 1, generator=g, device=device)
        v = verify_tree(P[j][None], Q[j][None], K[j][None], u[None], torch.rand((), generator=g, device=device)[None],
                        t, verifier, early_exit=True)
        torch.cat([v.accepted, v.path[0]]).tolist()
    return (time.perf_counter() - t0) / max(m, 1)


SWEEPS = {
    "cool-sd": ("delta", (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)),
    "uniform-rsd": ("c", (1.0, 1.25, 1.5, 2.0, 3.0, 4.0)),
    "lantern": ("delta", (0.05, 0.1, 0.2, 0.4, 0.8)),
    "lantern++": ("lambda", (1.5, 2.0, 3.0, 5.0, 8.0)),
    "lantern+G*": ("delta", (0.05, 0.1, 0.2, 0.4, 0.8)),
}


def _sweep_verifier(name: str, value: float, s: Settings, nb):
    """The rule of family ``name`` (theory.rules.methods) with its swept parameter (``SWEEPS``) set to ``value``."""
    from theory.rules import methods

    param = SWEEPS[name][0]
    extra = {"nu": s.nu} if name == "cool-sd" else {"k": s.lantern_k} if methods.get(name).needs_neighbors else {}
    return methods.build(name, s.L, nb, {**extra, param: value})


def sweep_predictions(report: dict, results: dict, s: Settings, max_rounds: int = 600) -> dict:
    """Predicted (tokens per call, per-round TV bound) of each rule family over a parameter sweep, from (a
    seeded subsample of) the vanilla chain records alone: the predicted trade-off curves."""
    checks.instance("sweep_predictions: report", report, dict, "a dict")
    checks.instance("sweep_predictions: results", results, dict, "a dict of Result")
    checks.instance("sweep_predictions: s", s, Settings, "coolsd.studies.demo.Settings")
    from real.zoo import vq

    van = next(r for r in results.values() if r.spec is not None and r.spec.record and not r.spec.tree_drafted)
    p, q, d, nd, start = chain_arrays(van.gens, s.L)
    if len(d) > max_rounds:
        idx = np.sort(np.random.default_rng(s.seed).choice(len(d), max_rounds, replace=False))
        p, q, d, nd, start = p[idx], q[idx], d[idx], nd[idx], start[idx]
    nb = rules.lantern_neighbors(vq.raw_codebook().numpy(), s.lantern_k + 1)  # raw vectors, as released
    grid = {(name, v): _sweep_verifier(name, v, s, nb) for name, (_, values) in SWEEPS.items() for v in values}
    pred = chain_predictions((p, q, d, nd, start), grid, s.L, s.chain_draft == "eagle", max_bound_rounds=100)
    return {name: [{"param": param, "value": v, "tokens_per_call": pred[name, v]["tokens_per_call"],
                    "tv_bound": pred[name, v]["tv_bound"]} for v in values] for name, (param, values) in SWEEPS.items()}
