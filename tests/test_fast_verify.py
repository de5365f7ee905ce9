"""theory.rules.walks, the fast walks vanilla and greedy supply for themselves (``Verifier.walk``): they give
theory.tree.verify_tree's verdict (vanilla with the point draft law, greedy with any law, vanilla with candidates drawn
without replacement), on static trees and per-round dynamic trees, with depth caps, repeated sibling tokens and peaked
rows; ``verify_round`` takes them; a control (the greedy walk against the vanilla verdict) must be told apart."""
import numpy as np
import pytest
import torch

from theory import rules
from theory.rules import walks
from theory.tree import EAGLE_25, Tree, TreeVerdict, verify_round, verify_tree
from tree_cases import rows, same, tree_case


def verify_tree_fast(verifier, p, q, tokens, u, us, tree, cap, law):
    """The verifier's own walk, as ``verify_round`` calls it (its "device" walk for torch rows)."""
    key = law if isinstance(p, np.ndarray) else "device"
    out = verifier.walk[key](p, q, tokens, u, us, tree.children, int(tree.depth), cap, law)
    return None if out is None else TreeVerdict(*out)


def _case(seed, static, V):
    return tree_case(seed, static, V)


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("V", [4, 50])
def test_fast_walks_equal_verify_tree(static, V):
    n_acc = 0
    for seed in range(150):
        p, q, tokens, u, us, tree, cap = _case(seed, static, V)
        for verifier, law in ((rules.vanilla(), "point"), (rules.greedy(), "point"),
                              (rules.greedy(), "without_replacement"), (rules.vanilla(), "without_replacement")):
            ref = verify_tree(p, q, tokens, u, us, tree, verifier, early_exit=True, max_depth=cap, draft_law=law)
            got = verify_tree_fast(verifier, p, q, tokens, u, us, tree, cap, law)
            assert same(ref, got), (seed, verifier.name, law, ref, got)
            assert same(ref, verify_round(p, q, tokens, u, us, tree, verifier, law=law, max_depth=cap))
            n_acc += int(np.asarray(ref.accepted).sum())
    assert n_acc > 100          # the cases do accept candidates, at several depths


def test_control_is_told_apart():
    """The greedy walk against the vanilla verdict differs on these cases: the comparison above has power."""
    diff = 0
    for seed in range(40):
        p, q, tokens, u, us, tree, cap = _case(seed, False, 50)
        ref = verify_tree(p, q, tokens, u, us, tree, rules.vanilla(), early_exit=True, max_depth=cap, draft_law="point")
        diff += not same(ref, verify_tree_fast(rules.greedy(), p, q, tokens, u, us, tree, cap, "point"))
    assert diff >= 10


def test_walks_are_the_rules_own_and_take_both_kinds_of_arrays():
    """Vanilla and greedy supply walks for every law; scaled rules with G* (Cool-SD, ...), LANTERN++ and LANTERN for the
    point law (LANTERN++ on device rows too); a verifier built from the same rules by hand takes the generic walk, which is
    correct, only slower; on torch rows a walk takes its device form (every node at once, no read-back), and
    ``verify_round`` gives the same verdict as ``verify_tree`` on numpy rows."""
    assert rules.vanilla().walk is not None and rules.greedy().walk is not None
    assert set(rules.scaled(rules.Uniform(2.0)).walk) == set(rules.cool_sd(2.0).walk) == {"point"}
    assert rules.scaled(rules.Uniform(2.0), resample=rules.Residual()).walk is None      # not G*: the generic walk
    nb = rules.lantern_neighbors(np.random.default_rng(0).normal(size=(8, 2)))
    assert set(rules.lantern_pp(nb, 3, 2.0).walk) == {"point", "device"}
    assert set(rules.lantern(nb, 3, 0.1).walk) == {"point"}                            # (numpy rows)
    assert rules.lantern(nb, 3, 0.1, resample="renormalised").walk is None
    import pickle                              # the walks are data: a verifier with one still pickles (user code,
    for v in (rules.cool_sd(2.0), rules.lantern_pp(nb, 3, 2.0), rules.lantern(nb, 3, 0.1)):      # multiprocessing)
        assert set(pickle.loads(pickle.dumps(v)).walk) == set(v.walk)
    assert rules.Verifier(rules.Vanilla(), rules.Residual()).walk is None
    assert set(rules.vanilla().walk) == set(rules.greedy().walk) == {"point", "without_replacement", "device"}
    t0 = [torch.as_tensor(a) for a in _case(1, True, 8)[:5]]
    assert rules.vanilla().walk["point"](*t0, Tree(EAGLE_25).children, 5, None, "point") is None   # host walks: numpy
    p, q, tokens, u, us, tree, cap = _case(1, True, 8)
    t = [torch.as_tensor(a) for a in (p, q, tokens, u, us)]
    ref = verify_tree(p, q, tokens, u, us, tree, rules.vanilla(), early_exit=True, draft_law="point")
    got = verify_round(*t, tree, rules.vanilla(), law="point")
    assert all(isinstance(x, torch.Tensor) for x in got) and same(ref, [x.numpy() for x in got])


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("name", ["greedy", "vanilla"])
def test_device_walks_equal_verify_tree_on_torch_arrays(static, name):
    """Greedy's and vanilla's walks on torch arrays (the engine's device path: every node at once, then the chosen
    children followed, nothing read back) give verify_tree's verdict, as the host walks do, for both draft laws and
    depth caps."""
    n_acc = 0
    verifier = getattr(rules, name)()
    for seed in range(150):
        p, q, tokens, u, us, tree, cap = _case(seed, static, 50)
        t = [torch.as_tensor(a) for a in (p, q, tokens, u, us)]
        tcap = None if cap is None else torch.as_tensor(cap)
        for law in ("point", "without_replacement"):
            ref = verify_tree(p, q, tokens, u, us, tree, verifier, early_exit=True, max_depth=cap, draft_law=law)
            got = verify_tree_fast(verifier, *t, tree, tcap, law)
            assert got is not None and all(isinstance(x, torch.Tensor) for x in got)
            assert same(ref, [x.numpy() for x in got]), (seed, law, ref, got)
            n_acc += int(np.asarray(ref.accepted).sum())
    assert n_acc > 100


