# %% [markdown]
# # 07 · Schedules tuned to the model
#
# One vanilla run's recorded rows predict any rule's accepted drafts (T10) and TV-bound term (T11) per
# round (`theory.likelihood.recorded`). `theory.likelihood.tune` turns that into an optimiser: the per-position weights
# w_1..w_L of the scaled rule (free, uniform, exponential with free nu, linear) or the levels of the
# level rule that minimise the predicted bound at a target tokens per call, on the model's own rows.
# This notebook (1) checks the optimiser against the exact theory on a synthetic chain, (2) shows the
# predicted frontier per family on the MNIST models and the measured points of the committed study
# (`scripts/tuned_study.py`, docs/results/tuned/).

# %%
import json
import os
import pathlib

import matplotlib.pyplot as plt
import numpy as np

from sim.rounds import simulate_rule
from theory.markov import chains, optimize
from theory import markov, rules
from theory.likelihood import tune

SMALL = os.environ.get("COOLSD_SMALL") == "1"
ROOT = pathlib.Path.cwd()
while not (ROOT / "docs").exists() and ROOT != ROOT.parent:
    ROOT = ROOT.parent

# %% [markdown]
# ## 1. Recorded-rows optimiser vs exact theory on a chain
#
# Simulated vanilla rounds on a 5-state chain give recorded rows; the tuned free weights are evaluated
# exactly (T2, T4) and compared with `optimize.optimal_schedule`'s exact optimum at the same E[tau].

# %%
P, Q = chains.random_pair(5, tv=0.4, seed=3)
mu = chains.stationary(P)
L = 3
n = 1500 if SMALL else 5000
r = simulate_rule(P, Q, rules.vanilla(), L, mu, n, seed=1)
pref = np.concatenate([r.start[:, None], r.drafts], axis=1)
rows = tune.Rows(P[pref], Q[pref[:, :L]], r.drafts, None, np.arange(n) // 25)
e_van = markov.expected_accepted(P, Q, optimize.scaled_tables(P, Q, np.ones(L))[0], mu)
e_max = optimize.max_reachable(P, Q, L, mu)
pts = {"tuned (recorded rows)": [], "exact optimum": [], "uniform (exact)": []}
for frac in ((0.3, 0.6) if SMALL else (0.2, 0.4, 0.6, 0.8)):
    T = e_van + frac * (e_max - e_van)
    res = tune.tune(rows, "free", tokens_per_call=1 + T, search_rounds=None, maxiter=30)
    F, G = optimize.scaled_tables(P, Q, res.values)
    pts["tuned (recorded rows)"].append((1 + markov.expected_accepted(P, Q, F, mu), markov.tv_bound(P, Q, F, G, mu)))
    opt = optimize.optimal_schedule(P, Q, L, mu, T, n_random=0)
    pts["exact optimum"].append((1 + T, opt.tv_bound))
    pts["uniform (exact)"].append((1 + T, opt.named["uniform"]["tv_bound"]))
    print(f"E[tau]+1 = {1 + T:.3f}: tuned w = {np.round(res.values, 3)}, exact B of tuned {pts['tuned (recorded rows)'][-1][1]:.4f}, "
          f"optimum {opt.tv_bound:.4f} (w = {np.round(opt.weights, 3)}), uniform {opt.named['uniform']['tv_bound']:.4f}")
fig, ax = plt.subplots(figsize=(6, 4))
for k, v in pts.items():
    ax.plot(*zip(*v), "o-" if "tuned" not in k else "x", label=k, ms=7)
ax.set_xlabel("tokens per call (exact)")
ax.set_ylabel("TV bound B (exact)")
ax.legend()
ax.set_title(f"free weights tuned on {n} simulated rounds")
plt.show()

# %% [markdown]
# ## 2. The MNIST models: predicted frontier per family, measured points
#
# From the committed study (`python scripts/tuned_study.py --out docs/results/tuned`): left, the predicted
# bound vs predicted tokens per drafted round of every family (on a subsample of the recorded rounds) with
# the tuned, Cool-SD and UniformRSD rules run in the study (crosses); right, what was measured when they ran.

# %%
rep_path = ROOT / "docs" / "results" / "tuned" / "report.json"
if rep_path.exists():
    rep = json.loads(rep_path.read_text())
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    fr = rep["frontier"]
    for fam in tune.FAMILIES:
        ax[0].plot([p["tokens_per_call"] for p in fr[fam]], [p["bound"] for p in fr[fam]], "o-", ms=4, label=fam)
    col = {"tuned": "C0", "tuned-exp": "C4", "cool-sd": "C1", "uniform-rsd": "C2", "vanilla": "k"}
    for name, x in rep["results"].items():
        base = name.split("@")[0]
        ax[0].plot(x["predicted"]["tokens_per_drafted_round"], x["predicted"]["bound"], "x", color=col[base], ms=8)
        m = x["measured"]
        ax[1].errorbar(m["tokens_per_call"], m["nll_per_token"], xerr=m["tokens_per_call_se"], yerr=m["nll_per_token_se"],
                       fmt="o", color=col[base], label=base if (name.endswith("@0") or name == "vanilla") else None)
        ax[1].annotate(f"{x['predicted']['tokens_per_call_renewal']:.2f}", (m["tokens_per_call"], m["nll_per_token"]),
                       fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax[0].set_xlabel("predicted tokens per drafted round")
    ax[0].set_ylabel("predicted TV bound per round")
    ax[0].legend(fontsize=8)
    ax[1].set_xlabel("measured tokens per call (labels: predicted)")
    ax[1].set_ylabel("measured target NLL per token")
    ax[1].legend(fontsize=8)
    plt.tight_layout()
    plt.show()
else:
    print("docs/results/tuned/report.json not found: run python scripts/tuned_study.py --out docs/results/tuned")
