"""The device path (issue 42) forced on the CPU: the same greedy tokens as the host path in every mode at B = 1 and
B = 4, its sync-inducing operations per round counted exactly (``real.decode.opcount``), and a control that an
extra ``.item()`` in the round is caught."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from real.decode import engine
from real.decode import round as rnd
from real.decode.dynamic_tree import DynamicTree
from real.decode.opcount import OpCounter
from real.decode.phases import phase
from real.decode.sampling import Processing
from real.nn import devpath
from real.registry import tiny_llamagen_pair
from theory import rules
from theory.tree import EAGLE_25, Tree

GREEDY = Processing(temperature=0.0, cfg_scale=2.0)
MODES = {"chain": lambda: 4, "eagle25": lambda: Tree(EAGLE_25), "dynamic": lambda: DynamicTree(26, 4, 4)}


@pytest.fixture(scope="module")
def pair():
    return tiny_llamagen_pair(seed=0)


def _gen(pair, mode, B, T=16, **kw):
    t, d = pair
    return engine.generate(t, d, list(range(B)), num_tokens=T, verifier=rules.greedy(), drafting=MODES[mode](),
                           processing=GREEDY, batch_size=B, **kw)


@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_device_path_tokens_equal_host_path(pair, mode, B):
    host = _gen(pair, mode, B, device_path=False)
    dev = _gen(pair, mode, B, device_path=True)
    for a, b in zip(host, dev):
        assert torch.equal(a.tokens, b.tokens)
        assert [r.accepted for r in a.rounds] == [r.accepted for r in b.rounds]
    assert sum(r.accepted for g in host for r in g.rounds) > 0        # drafts were accepted: the walk was exercised


def test_the_device_path_is_decided_in_one_place(monkeypatch):
    monkeypatch.delenv(devpath.ENV, raising=False)
    v = rules.greedy()
    assert devpath.host_verification("cpu", v) and devpath.host_path("cpu")
    monkeypatch.setenv(devpath.ENV, "1")
    assert not devpath.host_verification("cpu", v) and not devpath.host_path("cpu")
    with devpath.force(False):                       # the API flag wins over the environment
        assert devpath.host_verification("cpu", v)
    monkeypatch.setenv(devpath.ENV, "0")
    with devpath.force(True):
        assert not devpath.host_path("cpu")
    assert devpath.host_path("cpu")


def test_counter_counts_in_place_kernels_and_not_views():
    """Every kernel counts, in-place ones too (``add_``, ``copy_``, an indexed write): each is a launch on CUDA; views
    and ``.to`` to the tensor's own dtype are not kernels."""
    x, y = torch.zeros(4), torch.ones(4)
    with OpCounter() as c:
        with phase("target"):
            x.add_(1.0)                       # 1
            x.copy_(y)                        # 1
            x[torch.tensor([1, 2])] = 3.0     # index_put_ (and the index tensor's own lift: not a kernel): 1
            x.mul_(2.0).clamp_(max=5.0)       # 2
            x.view(2, 2).t()                  # views: 0
            x.to(torch.float32)               # the same dtype: no op at all
            x + y                             # 1
    assert dict(c.names["target", "ops"]) == {"add_": 1, "copy_": 1, "index_put_": 1, "mul_": 1, "clamp_": 1,
                                                "add": 1}


def test_counter_classifies_sync_inducing_operations():
    x = torch.arange(6.0)
    with OpCounter() as c:
        with phase("verify"):
            x.sum().item()                                 # d2h
            bool(x[0] > 1)                                 # d2h (is_nonzero)
            x.view(2, 3).t()                               # views: nothing
            x[x > 2]                                       # boolean index: shape (and the comparison: 1 op)
            torch.nonzero(x)                               # shape
            torch.as_tensor(np.arange(3), device="cpu")    # h2d
            x.cpu().numpy()                                # one read
            x[np.array([0, 1])]                            # a host index: h2d (and the gather: 1 op)
    t = c.table()["verify"]
    assert (t["d2h"], t["shape"], t["h2d"]) == (3, 2, 2)
    assert c.table()["draft"]["syncs"] == 0


def _count(pair, mode, B=1, T=16):
    with OpCounter() as c:
        gens = _gen(pair, mode, B, T, device_path=True)
    return c, gens


