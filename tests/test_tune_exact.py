"""The exact-law objective, its speed model and tuner (theory.likelihood.objective / speed / exact_tune, the row-scaled
rule, coolsd tune; docs/theory.md section 8c): against an independent enumeration of the SD process, the exact
likelihood, coolsd demo's speed prediction, a planted optimum with a negative control, and the CLI's refusals."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from bruteforce import entropy, optimal_g_rows, scaled_f, sequence_law

pytest.importorskip("jax")

from theory import rules  # noqa: E402
from theory.likelihood import arrows, exact_tune as et, log_likelihood, log_target, objective as ob, speed  # noqa: E402
from theory.likelihood.recorded import Rows  # noqa: E402


def _stamp(L, T, V, conv, **kw):
    return {"model": "chain", "draft": "table", "processing": {"temperature": 1.0}, "L": L, "convention": conv,
            "T": T, "V": V, "method": "vanilla", "per_row": kw.pop("per_row", T), **kw}


def _chain(V, L, seed, alpha=1.0):
    """An order-1 chain: the target P (V, V) and one draft table per offset Q (L, V, V)."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(V, alpha), V), rng.dirichlet(np.full(V, alpha), (L, V))


def _all_rows(P, Qs, T, conv, s0=0):
    """Every sequence of T tokens with its teacher-forced rows (p (n, T, V), q (n, T, L, V)) and P(x)."""
    V, L = P.shape[0], Qs.shape[0]
    x = np.array(list(itertools.product(range(V), repeat=T)), dtype=np.int64)
    pre = np.concatenate([np.full((len(x), 1), s0), x[:, :-1]], axis=1)
    prob = np.prod(P[pre, x], axis=1)
    rows = arrows.ARRows(P[pre], np.stack([Qs[i][pre] for i in range(L)], axis=2), x, _stamp(L, T, V, conv))
    return rows, prob


def _record(P, Qs, T, n_images, seed, conv, s0=0, per_row=None):
    """A vanilla SD run on the chain as a plain loop over rounds, recording each drafted round's rows and start."""
    rng = np.random.default_rng(seed)
    V, L = P.shape[0], Qs.shape[0]
    out = {k: [] for k in ("p", "q", "d", "nd", "image", "start")}
    calls = np.zeros(n_images)                       # target calls per image (every round, drafted or not)
    for img in range(n_images):
        n, prev = 0, s0
        while n < T:
            calls[img] += 1
            Lp = 0 if (conv == "eagle" and n == 0) else min(L, T - n - 1)
            if Lp == 0:
                prev, n = rng.choice(V, p=P[prev]), n + 1
                continue
            p, q, d = np.full((L + 1, V), 1.0 / V), np.full((L, V), 1.0 / V), np.zeros(L, np.int64)
            cur = prev
            for i in range(Lp):
                p[i], q[i] = P[cur], Qs[i][cur]
                d[i] = cur = rng.choice(V, p=q[i])
            p[Lp] = P[cur]
            acc, cur, nxt = 0, prev, None
            for i in range(Lp):
                if rng.random() < min(1.0, P[cur][d[i]] / Qs[i][cur][d[i]]):
                    acc, cur = acc + 1, d[i]
                    continue
                r = np.maximum(P[cur] - Qs[i][cur], 0)
                nxt = rng.choice(V, p=r / r.sum())
                break
            nxt = rng.choice(V, p=P[cur]) if nxt is None else nxt
            for k, v in zip(out, (p, q, d, Lp, img, n)):
                out[k].append(v)
            n, prev = n + acc + 1, nxt
    rows = Rows(*(np.array(out[k]) for k in ("p", "q", "d", "nd", "image")))
    rec = arrows.StampedRecord(rows, np.array(out["start"]), _stamp(L, T, V, conv, per_row=per_row or T))
    rec.calls = calls
    return rec


