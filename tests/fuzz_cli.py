"""The CLI fuzz of issue 50, by construction: every option of every ``coolsd`` subcommand is found by walking the
argparse tree (a flag added tomorrow is covered without being named here) and given the bad values of its kind.

Kinds (from the parser and the registries, not from a list of flags):
  - number: ``type=int`` / ``type=float``, or a verifier flag whose every owning method parameter is numeric
    (``theory.rules.methods.flag_owners``; it is given with ``--method <owner>``). Bad values: nan, inf, -inf, empty,
    huge (must be refused); negative and zero (refused, or accepted as valid).
  - path: a string option whose dest names a file (``PATH_WORDS``). Bad values: a FIFO, /dev/zero and empty (must be
    refused); a missing file, a directory, a truncated .npz, a decompression bomb and an input named as output
    (refused, or accepted where the option means it: an output directory may exist).
  - text: any other free string option: the empty string must be refused.
Choices and switches are argparse's own (a wrong choice is argparse's one-line error).

A run is judged in-process (``coolsd.cli.main``) in an empty working directory with the work patched out: the first
call into a command's work (``WORK``: a model build, the engine, a table, a simulation, the sweep, the tuner) raises
``WorkBegan``. Outcomes: "refused" (exit 2, one line ``coolsd: error: ...`` naming the option, no traceback, nothing
written), "accepted" (the checks passed and the work began; nothing written before it), anything else is a failure.
"""
from __future__ import annotations

import argparse
import importlib
import io
import os
import pathlib
import random
import time
import zipfile

import numpy as np

PATH_WORDS = ("file", "path", "ckpt", "dir", "out", "save", "record", "rows", "measured", "ref", "captions",
              "weights", "schedule", "clip", "figure", "manifest", "json")
NUMBER_BAD = {"nan": "nan", "inf": "inf", "-inf": "-inf", "empty": "", "huge": "1e300"}
NUMBER_MAYBE = {"negative": "-1", "zero": "0"}
INT_HUGE = str(10**30)
PATH_BAD = ("fifo", "devzero", "empty")
PATH_MAYBE = ("missing", "directory", "truncated", "bomb", "input_as_output")

# a valid invocation of each leaf command (the option under test is added to it, or replaces its value); "{f}" is the
# input-file directory. A new subcommand without an entry here fails test_every_subcommand_has_a_base.
BASE = {
    "generate": ["--model", "mnist", "--json", "--num-images", "2"],
    "sweep": ["--model", "mnist", "--images", "4", "--unit-images", "4", "--record-images", "4", "--out", "sw"],
    "tune": ["--record", "{f}/rec.npz", "--ar-rows", "{f}/ar.npz", "--tokens-per-call", "1.8"],
    "demo": ["--quick", "--out", "demo_out"],
    "theory table": [],
    "theory anneal": ["--out", "an_out"],
    "sim validate": [],
    "sim sources": [],
    "train-drafter": ["--model", "mnist", "--data", "generate", "--num-sequences", "4", "--out", "dr"],
}
# the first call into each command's work ("module:attribute"); a model build anywhere counts for every command
WORK = {
    "*": ["real.registry:build"],
    "generate": ["coolsd.commands.generate_checks:build_plan"],
    "sweep": ["coolsd.studies.sweep:sweep"],
    "tune": ["coolsd.rowfiles:make_record", "coolsd.rowfiles:make_ar_rows", "theory.likelihood.exact_tune:tune_exact",
             "coolsd.commands.tune:_legacy"],
    "demo": ["coolsd.studies.demo:run_demo"],
    "theory table": ["coolsd.commands.theory:make_chain", "coolsd.commands.theory:theory_table"],
    "theory anneal": ["coolsd.studies.anneal:anneal_study"],
    "sim validate": ["sim.validation:validate"],
    "sim sources": ["sim.sources:codebook_source", "sim.sources:grid_source", "sim.sources:compare"],
    "train-drafter": ["coolsd.commands.train_drafter:_run"],
}
# documented exceptions: (command, flag, bad value) -> why the value is valid there
ALLOWED = {
    ("*", "--max-seconds", "huge"): "a budget: a huge one means no practical limit (0 is the documented 'none')",
    ("*", "--z-max", "huge"): "a largest accepted |z|: any positive bound is a valid (lenient) test",
    ("*", "--tv-bias", "huge"): "an upper bias bound used to size n: a huge one sizes n at its floor",
    ("*", "--se", "huge"): "a target standard error: a huge one asks for the minimum rounds",
    ("*", "--ambiguity", "huge"): "a row flatness: a huge one is a flat (uniform) row, still a valid source",
}