# sync-inducing operations of the device path, tiny LlamaGen, greedy, 16 tokens, B = 1 (exact: any change to the
# round's syncs shows here; benchmarks/bench_ops.py prints the full table)
SYNCS = {"chain": {"draft": 0, "target": 0, "verify": 0, "bookkeeping": 7},
         "eagle25": {"draft": 0, "target": 0, "verify": 0, "bookkeeping": 5},
         "dynamic": {"draft": 0, "target": 0, "verify": 0, "bookkeeping": 5}}
# bookkeeping: the verdict's one read-back per round (a dynamic tree's parents and the prefill's finiteness ride
# on it).
# (before issue 42's reductions: chain 48 / 8 / 14 / 28, eagle25 131 / 12 / 43 / 24, dynamic 103 / 13 / 37 / 31;
# then chain 20 / 2 / 0 / 7, eagle25 85 / 7 / 6 / 8, dynamic 41 / 7 / 1 / 8 before the non-blocking copies of
# real.nn.devpath.to_device, the device-side mask check of real.nn.masks and the static tree's device children)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_device_path_sync_count_per_round(pair, mode):
    c, gens = _count(pair, mode)
    t = c.table()
    got = {ph: t[ph]["syncs"] for ph in SYNCS[mode]}
    assert got == SYNCS[mode], (got, {f"{p}/{k}": dict(v) for (p, k), v in c.names.items() if k != "ops"})


def test_an_extra_item_in_the_round_is_caught(pair, monkeypatch):
    before, _ = _count(pair, "eagle25")
    calls = []
    settle = rnd.settle

    def settle_and_read(run, prop, hidden, v, *a, **k):
        calls.append(1)
        torch.as_tensor(v.next_token).sum().item()           # the extra read-back
        return settle(run, prop, hidden, v, *a, **k)

    monkeypatch.setattr(rnd, "settle", settle_and_read)
    after, _ = _count(pair, "eagle25")
    assert len(calls) >= 2
    assert after.table()["bookkeeping"]["d2h"] - before.table()["bookkeeping"]["d2h"] == len(calls)
    assert after.syncs() - before.syncs() == len(calls)
    assert after.rounds == before.rounds


def test_to_device_is_an_asynchronous_copy_and_masks_are_checked_on_the_device():
    """``real.nn.devpath.to_device``: on the device path a copy counted as ``h2d_async`` (pinned + non-blocking on
    CUDA: no sync), where ``torch.as_tensor(x, device=...)`` counts as a sync; on the host path a plain tensor.
    ``real.nn.masks.check_attn_mask`` on the device path asserts on the device (no read-back), and still refuses a
    mask whose new tokens do not see themselves."""
    from real.nn.masks import check_attn_mask

    a = np.arange(4)
    with devpath.force(True), OpCounter() as c:
        t = devpath.to_device(a, "cpu")
        a[0] = 7                                                   # the copy does not follow its source
        torch.as_tensor(a, device="cpu")                           # the blocking copy: a sync
        check_attn_mask(torch.ones(2, 2, dtype=torch.bool).tril(), 2, 0, torch.device("cpu"))   # nothing read
    tab = c.table()["total"]
    assert (tab["h2d_async"], tab["h2d"], tab["syncs"]) == (1, 1, 1) and t.tolist() == [0, 1, 2, 3]
    with devpath.force(True), pytest.raises(RuntimeError, match="attend to itself"):
        check_attn_mask(torch.zeros(2, 2, dtype=torch.bool), 2, 0, "cpu")
    with devpath.force(False), pytest.raises(ValueError, match="attend to itself"):
        check_attn_mask(torch.zeros(2, 2, dtype=torch.bool), 2, 0, "cpu")
    with devpath.force(False):
        assert devpath.to_device(a, "cpu").tolist() == [7, 1, 2, 3]