def _scalar_f(family, theta, L):
    """The family's rule written as scalar code (independent of theory.rules): f(i, p, q) -> list."""
    sig = lambda t: 1.0 / (1.0 + math.exp(-t))   # noqa: E731
    if family == "free":
        return lambda i, p, q: scaled_f(math.exp(theta[i - 1]), p, q)
    if family == "exponential":
        return lambda i, p, q: scaled_f(math.exp(theta[0] - theta[1] * (i - 1)), p, q)
    if family == "level":
        return lambda i, p, q: [v + sig(theta[i - 1]) * (1 - v) for v in scaled_f(1.0, p, q)]
    if family == "entropy":
        return lambda i, p, q: scaled_f(math.exp(theta[i - 1] + theta[L] * entropy(p)), p, q)
    if family == "maxp":
        return lambda i, p, q: scaled_f(math.exp(theta[i - 1] + theta[L] * max(p)), p, q)
    raise KeyError(family)


def _bruteforce(P, Qs, T, conv, family, theta):
    """(KL(P||P^) per token, TV) by enumerating the SD process (bruteforce.sequence_law) and the target's law."""
    L = Qs.shape[0]
    last = lambda pre: pre[-1] if pre else 0   # noqa: E731
    law = sequence_law(lambda pre: P[last(pre)], lambda pre, i: Qs[i - 1][last(pre)], _scalar_f(family, theta, L),
                       optimal_g_rows, L, T, conv)
    kl = tv = 0.0
    for x in itertools.product(range(P.shape[0]), repeat=T):
        px = math.prod(P[last(x[:t])][x[t]] for t in range(T))
        kl += px * (math.log(px) - math.log(law[x])) / T
        tv += max(px - law.get(x, 0.0), 0.0)
    return kl, tv


# --------------------------------------------------------------------------- the objective is the exact law

@pytest.mark.parametrize("family, conv, V, T", [("free", "eagle", 3, 4), ("entropy", "theory", 3, 4),
                                                 ("level", "eagle", 4, 3), ("exponential", "theory", 3, 4)])
def test_kl_tv_and_gradient_match_the_enumerated_process(family, conv, V, T):
    """On a small Markov chain: KL(P||P^) and TV of ``ExactObjective`` over every sequence weighted by P(x) equal the
    enumeration of the SD process (bruteforce.sequence_law), and their JAX gradients equal central differences of it."""
    L = 2
    P, Qs = _chain(V, L, seed=V + T)
    rows, prob = _all_rows(P, Qs, T, conv)
    theta = np.random.default_rng(1).normal(0.6, 0.5, ob.n_params(family, L))
    obj = ob.ExactObjective(rows, family, weights=prob)
    (v, g) = obj.value_and_grad(theta)
    kl, tv = _bruteforce(P, Qs, T, conv, family, theta)
    assert v["kl"] == pytest.approx(kl, rel=1e-10) and v["tv"] == pytest.approx(tv, rel=1e-10)
    assert kl > 1e-4                                            # a relaxed rule: the check has something to see
    h = 1e-5
    pairs = [(_bruteforce(P, Qs, T, conv, family, theta + h * e), _bruteforce(P, Qs, T, conv, family, theta - h * e))
             for e in np.eye(theta.size)]
    for k, name in enumerate(("kl", "tv")):
        fd = [(a[k] - b[k]) / (2 * h) for a, b in pairs]
        np.testing.assert_allclose(g[name], fd, rtol=1e-5, atol=1e-9)
        assert np.max(np.abs(g[name])) > 1e-4


def _random_rows(rng, n, T, V, L, per_offset, conv, dtype, zp=0.25):
    def r(*shape):
        a = rng.gamma(rng.choice([0.3, 1.0]), size=shape)
        a[rng.random(shape) < zp] = 0.0
        a[..., 0] += 1e-3
        return (a / a.sum(-1, keepdims=True)).astype(dtype)
    p = r(n, T, V)
    q = r(n, T, L, V) if per_offset else r(n, T, V)
    pp = p.astype(np.float64)
    x = np.array([[rng.choice(V, p=row / row.sum()) for row in img] for img in pp])
    return arrows.ARRows(p, q, x, _stamp(L, T, V, conv))


