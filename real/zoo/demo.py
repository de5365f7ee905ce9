"""The main job (``coolsd demo``): predicted vs measured trade-offs of relaxed speculative decoding on the
shipped MNIST models (never trains).

Runs (``specs``), on the same digits (class i mod 10, seed + i), generated round-robin (digit i by every
run before digit i + 1, so drifts of the machine's speed hit every run alike): plain AR (the speed and
quality baseline); vanilla SD with chain drafts (L = 4, the EAGLE-1 drafter) recording the processed P
and Q rows of every round; Cool-SD at several deltas, UniformRSD, LANTERN, LANTERN++, LANTERN+G*; static
trees (EAGLE-1's 25-node tree) with vanilla (recording), Cool-SD and every other rule; optionally
(``extra_draft``, ``--extra-draft small``) one vanilla chain run with the independent small draft,
reported apart.

Predictions use only the recorded vanilla rows (docs/theory.md section 8): per round, T10 (accepted drafts) and
T11 (TV-bound term) of each rule (``theory.recorded.predict_rounds``; trees:
``predict_tree_rounds``); tokens per target call and the draft work per image then follow from a renewal
recursion over the 49 token positions (``expected_rounds``: short end-of-image rounds draft
L' = min(L, T - n - 1) tokens, the first round of EAGLE / tree runs is the prefill alone, acceptance is
estimated per image row); the speed-up from costs measured in the vanilla run (``predicted_speedup``).
Measured: tokens per target call (SE over rounds), wall-clock speed-up over plain AR, Frechet distance of
the decoded digits to the held-out digits in the shipped classifier's space (bootstrap SE), class
accuracy, the target's NLL per token of the generated codes.

Outputs in ``out``: report.json (the contract: ``{"methods": [{"name", "params", "drafting",
"accepted_length": {"predicted", "measured", "measured_se"}, "speedup": {"predicted", "measured"},
"frechet_distance", "class_accuracy", "tv_bound", ...}], ...}``), report.md and the PNG figures of
``real.zoo.demo_report``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import platform
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from theory import rules
from theory.recorded import predict_rounds, predict_tree_rounds
from theory.tree import EAGLE_25, Tree

from . import demo_report
from .demo_report import find_method

T_IMAGE = 49
ROWS = 7

# a 10-node static tree of depth 4: three candidates after the root, two after the first, then a spine
SMALL_TREE = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (1, 0, 0), (0, 0, 0, 0))


@dataclass
class Settings:
    """What the demo runs. ``quick`` only shrinks the sample counts (tests)."""
    n_images: int = 500                # per method, balanced over the 10 classes (class = i mod 10)
    batch_size: int = 50               # digits generated together (real.engine.generate); AR at the same size
    L: int = 4                         # chain draft length
    cfg_scale: float = 2.0
    temperature: float = 1.0
    seed: int = 0
    chain_draft: str = "eagle"         # "eagle" (EAGLE-1 drafter on the target's features) or "small"
    tree_draft: str = "eagle"
    extra_draft: str | None = None     # e.g. "small": one more vanilla chain run with this draft (reported apart)
    tree: str = "eagle25"              # "eagle25" (EAGLE-1's 25 nodes, depth 5) or "small" (SMALL_TREE)
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
    quick: bool = False

    def tree_obj(self) -> Tree:
        return Tree(EAGLE_25 if self.tree == "eagle25" else SMALL_TREE)


@dataclass
class Spec:
    name: str                 # contract name
    params: dict
    drafting: str             # "chain" | "tree"
    verifier: object          # for the engine (LANTERN tables as torch tensors on the device)
    draft: str
    record: bool = False
    theory_verifier: object = None   # the same rule on numpy rows (predictions); None: ``verifier``
    extra: bool = False              # reported under "other_drafts", not in "methods"

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
    from real.methods import make_verifier

    nb = np.asarray(neighbors)
    nb_dev = torch.as_tensor(nb, device=s.device)     # no host-to-device copy of the table per round

    def spec(name: str, params: dict, drafting: str, draft: str, **kw) -> Spec:
        """The run of method ``name`` (theory.methods) with ``params``; LANTERN rules get the table on the
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


# ----------------------------------------------------------------------------- predictions

def round_positions(gen) -> np.ndarray:
    """(rounds,) tokens generated before each round of one generation."""
    made = np.array([r.accepted + 1 for r in gen.rounds])
    return np.concatenate([[0], np.cumsum(made)[:-1]])