def test_dynamic_tree_records_on_the_device_path_equal_the_host_paths(pair):
    """The dynamic tree's parents stay on the device and come back with the verdict's one read-back: the recorded
    rounds (parents, accepted nodes, drafted counts) and tokens equal the host path's, greedy and T = 1, B = 3."""
    t, d = pair
    for proc, rule in ((GREEDY, rules.greedy()), (Processing(temperature=1.0, cfg_scale=2.0), rules.vanilla())):
        host, dev = (engine.generate(t, d, [0, 1, 2], num_tokens=24, verifier=rule, seed=3, batch_size=3,
                                     drafting=DynamicTree(26, 4, 4, "release"), processing=proc, device_path=dp,
                                     record_rows=True) for dp in (False, True))
        for a, b in zip(host, dev):
            assert torch.equal(a.tokens, b.tokens)
            for ra, rb in zip(a.rounds, b.rounds):
                assert (ra.parent is None) == (rb.parent is None) and (ra.nodes, ra.drafted) == (rb.nodes, rb.drafted)
                if ra.parent is not None:
                    assert rb.parent.dtype == np.int64 and np.array_equal(ra.parent, rb.parent)
        assert any(r.parent is not None and r.accepted > 0 for g in dev for r in g.rounds)


@pytest.mark.parametrize("T", [1, 2, 16])
@pytest.mark.parametrize("device_path", [False, True])
def test_a_non_finite_prefill_row_is_refused_on_both_paths(pair, monkeypatch, T, device_path):
    """The prefill's rows are checked for finiteness on the host path at once and on the device path with the first
    round's read-back (a speculative round, an AR round near the image's end, or the end of a 1-token image)."""
    t, d = pair
    prefill = t.prefill

    def nan_prefill(*a, **k):                                            # the target's prefill only
        o = prefill(*a, **k)
        return o._replace(logits=o.logits.clone().fill_(float("nan")))

    monkeypatch.setattr(t, "prefill", nan_prefill)
    with pytest.raises(ValueError, match="non-finite"):
        engine.generate(t, d if T > 1 else None, [0], num_tokens=T, verifier=rules.vanilla(),
                        drafting=min(4, T) if T > 1 else None, processing=Processing(temperature=1.0, cfg_scale=2.0),
                        device_path=device_path)              # (greedy rows are one-hot: finite whatever the logits)


@pytest.mark.parametrize("device_path", [True, False])
def test_round_uniforms_hashed_in_one_pass_are_the_same_bits(device_path):
    """``Streams.begin_round`` hashes the previous round's draws at the new n in one pass (torch on the device path,
    numpy on the host): every uniform is the value drawn one by one (bit for bit, float64 and float32, a draw the
    caller then changes in place included), a draw the plan did not foresee is hashed on its own, a planned round
    costs fewer device operations, and both paths give the same values."""
    from real.decode.rng import ACCEPT, SAMPLE, TREE, Streams

    asks = [(TREE, (3, 7), torch.float64), (TREE + 1, (2, 7), torch.float64), (ACCEPT, (9,), torch.float32),
            (SAMPLE, (), torch.float32)]
    ns = [np.array([0, 4, 9]), np.array([2, 5, 11]), np.array([3, 9, 12])]
    with devpath.force(device_path):
        planned, single = Streams(5, np.arange(3), "cpu"), Streams(5, np.arange(3), "cpu")
        ops = []
        for r, n in enumerate(ns):
            planned.begin_round(n)
            with OpCounter() as c:
                got = [planned.uniform(n, pu, s, dt) for pu, s, dt in asks]
                extra = planned.uniform(n, TREE + 2 + r, (4,))                  # not in the plan
            ops.append(c.table()["total"]["ops"])
            want = [single.uniform(n, pu, s, dt) for pu, s, dt in asks]      # (never begun: draw by draw)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)
            assert torch.equal(extra, single.uniform(n, TREE + 2 + r, (4,)))
            got[0].log_()                                                        # the caller works in place
            assert torch.equal(planned.uniform(n, TREE, (3, 7)), single.uniform(n, TREE, (3, 7)))
        if device_path:
            assert ops[1] < ops[0] / 3 and ops[2] == ops[1]  # round 0 hashes draw by draw; later rounds only cast
    with devpath.force(not device_path):                    # the other path: the same values
        other = Streams(5, np.arange(3), "cpu")
        assert torch.equal(other.uniform(ns[2], ACCEPT, (9,), torch.float32), want[2])
        assert torch.equal(other.uniform(ns[2], TREE + 1, (2, 7)), want[1])


