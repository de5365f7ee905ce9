"""A claim-based worker for the tuned_exact units (time-boxed run): takes the next unclaimed unit in priority order,
tuning its schedule first when needed (the study's own call), with the study's names and seeds."""
import json, os, sys, importlib.util
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
out, side = Path("/work/runs/tuned_exact"), Path("/work/runs/side")
keys = {}
for t in tes.TARGETS:
    for fam in ("kl-free", "kl-entropy", "bound-free", "uniform-rsd"):
        keys[f"{fam}@{t}"] = (fam, t)
for t in (*tes.TARGETS, *tes.EXTRA):
    keys[f"cool-sd@{t}"] = ("cool-sd", t)
names = sorted(keys, key=lambda k: (keys[k][1], tes.FAMILIES.index(keys[k][0])))
QUEUE = ["bound-free@3.0", "kl-free@3.4", "kl-entropy@3.4", "kl-free@3.8", "kl-entropy@3.8"]


def claim(tag):
    try:
        os.close(os.open(side / f"claim_{tag}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


ar = rec = None
bundle = build("mnist", draft="eagle")
proc = _processing(bundle)
for k in QUEUE:
    fam, t = keys[k]
    unit = out / f"unit_{k.replace('@', '_')}.npz"
    if unit.exists() or not claim(k):
        continue
    f = side / f"sched_{k}.json"
    if not f.exists():
        if ar is None:
            ar = load_ar_rows("/work/wt-kl/out/bench_tune_exact/mnist_eagle_L4_ar_2000.npz")
            rec = load_record("/work/wt-kl/out/kl/rec.npz")
        r = exact_tune.tune_exact(ar, rec, "entropy" if fam == "kl-entropy" else "free", "kl", tokens_per_call=t)
        f.write_text(json.dumps({"family": fam, "target": t, "schedule": r.to_dict()}, indent=1))
        print(f"worker {os.getpid()} tuned {k}: {r.to_dict().get('weights')} slope {r.to_dict().get('slope')}", flush=True)
    entry = json.loads(f.read_text())
    i = names.index(k)
    print(f"worker {os.getpid()}: {k} seed {1000 + 1 + i}", flush=True)
    tes.run_setting(out, k.replace("@", "_"), tes.rule_of(entry), bundle, proc, 2000, 1000 + 1 + i, 100)
