"""The decoder's shape (issue 36): from ``real.decode.engine.generate`` to the line that compares the uniform draw with
the acceptance probability f takes at most 4 frames, in every drafting mode, through the generic walk and through a
verifier's own fast walk; the frames are the loop, the round, ``verify_round`` and the verification itself."""
import sys

import pytest

from real.decode import engine
from real.decode.modes import DynamicTree, Jacobi, StaticTree
from real.decode.sampling import Processing
from real.registry import tiny_llamagen_pair
from theory import rules
from theory.tree import EAGLE_25, Tree

# the functions whose bodies hold the comparison u < f (chains; the generic tree walk; the fast host walks; the device
# path's node-parallel walks and greedy's chain verdict)
DECIDERS = {"verify_chain", "verify_tree", "_walk", "host_walk", "verify_tree_nodes", "_vanilla_device",
            "_greedy_device", "greedy_chain"}


def _stacks(fn) -> list[list[str]]:
    """Run ``fn``; for every call of a decider, the function names from ``generate`` down to it."""
    seen = []

    def prof(frame, event, arg):
        if event == "call" and frame.f_code.co_name in DECIDERS:
            names, f = [], frame
            while f is not None and f.f_code.co_name != "generate":
                names.append(f.f_code.co_name)
                f = f.f_back
            if f is not None:
                seen.append(["generate"] + names[::-1])
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("mode, verifier, draft", [
    (4, rules.cool_sd(2.0), "small"), (4, rules.vanilla(), "eagle"), (4, rules.greedy(), "small"),
    (StaticTree(Tree(EAGLE_25)), rules.greedy(), "eagle"), (StaticTree(Tree(EAGLE_25)), rules.cool_sd(2.0), "small"),
    (StaticTree(Tree(EAGLE_25)), rules.vanilla(), "eagle"), (DynamicTree(total=12, depth=3, topk=3), rules.vanilla(), "eagle"),
    (Jacobi(5), rules.lantern_pp(rules.lantern_neighbors(__import__("numpy").random.default_rng(0).normal(size=(256, 2)),
                                                         8), 4, 2.0), None)])
@pytest.mark.parametrize("device_path", [False, True])
def test_the_decision_is_four_frames_from_generate(mode, verifier, draft, device_path):
    t, d = tiny_llamagen_pair(seed=0, draft=draft or "layerskip")
    stacks = _stacks(lambda: engine.generate(t, d if draft else None, [1, 2], num_tokens=12, verifier=verifier,
                                             drafting=mode, processing=Processing(cfg_scale=2.0), batch_size=2,
                                             device_path=device_path))
    assert stacks, "no verification ran"
    assert max(len(s) for s in stacks) <= 4, stacks[0]
    assert {tuple(s[:3]) for s in stacks} == {("generate", "speculative_round", "verify_round")}
