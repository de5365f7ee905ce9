"""Many independent rounds of relaxed speculative decoding on order-1 chains (docs/theory.md sections 1-2).

Two entries, one law:

* :func:`simulate` takes per-position tables F, G (L, V, V) (e.g. from ``theory.markov.rule_tables``)
  and runs the round with O(1) alias-table draws; numpy (default) or JAX (jit + vmap) backend.
* :func:`simulate_rule` takes a ``theory.rules.Verifier`` and runs the engine's own path: drafts
  x~_{1:L} from Q, the rows P, Q gathered along the drafted path, and ``theory.rules.chain.verify_chain``
  with the real rule objects (so LANTERN's resampler sees the rejected token).

Both return the virtually extended sequence x_{1:L+1} (T7): after a round stops at tau, x_{tau+2:L+1}
are drawn from P. With a rejected-token resampler the table path uses the effective law G_eff
(section 6), which gives the same law of x_{1:L+1}: the rejected draft is not part of the output.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from theory.core import checks
from theory import markov
from theory.rules.chain import verify_chain

from .alias import alias_draw, alias_table

__all__ = ["SimResult", "simulate", "simulate_rule", "ChainTables", "prepare_tables", "BACKENDS"]

BACKENDS = ("numpy", "jax")
CHUNK = 1 << 16          # rounds per vectorised block; the random stream is read block by block, so keep it fixed


@dataclass(frozen=True)
class SimResult:
    """Outcome of n independent rounds.

    accepted (n,) int64: tau, accepted drafts per round (tokens per target call = tau + 1)
    tokens   (n, L+1) int64: x_{1:L+1}, virtually extended by P after the stop (T7)
    start    (n,) int64: the start state s of each round (drawn from ``init`` when it is a distribution)
    drafts   (n, L) int64: the drafted tokens x~_{1:L}. The rule path drafts all L (as the engine
             does); the table path drafts lazily and puts -1 after the first rejection.
    """
    accepted: np.ndarray
    tokens: np.ndarray
    start: np.ndarray
    drafts: np.ndarray
    backend: str = "numpy"
    seed: int | None = None
    meta: dict = field(default_factory=dict)

    @property
    def L(self) -> int:
        return self.tokens.shape[1] - 1

    @property
    def n_rounds(self) -> int:
        return self.accepted.shape[0]


# --------------------------------------------------------------------------- validation

def _check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


@dataclass(frozen=True)
class ChainTables:
    """Validated float64 tables and their alias tables, flattened for O(1) gathers.

    Row index conventions: Q rows s; T rows t * V + s with T[t] = G_{t+1} for t < L and T[L] = P
    (the table used after a rejection at position t+1, or for the bonus / virtual tokens).
    """
    P: np.ndarray
    Q: np.ndarray
    F: np.ndarray
    G: np.ndarray
    mu: np.ndarray
    q_prob: np.ndarray
    q_alias: np.ndarray
    t_prob: np.ndarray
    t_alias: np.ndarray
    m_prob: np.ndarray
    m_alias: np.ndarray

    @property
    def V(self) -> int:
        return self.P.shape[0]

    @property
    def L(self) -> int:
        return self.F.shape[0]


def prepare_tables(P, Q, F, G, init) -> ChainTables:
    """Check P, Q, F, G, init with the theory's validators and build the alias tables."""
    P, Q = markov.check_chain(P, Q)
    F = checks.acceptance_tables(F, P.shape[0])
    G = checks.resampling_tables(G, F)
    mu = markov.init_distribution(init, P.shape[0])
    qp, qa = alias_table(Q)
    tp, ta = alias_table(np.concatenate([G, P[None]], axis=0))
    mp, ma = alias_table(mu[None])
    return ChainTables(P, Q, F, G, mu, qp.ravel(), qa.ravel(), tp.ravel(), ta.ravel(), mp.ravel(), ma.ravel())


# --------------------------------------------------------------------------- numpy table kernel

