"""Held-out exact KL(P||P^) per token (with 95% CI) of every schedule in schedules.json, on the held-out half of the
tuning AR rows (the split tuned_exact_study uses), at each schedule's predicted tokens per call: the tuning-side view
of study (b), while its fresh-image measurement runs."""
import json, sys
import numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4] / "scripts"))
import tuned_exact_study as S
from theory.likelihood.arrows import load_ar_rows, load_record
from theory.likelihood import fidelity, log_likelihood, log_target, speed

out = sys.argv[1]                       # the study's --out (schedules.json); AR rows and record beside it, or given
ar = load_ar_rows(sys.argv[2] if len(sys.argv) > 2 else f"{out}/../ar400.npz")
rec = load_record(sys.argv[3] if len(sys.argv) > 3 else f"{out}/../rec200.npz")
saved = json.load(open(f"{out}/schedules.json"))
held = np.sort(np.random.default_rng(0).permutation(ar.n)[int(round(0.5 * ar.n)):])
h = ar.subset(held)
T = h.tokens.shape[-1]
lp = log_target(h.p, h.tokens)
sm = speed.SpeedModel(rec)
rows = []
for k in sorted(saved, key=lambda k: (saved[k]["target"], S.FAMILIES.index(saved[k]["family"]))):
    e = saved[k]; rule = S.rule_of(e)
    lph = np.concatenate([log_likelihood(h.p[s:s + 50], h.q[s:s + 50], h.tokens[s:s + 50], rule, 4,
                                         convention=h.convention) for s in range(0, h.n, 50)])
    kl = fidelity.kl_ar(lph, lp, T=T)
    tpc = e["schedule"].get("predicted_tokens_per_call") or S.predicted_speed(sm, rule, 4)
    rows.append({"name": k, "family": e["family"], "target": e["target"], "predicted_tokens_per_call": tpc,
                 "kl_per_token": kl["per_token"]["measured"], "ci": kl["per_token"]["ci"], "se": kl["se"] / T,
                 "per_image": (lp - lph).tolist()})
    print(f"{k:22s} tpc {tpc:.3f}  KL(P||P^)/token {kl['per_token']['measured']:.5f} "
          f"[{kl['per_token']['ci'][0]:.5f}, {kl['per_token']['ci'][1]:.5f}]", flush=True)
json.dump({"held_out_images": int(h.n), "rows": rows}, open(f"{out}/heldout_kl.json", "w"), indent=1)