@pytest.mark.parametrize("xp_name", ["numpy", "torch"])
def test_greedy_chain_equals_verify_chain(xp_name):
    """Greedy's own chain verdict (``Verifier.chain``, argmaxes only) is ``verify_chain``'s for the greedy rule:
    accepted count, next token and f at the drafts, with ragged draft counts, drafts the target likes, peaked and
    flat rows (a bonus draw that is not the argmax); the vanilla verdict on the same rows differs (the control)."""
    from theory.rules import verify_chain
    from theory.rules.walks import greedy_chain

    rng = np.random.default_rng(3)
    n_acc, n_bonus, differs = 0, 0, 0
    for seed in range(200):
        B, L, V = 4, int(rng.integers(1, 6)), 9
        p = rows(rng, B, L + 1, V, peaked=bool(seed % 2))
        q = rows(rng, B, L, V, peaked=False)
        tokens = rng.integers(0, V, size=(B, L))
        if seed % 3:
            tokens = np.where(rng.random((B, L)) < 0.8, p[:, :L].argmax(-1), tokens)
        u, us = rng.random((B, L)), rng.random(B)
        cap = rng.integers(0, L + 1, size=B) if seed % 4 == 0 else None
        arrays = (p, q, tokens, u, us, cap)
        if xp_name == "torch":
            arrays = tuple(None if a is None else torch.as_tensor(a) for a in arrays)
        ref = verify_chain(*arrays[:5], rules.greedy(), n_drafted=arrays[5], check=False)
        got = greedy_chain(*arrays)
        assert same(ref, got), (seed, ref, got)
        van = verify_chain(*arrays[:5], rules.vanilla(), n_drafted=arrays[5], check=False)
        differs += not same(ref[:2], van[:2])
        n_acc += int(np.asarray(ref.accepted).sum())
        full = np.asarray(ref.accepted) == (L if cap is None else np.asarray(cap))
        n_bonus += int((full & (np.asarray(ref.next_token) != p[np.arange(B), np.asarray(ref.accepted)].argmax(-1))).sum())
    assert n_acc > 200 and n_bonus > 10 and differs > 50
    assert rules.greedy().chain is greedy_chain and rules.vanilla().chain is None


def _lantern_pp_case(seed, static, V):
    rng = np.random.default_rng(10_000 + seed)
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    v = rules.lantern_pp(nb, int(rng.integers(1, V - 1)), float(rng.choice([1.5, 2.0, 5.0])))
    p, q, tokens, u, us, tree, cap = _case(seed, static, V)
    return v, p.astype(np.float32), q.astype(np.float32), tokens, u, us, tree, cap


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("V", [6, 50])
def test_lantern_pp_point_walk_equals_verify_tree(static, V):
    """LANTERN++ as released under the point law (deterministic candidates, the release's qx = 1) walks vanilla's walk
    with its admitted neighbour mass added (``Lantern.sibling_mass``: earlier siblings zeroed, the rest of the row
    rescaled): ``verify_tree``'s verdict (candidate by candidate, the residual renormalised), on static and per-round
    trees, flat and peaked float32 rows, repeated siblings, depth caps; lambda and k drawn so that neighbours are
    admitted (the verdict then differs from vanilla's)."""
    n_acc = n_boost = 0
    for seed in range(120):
        v, p, q, tokens, u, us, tree, cap = _lantern_pp_case(seed, static, V)
        assert "point" in v.walk
        ref = verify_tree(p, q, tokens, u, us, tree, v, early_exit=True, max_depth=cap, draft_law="point")
        got = verify_tree_fast(v, p, q, tokens, u, us, tree, cap, "point")
        assert same(ref, got), (seed, ref, got)
        assert same(ref, verify_round(p, q, tokens, u, us, tree, v, law="point", max_depth=cap))
        n_acc += int(np.asarray(ref.accepted).sum())
        van = verify_tree(p, q, tokens, u, us, tree, rules.vanilla(), early_exit=True, max_depth=cap, draft_law="point")
        n_boost += not same(ref, van)            # the neighbours' mass changed the verdict somewhere
        # the device walk (torch rows): vanilla's, reading LANTERN++'s acceptance at the candidates
        t = [torch.as_tensor(a) for a in (p, q, tokens, u, us)]
        tn = torch.as_tensor(np.asarray(v.accept.neighbors))
        vt = rules.lantern_pp(tn, v.accept.k, v.accept.lam)
        got_t = verify_tree_fast(vt, *t, tree, None if cap is None else torch.as_tensor(cap), "point")
        assert same(ref, [x.numpy() for x in got_t]), (seed, "device")
        assert verify_tree_fast(vt, *t, tree, None, "without_replacement") is None   # the point law's walk only
    assert n_acc > 100 and n_boost >= 20


