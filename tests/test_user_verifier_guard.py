"""A user's verifier is checked on the rows it is used on (issue 41): acceptance in [0, 1], resampling rows that are
distributions, a one-line ValueError naming the verifier; the toolkit's own rules are passed through untouched."""
import numpy as np
import pytest

from theory import rules
from theory.likelihood import log_likelihood
from theory.rules.acceptance import Vanilla
from theory.rules.resampling import Residual
from theory.rules.verifiers import Verifier, guarded


def _gen(verifier, **kw):
    from real.decode import engine
    from real.registry import tiny_llamagen_pair

    t, d = tiny_llamagen_pair(0)
    return engine.generate(t, d, [1, 2, 3], num_tokens=6, verifier=verifier, drafting=2, seed=3, **kw)


def _user(accept=None, resample=None, name="mine"):
    """A user's verifier: plain functions (not the toolkit's rule classes), by default vanilla's law."""
    return Verifier(accept or (lambda p, q, i: Vanilla()(p, q, i)),
                    resample or (lambda p, q, f, rejected=None: Residual()(p, q, f)), name)


def test_built_in_rules_pass_through():
    for v in (rules.vanilla(), rules.cool_sd(2.0), rules.uniform_rsd(1.5), rules.greedy(), rules.typical()):
        assert guarded(v) is v


def test_a_valid_user_rule_runs_and_gives_the_built_in_tokens():       # control: the guard changes nothing
    a = [g.tokens.tolist() for g in _gen(rules.vanilla())]
    b = [g.tokens.tolist() for g in _gen(_user())]
    assert a == b


@pytest.mark.parametrize("bad,msg", [
    (lambda p, q, i: 1.5 * Vanilla()(p, q, i) + 0.5, "outside [0, 1]"),
    (lambda p, q, i: Vanilla()(p, q, i) - 2.0, "outside [0, 1]"),
    (lambda p, q, i: Vanilla()(p, q, i) * float("nan"), "outside [0, 1]"),
])
def test_acceptance_outside_unit_interval_is_named(bad, msg):
    with pytest.raises(ValueError, match=r"verifier 'mine'.*" + msg.replace("[", r"\[").replace("]", r"\]")):
        _gen(_user(accept=bad))


def test_resampling_row_not_a_distribution_is_named():
    unnormalised = lambda p, q, f, rejected=None: 2.0 * Residual()(p, q, f)     # noqa: E731
    with pytest.raises(ValueError, match="verifier 'mine'.*not a distribution"):
        _gen(_user(resample=unnormalised))
    negative = lambda p, q, f, rejected=None: Residual()(p, q, f) - 0.1         # noqa: E731
    with pytest.raises(ValueError, match="verifier 'mine'.*not a distribution"):
        _gen(_user(resample=negative))


def test_the_likelihood_checks_a_user_rule_too():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(4), size=(2, 5))
    q = rng.dirichlet(np.ones(4), size=(2, 5))
    x = rng.integers(0, 4, size=(2, 5))
    ok = log_likelihood(p, q, x, _user(), 2)
    assert np.allclose(ok, log_likelihood(p, q, x, rules.vanilla(), 2), atol=1e-12)
    with pytest.raises(ValueError, match="verifier 'mine'"):
        log_likelihood(p, q, x, _user(accept=lambda p, q, i: np.full(p.shape, 1.2)), 2)
