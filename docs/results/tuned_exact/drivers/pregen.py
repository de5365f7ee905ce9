"""Pre-generate the Cool-SD / UniformRSD units of scripts/tuned_exact_study.py while its tuner runs (same names,
same seeds, same cache files: the study finds them and skips)."""
import sys, importlib.util
sys.path.insert(0, "/work/main")
spec = importlib.util.spec_from_file_location("tes", "/work/main/scripts/tuned_exact_study.py")
tes = importlib.util.module_from_spec(spec); spec.loader.exec_module(tes)
from pathlib import Path
import torch
from theory import rules
from theory.likelihood import speed
from theory.likelihood.arrows import load_record
from coolsd.rowfiles import _processing
from real.registry import build

torch.set_num_threads(1)
out = Path("/work/runs/tuned_exact")
rec = load_record("/work/wt-kl/out/kl/rec.npz")
sm = speed.SpeedModel(rec)
keys = {}
for t in tes.TARGETS:
    for fam in ("kl-free", "kl-entropy", "bound-free", "uniform-rsd"):
        keys[f"{fam}@{t}"] = (fam, t)
for t in (*tes.TARGETS, *tes.EXTRA):
    keys[f"cool-sd@{t}"] = ("cool-sd", t)
names = sorted(keys, key=lambda k: (keys[k][1], tes.FAMILIES.index(keys[k][0])))
bundle = build("mnist", draft="eagle")
proc = _processing(bundle)
for i, k in enumerate(names):
    fam, t = keys[k]
    if fam == "cool-sd":
        rule = rules.cool_sd(tes.solve(sm, lambda d: rules.cool_sd(d), 1.0 + 1e-9, 1e4, t, 4))
    elif fam == "uniform-rsd":
        rule = rules.uniform_rsd(tes.solve(sm, lambda c: rules.uniform_rsd(c), 1.0 + 1e-9, 1e4, t, 4))
    else:
        continue
    print(k, "seed", 1000 + 1 + i, flush=True)
    tes.run_setting(out, k.replace("@", "_"), rule, bundle, proc, 2000, 1000 + 1 + i, 100)