@pytest.mark.parametrize("first_block", [1, 3])
def test_lantern_pp_point_walk_in_column_blocks(monkeypatch, first_block):
    """The admitted neighbour mass of many entries is summed over blocks of columns (the first SIBLING_BLOCK wide, then
    doubling, the mass carried from block to block, the entries whose prefix stopped leaving): forced here on small
    rows, the verdict is still ``verify_tree``'s."""
    from theory.rules import prefix_mass
    monkeypatch.setattr(prefix_mass, "SMALL_BLOCK", 0)
    monkeypatch.setattr(prefix_mass, "SIBLING_BLOCK", first_block)
    n_acc = 0
    for seed in range(60):
        v, p, q, tokens, u, us, tree, cap = _lantern_pp_case(seed, bool(seed % 2), 50)
        ref = verify_tree(p, q, tokens, u, us, tree, v, early_exit=True, max_depth=cap, draft_law="point")
        assert same(ref, verify_tree_fast(v, p, q, tokens, u, us, tree, cap, "point")), seed
        n_acc += int(np.asarray(ref.accepted).sum())
    assert n_acc > 50


def test_lantern_pp_point_walk_control_unmasked_siblings_are_told_apart():
    """Control: the boost read from the unmasked row (the earlier, rejected siblings' mass still counted among a
    candidate's neighbours) gives other verdicts on the small-vocabulary static cases, where siblings are often
    each other's neighbours; the comparison above must see it."""
    wrong = 0
    for seed in range(120):
        v, p, q, tokens, u, us, tree, cap = _lantern_pp_case(seed, True, 6)

        def unmasked(pr, c, pc, rank_of, left, acc=v.accept):
            return acc.sibling_mass(pr, c, pc, np.zeros_like(rank_of), left)
        planted = rules.Verifier(v.accept, v.resample, "planted", {}, walk=walks.boosted_walks(unmasked))
        ref = verify_tree(p, q, tokens, u, us, tree, v, early_exit=True, max_depth=cap, draft_law="point")
        wrong += not same(ref, verify_tree_fast(planted, p, q, tokens, u, us, tree, cap, "point"))
    assert wrong >= 5


@pytest.mark.parametrize("static", [True, False])
def test_scaled_point_walk_equals_verify_tree(static):
    """Scaled rules with G* (Cool-SD, UniformRSD above and below 1, a linear and an explicit schedule crossing 1) under
    the point law walk vanilla's level walk with the schedule's weight (``scaled_walks``): ``verify_tree``'s verdict on
    random float32 cases with repeated siblings (w < 1 leaves part of a rejected candidate's mass, which a repeat of it
    then meets) and depth caps. Control: the walk with the weight left at 1 (vanilla's) is told apart."""
    verifiers = [rules.cool_sd(2.0), rules.cool_sd(6.0, 0.3), rules.uniform_rsd(1.7), rules.uniform_rsd(0.6),
                 rules.linear_rsd(3.0, 0.5, 32), rules.scaled(rules.Explicit(tuple(1.8 * 0.8 ** i for i in range(32))))]
    n_acc = wrong = 0
    for seed in range(60):
        p, q, tokens, u, us, tree, cap = _case(seed, static, 8 if seed % 2 else 50)
        p, q = p.astype(np.float32), q.astype(np.float32)
        for v in verifiers:
            assert "point" in v.walk
            ref = verify_tree(p, q, tokens, u, us, tree, v, early_exit=True, max_depth=cap, draft_law="point")
            got = verify_tree_fast(v, p, q, tokens, u, us, tree, cap, "point")
            assert same(ref, got), (seed, v.name, v.params, ref, got)
            assert same(ref, verify_round(p, q, tokens, u, us, tree, v, law="point", max_depth=cap))
            n_acc += int(np.asarray(ref.accepted).sum())
            plain = verify_tree_fast(rules.vanilla(), p, q, tokens, u, us, tree, cap, "point")
            wrong += not same(ref, plain)
    assert n_acc > 200 and wrong >= 30
