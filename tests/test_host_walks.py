"""theory.rules.host_walks: the batch-1 walk (``_one_round``: one round, the bookkeeping as Python ints) equals the
batched steps of ``host_walk`` bit for bit, for every kind of rule the host walk serves (vanilla's ratio, the scaled
ratio with G* (Cool-SD, UniformRSD), a level rule whose f changes with the position (G*), typical's entropy rule
with its argmax, GSD's grouped ratio with the residual and G*, LANTERN and LANTERN++ decided from their bounds with
their released laws, LANTERN++ with G* (f read in full)), both draft laws, float32 and float64 rows with exact zeros
and ties, static and random trees, depth caps: the same accepted count, path, next token and last node, of the same
dtypes. The batched steps over several rounds give each round's verdict too. Controls: a moved uniform, children
tried in another rank order, and (the level rule) f read one position deeper change verdicts, so the comparison would
see a walk that read the wrong uniform, tried the siblings out of order or passed the wrong position."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import rules
from theory.rules.host_walks import host_walk
from tree_cases import tree_case


def _rules(V, rng):
    """The verifiers compared (name -> Verifier) for V codes."""
    nb = rules.lantern_neighbors(rng.normal(size=(V, 3)))
    k = int(rng.integers(1, V // 2))
    return {"vanilla": rules.vanilla(), "cool-sd": rules.cool_sd(2.0), "uniform-rsd": rules.uniform_rsd(1.5),
            "level": rules.level([0.0, 0.9, 0.1, 0.8] * 16),      # f far from vanilla's at even positions only
            "typical": rules.typical(), "gsd": rules.gsd(d_threshold=None),
            "gsd+G*": rules.gsd(d_threshold=None, resample="optimal"),
            "lantern": rules.lantern(nb, k, float(rng.choice([0.0, 0.05, 0.2]))),
            "lantern++": rules.lantern_pp(nb, k, float(rng.choice([1.0, 2.0, 4.0]))),
            "lantern++G*": rules.lantern_pp(nb, k, 2.0, resample="optimal")}


NAMES = list(_rules(12, np.random.default_rng(0)))


def _case(seed, static, V, B, dtype, ties):
    """tree_case's rows (B rounds, exact zeros; ``ties``: masses on a grid of 1/8, many equal) in ``dtype``, the
    children table shared by the rounds (N+1, K)."""
    p, q, tokens, u, us, tree, cap = tree_case(seed, static, V, B=B)
    if ties:
        p, q = (np.round(a * 8) / 8 + (np.arange(V) == 0) for a in (p, q))
        p, q = (a / a.sum(-1, keepdims=True) for a in (p, q))
    children = np.asarray(tree.children)
    children = children if children.ndim == 2 else children[0]
    return p.astype(dtype), q.astype(dtype), tokens, u, us, children, int(tree.depth), cap


def _walk(v, case, one_round, law, u=None):
    p, q, tokens, ua, us, children, D, cap = case
    return host_walk(v.accept, v.resample, p, q, tokens, ua if u is None else u, us, children, D, cap, law,
                     one_round=one_round)


def _equal(a, b) -> bool:
    return all(x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b))


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), name=st.sampled_from(NAMES), V=st.sampled_from([6, 12, 40]),
       static=st.booleans(), dtype=st.sampled_from([np.float32, np.float64]),
       law=st.sampled_from(["without_replacement", "point"]), ties=st.booleans())
def test_one_round_equals_the_batched_steps(seed, name, V, static, dtype, law, ties):
    v = _rules(V, np.random.default_rng(seed))[name]
    case = _case(seed, static, V, 1, dtype, ties)
    rows = [case[0].copy(), case[1].copy()]
    got = _walk(v, case, True, law)
    assert _equal(case[:2], rows), name      # the batch-1 walk reads the caller's rows in place: it writes none
    assert _equal(got, _walk(v, case, False, law)), name


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), name=st.sampled_from(NAMES), dtype=st.sampled_from([np.float32, np.float64]),
       law=st.sampled_from(["without_replacement", "point"]))
def test_one_round_equals_its_round_of_a_batch(seed, name, dtype, law):
    """Each round of a batch of 3 walked alone (``_one_round``) gives the batched walk's verdict for that round."""
    v = _rules(12, np.random.default_rng(seed))[name]
    case = _case(seed, True, 12, 3, dtype, False)
    batch = _walk(v, case, True, law)
    for b in range(3):   # a loop over the rounds (test code)
        p, q, tokens, ua, us, children, D, cap = case
        one = (p[b:b + 1], q[b:b + 1], tokens[b:b + 1], ua[b:b + 1], us[b:b + 1], children, D,
               None if cap is None else cap[b:b + 1])
        assert _equal(_walk(v, one, True, law), [x[b:b + 1] for x in batch]), (name, b)