def round_kernel_np(tab: ChainTables, s0: np.ndarray, U: np.ndarray, Lp: np.ndarray | None = None):
    """One round for each entry of s0 (n,), from uniforms U (3L+1, n) (T0, T7).

    Per position j: U[3j-3] drafts x~_j ~ Q(.|state) (alias), U[3j-2] is the acceptance test
    u < F_j(x~_j | state), U[3j-1] draws the token used when the round has stopped: from G_j at the
    rejection, from P afterwards (virtual extension). U[3L] draws x_{L+1} from P (bonus token or
    virtual). ``Lp`` (n,) optionally caps the draft length per round (whole-sequence mode):
    positions j > Lp are not drafted and the token there comes from P.
    Returns (tau (n,), tokens (n, L+1), drafts (n, L)); drafts are -1 where nothing was verified.

    Selections are written as arithmetic (a + mask * (b - a)): np.where on a random mask is several
    times slower than the rest of the kernel.
    """
    V, L = tab.V, tab.L
    n = s0.shape[0]
    VV = V * V
    qp, qa, tp, ta = tab.q_prob, tab.q_alias, tab.t_prob, tab.t_alias
    tokens = np.empty((L + 1, n), np.int64)
    drafts = np.empty((L, n), np.int64)
    state = s0
    alive = np.ones(n, bool)
    tau = np.zeros(n, np.int64)
    for j in range(1, L + 1):  # loop over draft positions; everything inside is vectorised over rounds
        Fj = tab.F[j - 1].ravel()
        sV = state * V
        u = U[3 * j - 3] * V                                    # draft x~_j ~ Q(.|state), alias draw
        c = u.astype(np.int64)
        k = sV + c
        a = qa[k]
        x = a + (u - c < qp[k]) * (c - a)
        acc = alive & (U[3 * j - 2] < Fj[sV + x])               # accept iff u < f_j(x~_j | state)
        if Lp is not None:
            allowed = j <= Lp
            acc &= allowed
            drafted = alive & allowed
        else:
            drafted = alive
        rej = drafted ^ acc                                     # rejected at this position
        u = U[3 * j - 1] * V                                    # stopped: G_j at the rejection, else P
        c = u.astype(np.int64)
        k = (L * VV - rej * ((L - j + 1) * VV)) + sV + c
        a = ta[k]
        y = a + (u - c < tp[k]) * (c - a)
        out = y + acc * (x - y)
        drafts[j - 1] = drafted * (x + 1) - 1
        tokens[j - 1] = out
        tau += acc
        alive = acc
        state = out
    u = U[3 * L] * V                                            # x_{L+1} ~ P(.|x_L)
    c = u.astype(np.int64)
    k = L * VV + state * V + c
    a = ta[k]
    tokens[L] = a + (u - c < tp[k]) * (c - a)
    return tau, tokens.T, drafts.T


def _draw_start(tab: ChainTables, u: np.ndarray) -> np.ndarray:
    return alias_draw(tab.m_prob, tab.m_alias, np.zeros(u.shape, np.int64), u, tab.V)


def _simulate_np(tab: ChainTables, n_rounds: int, seed) -> SimResult:
    rng = np.random.default_rng(seed)
    L = tab.L
    outs = []
    for lo in range(0, n_rounds, CHUNK):
        n = min(CHUNK, n_rounds - lo)
        U = rng.random((3 * L + 2, n))
        s0 = _draw_start(tab, U[3 * L + 1])
        outs.append((*round_kernel_np(tab, s0, U), s0))
    tau, tokens, drafts, start = (np.concatenate(a) for a in zip(*outs))
    return SimResult(tau, tokens, start, drafts, "numpy", seed)


# --------------------------------------------------------------------------- public entries

ROUND_SECONDS = {"table": 1.5e-7, "rule": 8e-7}   # per round and position, one core (measured 0.1 / 0.6 us at L = 4)


def check_rounds_cost(what: str, n_rounds: int, L: int, V: int, path: str = "table", runs: int = 1, *,
                      max_bytes: float | None = checks.MAX_BYTES, max_seconds: float | None = checks.MAX_SECONDS) -> tuple[str, float]:
    """Refuse (``checks.SizeError``) before any work a simulation of ``n_rounds`` rounds whose results (tau, the
    L + 1 tokens, the start and the L drafts: (2L + 3) int64 per round; the rule path also holds a chunk of
    (2L + 1) V float64 rows) or run time (``ROUND_SECONDS``) exceed the budgets; ``runs`` such runs one after another cost ``runs`` times the time, not the memory.
    Returns (the estimate, seconds)."""
    n = checks.count("n_rounds", n_rounds)
    nbytes = 8 * n * (2 * L + 3) + (8 * min(n, 8192) * (2 * L + 1) * V if path == "rule" else 0)
    secs = runs * n * (L + 1) * ROUND_SECONDS[path] * (1 + V / 512 if path == "rule" else 1)
    est = checks.check_cost(f"{what}: {checks.fmt_count(n)} rounds of L={L}", nbytes, secs, max_bytes, max_seconds,
                            "use fewer rounds, or raise max_bytes / max_seconds (None or --max-seconds 0: no limit)")
    return est, secs


