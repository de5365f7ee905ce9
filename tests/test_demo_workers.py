"""``coolsd demo`` over several worker processes (coolsd.studies.demo.generation, coolsd.workers): the split changes no
token, round or recorded row, and a worker's failure reaches the caller with its reason."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from coolsd.studies.demo import Settings
from coolsd.studies.demo.generation import generate_all, models_and_runs
from coolsd.workers import Spawned


def _gens(**kw):
    s = Settings(n_images=6, batch_size=2, quick=True, tree_rules=("lantern++",), deltas=(4.0,), tree_deltas=(4.0,),
                 **kw)
    return generate_all(s, models_and_runs(s), progress=False)


def _rows(g):
    raw = lambda a: None if a is None else a.tobytes()   # noqa: E731
    return [(r.drafted, r.accepted, r.nodes, raw(r.p), raw(r.q), raw(r.drafts)) for r in g.rounds]


@pytest.fixture(scope="module")
def one_worker():
    return _gens(workers=1)


def test_the_split_over_workers_changes_no_token_round_or_recorded_row(one_worker):
    two = _gens(workers=2)           # 3 batches: batches 0 and 2 here, batch 1 in a spawned worker
    assert list(two) == list(one_worker)
    for key in one_worker:
        a, b = one_worker[key], two[key]
        assert len(a) == len(b) == 6, key
        for i, (x, y) in enumerate(zip(a, b)):
            assert np.array_equal(x.tokens.numpy(), y.tokens.numpy()), (key, i)
            assert _rows(x) == _rows(y), (key, i)
    assert any(r.p is not None for g in one_worker["vanilla() chain eagle"] for r in g.rounds)   # rows compared


def test_control_another_seed_changes_the_tokens(one_worker):
    """The comparison above can fail: the same split with another seed gives other digits."""
    other = _gens(workers=2, seed=1)
    differ = sum(not np.array_equal(x.tokens.numpy(), y.tokens.numpy())
                 for key in one_worker for x, y in zip(one_worker[key], other[key]))
    assert differ >= 0.9 * sum(len(v) for v in one_worker.values())


def _raises(n, tick):
    tick(n)
    raise ValueError(f"bad value {n}")


def _dies(n, tick):
    os._exit(n)


def _doubles(n, tick):
    tick(1)
    tick(2)
    return 2 * n


def test_a_worker_returns_its_value_and_progress():
    w = Spawned(_doubles, 21)
    seen = []
    try:
        assert w.result(on_tick=seen.append) == 42
    finally:
        w.close()
    assert sum(seen) == 3


@pytest.mark.parametrize("fn, arg, reason", [
    (_raises, 7, r"(?s)_raises failed in a worker process.*ValueError: bad value 7"),      # its traceback
    (_dies, 3, r"exit code 3\) without returning a result"),                              # its exit code
])
def test_a_worker_failure_is_raised_with_its_reason(fn, arg, reason):
    w = Spawned(fn, arg)
    try:
        with pytest.raises(RuntimeError, match=reason):
            w.result()
    finally:
        w.close()


def test_a_script_without_a_main_guard_can_start_a_worker(tmp_path):
    """The worker never re-imports the caller's script (multiprocessing's spawn would, and run it again), and it
    finds what the caller put on sys.path."""
    script = tmp_path / "job.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})\n"
                      "from test_demo_workers import _doubles\nfrom coolsd.workers import Spawned\n"
                      "print('answer', Spawned(_doubles, 5).result())\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["answer", "10"]