class _Deeper:
    """An acceptance rule read one position deeper than asked (the control's wrong position)."""

    def __init__(self, rule):
        self.rule = rule

    def __call__(self, p, q, i):
        return self.rule(p, q, i + 1)

    def at(self, p, q, i, x):
        return self.rule.at(p, q, i + 1, x)


def test_control_a_wrong_position_is_seen():
    """The level rule read at position i + 1 in the batch-1 walk alone: verdicts differ from the batched steps'."""
    wrong = 0
    for seed in range(60):   # a loop over fixed cases (test code)
        v = _rules(12, np.random.default_rng(seed))["level"]
        case = _case(seed, bool(seed % 2), 12, 1, np.float64, False)
        law = "point" if seed % 3 == 0 else "without_replacement"
        ref = _walk(v, case, False, law)
        p, q, tokens, ua, us, children, D, cap = case
        got = host_walk(_Deeper(v.accept), v.resample, p, q, tokens, ua, us, children, D, cap, law)
        wrong += not _equal(got, ref)
    assert wrong >= 5, wrong


def test_controls_a_moved_uniform_and_another_rank_order_are_seen():
    """The first candidate's uniform moved (u -> 1 - u), or each node's first two children swapped, in the batch-1
    walk alone: its verdict differs from the batched steps' on the original case, for every rule kind (the uniform:
    but typical's, whose f is 0 or 1)."""
    moved = {n: 0 for n in NAMES}
    swapped = {n: 0 for n in NAMES}
    for seed in range(40):   # a loop over fixed cases (test code)
        rng = np.random.default_rng(seed)
        for name, v in _rules(12, rng).items():
            case = _case(seed, bool(seed % 2), 12, 1, np.float32, False)
            law = "point" if seed % 3 == 0 else "without_replacement"
            ref = _walk(v, case, False, law)
            u = case[3].copy()
            u[0, 1:] = 1.0 - u[0, 1:]
            moved[name] += not _equal(_walk(v, case, True, law, u=u), ref)
            children = case[5].copy()
            two = children[:, 1] >= 0
            children[two, :2] = children[two, 1::-1]
            swapped[name] += not _equal(_walk(v, case[:5] + (children,) + case[6:], True, law), ref)
    assert moved.pop("typical") == 0 and min(moved.values()) >= 5 and min(swapped.values()) >= 5, (moved, swapped)


class _Scribbler:
    """A resampling rule that zeroes its input row's first entry before the residual (the control's in-place write)."""

    def __init__(self, rule):
        self.rule, self.reads_f = rule, False

    def __call__(self, p, q, f, rejected=None):
        p[..., 0] = 0.0
        return self.rule(p, q, f, rejected)


def test_control_a_rule_writing_its_rows_is_seen():
    """A resampler that writes into the row it is given changes the caller's rows through the batch-1 walk's views
    (the check above would see a rule that did), and leaves them alone in the batched steps (their own copies)."""
    v = rules.vanilla()
    hit = 0
    for seed in range(20):   # a loop over fixed cases (test code)
        case = _case(seed, True, 12, 1, np.float64, False)
        rows = case[0].copy()
        _walk(type("V", (), {"accept": v.accept, "resample": _Scribbler(v.resample)}), case, False,
              "without_replacement")
        assert np.array_equal(case[0], rows)
        _walk(type("V", (), {"accept": v.accept, "resample": _Scribbler(v.resample)}), case, True,
              "without_replacement")
        hit += not np.array_equal(case[0], rows)
    assert hit >= 5, hit
