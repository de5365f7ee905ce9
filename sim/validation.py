"""Statistical validation of the simulator against the exact theory (``coolsd sim validate``).

For each chain and verifier, on both simulation paths (tables F, G and the rule objects):
* mean tau against the exact E[tau] (T2, T8): z = (mean - E[tau]) / SE with the exact SE sqrt(Var(tau)/n);
* the empirical joint law of (start state, x_{1:L+1}) against the exact Phat (T7): pooled chi-square,
  must not be rejected;
* the same law against the target law P: vanilla must pass (Theorem 1); the negative control (vanilla
  acceptance with the biased resampler G = P) must be rejected; relaxed rules are rejected when the
  test's power against their exact Phat is >= 0.99 (otherwise the outcome is only reported);
* the plug-in TV(empirical, P) against its own sampling law under Phat (the plug-in is biased upward by
  sampling noise, so it is compared with a parametric bootstrap under the exact law, z-score); the
  bias-corrected estimate (plug-in minus the bootstrap bias) is printed next to the exact TV and the
  bound B (T4, T9), and must not exceed B by more than z_max bootstrap SDs.
Plus, per chain, whole-sequence mode with vanilla (Theorem 1 applied round after round): the law of the
last two tokens of T-token sequences against the target chain.

Sample sizes: n is the largest of (a) the n that makes the SE of mean tau <= ``se_target`` for every rule,
(b) the n that gives the chi-square test power >= ``power_target`` against the negative control at
level alpha, (c) the n that keeps the plug-in TV's upward bias under P below ``tv_bias_target``; all
three are printed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from theory.markov import chains as _chains
from theory import markov, rules
from theory.rules import methods

from . import stats
from .rounds import simulate, simulate_rule
from .sequence import simulate_sequence

__all__ = ["Check", "Report", "default_chains", "default_verifiers", "negative_control", "validate", "format_report"]


@dataclass(frozen=True)
class Check:
    chain: str
    verifier: str
    path: str
    check: str
    value: float
    reference: float
    stat: str                  # "z=..." or "p=..."
    expected: str              # "pass", "flag" or "info"
    outcome: str               # "pass" or "flag"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.expected == "info" or self.expected == self.outcome


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


@dataclass(frozen=True)
class ChainCase:
    name: str
    P: np.ndarray
    Q: np.ndarray
    L: int
    init: object
    neighbors: np.ndarray


def default_chains() -> list[ChainCase]:
    """Two small chains (V^(L+1) cells small enough for a chi-square on the joint law)."""
    P1, Q1 = _chains.ambiguous_pair(5, spread=0.5, tv=0.4, seed=0)
    P2, Q2 = _chains.random_pair(4, tv=0.5, seed=1)
    nb1 = rules.lantern_neighbors(np.random.default_rng(10).normal(size=(5, 2)))
    nb2 = rules.lantern_neighbors(np.random.default_rng(11).normal(size=(4, 2)))
    return [ChainCase("ambiguous V=5 L=3 s~unif", P1, Q1, 3, np.full(5, 0.2), nb1),
            ChainCase("random V=4 L=2 s=0", P2, Q2, 2, 0, nb2)]


def negative_control() -> rules.Verifier:
    """Vanilla acceptance with G = P instead of the residual: a plausible bug, lossy (not P)."""
    return rules.Verifier(rules.Vanilla(), rules.Target(), "neg-control", {"G": "P"})


# (method of theory.rules.methods, parameters) checked on every chain, besides the negative control
VALIDATED = (("vanilla", {}), ("cool-sd", {"delta": 2.0}), ("uniform-rsd", {"c": 1.5}), ("lantern", {"k": 1, "delta": 0.2}),
             ("lantern+G*", {"k": 1, "delta": 0.2}), ("lantern++", {"k": 1, "lambda": 2.0}))


def default_verifiers(neighbors, L: int = 4) -> list[rules.Verifier]:
    """The ``VALIDATED`` rules (neighbour table (V, K) for LANTERN) and the negative control."""
    return [*(methods.build(name, L, neighbors, p) for name, p in VALIDATED), negative_control()]


def joint_laws(case: ChainCase, F, G) -> tuple[np.ndarray, np.ndarray]:
    """Exact laws of (s, x_{1:L+1}) (shape (V,) * (L+2), start state first) under relaxed SD and under P.

    The start state is part of the outcome: TV between these joint laws is sum_s mu(s) TV(Phat_s, P_s),
    which is what ``theory.markov.exact_tv`` and the bound B measure (the decoder knows its prefix),
    whereas the laws mixed over s (``sequence_laws``) would give a smaller TV."""
    V = case.P.shape[0]
    mu = markov.init_distribution(case.init, V)
    ph = np.zeros((V,) * (case.L + 2))
    pt = np.zeros_like(ph)
    for s in np.flatnonzero(mu > 0):  # loop over start states (V small here)
        a, b = markov.sequence_laws(case.P, case.Q, F, G, int(s))
        ph[s], pt[s] = mu[s] * a, mu[s] * b
    return ph, pt


def choose_n(case: ChainCase, verifiers, se_target: float, power_target: float, alpha: float,
             tv_bias_target: float) -> tuple[int, dict]:
    """n from the SE of mean tau (every rule), from the chi-square power against the negative control,
    and from the upward bias of the plug-in TV under P (about 1/2 sum sqrt(2 p (1 - p) / (pi n)))."""
    var_max = 0.0
    for v in verifiers:
        F, _ = markov.rule_tables(case.P, case.Q, case.L, v)
        var_max = max(var_max, stats.tau_moments(markov.acceptance_probs(case.P, case.Q, F, case.init))[1])
    n_se = math.ceil(var_max / se_target**2)
    F, G = markov.rule_tables(case.P, case.Q, case.L, negative_control())
    ph, pt = joint_laws(case, F, G)
    n_pow = 1000
    while stats.chi_square_power(n_pow, pt, ph, alpha) < power_target:
        n_pow = int(n_pow * 1.25)
    p = np.ravel(pt)
    n_tv = math.ceil((0.5 * np.sqrt(2 * p * (1 - p) / math.pi).sum() / tv_bias_target) ** 2)
    n = int(math.ceil(max(n_se, n_pow, n_tv) / 1000) * 1000)
    return n, {"n_se": n_se, "var_tau_max": var_max, "n_power": n_pow, "n_tv": n_tv,
               "power": stats.chi_square_power(n, pt, ph, alpha)}


def _checks_for(case, v, path, res, n, alpha, z_max, seed) -> list[Check]:
    F, G = markov.rule_tables(case.P, case.Q, case.L, v)
    e_tau, var = stats.tau_moments(markov.acceptance_probs(case.P, case.Q, F, case.init))
    se = math.sqrt(var / n)
    mean = float(res.accepted.mean())
    z = stats.z_score(mean, e_tau, se)
    out = [Check(case.name, v.name, path, "mean tau", mean, e_tau, f"z={z:+.2f}", "pass",
                 "pass" if abs(z) <= z_max else "flag", f"SE={se:.4f}")]
    ph, pt = joint_laws(case, F, G)
    V = case.P.shape[0]
    counts = stats.sequence_counts(np.column_stack([res.start, res.tokens]), V)
    c = stats.chi_square(counts, ph)
    out.append(Check(case.name, v.name, path, "law vs Phat", c.stat, c.df, f"p={c.pvalue:.3g}", "pass",
                     "pass" if c.pvalue >= alpha else "flag", f"chi2 df={c.df}"))
    cp = stats.chi_square(counts, pt)
    power = stats.chi_square_power(n, pt, ph, alpha)
    if v.name == "vanilla":
        exp = "pass"
    elif v.name == "neg-control" or power >= 0.99:
        exp = "flag"
    else:
        exp = "info"
    out.append(Check(case.name, v.name, path, "law vs P", cp.stat, cp.df, f"p={cp.pvalue:.3g}", exp,
                     "pass" if cp.pvalue >= alpha else "flag", f"power={power:.3f}"))
    tv_exact = markov.exact_tv(case.P, case.Q, F, G, case.init)
    bound = markov.tv_bound(case.P, case.Q, F, G, case.init)
    tv_obs = stats.plugin_tv(counts, pt)
    m0, sd0 = stats.plugin_tv_null(ph, pt, n, reps=200, seed=seed)
    z_tv = stats.z_score(tv_obs, m0, sd0)
    corrected = tv_obs - (m0 - tv_exact)
    ok = abs(z_tv) <= z_max and corrected <= bound + z_max * sd0 and tv_exact <= bound + 1e-12
    out.append(Check(case.name, v.name, path, "TV plug-in", tv_obs, m0, f"z={z_tv:+.2f}", "pass",
                     "pass" if ok else "flag",
                     f"exact={tv_exact:.4f} corrected={corrected:.4f} bound={bound:.4f} bias={m0 - tv_exact:.4f}"))
    return out


def validate(cases=None, verifiers=None, *, n_rounds: int | None = None, seed: int = 0, alpha: float = 1e-3,
             z_max: float = 4.0, se_target: float = 0.005, power_target: float = 0.999, tv_bias_target: float = 0.03,
             paths=("table", "rule"), backend: str = "numpy", sequence_T: int = 8, progress: bool = False) -> Report:
    """Run every check on every chain (default: :func:`default_chains`) and verifier (default:
    :func:`default_verifiers` on the chain's neighbour table, including the negative control)."""
    cases = default_chains() if cases is None else cases
    rep = Report()
    rep.notes.append(f"alpha={alpha:g} (chi-square), |z| <= {z_max:g} (mean tau, TV), SE target {se_target:g}, "
                     f"power target {power_target:g} against the negative control")
    rep.notes.append("TV plug-in: 'value' is 1/2 sum |empirical - P| over (start, x_1..x_L+1); 'reference' is its mean "
                     "under the exact Phat (200 multinomial draws of the same n), z uses their SD; "
                     "corrected = plug-in - (reference - exact TV), must stay <= bound + z_max SD")
    jobs = []
    for ci, case in enumerate(cases):
        vs = default_verifiers(case.neighbors, case.L) if verifiers is None else verifiers
        if n_rounds is None:
            n, info = choose_n(case, vs, se_target, power_target, alpha, tv_bias_target)
            rep.notes.append(f"{case.name}: n={n} rounds per run (SE <= {se_target:g} needs {info['n_se']} with max "
                             f"Var(tau)={info['var_tau_max']:.3f}; power >= {power_target:g} needs {info['n_power']} "
                             f"(power at n: {info['power']:.4f}); plug-in TV bias <= {tv_bias_target:g} under P needs "
                             f"{info['n_tv']})")
        else:
            n = n_rounds
            rep.notes.append(f"{case.name}: n={n} rounds per run (given)")
        for vi, v in enumerate(vs):
            for path in paths:
                jobs.append((ci, case, vi, v, path, n))
    it = jobs
    if progress:
        from tqdm import tqdm

        it = tqdm(jobs, desc="sim validate", leave=False)
    for ci, case, vi, v, path, n in it:
        s = seed + 1000 * ci + 10 * vi + (path == "rule")
        if path == "table":
            F, G = markov.rule_tables(case.P, case.Q, case.L, v)
            res = simulate(case.P, case.Q, F, G, case.init, n, s, backend=backend)
        else:
            res = simulate_rule(case.P, case.Q, v, case.L, case.init, n, s)
        rep.checks.extend(_checks_for(case, v, path if path == "rule" else f"table/{backend}", res, n, alpha, z_max, s))
    for ci, case in enumerate(cases):
        rep.checks.append(_sequence_check(case, sequence_T, seed + 7 + ci, alpha))
    return rep


def _sequence_check(case: ChainCase, T: int, seed: int, alpha: float, n: int = 100_000) -> Check:
    """Whole sequences with vanilla: the law of (x_{T-1}, x_T) must be the target chain's."""
    F, G = markov.rule_tables(case.P, case.Q, case.L, rules.vanilla())
    res = simulate_sequence(case.P, case.Q, F, G, case.init, T, n, seed)
    mu = markov.init_distribution(case.init, case.P.shape[0])
    m = mu @ np.linalg.matrix_power(case.P, T - 1)            # law of x_{T-1}
    law = m[:, None] * case.P
    V = case.P.shape[0]
    c = stats.chi_square(stats.sequence_counts(res.tokens[:, -2:], V), law)
    return Check(case.name, "vanilla", f"sequence T={T}", "(x_T-1,x_T) vs P", c.stat, c.df, f"p={c.pvalue:.3g}",
                 "pass", "pass" if c.pvalue >= alpha else "flag",
                 f"n={n} seqs, mean rounds {res.n_rounds.mean():.3f}")


def format_report(rep: Report) -> str:
    if not isinstance(rep, Report):
        raise TypeError(f"format_report: rep must be a sim.validation.Report (sim.validate's result), got "
                        f"{type(rep).__name__}")
    head = (f"{'chain':26s} {'verifier':12s} {'path':12s} {'check':17s} {'value':>9s} {'reference':>9s} "
            f"{'statistic':>10s} {'expect':>6s} {'got':>5s} {'':2s} detail")
    lines = [head, "-" * len(head)]
    for c in rep.checks:
        lines.append(f"{c.chain[:26]:26s} {c.verifier[:12]:12s} {c.path[:12]:12s} {c.check:17s} {c.value:9.4f} "
                     f"{c.reference:9.4f} {c.stat:>10s} {c.expected:>6s} {c.outcome:>5s} "
                     f"{'ok' if c.ok else 'XX':2s} {c.detail}")
    lines += [""] + [f"note: {t}" for t in rep.notes]
    n_bad = sum(not c.ok for c in rep.checks)
    n_flag = sum(c.expected == "flag" and c.ok for c in rep.checks)
    lines.append(f"{len(rep.checks)} checks, {n_bad} unexpected outcome(s); {n_flag} expected rejection(s) "
                 f"detected (negative control and relaxed rules vs P). {'ALL OK' if rep.ok else 'FAILED'}")
    return "\n".join(lines)
