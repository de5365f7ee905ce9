"""Issue 50's API fuzz, by construction: every public function and class of ``theory``, ``sim``, ``real`` and ``coolsd``
(the ``__all__`` of each package, found by walking the packages: a name exported tomorrow is covered without being
named here) is called with None, NaN, a list and an array of a wrong shape in every required argument at once. Each
must raise ValueError or TypeError with a one-line message within ``SECONDS``: never AttributeError, IndexError or
another exception, and never a silent result. Plain records (dataclasses without a ``__post_init__`` check) hold what
they are given and are skipped; ``ALLOWED`` lists the documented exceptions, each with why. A planted unchecked
function must be caught (negative control)."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import signal

import numpy as np

PACKAGES = ("theory", "sim", "real", "coolsd")
SECONDS = 5.0
BAD = {"None": None, "NaN": float("nan"), "list": [1.0, 2.0], "wrong shape": np.zeros((2, 3, 4, 5))}
# a list of two numbers and a 4-d array may be valid input (lists are converted; functions are batched over leading
# axes): a result is accepted for them, only another exception is a failure. None and NaN never give a result.
RESULT_OK = ("list", "wrong shape")
# documented exceptions: "module.name" -> why calling it with junk is not a contract violation
ALLOWED = {
    "real.decode.modes.register": "registers a user's mode declaration object: duck-typed (anything with the "
                                  "ModeDef fields); tests/test_decoder_contract.py checks registered modes",
    "coolsd.studies.demo.real_floor": "the demo's measured quality floor: generates images with the shipped "
                                      "models (minutes) before reading its arguments; called by run_demo only",
    "theory.rules.reads_f": "a duck-typed predicate on a resampling rule: an object without the reads_f attribute "
                            "is documented to read f (True), so any object has an answer",
}


class _Timeout(BaseException):
    pass


def public_callables(packages=PACKAGES) -> dict:
    """{"package.name": object}: the functions and classes in the ``__all__`` of every package (``__init__``) under
    ``packages``, each object once (the first package that exports it)."""
    out, seen = {}, set()
    for top in packages:
        pkg = importlib.import_module(top)
        mods = [pkg] + [importlib.import_module(m.name) for m in pkgutil.walk_packages(pkg.__path__, top + ".")
                        if m.ispkg]
        for mod in mods:
            for name in getattr(mod, "__all__", ()) or ():
                obj = getattr(mod, name, None)
                if (inspect.isfunction(obj) or inspect.isclass(obj)) and id(obj) not in seen:
                    seen.add(id(obj))
                    out[f"{mod.__name__}.{name}"] = obj
    return out


def required(obj) -> list[inspect.Parameter] | None:
    """The required parameters of ``obj`` (None: no signature, or a plain record: a dataclass without a
    ``__post_init__`` check, or a NamedTuple)."""
    if inspect.isclass(obj) and ((dataclasses.is_dataclass(obj) and not hasattr(obj, "__post_init__"))
                                 or (issubclass(obj, tuple) and hasattr(obj, "_fields"))):
        return None
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [p for p in sig.parameters.values() if p.default is p.empty and p.kind in
            (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def judge(name: str, obj, bad, result_ok: bool = False) -> str | None:
    """None when ``obj`` called with ``bad`` in every required argument raises a one-line ValueError / TypeError,
    else what happened."""
    req = required(obj)
    if not req:
        return None
    args = [bad for p in req if p.kind != p.KEYWORD_ONLY]
    kw = {p.name: bad for p in req if p.kind == p.KEYWORD_ONLY}

    def alarm(*_):
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, SECONDS)
    try:
        obj(*args, **kw)
        return None if result_ok else f"{name}: a silent result"
    except _Timeout:
        return f"{name}: still running after {SECONDS:g} s"
    except (ValueError, TypeError) as e:
        msg = str(e).strip()
        if not msg or "\n" in msg:
            return f"{name}: {type(e).__name__} without a one-line message: {msg[:120]!r}"
        return None
    except Exception as e:  # noqa: BLE001 (the point: any other exception is a failure)
        return f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def failures(callables: dict) -> list[str]:
    out = []
    for name, obj in sorted(callables.items()):
        if name in ALLOWED:
            continue
        for label, bad in BAD.items():
            why = judge(name, obj, bad, label in RESULT_OK)
            if why:
                out.append(f"{why} ({label})")
    return out


def test_api_fuzz(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                 # whatever a call might write lands here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")   # nothing reaches the network
    found = public_callables()
    assert len(found) > 120, len(found)
    bad = failures(found)
    print(f"API fuzz: {len(found)} public callables x {len(BAD)} bad values, {len(bad)} failures")
    assert not bad, f"{len(bad)} failures:\n" + "\n".join(bad[:60])
    assert set(ALLOWED) <= set(found), sorted(set(ALLOWED) - set(found))      # no stale allowance


def test_api_fuzz_catches_planted_unchecked_functions(tmp_path, monkeypatch):
    """Negative control: a function exported without checks is found by the walk and caught (AttributeError on None,
    IndexError on a list, a silent result on NaN)."""
    import theory.markov as pkg

    def planted_rate(rows, n):
        return rows[5] * n if isinstance(rows, list) else rows.sum() * n

    def planted_scale(x):
        return x * 2.0

    monkeypatch.setattr(pkg, "planted_rate", planted_rate, raising=False)
    monkeypatch.setattr(pkg, "planted_scale", planted_scale, raising=False)
    monkeypatch.setattr(pkg, "__all__", list(pkg.__all__) + ["planted_rate", "planted_scale"])
    found = public_callables(("theory",))
    assert "theory.markov.planted_rate" in found and "theory.markov.planted_scale" in found
    bad = failures({k: v for k, v in found.items() if "planted" in k})
    assert any("planted_rate: AttributeError" in b for b in bad), bad
    assert any("planted_rate: IndexError" in b for b in bad), bad
    assert any("planted_scale: a silent result (NaN)" in b for b in bad), bad
