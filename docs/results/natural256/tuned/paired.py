import json, math, numpy as np, sys
d = json.load(open(sys.argv[1]))
rows = {r["name"]: r for r in d["rows"]}
out = []
for t in (4.3, 4.5, 4.7):
    c = np.array(rows[f"cool-sd@{t}"]["per_image"])
    for fam in ("kl-free", "kl-entropy", "uniform-rsd"):
        a = np.array(rows[f"{fam}@{t}"]["per_image"])
        T = 256
        diff = (a - c) / T
        m, se = diff.mean(), diff.std(ddof=1) / math.sqrt(diff.size)
        rel = m / (c.mean() / T)
        z = m / se
        v = "a lower KL" if z < -1.959963984540054 else "cool-sd lower KL" if z > 1.959963984540054 else "no significant difference"
        out.append({"a": f"{fam}@{t}", "b": f"cool-sd@{t}", "target": t, "delta_kl_per_token": m, "se": se, "z": z,
                    "relative": rel, "verdict": v, "paired_images": int(diff.size)})
        print(f"{fam:12s} @{t}: dKL/token {m:+.5f} (SE {se:.5f}, z {z:+.2f}, {100*rel:+.1f}% of Cool-SD) {v}")
json.dump(out, open(sys.argv[2], "w"), indent=1)
