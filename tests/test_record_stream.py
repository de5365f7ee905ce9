"""``coolsd generate --record`` streamed batch by batch (``coolsd.npzstream``, ``coolsd.rowfiles.record_batches``,
``real.decode.engine.generate(on_batch=...)``): the file equals the one-shot record whatever the batch size, the rows
keep their dtype, and the rows held in memory are one batch's, not the run's."""
from __future__ import annotations

import json

import numpy as np
import pytest

from coolsd.npzstream import NpzStream


def test_npzstream_equals_savez_and_refuses_mismatched_batches(tmp_path):
    """Batches appended along axis 0 == np.savez of their concatenation (float32, float64, int64, an empty
    placeholder, a JSON scalar). Negative controls: a batch whose dtype or trailing shape differs, or whose stamp
    differs, is refused; a failure inside the with-block leaves no file."""
    rng = np.random.default_rng(0)
    parts = [{"p": rng.random((n, 3, 5), dtype=np.float32), "d": rng.random((n, 2)),
              "image": np.arange(n, dtype=np.int64), "q": np.zeros(0, np.float32),
              "stamp": np.array(json.dumps({"a": 1}))} for n in (2, 0, 3)]
    f = tmp_path / "s.npz"
    with NpzStream(f) as s:
        for a in parts:
            s.append(a)
    z = np.load(f)
    for k in ("p", "d", "image"):
        want = np.concatenate([a[k] for a in parts])
        assert z[k].dtype == want.dtype and np.array_equal(z[k], want)
    assert z["q"].shape == (0,) and z["q"].dtype == np.float32 and json.loads(str(z["stamp"])) == {"a": 1}
    for bad, match in (({"p": parts[0]["p"].astype(np.float64)}, "float64"), ({"p": np.zeros((1, 3, 4), np.float32)},
                       r"\(3, 4\)"), ({"stamp": np.array("other")}, "disagree")):
        with pytest.raises(ValueError, match=match), NpzStream(tmp_path / "bad.npz") as s:
            s.append(parts[0])
            s.append(bad)
    assert not (tmp_path / "bad.npz").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.npz"]          # no spool left behind


def _modes():
    from real.decode.dynamic_tree import DynamicTree
    from real.decode.modes.base import tree_arrays
    from real.decode.modes.dynamic import dynamic_arrays
    from coolsd.rowfiles import record_arrays
    from theory.tree import Tree

    tree = Tree(((0,), (1,), (0, 0)))
    dyn = DynamicTree(total=6, depth=2, topk=2)
    return {"chain": (3, lambda g: record_arrays(g, 3, {"T": 24})), "static": (tree, lambda g: tree_arrays(g, tree)),
            "dynamic": (dyn, lambda g: dynamic_arrays(g, dyn))}


@pytest.mark.parametrize("kind", ["chain", "static", "dynamic"])
def test_streamed_record_equals_the_one_shot_record(tmp_path, kind):
    """Chain, static-tree and dynamic-tree records of 5 images at batch size 2 (three streamed batches) == the
    mode's record of the whole run made at once (as ``--record`` wrote it before streaming): every array equal (the
    image indices shifted per batch), the rows in the dtype computed (float32 here), the rows dropped once written.
    Negative control: the batches' own image indices, unshifted, differ from the file's."""
    from coolsd.rowfiles import record_batches
    from real.decode.engine import generate
    from real.registry import BuildOptions, build
    from theory import rules

    drafting, make = _modes()[kind]
    b = build("llamagen-tiny", BuildOptions(draft="eagle", num_images=5, seed=0))

    def run(on_batch=None):
        return generate(b.target, b.draft, b.conds, num_tokens=24, verifier=rules.vanilla(), drafting=drafting,
                        seed=3, batch_size=2, record_rows=True, on_batch=on_batch)

    whole = make(run())
    own = []
    with NpzStream(tmp_path / "s.npz") as s:
        sink = record_batches(s, lambda g: own.append(make(g)["image"].copy()) or make(g))
        gens = run(sink)
        sink.finish()
    assert len(own) == 3 and all(r.p is None for g in gens for r in g.rounds)
    z = np.load(tmp_path / "s.npz")
    assert set(z.files) == set(whole)
    for k in z.files:
        assert z[k].dtype == np.asarray(whole[k]).dtype and np.array_equal(z[k], whole[k]), k
    assert z["p"].dtype == np.float32 and len(np.unique(z["image"])) >= 3
    assert not np.array_equal(np.concatenate(own), z["image"])