class WorkBegan(BaseException):
    """Raised by the patched work entry points: the command passed its checks (a BaseException: main() lets it by)."""


def leaf_parsers(parser=None, prefix=()) -> dict:
    """{"generate": parser, "theory table": parser, ...}: every subcommand that runs (has ``func``)."""
    from coolsd.cli import build_parser

    parser = parser or build_parser()
    out = {}
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                out.update(leaf_parsers(sp, prefix + (name,)))
    if prefix and parser.get_default("func") is not None:
        out[" ".join(prefix)] = parser
    return out


def _method_flag_kind(dest: str):
    """(kind, an owning method) of a verifier flag parsed as text: "number" when every owner's parameter is."""
    from theory.rules import methods as registry

    owners = registry.flag_owners().get(dest)
    if not owners:
        return None, None
    numeric = all(p.type in (int, float) for _, p in owners)
    return ("number" if numeric else "text"), owners[0][0].name


def option_kinds(parser) -> list[tuple[str, str, str, object]]:
    """[(flag, dest, kind, extra)]: every option of a leaf parser with a kind; extra = "int" / "float" for numbers,
    the owning method for a verifier flag."""
    out = []
    for a in parser._actions:
        if not a.option_strings or a.nargs == 0 or a.choices is not None:
            continue                      # --help, switches, choices: argparse's own
        flag = max(a.option_strings, key=len)
        if a.type in (int, float):
            out.append((flag, a.dest, "number", a.type.__name__))
            continue
        kind, owner = _method_flag_kind(a.dest)
        if kind is not None:
            out.append((flag, a.dest, kind, owner))
        elif any(w in a.dest for w in PATH_WORDS) or (a.metavar and any(w in str(a.metavar).lower()
                                                                       for w in ("file", "dir", "npz", "json"))):
            out.append((flag, a.dest, "path", None))
        else:
            out.append((flag, a.dest, "text", None))
    return out


def cases(commands: dict) -> list[tuple[str, str, str, str, object, str]]:
    """Every (command, flag, dest, kind, extra, bad-value name) the fuzz tries."""
    out = []
    for cmd, parser in sorted(commands.items()):
        for flag, dest, kind, extra in option_kinds(parser):
            names = (list(NUMBER_BAD) + list(NUMBER_MAYBE) if kind == "number" else
                     list(PATH_BAD) + list(PATH_MAYBE) if kind == "path" else ["empty"])
            out += [(cmd, flag, dest, kind, extra, n) for n in names]
    return out


def sample(all_cases: list, n: int, seed: int = 50) -> list:
    """``n`` cases drawn with a fixed seed, every option at least once when n allows (COOLSD_FUZZ=all: every case)."""
    if os.environ.get("COOLSD_FUZZ", "").lower() == "all" or n >= len(all_cases):
        return list(all_cases)
    rng = random.Random(seed)
    by_opt: dict = {}
    for c in all_cases:
        by_opt.setdefault(c[:2], []).append(c)
    first = [rng.choice(v) for _, v in sorted(by_opt.items())]
    rest = [c for c in all_cases if c not in first]
    rng.shuffle(first)
    return (first + rng.sample(rest, max(0, n - len(first))))[:n] if n >= len(first) else first[:n]