@pytest.mark.parametrize("per_offset, conv, dtype, families", [
    (True, "eagle", np.float64, ob.FAMILIES), (True, "eagle", np.float32, ("free", "entropy")),
    (False, "theory", np.float64, ("free", "level"))])
def test_objective_is_log_likelihood_on_the_familys_rule(per_offset, conv, dtype, families):
    """Per image, log P^ of the objective equals ``log_likelihood`` on ``rule_of(family, theta)`` (the engine's rule
    objects) on random rows with zeros (float64 and float32 model rows, EAGLE-shaped q or not, chunks with padding)."""
    rng = np.random.default_rng(7)
    L, T, V = 3, 7, 6
    rows = _random_rows(rng, 7, T, V, L, per_offset, conv, dtype)
    for fam in families:
        theta = rng.normal(0.4, 0.8, ob.n_params(fam, L))
        obj = ob.ExactObjective(rows, fam, chunk_images=3)
        ref = log_likelihood(rows.p, rows.q, rows.tokens, ob.rule_of(fam, theta, L), L, convention=conv)
        mine = obj.log_p_hat(theta)
        assert np.array_equal(np.isneginf(mine), np.isneginf(ref))
        fin = np.isfinite(ref)
        np.testing.assert_allclose(mine[fin], ref[fin], rtol=1e-11)
        np.testing.assert_allclose(obj.log_p(), log_target(rows.p, rows.tokens), rtol=1e-12)


def test_streamed_chunks_equal_in_memory():
    """A source made chunk by chunk (``keep=False``: the memory-bounded path) gives the in-memory values."""
    rng = np.random.default_rng(3)
    rows = _random_rows(rng, 9, 7, 6, 3, True, "eagle", np.float64)

    class Stream:
        stamp, n = rows.stamp, rows.n

        def chunk(self, a, b):
            return rows.p[a:b], rows.q[a:b], rows.tokens[a:b]
    theta = np.array([0.9, 0.2, 0.5])
    a = ob.ExactObjective(rows, "free", chunk_images=4).values(theta)
    b = ob.ExactObjective(Stream(), "free", chunk_images=4, keep=False).values(theta)
    assert a == pytest.approx(b, rel=1e-13)


# --------------------------------------------------------------------------- the row-conditioned rule

