"""Extension recipe 1 (issue 47): a new verifier rule on the command line. This file is the whole change: the rule
(an acceptance function), its registration with its own flag (``--gamma``), and runs through ``coolsd generate``
with ``--fidelity`` (the exact likelihood reads the rule like any other).

The rule, tempered acceptance: f(x) = min(1, p(x)/q(x))^gamma with G* resampling (T5); gamma = 1 accepts as vanilla
(lossless: log P^(x) = log P(x) for every image), gamma < 1 accepts more (a relaxed law)."""
import contextlib
import io
import json
from dataclasses import dataclass

import array_api_compat
import numpy as np
import pytest

from theory.rules import Optimal, Verifier
from theory.rules import methods as registry


@dataclass(frozen=True)
class Tempered:
    """f(x) = min(1, p(x)/q(x))^gamma on rows (..., V) of any array library (q = 0: 1, never drafted)."""
    gamma: float

    def __call__(self, p, q, i):
        xp = array_api_compat.array_namespace(p, q)
        pos = q > 0
        r = xp.where(pos, p / xp.where(pos, q, xp.ones_like(q)), xp.ones_like(p))
        return xp.where(r < 1, r, xp.ones_like(r)) ** self.gamma


@pytest.fixture(scope="module")
def tempered():
    m = registry.register(registry.Method(
        "tempered", "tempered acceptance",
        (registry.Param("gamma", float, 0.5, low=0.0, high=1.0, low_open=True, flag="gamma",
                        help="tempered: the exponent of min(1, p/q) (1: vanilla)"),),
        lambda p, L, nb: Verifier(Tempered(p["gamma"]), Optimal(), "tempered", {"gamma": p["gamma"]}),
        help="min(1, p/q)^gamma with G*"))
    yield m
    registry.METHODS.pop("tempered")


def _generate(tmp_path, *argv):
    from coolsd.cli import main

    out, err = io.StringIO(), io.StringIO()
    save = tmp_path / "x.npz"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["generate", "--model", "mnist", "--num-images", "4", "--batch-size", "2", "--seed", "3", "--json",
                   "--fidelity", "--save", str(save), *argv])
    return rc, (json.loads(out.getvalue()) if rc == 0 else None), err.getvalue(), save


def test_the_rule_runs_with_its_flag_and_is_scored_exactly(tempered, tmp_path):
    rc, d, err, save = _generate(tmp_path, "--method", "tempered", "--gamma", "0.3")
    assert rc == 0, err
    assert d["verifier"] == "tempered" and d["params"] == {"gamma": 0.3}
    z = np.load(save)
    assert np.all(np.isfinite(z["log_p_hat"])) and not np.allclose(z["log_p_hat"], z["log_p"])   # relaxed
    rc, d, err, save = _generate(tmp_path, "--method", "tempered", "--gamma", "1")
    z = np.load(save)
    assert rc == 0 and np.allclose(z["log_p_hat"], z["log_p"], atol=1e-6)      # gamma = 1: the lossless law


def test_the_flag_is_checked_and_owned(tempered, tmp_path):
    rc, _, err, _ = _generate(tmp_path, "--method", "tempered", "--gamma", "1.5")
    assert rc != 0 and "--gamma" in err
    rc, _, err, _ = _generate(tmp_path, "--method", "vanilla", "--gamma", "0.5")     # control: vanilla has none
    assert rc != 0 and "--gamma do(es) not apply to method vanilla" in err