def survival_by_row(acc: np.ndarray, live: np.ndarray, start: np.ndarray, min_count: int = 30, T: int = T_IMAGE,
                    per_row: int = ROWS) -> np.ndarray:
    """Pr(tau >= i) per image row of the round's start: acc (R, L) per-round estimates of
    Pr(all of drafts 1..i accepted | drafts) (T10's products, or a tree's summed reach per depth), live
    (R, L) where position i was drafted, start (R,) tokens generated before the round; images of T tokens
    in rows of ``per_row`` (MNIST: 7 x 7). Returns (rows, L), monotone in i; rows with fewer than
    ``min_count`` live rounds at i use the pooled estimate."""
    L = acc.shape[1]
    pooled = (acc * live).sum(0) / np.maximum(live.sum(0), 1)
    rows = -(-T // per_row)
    S = np.tile(pooled, (rows, 1))
    row = np.minimum(start // per_row, rows - 1)
    for b in range(rows):  # image rows (seven for MNIST)
        m = row == b
        cnt = live[m].sum(0)
        ok = cnt >= min_count
        S[b, ok] = (acc[m] * live[m]).sum(0)[ok] / cnt[ok]
    return np.minimum.accumulate(np.clip(S, 0.0, 1.0), axis=1)


def expected_rounds(S: np.ndarray, depth: int, first_single: bool, T: int = T_IMAGE, per_row: int = ROWS) -> dict:
    """Renewal recursion over positions n = 0..T-1 (docs/theory.md section 7 with a position-dependent round law):
    a round started at n drafts L' = min(depth, T - n - 1) (0 for the first round when ``first_single``:
    EAGLE drafters and tree rounds start with the prefill alone) and yields tau + 1 tokens with
    Pr(tau >= i) = S[row(n), i-1] for i <= L'. Returns expected rounds (= target calls), draft steps
    (sum of L'), single target steps and tokens per target call T / rounds."""
    pi = np.zeros(T + depth + 2)
    pi[0] = 1.0
    rounds = draft = single = 0.0
    for n in range(T):  # sequential over positions (49)
        m = pi[n]
        if m == 0.0:
            continue
        ell = 0 if (n == 0 and first_single) else min(depth, T - n - 1)
        rounds += m
        if ell == 0:
            single += m
            pi[n + 1] += m
            continue
        draft += m * ell
        surv = np.concatenate([[1.0], S[min(n // per_row, len(S) - 1), :ell], [0.0]])
        pi[n + 1:n + ell + 2] += m * (surv[:-1] - surv[1:])     # tau = 0..ell
    return {"rounds": rounds, "draft_steps": draft, "single_steps": single, "tokens_per_call": T / rounds}


def chain_arrays(gens, L: int):
    """Stack the recorded chain rounds of several generations: p (R, L+1, V), q (R, L, V), drafts (R, L),
    n_drafted (R,), start (R,) (float64 for the theory)."""
    from real.engine import records_to_arrays

    recs, starts = [], []
    for g in gens:
        pos = round_positions(g)
        for r, n in zip(g.rounds, pos):
            if r.drafted > 0:
                recs.append(r)
                starts.append(n)
    p, q, d, nd = records_to_arrays(recs, L)
    return p.astype(np.float64), q.astype(np.float64), d, nd, np.array(starts)


def _costly_resampler(verifier) -> bool:
    """A resampler whose effective law (``rejected=None``, section 6) forms a (V, V) mixture per row, O(V^2) per
    round and position: our renormalised LANTERN++ variant (the released laws are (V,) @ (V, V) products)."""
    return bool(getattr(verifier.resample, "dense_effective_law", False))


def predict_chain(arrays, verifier, chunk: int = 64, max_bound_rounds: int = 400, seed: int = 0):
    """T10 / T11 per recorded round for ``verifier`` (torch float64 on the CPU, in chunks of rounds).

    T10 depends only on the acceptance rule, so it is computed on every round with a cheap resampler in
    place of the rule's own; the bound uses the rule itself, on every round, except for a costly
    resampler (our renormalised LANTERN++ variant), whose bound is averaged over a seeded subsample of ``max_bound_rounds``
    rounds (an unbiased estimate of the same mean; its SE is reported). Returns accepted (R,), f (R, L),
    bound terms (R',), R'."""
    p, q, d, nd, _ = arrays
    P, Q = torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64)
    D, ND = torch.as_tensor(d), torch.as_tensor(nd)
    costly = _costly_resampler(verifier)
    first = rules.Verifier(verifier.accept, rules.Optimal(), verifier.name) if costly else verifier
    acc, bound, f = [], [], []
    for a in range(0, len(d), chunk):
        r = predict_rounds(P[a:a + chunk], Q[a:a + chunk], D[a:a + chunk], first, n_drafted=ND[a:a + chunk])
        acc.append(r.accepted.numpy())
        f.append(r.f.numpy())
        if not costly:
            bound.append(r.bound.numpy())
    if costly:
        idx = np.arange(len(d))
        if len(idx) > max_bound_rounds:
            idx = np.sort(np.random.default_rng(seed).choice(len(idx), max_bound_rounds, replace=False))
        for a in range(0, len(idx), chunk // 4):
            j = torch.as_tensor(idx[a:a + chunk // 4])
            bound.append(predict_rounds(P[j], Q[j], D[j], verifier, n_drafted=ND[j]).bound.numpy())
    bound = np.concatenate(bound)
    return np.concatenate(acc), np.concatenate(f), bound


def chain_prediction(arrays, verifier, L: int, first_single: bool, max_bound_rounds: int = 400, T: int = T_IMAGE,
                     per_row: int = ROWS) -> dict:
    """Predicted tokens per target call, draft work and per-round TV bound of ``verifier`` from recorded
    chain rounds (``chain_arrays``) of images of T tokens in rows of ``per_row``."""
    p, q, d, nd, start = arrays
    accepted, f, bound = predict_chain(arrays, verifier, max_bound_rounds=max_bound_rounds)
    live = (np.arange(1, L + 1)[None, :] <= nd[:, None]).astype(np.float64)
    S = survival_by_row(np.cumprod(f, axis=1), live, start, T=T, per_row=per_row)
    er = expected_rounds(S, L, first_single, T, per_row)
    return {**er, "per_round_accepted": float(accepted.mean()), "tv_bound": float(bound.mean()),
            "tv_bound_se": float(bound.std(ddof=1) / math.sqrt(len(bound))) if len(bound) > 1 else float("nan"),
            "tv_bound_rounds": int(len(bound)), "rounds_recorded": int(len(d))}


def tree_records(gens):
    """Group the drafted rounds of tree generations by their (possibly truncated) tree depth:
    {depth: (p (R, N+1, V), q, tokens (R, N+1), start (R,))}."""
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


def tree_prediction(groups, verifier, tree: Tree, chunk: int = 64, max_costly_rounds: int = 400,
                    seed: int = 0, T: int = T_IMAGE, per_row: int = ROWS) -> dict:
    """Predicted tokens per target call and per-round TV bound of ``verifier`` from recorded tree rounds
    (``tree_records``), by ``theory.recorded.predict_tree_rounds`` in chunks of rounds (its bound term
    forms the resampler's effective law, (rounds, V) per node, or (rounds, V, V) for our renormalised LANTERN++
    resampler). With a costly resampler the rounds are a seeded subsample of ``max_costly_rounds`` (spread
    over the depth groups in proportion): unbiased for the same means, at a few times the SE."""
    from real.engine import truncate_tree

    D = tree.depth
    costly = _costly_resampler(verifier)
    total = sum(len(g[2]) for g in groups.values())
    rng = np.random.default_rng(seed)
    if costly:
        chunk = max(1, chunk // 16)
    accs, lives, starts, bounds, per_round = [], [], [], [], []
    for dep, (p, q, toks, start) in sorted(groups.items()):
        t = truncate_tree(tree, dep)
        if costly and total > max_costly_rounds:
            m = max(1, math.ceil(max_costly_rounds * len(toks) / total))
            idx = np.sort(rng.choice(len(toks), min(m, len(toks)), replace=False))
            p, q, toks, start = p[idx], q[idx], toks[idx], start[idx]
        parts = [predict_tree_rounds(p[a:a + chunk], q[a:a + chunk], toks[a:a + chunk], t, verifier)
                 for a in range(0, len(toks), chunk)]
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


def predicted_speedup(er: dict, costs: dict, verify_s: float, T: int = T_IMAGE) -> float:
    """Speed-up over plain AR predicted from the expected work per image and measured unit costs (seconds):
    time = rounds (target pass + bookkeeping) + drafted rounds x verifier + draft steps x draft step, AR
    time = T x AR step. In units of the AR step this is ``theory.image.ImagePrediction.speedup`` with
    cost_ratio = draft step / AR step and verify_cost = (target pass + verifier + bookkeeping) / AR step."""
    drafted_rounds = er["rounds"] - er["single_steps"]
    t = er["rounds"] * (costs["target_per_round_s"] + costs["other_per_round_s"]) \
        + drafted_rounds * verify_s + er["draft_steps"] * costs["draft_step_s"]
    return T * costs["ar_step_s"] / t


def time_verifier(kind: str, arrays_or_groups, verifier, tree: Tree | None, n: int = 100, device="cpu") -> float:
    """Seconds per round of the verifier alone, timed on recorded rows as the engine calls it
    (one round at a time, torch tensors)."""
    from theory.tree import verify_tree
    from theory.verify import verify_chain

    from real.engine import truncate_tree

    g = torch.Generator(device=device).manual_seed(0)
    if kind == "chain":
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


# ----------------------------------------------------------------------------- quality

def fd_with_se(images: torch.Tensor, n_boot: int, seed: int) -> tuple[float, float]:
    """Frechet distance to the held-out digits and its bootstrap standard error (resampling the images)."""
    from .metrics import frechet_distance_stats, gaussian_stats, image_features, reference_stats

    f = image_features(images).numpy()
    ref = reference_stats()
    fd = frechet_distance_stats(*gaussian_stats(f), *ref)
    rng = np.random.default_rng(seed)
    boots = [frechet_distance_stats(*gaussian_stats(f[rng.integers(0, len(f), len(f))]), *ref) for _ in range(n_boot)]
    return float(fd), float(np.std(boots, ddof=1))


@torch.no_grad()
def per_image_nll(target, labels: torch.Tensor, tokens: torch.Tensor) -> np.ndarray:
    """Target NLL per token of each generated image's codes (N, 49) given its class: (N,) float64."""
    import torch.nn.functional as F

    from .gpt import train_logits

    logits = train_logits(target, labels, tokens)
    return F.cross_entropy(logits.transpose(1, 2), tokens.to(logits.device), reduction="none").mean(1).cpu().double().numpy()


def nll_with_se(target, labels: torch.Tensor, tokens: torch.Tensor) -> dict:
    """Target NLL per token of generated codes (N, 49) given their classes, and its SE over the N images
    (relaxed rules move the output away from the target's law; vanilla and plain AR sample it exactly)."""
    per_image = per_image_nll(target, labels, tokens)
    return {"nll_per_token": float(per_image.mean()),
            "nll_per_token_se": float(per_image.std(ddof=1) / math.sqrt(len(per_image)))}


def real_floor(n: int, seed: int, repeats: int = 5) -> dict:
    """FD of n real train digits (never generated) to the held-out digits: the floor any generator faces
    at this sample size (mean and sd over random subsets)."""
    from . import data
    from .metrics import frechet_distance_stats, gaussian_stats, image_features, reference_stats

    x, _ = data.train_split()
    f = image_features(x).numpy()
    rng = np.random.default_rng(seed)
    vals = [frechet_distance_stats(*gaussian_stats(f[rng.choice(len(f), n, replace=False)]), *reference_stats())
            for _ in range(repeats)]
    return {"n": n, "mean": float(np.mean(vals)), "sd": float(np.std(vals, ddof=1))}


# ----------------------------------------------------------------------------- the job

@dataclass
class Result:
    spec: Spec | None
    gens: list
    tokens: torch.Tensor
    stats: dict
    extra: dict = field(default_factory=dict)


def _models(s: Settings):
    from . import gpt

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


def run_demo(out: str | pathlib.Path, settings: Settings | None = None, progress: bool = True) -> dict:
    """Run the whole job and write report.json, report.md and the figures into ``out``; returns the report."""
    from tqdm import tqdm

    from real import engine
    from real.sampling import Processing

    from . import gpt, vq
    from .checkpoint import read_manifest

    s = settings or Settings()
    if s.n_images < 2:
        raise ValueError(f"n_images must be >= 2 (standard errors), got {s.n_images}")
    if not set(s.tree_deltas) <= set(s.deltas):
        raise ValueError(f"tree_deltas {s.tree_deltas} must be among the chain deltas {s.deltas} (chain vs tree)")
    if str(s.device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but torch.cuda.is_available() is False")
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_job = time.perf_counter()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(s.threads)
    try:
        target, drafts = _models(s)
        neighbors = rules.lantern_neighbors(vq.raw_codebook().numpy(), s.lantern_k + 1)  # raw vectors, as released
        runs = specs(s, neighbors)
        tree = s.tree_obj()
        proc = Processing(temperature=s.temperature, cfg_scale=s.cfg_scale)
        N = s.n_images
        classes = [i % gpt.NUM_CLASSES for i in range(N)]
        seeds = [s.seed + i for i in range(N)]
        bar = tqdm(total=N * (len(runs) + 1), desc="coolsd demo", disable=not progress, unit="img")
        B = min(s.batch_size, N)
        # warm-up (first calls allocate caches, build plans)
        engine.generate(target, None, classes[:B], num_tokens=T_IMAGE, processing=proc, seed=10**6, batch_size=B)
        for sp in {(sp.drafting, sp.draft): sp for sp in runs}.values():
            _generate(engine, target, drafts[sp.draft], sp, classes[:B], 10**6, proc, tree, s.L, B)

        # round robin: batch k of digits is generated by plain AR and by every run before batch k + 1, so
        # slow drifts of the machine's speed hit every method alike (speed-ups compare the same digits)
        gens: dict = {"ar": []} | {sp.key: [] for sp in runs}
        for k, a in enumerate(range(0, N, B)):
            cls, sd = classes[a:a + B], seeds[k]
            gens["ar"] += engine.generate(target, None, cls, num_tokens=T_IMAGE, processing=proc, seed=sd,
                                          batch_size=B)
            bar.update(len(cls))
            for sp in runs:
                gens[sp.key] += _generate(engine, target, drafts[sp.draft], sp, cls, sd, proc, tree, s.L, B)
                bar.update(len(cls))
        results = {"ar": Result(None, [], torch.stack([g.tokens for g in gens["ar"]]), engine.summarize(gens["ar"]))}
        for sp in runs:
            g = gens.pop(sp.key)
            results[sp.key] = Result(sp, g if sp.record else [], torch.stack([x.tokens for x in g]), engine.summarize(g))
        bar.close()
        torch.set_num_threads(max(old_threads, 1))
        report = _analyse(s, runs, results, target, tree, classes, progress)
    finally:
        torch.set_num_threads(old_threads)
    report["manifest"] = {k: {"sha256": v["sha256"], "command": v.get("command")}
                          for k, v in read_manifest()["files"].items()}
    report["predicted_sweeps"] = sweep_predictions(report, results, s)
    report["figures"] = demo_report.figures(out, report, results, s)
    report["wall_clock_s"] = time.perf_counter() - t_job
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(demo_report.markdown(report))
    return report


def _generate(engine, target, draft, sp: Spec, classes: list, seed: int, proc, tree: Tree, L: int, B: int):
    kw = dict(tree=tree) if sp.drafting == "tree" else dict(L=L)
    return engine.generate(target, draft, classes, num_tokens=T_IMAGE, verifier=sp.verifier, processing=proc,
                           seed=seed, batch_size=min(B, len(classes)), record_rows=sp.record, **kw)


def unit_costs(stats: dict, ar_stats: dict) -> dict:
    """Measured unit costs (seconds) from summarized runs: AR step, draft step, target pass, verifier and
    bookkeeping per round (``stats`` of a speculative run, ``ar_stats`` of plain AR; ``real.engine.summarize``)."""
    R = stats["rounds"]
    other = stats["seconds"] - stats["time_draft_s"] - stats["time_target_s"] - stats["time_verify_s"]
    return {"ar_step_s": ar_stats["seconds"] / ar_stats["tokens"],
            "draft_step_s": stats["time_draft_s"] / max(stats["draft_forwards"], 1),
            "target_per_round_s": stats["time_target_s"] / R,
            "verify_per_round_s": stats["time_verify_s"] / R,
            "other_per_round_s": other / R}


def _analyse(s: Settings, runs, results, target, tree, classes, progress: bool = False) -> dict:
    from . import gpt, vq
    from .metrics import class_accuracy

    labels = torch.tensor(classes)
    ar = results["ar"]
    # the recorded vanilla run of each (drafting, draft) is the only input of that setting's predictions
    sources = {}
    for sp in runs:
        if sp.record:
            res = results[sp.key]
            data = chain_arrays(res.gens, s.L) if sp.drafting == "chain" else tree_records(res.gens)
            c = unit_costs(res.stats, ar.stats)
            c["cost_ratio_draft_over_ar_step"] = c["draft_step_s"] / c["ar_step_s"]
            c["cost_ratio_target_pass_over_ar_step"] = c["target_per_round_s"] / c["ar_step_s"]
            sources[(sp.drafting, sp.draft)] = (data, c)
    n_boot = 30 if s.quick else 100

    def quality(tokens: torch.Tensor, seed: int) -> dict:
        images = vq.decode(tokens)
        fd, fd_se = fd_with_se(images, n_boot, seed)
        acc = class_accuracy(images, labels)
        return {"frechet_distance": fd, "frechet_distance_se": fd_se, "class_accuracy": acc,
                "class_accuracy_se": math.sqrt(acc * (1 - acc) / len(labels)), **nll_with_se(target, labels, tokens)}

    from tqdm import tqdm

    methods, others = [], []
    ar_q = quality(ar.tokens, 0)
    for j, sp in enumerate(tqdm(runs, desc="predict + measure", disable=not progress, unit="run")):
        res = results[sp.key]
        st = res.stats
        data, c = sources[(sp.drafting, sp.draft)]
        if sp.drafting == "chain":
            pred = chain_prediction(data, sp.rule, s.L, sp.draft == "eagle")
            verify_s = time_verifier("chain", data, sp.verifier, None, device=s.device)
        else:
            pred = tree_prediction(data, sp.rule, tree)
            verify_s = time_verifier("tree", data, sp.verifier, tree, device=s.device)
        measured = st["tokens_per_target_call"]
        entry = {
            "name": sp.name, "params": sp.params, "drafting": sp.drafting, "draft": sp.draft,
            "L": s.L if sp.drafting == "chain" else tree.depth,
            **({"tree": {"nodes": tree.n_nodes, "depth": tree.depth, "name": s.tree}} if sp.drafting == "tree" else {}),
            "accepted_length": {"predicted": pred["tokens_per_call"], "measured": measured,
                                "measured_se": st["tokens_per_target_call_se"],
                                "relative_error": (pred["tokens_per_call"] - measured) / measured,
                                "predicted_rounds_per_image": pred["rounds"],
                                "measured_rounds_per_image": st["rounds"] / st["images"],
                                "predicted_per_round_mean": 1.0 + pred["per_round_accepted"]},
            "speedup": {"predicted": predicted_speedup(pred, c, verify_s), "measured": ar.stats["seconds"] / st["seconds"],
                        "verifier_s_per_round_timed": verify_s},
            **quality(res.tokens, j + 1),
            "tv_bound": pred["tv_bound"], "tv_bound_se": pred["tv_bound_se"],
            "tv_bound_rounds": pred.get("tv_bound_rounds", st["rounds"]),
            "acceptance_rate": st["acceptance_rate"], "seconds": st["seconds"], "rounds": st["rounds"],
            "images": st["images"], "time_split_s": {k: st[k] for k in ("time_draft_s", "time_target_s", "time_verify_s")},
            "predicted_from": f"vanilla {sp.drafting} run with the {sp.draft} draft: recorded P/Q rows "
                              + ("(T10/T11, theory.recorded.predict_rounds)" if sp.drafting == "chain"
                                 else "(theory.recorded.predict_tree_rounds)"),
        }
        (others if sp.extra else methods).append(entry)
    floor = real_floor(s.n_images, s.seed)
    checks = _checks(methods)
    return {
        "methods": methods,
        "other_drafts": others,
        "baseline": {"name": "ar", "seconds": ar.stats["seconds"], "tokens_per_target_call": 1.0, **ar_q},
        "floors": {"real_digits_same_n": floor,
                   "manifest_fd_train_n_vs_heldout": _manifest_floor()},
        "costs": {f"{k[0]} ({k[1]} draft)": v[1] for k, v in sources.items()},
        "checks": checks,
        "config": {**{k: v for k, v in dataclasses.asdict(s).items()}, "T": T_IMAGE,
                   "tree_paths": [list(p) for p in tree.paths],
                   "cool_sd_norm": rules.COOL_SD_NORM,
                   "cool_sd_weights": {str(d): [float(rules.cool_sd_schedule(d, s.nu)(i, np)) for i in range(1, s.L + 1)]
                                       for d in s.deltas},
                   "torch": torch.__version__, "python": platform.python_version()},
    }


def _manifest_floor():
    from .checkpoint import read_manifest

    try:
        return read_manifest()["files"]["classifier.safetensors"]["quality"]["fd_train_n_vs_heldout"]
    except KeyError:
        return None


def _checks(methods) -> dict:
    """The demo's pass/fail checks (report["checks"]), computed from the report itself: the vanilla chain
    prediction within 5 %, Cool-SD with delta > 1 accepting more than vanilla, trees over chains."""
    out = {}
    van = find_method(methods, "vanilla", "chain")
    a = van["accepted_length"]
    out["vanilla_chain_prediction_within_5pct"] = {"predicted": a["predicted"], "measured": a["measured"],
                                                    "relative_error": a["relative_error"],
                                                    "z": (a["predicted"] - a["measured"]) / a["measured_se"],
                                                    "pass": bool(abs(a["relative_error"]) < 0.05)}
    cs = []
    for m in methods:
        if m["name"] == "cool-sd" and m["drafting"] == "chain" and m["params"]["delta"] > 1:
            b = m["accepted_length"]
            se = math.hypot(b["measured_se"], a["measured_se"])
            cs.append({"delta": m["params"]["delta"], "measured": b["measured"], "vanilla": a["measured"],
                       "difference_in_se": (b["measured"] - a["measured"]) / se, "pass": bool(b["measured"] > a["measured"])})
    out["cool_sd_delta_gt_1_accepts_more_than_vanilla"] = {"runs": cs, "pass": bool(cs) and all(c["pass"] for c in cs)}
    tv = []
    for m in methods:
        if m["drafting"] == "tree":
            ch = find_method(methods, m["name"], "chain", **m["params"])
            if ch is not None:
                tv.append({"name": m["name"], "params": m["params"], "chain": ch["accepted_length"]["measured"],
                           "tree": m["accepted_length"]["measured"],
                           "pass": bool(m["accepted_length"]["measured"] > ch["accepted_length"]["measured"])})
    out["tree_raises_tokens_per_call_over_chain"] = {"runs": tv, "pass": bool(tv) and all(t["pass"] for t in tv)}
    return out


SWEEPS = {
    "cool-sd": ("delta", (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)),
    "uniform-rsd": ("c", (1.0, 1.25, 1.5, 2.0, 3.0, 4.0)),
    "lantern": ("delta", (0.05, 0.1, 0.2, 0.4, 0.8)),
    "lantern++": ("lambda", (1.5, 2.0, 3.0, 5.0, 8.0)),
    "lantern+G*": ("delta", (0.05, 0.1, 0.2, 0.4, 0.8)),
}


def _sweep_verifier(name: str, value: float, s: Settings, nb):
    """The rule of family ``name`` (theory.methods) with its swept parameter (``SWEEPS``) set to ``value``."""
    from theory import methods

    param = SWEEPS[name][0]
    extra = {"nu": s.nu} if name == "cool-sd" else {"k": s.lantern_k} if methods.get(name).needs_neighbors else {}
    return methods.build(name, s.L, nb, {**extra, param: value})


def sweep_predictions(report: dict, results: dict, s: Settings, max_rounds: int = 600) -> dict:
    """Predicted (tokens per call, per-round TV bound) of each rule family over a parameter sweep, from (a
    seeded subsample of) the vanilla chain records alone: the predicted trade-off curves."""
    from . import vq

    van = next(r for r in results.values() if r.spec is not None and r.spec.record and r.spec.drafting == "chain")
    p, q, d, nd, start = chain_arrays(van.gens, s.L)
    if len(d) > max_rounds:
        idx = np.sort(np.random.default_rng(s.seed).choice(len(d), max_rounds, replace=False))
        p, q, d, nd, start = p[idx], q[idx], d[idx], nd[idx], start[idx]
    nb = rules.lantern_neighbors(vq.raw_codebook().numpy(), s.lantern_k + 1)  # raw vectors, as released
    out = {}
    for name, (param, values) in SWEEPS.items():
        pts = []
        for v in values:
            pr = chain_prediction((p, q, d, nd, start), _sweep_verifier(name, v, s, nb), s.L, s.chain_draft == "eagle",
                                  max_bound_rounds=100)
            pts.append({"param": param, "value": v, "tokens_per_call": pr["tokens_per_call"], "tv_bound": pr["tv_bound"]})
        out[name] = pts
    return out