def test_rows_of_written_batches_are_freed():
    """The host rows of a batch are freed once it is streamed (weak references to each batch's row buffers die
    before the run ends), so a recording run holds one batch's rows, whatever its number of images. Negative
    control: a sink that writes but keeps the rows (no ``drop_rows``) leaves every buffer alive."""
    import gc
    import weakref

    from real.decode.engine import generate
    from real.registry import BuildOptions, build
    from theory import rules

    b = build("llamagen-tiny", BuildOptions(draft="eagle", num_images=4, seed=0))

    def alive(drop: bool) -> list[int]:
        from coolsd.rowfiles import record_batches

        refs, counts = [], []

        def watch(first, gens):
            gc.collect()
            counts.append(sum(r() is not None for r in refs))          # earlier batches' buffers still alive
            refs.extend(weakref.ref(r.p.base if r.p.base is not None else r.p) for g in gens for r in g.rounds)
            (sink if drop else (lambda f, g: None))(first, gens)

        class Null:
            def append(self, arrays):
                pass

        from coolsd.rowfiles import record_arrays
        sink = record_batches(Null(), lambda g: record_arrays(g, 3, {}))
        generate(b.target, b.draft, b.conds, num_tokens=24, verifier=rules.vanilla(), drafting=3, seed=0,
                 batch_size=1, record_rows=True, on_batch=watch)
        return counts

    assert alive(True) == [0, 0, 0, 0]
    kept = alive(False)
    assert kept[0] == 0 and all(k > 0 for k in kept[1:]) and kept == sorted(kept)


def test_batch_sizing_counts_the_recorded_rows(monkeypatch):
    """``real.decode.memory.record_bytes`` (T x 2 (nodes + 1) x V x 4 per image) lowers the default batch size of a
    recording run and refuses an explicit batch whose rows do not fit; without records the same batch is taken
    (negative control: the refusal comes from the records alone)."""
    from real.decode import memory
    from real.decode.dynamic_tree import DynamicTree
    from real.decode.sampling import Processing
    from real.registry import tiny_llamagen_pair

    t, d = tiny_llamagen_pair(0)
    dyn = DynamicTree(total=60, depth=5, topk=10)
    assert memory.record_bytes(dyn, 256, 16384) == 256 * 2 * 60 * 16384 * 4      # 60 rows per round, root included
    rec = memory.record_bytes(dyn, 64, 256)
    free = 40 * rec
    monkeypatch.setattr(memory, "_available_bytes", lambda dev: free)
    proc = Processing()
    plain = memory.default_batch_size(t, d, 64, proc)
    recording = memory.default_batch_size(t, d, 64, proc, rec)
    assert recording < plain and recording <= 20
    assert memory.check_batch(t, d, 64, 64, proc) == 64
    with pytest.raises(ValueError, match="recorded rows included"):
        memory.check_batch(t, d, 64, 64, proc, rec)


def test_release_dynamic_record_keeps_no_draft_rows():
    """A release-construction dynamic tree (top-k candidates, the point law) records p but no q: ``load_rows`` reads
    its rounds under the point law, and the record is half the size. Negative control: the lossless construction
    keeps its q (the without-replacement law reads it)."""
    from real.decode.dynamic_tree import DynamicTree
    from real.decode.engine import generate
    from real.decode.modes.dynamic import dynamic_arrays
    from real.registry import BuildOptions, build
    from theory import rules
    from theory.likelihood.recorded import DynamicRows

    b = build("llamagen-tiny", BuildOptions(draft="eagle", num_images=2, seed=0))
    laws = {}
    for sampling in ("release", "lossless"):
        mode = DynamicTree(total=6, depth=2, topk=2, sampling=sampling)
        gens = generate(b.target, b.draft, b.conds, num_tokens=24, verifier=rules.vanilla(), drafting=mode, seed=1,
                        batch_size=2, record_rows=True)
        a = dynamic_arrays(gens, mode)
        rows = DynamicRows(a["p"], a["q"] if a["q"].size else None, a["tokens"], a["parent"], a["max_depth"], 2,
                           a["image"])
        laws[sampling] = (rows.draft_law, a["q"].size)
    assert laws["release"] == ("point", 0)
    assert laws["lossless"][0] == "without_replacement" and laws["lossless"][1] > 0