@pytest.mark.parametrize("feature", ["entropy", "maxp"])
def test_row_scaled_rule_against_bruteforce(feature):
    """``rules.row_scaled``: log_likelihood against the enumerated process with the rule written as scalar code,
    verify_chain's decisions and replacement against the scalar f and G*, torch = numpy, and verify_tree runs it."""
    import torch

    from theory.tree import Tree, verify_tree

    rng = np.random.default_rng(11)
    V, T, L = 3, 4, 2
    P, Qs = _chain(V, L, seed=5, alpha=0.7)
    c, b = (1.7, 2.6), (0.9 if feature == "entropy" else -2.0)
    v = rules.row_scaled(list(c), b, feature)
    theta = np.r_[np.log(c), b]
    f_rule = _scalar_f(feature, theta, L)
    for conv in ("theory", "eagle"):
        rows, _ = _all_rows(P, Qs, T, conv)
        last = lambda pre: pre[-1] if pre else 0   # noqa: E731
        law = sequence_law(lambda pre: P[last(pre)], lambda pre, i: Qs[i - 1][last(pre)], f_rule, optimal_g_rows, L, T,
                           conv)
        exact = np.array([law.get(tuple(s), 0.0) for s in rows.tokens])
        np.testing.assert_allclose(np.exp(log_likelihood(rows.p, rows.q, rows.tokens, v, L, convention=conv)), exact,
                                   rtol=1e-10, atol=1e-15)
    # verify_chain: f at the drafts, tau and the replacement token, round by round
    p = rng.dirichlet(np.ones(V), (50, L + 1))
    q = rng.dirichlet(np.ones(V), (50, L))
    d = np.array([[rng.choice(V, p=qq) for qq in qr] for qr in q])
    u, us = rng.random((50, L)), rng.random(50)
    out = rules.verify_chain(p, q, d, u, us, v)
    for k in range(50):
        f = [f_rule(i + 1, list(p[k, i]), list(q[k, i]))[d[k, i]] for i in range(L)]
        np.testing.assert_allclose(out.f_drafted[k], f, rtol=1e-12)
        tau = next((i for i in range(L) if not u[k, i] < f[i]), L)
        assert out.accepted[k] == tau
        row = p[k, L] if tau == L else optimal_g_rows(list(p[k, tau]), list(q[k, tau]),
                                                      f_rule(tau + 1, list(p[k, tau]), list(q[k, tau])))
        assert out.next_token[k] == int(np.sum(np.cumsum(row) <= us[k] * np.sum(row)))
    ft = v.accept(torch.as_tensor(p[:, :L]), torch.as_tensor(q), torch.arange(1, L + 1))
    np.testing.assert_allclose(ft.numpy(), v.accept(p[:, :L], q, np.arange(1, L + 1)), rtol=1e-12)
    tree = Tree(((0,), (1,), (0, 0)))               # two candidates at the root, one below the first
    pt, qt = rng.dirichlet(np.ones(V), (20, 4)), rng.dirichlet(np.ones(V), (20, 4))
    first = np.array([rng.choice(V, 2, replace=False, p=qq) for qq in qt[:, 0]])
    toks = np.stack([np.zeros(20, int), first[:, 0], first[:, 1], [rng.choice(V, p=qq) for qq in qt[:, 1]]], axis=1)
    res = verify_tree(pt, qt, toks, rng.random((20, 4)), rng.random(20), tree, v)
    assert np.all((np.asarray(res.accepted) >= 0) & (np.asarray(res.accepted) <= 2))


def test_row_scaled_method_and_schedule_files(tmp_path):
    from theory.rules import methods

    v = methods.build("row-scaled", 2, schedule="maxp:-1.5:2,1.2")
    assert isinstance(v.accept, rules.RowScaled) and v.accept.feature == "maxp" and v.accept.slope == -1.5
    s = tmp_path / "e.json"
    s.write_text(json.dumps({"rule": "row-scaled", "weights": [2.0, 1.2], "slope": 0.3, "feature": "entropy"}))
    assert methods.row_schedule_value(str(s)) == methods.RowSchedule((2.0, 1.2), 0.3, "entropy")
    with pytest.raises(ValueError, match="--method row-scaled --schedule"):
        methods.weights_value(str(s))                         # a row schedule never runs as plain weights
    assert isinstance(methods.build("row-scaled", 3).accept, rules.RowScaled)       # unset: c = 1, b = 0
    with pytest.raises(ValueError, match="2 weights given for draft length L=3"):
        methods.build("row-scaled", 3, schedule=str(s))


# --------------------------------------------------------------------------- speed: coolsd demo's prediction

