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
    assert rnd.host_verification("cpu", v) and devpath.host_path("cpu")
    monkeypatch.setenv(devpath.ENV, "1")
    assert not rnd.host_verification("cpu", v) and not devpath.host_path("cpu")
    with devpath.force(False):                       # the API flag wins over the environment
        assert rnd.host_verification("cpu", v)
    monkeypatch.setenv(devpath.ENV, "0")
    with devpath.force(True):
        assert not devpath.host_path("cpu")
    assert devpath.host_path("cpu")


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
SYNCS = {"chain": {"draft": 20, "target": 2, "verify": 0, "bookkeeping": 7},
         "eagle25": {"draft": 85, "target": 7, "verify": 6, "bookkeeping": 8},
         "dynamic": {"draft": 41, "target": 7, "verify": 1, "bookkeeping": 8}}
# (before issue 42's reductions: chain 48 / 8 / 14 / 28, eagle25 131 / 12 / 43 / 24, dynamic 103 / 13 / 37 / 31)


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
