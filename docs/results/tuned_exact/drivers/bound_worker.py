"""Tune bound-free at one target exactly as the study does (objective "bound"), then generate its unit."""
import json, sys, importlib.util
sys.path.insert(0, "/work/main")
spec = importlib.util.spec_from_file_location("tes", "/work/main/scripts/tuned_exact_study.py")
tes = importlib.util.module_from_spec(spec); spec.loader.exec_module(tes)
from pathlib import Path
import torch
from theory.likelihood import exact_tune
from theory.likelihood.arrows import load_ar_rows, load_record
from coolsd.rowfiles import _processing
from real.registry import build

torch.set_num_threads(1)
t = float(sys.argv[1])
k = f"bound-free@{t}"
out, side = Path("/work/runs/tuned_exact"), Path("/work/runs/side")
keys = {}
for tt in tes.TARGETS:
    for fam in ("kl-free", "kl-entropy", "bound-free", "uniform-rsd"):
        keys[f"{fam}@{tt}"] = (fam, tt)
for tt in (*tes.TARGETS, *tes.EXTRA):
    keys[f"cool-sd@{tt}"] = ("cool-sd", tt)
names = sorted(keys, key=lambda kk: (keys[kk][1], tes.FAMILIES.index(keys[kk][0])))
ar = load_ar_rows("/work/wt-kl/out/bench_tune_exact/mnist_eagle_L4_ar_2000.npz")
rec = load_record("/work/wt-kl/out/kl/rec.npz")
r = exact_tune.tune_exact(ar, rec, "free", "bound", tokens_per_call=t)
f = side / f"sched_{k}.json"
f.write_text(json.dumps({"family": "bound-free", "target": t, "schedule": r.to_dict()}, indent=1))
print(f"tuned {k}: {r.to_dict().get('weights')}", flush=True)
bundle = build("mnist", draft="eagle")
i = names.index(k)
tes.run_setting(out, k.replace("@", "_"), tes.rule_of(json.loads(f.read_text())), bundle, _processing(bundle), 2000,
                1000 + 1 + i, 100)