def simulate(P, Q, F, G, init, n_rounds: int, seed: int | None = 0, *, backend: str = "numpy",
             max_bytes: float | None = checks.MAX_BYTES, max_seconds: float | None = checks.MAX_SECONDS) -> SimResult:
    """Simulate ``n_rounds`` independent rounds from per-position tables (a contract: external checks call
    it with this signature).

    P, Q (V, V) row-stochastic; F (L, V, V) acceptance probabilities F[i-1, s, x] = f_i(x | s);
    G (L, V, V) resampling laws G[i-1, s] = G_i(. | s) (effective law for rejected-token rules);
    ``init`` a start state or a distribution (V,) (the start is drawn per round and recorded).
    Same seed -> identical output for a given backend. Returns :class:`SimResult`; tau per round
    is ``result.accepted`` and x_{1:L+1} is ``result.tokens`` (T7).

    backend "numpy": float64 uniforms (PCG64) and alias tables. backend "jax": jit + vmap over rounds,
    one uint32 PCG64 word per draw and float32 thresholds (resolution 2^-24; see ``sim._jax``).
    The two backends read the random stream differently: same law, different samples. A run whose results or
    time exceed ``max_bytes`` / ``max_seconds`` is refused first (``check_rounds_cost``; None: no limit).
    """
    n_rounds = checks.count("n_rounds", n_rounds)
    seed = checks.seed(seed)
    backend = _check_backend(backend)
    tab = prepare_tables(P, Q, F, G, init)
    check_rounds_cost("simulate", n_rounds, tab.F.shape[0], tab.P.shape[0], "table", max_bytes=max_bytes,
                      max_seconds=max_seconds)
    if backend == "jax":
        try:
            import jax  # noqa: F401
        except ImportError as e:
            raise ImportError("backend='jax' needs JAX: pip install 'coolsd[jax]'") from e
        from . import _jax

        tau, tokens, start, drafts = _jax.simulate(tab, n_rounds, seed)
        return SimResult(tau, tokens, start, drafts, "jax", seed)
    return _simulate_np(tab, n_rounds, seed)


def simulate_rule(P, Q, verifier, L: int, init, n_rounds: int, seed: int | None = 0, *, chunk: int = 8192,
                  max_bytes: float | None = checks.MAX_BYTES, max_seconds: float | None = checks.MAX_SECONDS) -> SimResult:
    """Simulate ``n_rounds`` rounds with a verifier's rule objects, exactly as the engine runs them.

    Per round: start s ~ init; drafts x~_i ~ Q(. | x~_{i-1}) for i = 1..L (x~_0 = s); the rows
    p (L+1, V) = P[s, x~_1, ..., x~_L] and q (L, V) = Q[s, x~_1..x~_{L-1}] along the drafted path go
    to ``theory.rules.chain.verify_chain`` (acceptance u < f_i(x~_i), resampling from G given the rejected
    token, bonus from P). Then x_{tau+2:L+1} ~ P (virtual extension, T7). numpy, float64.
    ``chunk`` rounds are verified at once (memory ~ chunk * (2L+1) * V * 8 bytes); it does not
    change the output. Refused first when the results or time exceed ``max_bytes`` / ``max_seconds``.
    """
    checks.verifier(verifier)
    L = checks.integer("draft length L", L, lo=1)
    n_rounds = checks.count("n_rounds", n_rounds)
    chunk = checks.count("chunk", chunk)
    seed = checks.seed(seed)
    P, Q = markov.check_chain(P, Q)
    check_rounds_cost("simulate_rule", n_rounds, L, P.shape[0], "rule", max_bytes=max_bytes, max_seconds=max_seconds)
    mu = markov.init_distribution(init, P.shape[0])
    V = P.shape[0]
    qp, qa = alias_table(Q)
    pp, pa = alias_table(P)
    mp, ma = alias_table(mu[None])
    qp, qa, pp, pa = qp.ravel(), qa.ravel(), pp.ravel(), pa.ravel()
    rng = np.random.default_rng(seed)
    out_tau, out_tok, out_s, out_d = [], [], [], []
    for lo in range(0, n_rounds, chunk):
        n = min(chunk, n_rounds - lo)
        U = rng.random((n, 3 * L + 2)).T          # round-major stream: output independent of ``chunk``
        s0 = alias_draw(mp.ravel(), ma.ravel(), np.zeros(n, np.int64), U[0], V)
        path = np.empty((n, L + 1), np.int64)
        path[:, 0] = s0
        for i in range(1, L + 1):  # drafting is sequential in the position
            path[:, i] = alias_draw(qp, qa, path[:, i - 1], U[i], V)
        drafts = path[:, 1:]
        verdict = verify_chain(P[path], Q[path[:, :L]], drafts, U[L + 1:2 * L + 1].T, U[2 * L + 1], verifier,
                               check=False)
        tau = np.asarray(verdict.accepted, np.int64)
        tokens = np.empty((n, L + 1), np.int64)
        prev = s0
        for j in range(1, L + 2):  # j-th output token: accepted draft, verifier's token, or virtual P draw
            virt = alias_draw(pp, pa, prev, U[2 * L + j], V) if j > 1 else None
            tok = np.where(j <= tau, drafts[:, min(j, L) - 1], verdict.next_token)
            if virt is not None:
                tok = np.where(j > tau + 1, virt, tok)
            tokens[:, j - 1] = tok
            prev = tok
        out_tau.append(tau)
        out_tok.append(tokens)
        out_s.append(s0)
        out_d.append(drafts)
    return SimResult(np.concatenate(out_tau), np.concatenate(out_tok), np.concatenate(out_s),
                     np.concatenate(out_d), "numpy", seed, {"verifier": getattr(verifier, "name", "custom")})
