"""Extension recipe 2 (issue 47): a new model-drafted mode with its own flag and record. This file is the whole change:
the mode's value, its declaration (``real.decode.modes.ModeDef``: its ``--fork-length`` flag, how it is built, its
record, its likelihood hook, its report), one ``register`` call, and runs through ``coolsd generate --mode fork``
with ``--record`` and ``--fidelity``.

The mode, a forked chain: each round the draft model drafts a chain of ``--fork-length`` L tokens and, beside its first
token, the draft's second choice (a static tree of L + 1 nodes: paths [0], [0, 0], ..., [0]*L and [1]; its nodes'
top-m tokens, verified with qx = 1 as the EAGLE-1 release). Its record is the static-tree format plus its length;
its exact likelihood is the static tree's (``real.decode.score_tree``)."""
import contextlib
import io
import json
from dataclasses import dataclass

import numpy as np
import pytest

from real.decode import modes
from real.decode.modes.base import ModeDef, Option, tree_arrays
from theory.tree import parse_tree


@dataclass(frozen=True)
class Fork(modes.StaticTree):
    """A chain of L drafts with a sibling at its root (a ``StaticTree`` of top-m candidates)."""

    def params(self) -> dict:
        return super().params() | {"fork_length": self.tree.depth}


class ForkDef(ModeDef):
    name, label, describes, needs_draft, static_tree = "fork", "fork", "forked chains", True, True
    options = (Option("fork_length", int, "fork: chain drafts per round beside the root's second choice (default 3)",
                      lo=1, image_bound=True),)
    no_likelihood = None

    def build(self, opts, facts=None):
        L = int(opts.get("fork_length", 3))
        paths = [[0] * k for k in range(1, L + 1)] + [[1]]
        return Fork(parse_tree(json.dumps(paths), L), "topk")

    def report(self, mode, opts):
        return {"tree": {"name": "fork", "nodes": mode.tree.n_nodes, "depth": mode.tree.depth}}

    def record(self, gens, mode, stamp, chain_arrays):
        return tree_arrays(gens, mode.tree) | {"fork_length": np.array(mode.tree.depth)}

    def likelihood(self, mode, verifier, V, processing):
        return modes.lookup("tree").likelihood(mode, verifier, V, processing)


@pytest.fixture(scope="module")
def fork():
    d = modes.register(ForkDef())
    yield d
    modes.REGISTRY.pop(d.name)


def _generate(tmp_path, *argv):
    from coolsd.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["generate", "--model", "mnist", "--draft", "eagle", "--num-images", "4", "--batch-size", "2",
                   "--seed", "5", "--json", *argv])
    return rc, (json.loads(out.getvalue()) if rc == 0 else None), err.getvalue()


def test_the_mode_runs_records_and_is_scored(fork, tmp_path):
    from theory.likelihood import recorded

    rec, save = tmp_path / "r.npz", tmp_path / "s.npz"
    rc, d, err = _generate(tmp_path, "--mode", "fork", "--fork-length", "4", "--method", "cool-sd", "--delta", "2",
                           "--record", str(rec), "--save", str(save), "--fidelity")
    assert rc == 0, err
    assert d["tree"] == {"name": "fork", "nodes": 5, "depth": 4} and d["L"] == 4 and d["tokens_per_target_call"] > 1
    rows = recorded.load_rows(str(rec))
    assert rows.tree.n_nodes == 5 and rows.p.shape[1] == 6 and int(np.load(rec)["fork_length"]) == 4
    z = np.load(save)
    assert np.all(np.isfinite(z["log_p_hat"])) and d["fidelity"]["kl_per_token"]["measured"] is not None


def test_its_flag_belongs_to_it(fork, tmp_path):
    rc, _, err = _generate(tmp_path, "--fork-length", "3")                     # no --mode fork: refused, named
    assert rc != 0 and "--fork-length configures forked chains: add --mode fork" in err
    rc, _, err = _generate(tmp_path, "--mode", "fork", "--L", "3")             # control: chains' flag, not its own
    assert rc != 0 and "--L do(es) not apply to --mode fork" in err