def write_bomb(path) -> None:
    """An .npz whose zip directory says a member inflates to about 4 GB (written small: the sizes are declared)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("p.npy", b"\0" * 1024)
    raw = bytearray(buf.getvalue())
    for sig, off in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):    # uncompressed size: local header, directory
        i = raw.find(sig)
        raw[i + off:i + off + 4] = (0xF0000000).to_bytes(4, "little")
    pathlib.Path(path).write_bytes(bytes(raw))


def input_files(d: pathlib.Path) -> pathlib.Path:
    """The inputs the bases and the bad values name, under ``d``."""
    tune_inputs(d / "rec.npz", d / "ar.npz")
    raw = (d / "rec.npz").read_bytes()
    (d / "truncated.npz").write_bytes(raw[: len(raw) // 2])
    write_bomb(d / "bomb.npz")
    (d / "adir").mkdir()
    os.mkfifo(d / "fifo")
    return d


def tune_inputs(rec_path, ar_path, V=4, L=2, T=6, n=12, seed=0) -> None:
    """A stamped vanilla record and matching AR rows (random rows; ``coolsd tune``'s inputs) written to the paths."""
    import json

    from coolsd.rowfiles import save_ar_rows, save_record
    from theory.likelihood import arrows

    rng = np.random.default_rng(seed)
    stamp = {"model": "chain", "draft": "table", "processing": {"temperature": 1.0}, "L": L, "convention": "eagle",
             "T": T, "V": V, "method": "vanilla", "per_row": T}
    ar = arrows.ARRows(rng.dirichlet(np.ones(V), (n, T)), rng.dirichlet(np.ones(V), (n, T, L)),
                       rng.integers(0, V, (n, T)), stamp)
    save_ar_rows(ar_path, ar)
    R = 3 * n
    save_record(rec_path, {"p": rng.dirichlet(np.ones(V), (R, L + 1)), "q": rng.dirichlet(np.ones(V), (R, L)),
                           "drafts": rng.integers(0, V, (R, L)), "n_drafted": np.full(R, L),
                           "image": np.arange(R) // 3, "start": np.tile([0, 1, 3], n),
                           "stamp": np.array(json.dumps(stamp))})


def bad_value(kind: str, extra, name: str, files: pathlib.Path, base: list) -> str:
    if kind == "number":
        if name == "huge" and extra == "int":
            return INT_HUGE
        return {**NUMBER_BAD, **NUMBER_MAYBE}[name]
    if kind == "text":
        return ""
    if name == "input_as_output":
        ins = [a for a in base if a.startswith("{f}/")]
        return (ins[0] if ins else "{f}/rec.npz").replace("{f}", str(files))
    return {"fifo": str(files / "fifo"), "devzero": "/dev/zero", "empty": "", "missing": str(files / "nope/x.npz"),
            "directory": str(files / "adir"), "truncated": str(files / "truncated.npz"),
            "bomb": str(files / "bomb.npz")}[name]


def argv_for(cmd: str, flag: str, dest: str, kind: str, extra, value: str, files: pathlib.Path) -> list[str]:
    base = [a.replace("{f}", str(files)) for a in BASE[cmd]]
    if flag in base:                                   # replace the base's value
        i = base.index(flag)
        base = base[:i] + base[i + 2:]
    if kind in ("number", "text") and extra not in (None, "int", "float") and cmd == "generate":
        base += ["--method", str(extra)]               # a verifier flag, given with a method that reads it
    return cmd.split() + base + [f"{flag}={value}"]


def patch_work(monkeypatch, cmd: str) -> None:
    def began(*a, **k):
        raise WorkBegan()

    for target in WORK["*"] + WORK[cmd]:
        mod, attr = target.split(":")
        monkeypatch.setattr(importlib.import_module(mod), attr, began)


def snapshot(d: pathlib.Path) -> set:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


def run_case(case, files: pathlib.Path, workdir: pathlib.Path, monkeypatch, capsys, seconds: float) -> str | None:
    """None when the outcome is allowed, else what went wrong (one line)."""
    from coolsd.cli import main

    cmd, flag, dest, kind, extra, name = case
    value = bad_value(kind, extra, name, files, BASE[cmd])
    argv = argv_for(cmd, flag, dest, kind, extra, value, files)
    monkeypatch.chdir(workdir)
    patch_work(monkeypatch, cmd)
    before, before_in = snapshot(workdir), snapshot(files)
    t0 = time.perf_counter()
    try:
        rc = main(argv)
    except WorkBegan:
        rc = "work"
    except SystemExit as e:             # argparse's own refusal
        rc = e.code
    except BaseException as e:          # a traceback
        return f"{' '.join(argv)}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        monkeypatch.undo()
    dt = time.perf_counter() - t0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("coolsd: warning:")
             and "is deprecated" not in ln and not ln.startswith("usage:") and not ln.startswith("  ")]
    where = " ".join(argv)
    if dt > seconds:
        return f"{where}: {dt:.1f} s"
    if snapshot(workdir) != before or snapshot(files) != before_in:
        return f"{where}: files written ({sorted(snapshot(workdir) ^ before)[:3]})"
    must_refuse = (name in NUMBER_BAD or name in PATH_BAD or kind == "text") and not any(
        (c, flag, name) in ALLOWED for c in ("*", cmd))
    if rc == "work":
        return f"{where}: accepted (the work began)" if must_refuse else None
    if rc != 2:
        return f"{where}: exit {rc}: {err.strip()[:200]}"
    if len(lines) != 1 or "error:" not in lines[0] or "Traceback" in err:
        return f"{where}: not one error line: {err.strip()[:300]}"
    if flag not in lines[0] and not (name == "huge" and "--max-seconds" in lines[0]):
        return f"{where}: the error does not name {flag}: {lines[0][:200]}"
    return None