def test_a_mask_is_asserted_once_until_it_changes():
    """On the device path a mask tensor already checked (a tree plan's level masks, the same every round) is not
    asserted again; changing it in place makes it checked again, and a bad diagonal is still refused."""
    from real.nn.masks import check_attn_mask

    m = torch.ones(3, 3, dtype=torch.bool).tril()
    with devpath.force(True):
        with OpCounter() as first:
            check_attn_mask(m, 3, 0, "cpu")
        with OpCounter() as again:
            check_attn_mask(m, 3, 0, "cpu")
        assert first.names["bookkeeping", "ops"]["_assert_async"] == 1
        assert again.names["bookkeeping", "ops"]["_assert_async"] == 0
        m[1, 1] = False                                            # in place: the version moves
        with pytest.raises(RuntimeError, match="attend to itself"):
            check_attn_mask(m, 3, 0, "cpu")


SAMPLED = Processing(temperature=1.0, cfg_scale=2.0)


@pytest.mark.parametrize("verifier", ["vanilla", "cool_sd"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_sampled_rounds_on_the_device_path_read_back_once_and_draw_the_host_paths_tokens(pair, mode, verifier):
    """T = 1 (trees drawn without replacement, verified node-parallel on the device path): no sync in the draft,
    target or verify phases, at most one per round in all, and the same tokens as the host path's walk at B = 1
    and 3 (same uniforms, same operations per row)."""
    t, d = pair
    v = (lambda: rules.cool_sd(2.0)) if verifier == "cool_sd" else rules.vanilla

    def gen(B, dp):
        return engine.generate(t, d, list(range(B)), num_tokens=16, verifier=v(), drafting=MODES[mode](),
                               processing=SAMPLED, batch_size=B, device_path=dp)
    with OpCounter() as c:
        dev1 = gen(1, True)
    tab = c.table()
    assert all(tab[ph]["syncs"] == 0 for ph in ("draft", "target", "verify")), tab
    assert tab["total"]["syncs"] <= c.rounds + 1                      # + the output's one read
    for B, dev in ((1, dev1), (3, gen(3, True))):
        host = gen(B, False)
        assert all(torch.equal(a.tokens, b.tokens) for a, b in zip(host, dev))
    assert sum(r.accepted for g in dev1 for r in g.rounds) > 0


@pytest.mark.parametrize("mode", ["chain", "eagle25"])
def test_device_path_blocks_keep_one_shape_every_round(pair, mode, monkeypatch):
    """On the device path a chain drafts L and a static tree its whole tree every round, the last rounds of an image
    included (``real.decode.drafting.static_depth``): every verification block the target runs has one shape, and the
    tokens are the host path's. The host path's blocks shrink at the image's end (the control: this is what the
    padding changes)."""
    t, d = pair
    shapes = []
    fwd = t.forward

    def recording(tokens, *a, **k):
        if tokens.shape[1] > 1:
            shapes.append(tuple(tokens.shape))
        return fwd(tokens, *a, **k)

    monkeypatch.setattr(t, "forward", recording)
    dev = _gen(pair, mode, 2, T=24, device_path=True)
    on_device, shapes[:] = sorted(set(shapes)), []
    host = _gen(pair, mode, 2, T=24, device_path=False)
    assert len(on_device) == 1 and len(set(shapes)) > 1, (on_device, sorted(set(shapes)))
    assert all(torch.equal(a.tokens, b.tokens) for a, b in zip(host, dev))


@pytest.mark.parametrize("device_path", [True, False])
def test_a_plan_over_the_memory_cap_is_drawn_draw_by_draw(device_path, monkeypatch):
    """A round whose draws exceed ``Streams._PLAN_MAX`` entries (all rows together) is not hashed ahead: every draw is
    hashed on its own, with the same values."""
    from real.decode.rng import ACCEPT, TREE, Streams

    monkeypatch.setattr(Streams, "_PLAN_MAX", 40)              # 3 rows x (2 x 7 + 9) = 69 entries: over the cap
    with devpath.force(device_path):
        capped, single = Streams(1, np.arange(3), "cpu"), Streams(1, np.arange(3), "cpu")
        for n in (np.array([0, 1, 2]), np.array([3, 4, 5])):
            capped.begin_round(n)
            got = [capped.uniform(n, TREE, (2, 7)), capped.uniform(n, ACCEPT, (9,))]
            assert not capped._ahead                                    # nothing was hashed ahead
            want = [single.uniform(n, TREE, (2, 7)), single.uniform(n, ACCEPT, (9,))]
            assert all(torch.equal(g, w) for g, w in zip(got, want))