def test_speed_model_is_chain_prediction():
    """Predicted tokens per call of the speed model = ``coolsd.studies.demo.predict.chain_prediction`` on the same
    record with the family's rule object (scaled, level, row families), and its JAX gradient = central differences."""
    from coolsd.studies.demo.predict import chain_prediction

    P, Qs = _chain(4, 3, seed=2)
    rec = _record(P, Qs, 12, 150, seed=4, conv="eagle", per_row=4)
    sm = speed.SpeedModel(rec)
    r = rec.rows
    arrays = (r.p, r.q, r.drafts, r.n_drafted, rec.start)
    rng = np.random.default_rng(0)
    for fam in ("free", "level", "entropy"):
        theta = rng.normal(0.5, 0.5, ob.n_params(fam, 3))
        ref = chain_prediction(arrays, ob.rule_of(fam, theta, 3), 3, True, T=12, per_row=4)["tokens_per_call"]
        mine = float(sm.tokens_per_call(et.f_at_drafts(sm, fam, theta, 3)))
        assert mine == pytest.approx(ref, rel=1e-12)
        fn = et._speed_fn(sm, fam, 3)
        v, g = fn(theta)
        assert v == pytest.approx(ref, rel=1e-12)
        fd = [(sm.tokens_per_call(et.f_at_drafts(sm, fam, theta + 1e-6 * e, 3))
               - sm.tokens_per_call(et.f_at_drafts(sm, fam, theta - 1e-6 * e, 3))) / 2e-6 for e in np.eye(theta.size)]
        np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-8)
    boot = sm.bootstrap(et.f_at_drafts(sm, "free", np.zeros(3), 3), n_boot=200)
    assert boot["ci95"][0] < boot["tokens_per_call"] < boot["ci95"][1]
    # vanilla's prediction against the run itself: T / mean target calls per image (prefill and end rounds included)
    measured = 12 / rec.calls.mean()
    se = 12 * rec.calls.std(ddof=1) / math.sqrt(rec.calls.size) / rec.calls.mean() ** 2
    assert abs(boot["tokens_per_call"] - measured) < 3 * se and se < 0.03 * measured


# --------------------------------------------------------------------------- the tuner: a planted optimum

V_P, L_P, T_P = 3, 2, 5
ROW_P = np.array([0.6, 0.39, 0.01])


def _planted(q1, q2, seed=3):
    """Context-free rows: every sequence of T_P tokens weighted by P(x) (the exact KL, no sampling noise), and a
    simulated vanilla record. Returns (objective, speed callable, bound callable, record)."""
    P = np.tile(ROW_P, (V_P, 1))
    Qs = np.stack([np.tile(q1, (V_P, 1)), np.tile(q2, (V_P, 1))])
    rows, prob = _all_rows(P, Qs, T_P, "theory")
    rec = _record(P, Qs, T_P, 400, seed, "theory")
    sm = speed.SpeedModel(rec)
    obj = ob.ExactObjective(rows, "free", weights=prob)
    return obj, sm, et._fidelity_fn(obj, "kl"), et._speed_fn(sm, "free", L_P), et._bound_fn(rec, "free", L_P)


def test_planted_optimum_is_recovered_and_the_bound_misses_it():
    """Rows where relaxing position 1 admits a token the target almost never emits (p = 0.01, q_1 = 0.2: costly) and
    position 2 an over-drafted likely one (p = 0.39, q_2 = 0.65: cheap). At a target speed the KL-optimal schedule is
    found by an exhaustive search independent of the tuner (w_1 on a bracket, w_2 solved for the speed, KL minimised
    by golden section on values only); the tuner (SLSQP, JAX gradients) must reach it. Negative control: the bound
    objective (T11, section 8b) at the same speed puts the relaxation elsewhere and its KL is >= 10% worse. Second
    plant: q_1 = p, so position 1 cannot be relaxed: the optimum is w_2 alone, solved in one dimension."""
    from scipy.optimize import brentq, minimize_scalar

    obj, sm, fid, spd, bnd = _planted(np.array([0.5, 0.3, 0.2]), np.array([0.3, 0.65, 0.05]))
    van, top = spd(np.zeros(2))[0], sm.tokens_per_call(sm.f_max())
    target = van + 0.3 * (top - van)
    speed_np = lambda th: sm.tokens_per_call(et.f_at_drafts(sm, "free", np.asarray(th), 2))   # noqa: E731

    def kl_at(l1):
        l2 = brentq(lambda l2: speed_np([l1, l2]) - target, -12, 12, xtol=1e-13)
        return obj.values(np.array([l1, l2]))["kl"], l2
    ref = minimize_scalar(lambda l1: kl_at(l1)[0], bounds=(0.5, 3.5), method="bounded", options={"xatol": 1e-7})
    kl_ref, l2_ref = kl_at(ref.x)
    theta, _, _ = et.search(fid, spd, "free", 2, "target", target)
    assert spd(theta)[0] == pytest.approx(target, rel=1e-9)
    np.testing.assert_allclose(theta, [ref.x, l2_ref], atol=2e-3)
    assert obj.values(theta)["kl"] == pytest.approx(kl_ref, rel=1e-6)
    assert np.exp(theta[0]) > 3 and np.exp(theta[1]) > 1.05          # both positions relaxed at the optimum
    tb, _, _ = et.search(bnd, spd, "free", 2, "target", target)        # negative control: the per-round bound
    assert spd(tb)[0] == pytest.approx(target, rel=1e-9)
    assert abs(tb[1] - theta[1]) > 0.1 and obj.values(tb)["kl"] > 1.1 * kl_ref
    # only position 2 can be relaxed (q_1 = p: f_1 = 1 already)
    obj, sm, fid, spd, _ = _planted(ROW_P, np.array([0.3, 0.65, 0.05]), seed=5)
    target = spd(np.zeros(2))[0] + 0.1
    l2 = brentq(lambda l2: spd(np.array([0.0, l2]))[0] - target, -12, 12, xtol=1e-13)
    theta, _, _ = et.search(fid, spd, "free", 2, "target", target)
    assert theta[0] > -1e-6 and theta[1] == pytest.approx(l2, abs=1e-6)
    assert obj.values(theta)["kl"] == pytest.approx(obj.values(np.array([0.0, l2]))["kl"], rel=1e-8)


