# %% [markdown]
# # 01 · Theorem 2 on a small chain: accepted length, the TV bound, the exact TV
#
# One round of (relaxed) speculative decoding drafts L tokens from Q and verifies them against P.
# For any acceptance rule f_i and resampling rule G_i the toolkit computes exactly, on Markov chains:
#
# * the expected number of accepted drafts E[tau] (T2, T8) — tokens per target call is E[tau] + 1;
# * the upper bound B on TV(Phat, P) (T3, T4, T9);
# * the exact TV between the law of the round's L+1 tokens and the target's (T7).
#
# This notebook checks Theorem 1 (vanilla SD is exact), shows that the bound is tight for L = 1 and
# loose for L > 1, and traces the speed / fidelity trade-off of Cool-SD and UniformRSD.
# Set `COOLSD_SMALL=1` for a quick run (CI does).

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

from theory.markov import chains
from theory import markov, rules

SMALL = os.environ.get("COOLSD_SMALL") == "1"
V, L = (6, 3) if SMALL else (8, 4)
P, Q = chains.ambiguous_pair(V, spread=0.5, tv=0.4, seed=0)   # near-uniform rows: image-token-like
init = chains.stationary(P)                                   # rounds start from the stationary law
print(f"V={V}, L={L}, TV(P(.|s), Q(.|s)) = {chains.row_tv(P, Q).mean():.3f} in every row")

# %% [markdown]
# ## Theorem 1: vanilla SD is exact
# With f = min(1, P/Q) and G = Norm([P - Q]_+) the bound and the exact TV are zero (up to round-off).

# %%
F, G = markov.rule_tables(P, Q, L, rules.vanilla())
print(f"vanilla: E[tau] = {markov.expected_accepted(P, Q, F, init):.4f}, "
      f"B = {markov.tv_bound(P, Q, F, G, init):.2e}, exact TV = {markov.exact_tv(P, Q, F, G, init):.2e}")

# %% [markdown]
# ## The trade-off: relax more, accept more, drift more
# Cool-SD uses w_i = delta exp(-nu i - mu) with nu = 0.7 (here normalised so that w_1 = delta:
# `norm="first"`, the earlier default; docs/theory.md section 5 compares the normalisations);
# UniformRSD uses w_i = c. Both resample with G* (T5).

# %%
def sweep(make, params, L):
    out = []
    for a in params:
        v = make(a)
        F, G = markov.rule_tables(P, Q, L, v)
        out.append((markov.expected_accepted(P, Q, F, init) + 1, markov.tv_bound(P, Q, F, G, init),
                    markov.exact_tv(P, Q, F, G, init)))
    return np.array(out)

deltas = np.geomspace(1.0, 12.0, 8 if SMALL else 20)
curves = {
    "Cool-SD (exp, nu=0.7)": sweep(lambda d: rules.cool_sd(d, norm="first"), deltas, L),
    "UniformRSD": sweep(lambda c: rules.uniform_rsd(c), deltas, L),
}
fig, ax = plt.subplots(figsize=(6.4, 4.2))
for (name, arr), col in zip(curves.items(), ["C0", "C1"]):
    ax.plot(arr[:, 0], arr[:, 2], "-o", color=col, ms=3, label=f"{name}: exact TV")
    ax.plot(arr[:, 0], arr[:, 1], "--", color=col, label=f"{name}: bound B")
ax.set_xlabel("tokens per target call  E[tau] + 1")
ax.set_ylabel("TV to the target (one round)")
ax.set_title(f"Speed vs fidelity, ambiguous chain V={V}, L={L}")
ax.legend(fontsize=8)
fig.tight_layout()
if not SMALL:
    fig.savefig("../docs/figures/01_tradeoff.png", dpi=120)
plt.show()

# %% [markdown]
# Read the two curves at equal speed: interpolate each method's exact TV and bound at the same
# tokens per target call. On this chain the steep exponential schedule (nu = 0.7, w_1 = delta) has the
# *higher* exact TV at equal speed, even where its bound is lower; with delta near 1 it is even slower
# than vanilla, because w_i < 1 makes later positions stricter than vanilla. Notebook 03 measures
# where decaying schedules win, for the bound and for the exact TV.

# %%
x0 = np.linspace(2.6, 3.8 if not SMALL else 3.2, 4)
for name, arr in curves.items():
    tv_at = np.interp(x0, arr[:, 0], arr[:, 2])
    b_at = np.interp(x0, arr[:, 0], arr[:, 1])
    print(f"{name:24s} tokens/call {np.round(x0, 2)}  exact TV {np.round(tv_at, 3)}  bound {np.round(b_at, 3)}")

# %% [markdown]
# ## Tightness: B = TV when L = 1, B > TV when L > 1
# With one draft, the round's output is one token from Q f + (1 - beta) G, so the bound is the TV.
# With more drafts the triangle inequality in the proof loses the cancellations between positions.

# %%
for LL in (1, 2, L):
    arr = sweep(lambda c: rules.uniform_rsd(c), deltas, LL)
    gap = arr[:, 1] - arr[:, 2]
    print(f"L={LL}: max |B - TV| = {np.abs(gap).max():.2e};  B / TV at the largest relaxation = "
          f"{arr[-1, 1] / arr[-1, 2]:.3f}")

# %% [markdown]
# ## Every verifier on this chain
# The same table is printed by `coolsd theory table`.

# %%
from coolsd.commands.theory import default_verifiers, format_table, theory_table

print(format_table(theory_table(P, Q, L, default_verifiers(V, L), init=init)))
