"""A new drafting mode in one file (issue 36): prompt lookup. Each round drafts the tokens that followed the last earlier
occurrence of the current token (deterministic drafts: the point law), registered and run through engine.generate."""
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from real.decode import engine, modes
from real.decode.sampling import Processing
from real.protocol import Proposal
from real.registry import tiny_llamagen_pair
from test_real_engine import _chi2, _exact_law, _law_models
from theory import rules


@dataclass(frozen=True)
class NGram:
    L: int = 3
    needs_draft, trees, max_depth = False, False, property(lambda self: self.L)

    def check(self, *args): pass
    def start(self, run): return None
    def from_prefill(self, run): return False
    def advance(self, *args): pass
    def params(self): return {"draft": "ngram", "L": self.L}

    def propose(self, run, depth):
        Lr, n, last = int(depth.max()), torch.as_tensor(run.n)[:, None], run.last_tokens()
        pos = torch.arange(run.out.shape[1])[None]
        j = torch.where((run.out == last) & (pos < n - 1), pos, -1).amax(1, keepdim=True)   # last earlier occurrence
        idx = j + 1 + torch.arange(Lr)
        x = torch.where((j >= 0) & (idx < n), run.out.gather(1, idx.clamp(max=run.out.shape[1] - 1)), last)
        return Proposal(torch.cat([last, x], 1), None, "point", None, np.arange(Lr + 1))


@pytest.fixture
def ngram():
    modes.register("ngram", lambda o: NGram(**o))
    yield modes.get("ngram", {"L": 3})
    modes.DRAFTER_FREE.pop("ngram")


def test_greedy_equals_plain_greedy_and_cool_sd_runs(ngram):
    t, _ = tiny_llamagen_pair(seed=0)
    kw = dict(num_tokens=64, seed=1, batch_size=2)
    greedy = Processing(temperature=0.0, cfg_scale=2.0)
    ar = engine.generate(t, None, [1, 2, 3], processing=greedy, **kw)
    sd = engine.generate(t, None, [1, 2, 3], verifier=rules.greedy(), drafting=ngram, processing=greedy, **kw)
    assert all(torch.equal(a.tokens, b.tokens) for a, b in zip(ar, sd)) and engine.summarize(sd)["accepted_mean"] > 0
    cool = engine.generate(t, None, [1, 2, 3], verifier=rules.cool_sd(4.0), drafting=ngram, **kw)
    assert engine.summarize(cool)["tokens_per_target_call"] > 1


def test_vanilla_law_with_a_negative_control(ngram):
    t, _ = _law_models()
    proc, T, N = Processing(), 4, 4000
    law = _exact_law(t, 1, T, proc)
    def counts(v, seed):
        g = engine.generate(t, None, [1] * N, num_tokens=T, verifier=v, drafting=ngram, seed=seed, batch_size=50)
        return Counter(tuple(x.tokens.tolist()) for x in g)
    assert _chi2(counts(rules.vanilla(), 0), law, N)[0] > 1e-3
    assert _chi2(counts(rules.Verifier(rules.Vanilla(), rules.Target(), "wrong"), 1), law, N)[0] < 1e-6