# --------------------------------------------------------------------------- refusals (theory and CLI)

def _inputs(seed=0):
    """Small AR rows (an order-1 chain, EAGLE-shaped q) whose rows sum to 1 within float32 rounding but not exactly
    (so vanilla's law is not exactly P: the lossless member has a small positive TV), and a vanilla record."""
    V, L, T = 4, 2, 6
    P, Qs = _chain(V, L, seed=seed + 20)
    rng = np.random.default_rng(seed)
    n = 40
    x = np.zeros((n, T), np.int64)
    prev = np.zeros(n, np.int64)
    for t in range(T):
        x[:, t] = [rng.choice(V, p=P[s]) for s in prev]
        prev = x[:, t]
    pre = np.concatenate([np.zeros((n, 1), np.int64), x[:, :-1]], axis=1)
    p = P[pre] * (1 + 2e-7)                      # within float32 rounding of 1, as model rows are
    q = np.stack([Qs[i][pre] for i in range(L)], axis=2) * (1 - 2e-7)
    ar = arrows.ARRows(p, q, x, _stamp(L, T, V, "eagle"))
    return ar, _record(P, Qs, T, 60, seed=seed + 1, conv="eagle")


def test_tuner_refusals():
    ar, rec = _inputs()
    call = lambda **kw: et.tune_exact(kw.pop("ar", ar), kw.pop("rec", rec), kw.pop("family", "free"), **kw)  # noqa: E731
    for kw, match in [({"kl_budget": 0.0}, "kl_budget must be > 0"), ({"tv_budget": -1.0}, "tv_budget must be > 0"),
                      ({"kl_budget": float("nan")}, "kl_budget"), ({}, "exactly one of"),
                      ({"kl_budget": 0.1, "tokens_per_call": 2.0}, "exactly one of"),
                      ({"objective": "tv", "kl_budget": 0.1}, "bounds the KL"),
                      ({"tokens_per_call": 50.0}, "outside the reachable range"),
                      ({"family": "nope", "tokens_per_call": 2.0}, "family must be one of"),
                      ({"ar": None, "kl_budget": 0.1}, "needs the teacher-forced rows"),
                      ({"rec": rec.rows, "kl_budget": 0.1}, "stamped chain record")]:
        with pytest.raises(ValueError, match=match):
            call(**kw)
    bad = arrows.ARRows(ar.p, ar.q, ar.tokens, {**ar.stamp, "processing": {"temperature": 0.5}}, checked=True)
    with pytest.raises(ValueError, match="differ in 'processing'"):
        call(ar=bad, kl_budget=0.1)
    other = arrows.StampedRecord(rec.rows, rec.start, {**rec.stamp, "method": "cool-sd"})
    with pytest.raises(ValueError, match="needs vanilla rounds"):
        call(rec=other, kl_budget=0.1)
    with pytest.raises(ValueError, match="unreachable: the smallest TV in family 'free' on these images is") as e:
        call(tv_budget=1e-12)
    floor = float(str(e.value).split(" is ")[-1].split()[0])
    assert 1e-12 < floor < 1e-5                       # the lossless member's TV: float32-level row sums
    res = call(tv_budget=2 * floor + 0.05)            # a reachable budget: met on the fit images, speed above vanilla
    assert res.fit["tv"] == pytest.approx(2 * floor + 0.05, rel=1e-7) and res.tokens_per_call > res.vanilla_tokens_per_call
    assert res.heldout["tv"]["measured"] is not None and res.heldout["images"] == ar.n - res.fit["images"]


