"""SJD / SCD schedules as released (issue 40): the plain tail on Lumina-mGPT (the releases' loop interval
l = 3, r = (size // 16) ** 2 + size // 16 - 10, counted by brute force over the generated token stream), a Jacobi
run never drafting into it, and SCD's window of 32 with a coupling (SJD's 16 without)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from real.adapters.chameleon import lumina_layout, sjd_plain_tail
from real.decode import engine
from real.decode.jacobi import Jacobi
from real.decode.sampling import Processing
from theory import rules


def _release_plain_codes(size: int) -> tuple[int, int]:
    """(codes the release samples plainly at the end, codes before l) for a square Lumina-mGPT image of ``size``
    px: the generated stream boi, height, width, then per row side codes and a newline, then eoi; g = the index
    in that stream; the loop drafts while l <= g < r, l = 3, r = (size // 16) ** 2 + size // 16 - 10."""
    side = size // 16
    stream = ["boi", "h", "w"]
    for _ in range(side):
        stream += ["code"] * side + ["newline"]
    stream.append("eoi")
    l, r = 3, (size // 16) ** 2 + size // 16 - 10
    tail = sum(1 for g, tok in enumerate(stream) if tok == "code" and g >= r)
    head = sum(1 for g, tok in enumerate(stream) if tok == "code" and g < l)
    return tail, head


@pytest.mark.parametrize("size", [256, 512, 768, 1024])
def test_lumina_plain_tail_follows_the_release(size):
    tail, head = _release_plain_codes(size)
    assert (tail, head) == (12, 0)
    assert sjd_plain_tail(lumina_layout(size)) == tail


def test_lumina_model_gets_the_plain_tail_and_others_do_not():
    """coolsd's --draft jacobi sets the tail for --model lumina-mgpt only (real.specs sjd_schedule)."""
    from coolsd.options import DraftingSpec
    from real.specs import model_facts

    spec = DraftingSpec(kind="jacobi", options=(("window", 16),))
    lay = lumina_layout(512)
    bundle = SimpleNamespace(info={"grid": [32, 32]}, num_tokens=1024, target=SimpleNamespace(layout=lay))
    assert spec.build(model_facts(bundle, "lumina-mgpt")).plain_tail == 12
    assert spec.build(model_facts(bundle, "mnist")).plain_tail == 0


@pytest.fixture(scope="module")
def mnist():
    from real.zoo import gpt

    return gpt.load_target()


def _draft_extents(gens, T):
    """Per round of every image: (first position it commits n, last drafted position n + drafted - 1)."""
    out = []
    for g in gens:   # a loop over images and their rounds (bookkeeping of a test)
        n = 0
        for r in g.rounds:
            out.append((n, n + r.drafted - 1, r.drafted))
            n += r.accepted + 1
        assert n == T
    return out


@pytest.mark.parametrize("tail", [12, 5])
def test_jacobi_never_drafts_into_the_plain_tail(mnist, tail):
    """MNIST (T = 49), window 8, 10 images at batch 5: no draft lands on the last ``tail`` positions, each of them is
    its own plain call; the same run without the tail does draft there (negative control)."""
    T, proc = 49, Processing(temperature=1.0, cfg_scale=2.0)

    def run(pt):
        return engine.generate(mnist, None, list(range(10)), num_tokens=T, verifier=rules.vanilla(),
                               drafting=Jacobi(8, plain_tail=pt), processing=proc, seed=3, batch_size=5)

    ext = _draft_extents(run(tail), T)
    assert max(last for _, last, d in ext if d > 0) <= T - tail - 2      # drafts stop before the tail's bonus slot
    assert all(d == 0 for n, _, d in ext if n >= T - tail)
    assert sum(1 for n, _, _ in ext if n >= T - tail) == 10 * tail        # one plain call per tail token
    ext0 = _draft_extents(run(0), T)
    assert max(last for _, last, d in ext0 if d > 0) > T - tail - 2


def test_scd_window_defaults():
    assert Jacobi().window == 16 and Jacobi(coupling="none").window == 16
    for c in ("scd-mc", "scd-mc-p", "scd-gs"):
        assert Jacobi(coupling=c).window == 32
    assert Jacobi(8, coupling="scd-mc").window == 8
