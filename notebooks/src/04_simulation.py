# %% [markdown]
# # 04 · Simulation against theory
#
# The simulator (`sim`) runs the actual algorithm — draft from Q, verify with the same rule objects
# as the theory, resample, bonus token — many rounds at once. Here every exact quantity of the theory
# is checked by sampling: the expected accepted length, the law of the round's tokens, tree rounds,
# whole images, and the image-like token sources where the exact engine cannot go.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
from scipy import stats

import sim
from sim.stats import chi_square, sequence_counts, tau_moments
from theory.markov import chains, image
from theory import markov, rules, tree

SMALL = os.environ.get("COOLSD_SMALL") == "1"
N = 20_000 if SMALL else 400_000
V, L = 5, 3
P, Q = chains.ambiguous_pair(V, spread=0.8, tv=0.4, seed=1)
mu = chains.stationary(P)
nb = rules.lantern_neighbors(np.random.default_rng(0).normal(size=(V, 2)))
verifiers = [rules.vanilla(), rules.cool_sd(2.5), rules.uniform_rsd(1.6), rules.lantern(nb, 2, 0.2),
             rules.lantern_pp(nb, 2, 2.0), rules.lantern(nb, 2, 0.2, resample="optimal")]

# %% [markdown]
# ## Mean accepted length: simulated vs exact (z-scores from the exact variance of tau)

# %%
print(f"{'verifier':12s} {'exact E[tau]':>12s} {'simulated':>10s} {'SE':>8s} {'z':>6s}   (n = {N} rounds each)")
for j, v in enumerate(verifiers):
    F, G = markov.rule_tables(P, Q, L, v)
    e, var = tau_moments(markov.acceptance_probs(P, Q, F, mu))
    r = sim.simulate(P, Q, F, G, mu, N, seed=j)
    se = np.sqrt(var / N)
    print(f"{v.name:12s} {e:12.4f} {r.accepted.mean():10.4f} {se:8.4f} {(r.accepted.mean() - e) / se:6.2f}")

# %% [markdown]
# ## The law of the round's L+1 tokens
# Chi-square of the simulated (start, x_1..x_{L+1}) counts against the exact law Phat (T7), and
# against the target P. Vanilla must be indistinguishable from P; a deliberately wrong resampler
# (vanilla acceptance, resample from P itself) must be detected.

# %%
wrong = rules.Verifier(rules.Vanilla(), rules.Target(), "wrong-resampler")
print(f"{'verifier':16s} {'p vs Phat':>10s} {'p vs P':>10s}  exact TV")
for j, v in enumerate([rules.vanilla(), rules.cool_sd(2.5), wrong]):
    F, G = markov.rule_tables(P, Q, L, v)
    r = sim.simulate_rule(P, Q, v, L, 0, N, seed=100 + j)
    ph, pt = markov.sequence_laws(P, Q, F, G, 0)
    counts = sequence_counts(r.tokens, V)
    print(f"{v.name:16s} {chi_square(counts, ph.ravel()).pvalue:10.3g} {chi_square(counts, pt.ravel()).pvalue:10.3g}  "
          f"{markov.exact_tv(P, Q, F, G, 0):.4f}")

# %% [markdown]
# ## Static-tree rounds (EAGLE-1 shape, multi-candidate verification)
# `theory.tree.tree_round` enumerates a tree round exactly; `sim.simulate_tree` runs it.

# %%
t = tree.Tree(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))
print(f"tree with {t.n_nodes} nodes, depth {t.depth}")
for j, v in enumerate([rules.vanilla(), rules.cool_sd(2.5), rules.uniform_rsd(1.6)]):
    ex = tree_ex = tree.tree_round(P, Q, t, v, 0)
    r = sim.simulate_tree(P, Q, t, v, 0, N // 4, seed=200 + j)
    se = r.accepted.std() / np.sqrt(r.accepted.size)
    F, _ = markov.rule_tables(P, Q, t.depth, v)
    print(f"{v.name:12s} tree: exact E[accepted] {ex.expected_accepted:.4f}, simulated {r.accepted.mean():.4f} "
          f"+- {se:.4f}, exact TV {ex.tv:.4f}   | chain of {t.depth}: E[tau] {markov.expected_accepted(P, Q, F, 0):.4f}")

# %% [markdown]
# ## Whole images: rounds per image
# An image of T tokens is made by successive rounds; `theory.markov.image` predicts the expected number of
# target calls exactly (a recursion over tokens generated and last state).

# %%
T = 64 if SMALL else 256
fig, ax = plt.subplots(figsize=(6, 3.8))
for j, v in enumerate([rules.vanilla(), rules.cool_sd(2.5), rules.uniform_rsd(1.6)]):
    F, G = markov.rule_tables(P, Q, L, v)
    pred = image.image_prediction(P, Q, F, G, T, 0)
    s = sim.simulate_sequence(P, Q, F, G, 0, T, 500 if SMALL else 4000, seed=300 + j)
    se = s.n_rounds.std() / np.sqrt(s.n_rounds.size)
    print(f"{v.name:12s} T={T}: predicted rounds {pred.expected_rounds:7.2f}, simulated {s.n_rounds.mean():7.2f} +- {se:.2f}; "
          f"accumulated bound {pred.accumulated_bound:.2f}")
    ax.hist(s.n_rounds, bins=30, alpha=0.5, label=f"{v.name} (simulated)")
    ax.axvline(pred.expected_rounds, color=f"C{j}", ls="--")
ax.set_xlabel(f"target calls for a {T}-token image (dashed: exact expectation)")
ax.set_ylabel("images")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Image-like token sources
# (a) a latent codebook: an order-1 chain whose rows put similar mass on latent neighbours (exact TV
# available); (b) a 2-D grid where each token depends on its left and upper neighbours (not an
# order-1 chain: the per-round TV bound is estimated along the drafted paths, T11).

# %%
rows = sim.sources.compare(n_rounds=5_000 if SMALL else 40_000, n_images=8 if SMALL else 48,
                           grid=sim.sources.grid_source(H=8, W=8) if SMALL else None)
print(sim.sources.format_rows(rows))
sim.sources.plot(rows, "/tmp/coolsd_sources.png")
from IPython.display import Image, display

display(Image("/tmp/coolsd_sources.png"))