def _cli_files(tmp_path):
    from coolsd.rowfiles import save_ar_rows, save_record

    ar, rec = _inputs()
    r = rec.rows
    save_ar_rows(tmp_path / "ar.npz", ar)
    save_record(tmp_path / "rec.npz", {"p": r.p, "q": r.q, "drafts": r.drafts, "n_drafted": r.n_drafted,
                                       "image": r.image, "start": rec.start, "stamp": np.array(json.dumps(rec.stamp))})
    return ar, rec


def _one_line_error(capsys, match):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("coolsd: error:") and match in err[0], err


def test_cli_refusals_write_nothing(tmp_path, capsys):
    from coolsd.cli import main
    from coolsd.rowfiles import save_ar_rows

    ar, _ = _cli_files(tmp_path)
    base = ["tune", "--record", str(tmp_path / "rec.npz"), "--ar-rows", str(tmp_path / "ar.npz")]
    out = tmp_path / "s.json"
    before = (tmp_path / "ar.npz").read_bytes()
    for argv, match in [(["--kl-budget", "0"], "--kl-budget must be > 0"), (["--kl-budget", "-0.5"], "--kl-budget"),
                        (["--tv-budget", "1e-12"], "unreachable"), (["--objective", "tv", "--kl-budget", "0.1"],
                                                                    "--objective kl"),
                        (["--tokens-per-call", "40"], "outside the reachable range")]:
        assert main(base + argv + ["--out", str(out)]) == 2
        _one_line_error(capsys, match)
        assert not out.exists()
    assert main(base + ["--kl-budget", "0.1", "--out", str(tmp_path / "ar.npz")]) == 2       # output = an input
    _one_line_error(capsys, "may not overwrite an input")
    assert main(base + ["--kl-budget", "0.1", "--out", str(tmp_path / "rec.npz")]) == 2
    _one_line_error(capsys, "may not overwrite an input")
    assert (tmp_path / "ar.npz").read_bytes() == before
    mism = arrows.ARRows(ar.p, ar.q, ar.tokens, {**ar.stamp, "model": "other"}, checked=True)
    save_ar_rows(tmp_path / "other.npz", mism)
    assert main(["tune", "--record", str(tmp_path / "rec.npz"), "--ar-rows", str(tmp_path / "other.npz"),
                 "--kl-budget", "0.1", "--out", str(out)]) == 2
    _one_line_error(capsys, "stamps differ in 'model'")
    assert not out.exists()


