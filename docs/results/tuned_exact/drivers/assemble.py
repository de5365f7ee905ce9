"""Write /work/runs/tuned_exact/schedules.json from what exists (Cool-SD / UniformRSD solved as the study does; the
tuned schedules from /work/runs/side/sched_*.json), then (with --ar) score the fresh AR images under every rule."""
import json, sys, importlib.util
sys.path.insert(0, "/work/main")
spec = importlib.util.spec_from_file_location("tes", "/work/main/scripts/tuned_exact_study.py")
tes = importlib.util.module_from_spec(spec); spec.loader.exec_module(tes)
from pathlib import Path
from theory import rules
from theory.likelihood import speed
from theory.likelihood.arrows import load_record

out = Path("/work/runs/tuned_exact")
rec = load_record("/work/wt-kl/out/kl/rec.npz")
sm = speed.SpeedModel(rec)
saved = {}
for t in (*tes.TARGETS, *tes.EXTRA):
    saved[f"cool-sd@{t}"] = {"family": "cool-sd", "target": t, "schedule": {
        "delta": tes.solve(sm, lambda d: rules.cool_sd(d), 1.0 + 1e-9, 1e4, t, 4), "nu": 0.7}}
for t in tes.TARGETS:
    saved[f"uniform-rsd@{t}"] = {"family": "uniform-rsd", "target": t, "schedule": {
        "c": tes.solve(sm, lambda c: rules.uniform_rsd(c), 1.0 + 1e-9, 1e4, t, 4)}}
for f in sorted(Path("/work/runs/side").glob("sched_*.json")):
    saved[f.stem[len("sched_"):]] = json.loads(f.read_text())
(out / "schedules.json").write_text(json.dumps(saved, indent=1))
print(sorted(saved))
if "--ar" in sys.argv:
    import torch
    from coolsd.rowfiles import _processing
    from real.registry import build
    torch.set_num_threads(1)
    bundle = build("mnist", draft="eagle")
    proc = _processing(bundle)
    tes.run_ar(out, {k.replace("@", "_"): tes.rule_of(e) for k, e in saved.items()}, bundle, proc, 2000, 999, 100)