def test_cli_writes_schedules_generate_reads(tmp_path, capsys):
    from coolsd.cli import main
    from theory.rules import methods

    _cli_files(tmp_path)
    base = ["tune", "--record", str(tmp_path / "rec.npz"), "--ar-rows", str(tmp_path / "ar.npz")]
    out = tmp_path / "s.json"
    assert main(base + ["--kl-budget", "0.02", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "predicted tokens per call" in text and "95% CI" in text and "held out" in text
    d = json.loads(out.read_text())
    assert d["rule"] == "scaled" and d["objective"] == "kl" and d["mode"] == "budget" and len(d["weights"]) == 2
    assert d["fit"]["kl"] <= 0.02 * (1 + 1e-7) and d["stamp"]["model"] == "chain" and d["heldout"]["images"] > 0
    assert len(d["fit_images"]) + len(d["heldout_images"]) == 40
    assert methods.weights_value(str(out)) == tuple(d["weights"])               # coolsd generate --weights S.json
    row = tmp_path / "e.json"
    assert main(base + ["--family", "entropy", "--tokens-per-call", str(d["predicted_tokens_per_call"]),
                        "--out", str(row), "--json"]) == 0
    e = json.loads(capsys.readouterr().out)
    assert e["rule"] == "row-scaled" and e["predicted_tokens_per_call"] == pytest.approx(d["predicted_tokens_per_call"])
    assert methods.row_schedule_value(str(row)).slope == e["slope"]          # coolsd generate --schedule S.json


@pytest.mark.parametrize("first_single", [False, True])
def test_expected_rounds_under_jax_is_one_scan_whatever_T(first_single):
    """``speed.expected_rounds`` under JAX equals the numpy run (the same step) and its graph does not grow with T:
    the unrolled loop over the T positions compiled T copies (tune on a 256-token V = 16,384 record passed 4 GB
    while JAX compiled). Control: a changed survival curve changes the value."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(1)
    S = np.minimum.accumulate(rng.uniform(0.2, 1.0, size=(24, 4)), axis=1)
    eqns = {}
    for T in (49, 576):
        ref = speed.expected_rounds(S, 4, first_single, T=T, per_row=24)
        with jax.enable_x64(True):
            got = speed.expected_rounds(jnp.asarray(S), 4, first_single, T=T, per_row=24)
            eqns[T] = len(jax.make_jaxpr(lambda s: speed.expected_rounds(s, 4, first_single, T=T,
                                                                        per_row=24)["rounds"])(jnp.asarray(S)).eqns)
        for k in ("rounds", "draft_steps", "single_steps", "tokens_per_call"):
            assert abs(float(got[k]) - float(ref[k])) <= 1e-12 * max(1.0, abs(float(ref[k]))), k
        S2 = S.copy()
        S2[0, 0] *= 0.5
        assert abs(speed.expected_rounds(S2, 4, first_single, T=T, per_row=24)["rounds"] - ref["rounds"]) > 1e-6
    assert eqns[49] == eqns[576] < 60, eqns


def test_bound_objective_in_chunks_of_rounds_equals_the_whole_record(monkeypatch):
    """``exact_tune._bound_fn`` sums its value and gradient over chunks of rounds of one compiled shape, the last one
    padded with weight-0 copies: a record cut into 7-round chunks (with a padded tail) gives the one-chunk values and
    gradients, and the mean of ``predict_rounds``' bound on numpy. Control: counting the padding changes the value."""
    from theory.likelihood.recorded import predict_rounds

    P, Qs = _chain(5, 2, 11)
    rec = _record(P, Qs, 6, 12, 2, "theory")
    L, R = rec.L, rec.rows.R
    assert R > 7 and R % 7, R                             # several chunks, the last one padded
    theta = np.array([0.3, -0.2])
    whole = et._bound_fn(rec, "free", L)(theta)
    monkeypatch.setattr(et, "BOUND_CHUNK_ENTRIES", 7 * (L + 1) * 5)
    cut = et._bound_fn(rec, "free", L)(theta)
    r = rec.rows
    ref = predict_rounds(r.p, r.q, r.drafts, ob.rule_of("free", theta, L), n_drafted=r.n_drafted).bound
    assert abs(cut[0] - whole[0]) <= 1e-13 and np.allclose(cut[1], whole[1], rtol=0, atol=1e-13)
    assert abs(whole[0] - float(np.mean(ref))) <= 1e-13
    padded = -(-R // 7) * 7                               # the control: the mean over the padded rounds
    last = float(ref[-1])
    assert abs((whole[0] * R + (padded - R) * last) / padded - whole[0]) > 1e-9
