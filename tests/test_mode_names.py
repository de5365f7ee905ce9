"""The drafting mode is the one carrier (issue 47): no code in coolsd/ compares a value with a mode's name (reports
read a mode's label and capabilities from its declaration, ``real.decode.modes``), and real/decode/score*.py holds no
``isinstance`` on a mode class. Both scans have negative controls that plant one violation."""
import ast

import pytest
from pathlib import Path

from real.decode import modes

ROOT = Path(__file__).resolve().parents[1]
MODE_CLASSES = {"Plain", "Chain", "StaticTree", "DynamicTree", "Jacobi", "SJDPAC", "ModelDrafting"}


def _names() -> set:
    """Every registered mode's name and report label, and the older spellings (``dynamic-tree``)."""
    return {n for d in modes.REGISTRY.values() for n in (d.name, d.label)} - {"ar"}


def _strings(node) -> list:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def name_comparisons(root: Path = ROOT, names: set | None = None) -> list:
    """(file:line, the name) of every comparison in ``root``/coolsd whose operand is a mode's name (``x == "chain"``,
    ``k in ("tree", "dynamic")``, ``"tree" in label``), f-strings included."""
    names = _names() if names is None else names
    bad = []
    for f in sorted((root / "coolsd").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Compare):
                for operand in (node.left, *node.comparators):
                    bad += [(f"{f.relative_to(root)}:{node.lineno}", s) for s in _strings(operand) if s.lower() in names]
    return bad


def mode_isinstance(root: Path = ROOT) -> list:
    """(file:line, class) of every ``isinstance(x, ModeClass)`` in real/decode/score*.py."""
    bad = []
    for f in sorted((root / "real" / "decode").glob("score*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                bad += [(f"{f.relative_to(root)}:{node.lineno}", c.id) for c in classes
                        if isinstance(c, ast.Name) and c.id in MODE_CLASSES]
    return bad


def test_registry_names_cover_every_builtin_mode():
    assert {"chain", "tree", "dynamic", "dynamic-tree", "jacobi", "sjd-pac", "sjd-pac-p", "plain"} <= _names()


def test_no_comparison_with_a_mode_name_in_coolsd():
    assert name_comparisons() == []


def test_no_isinstance_on_a_mode_class_in_score():
    assert mode_isinstance() == []


def _tree(tmp_path, coolsd_src: str, score_src: str) -> Path:
    (tmp_path / "coolsd").mkdir()
    (tmp_path / "real" / "decode").mkdir(parents=True)
    (tmp_path / "coolsd" / "ok.py").write_text("def f(m):\n    return m.label, m.static_tree\n")
    (tmp_path / "coolsd" / "bad.py").write_text(coolsd_src)
    (tmp_path / "real" / "decode" / "score_x.py").write_text(score_src)
    return tmp_path


def test_the_scans_catch_a_planted_violation(tmp_path):
    """Negative controls: one planted comparison of each form, one planted isinstance, are all found."""
    root = _tree(tmp_path, 'def f(spec, r, m):\n    a = spec.kind == "chain"\n    b = r["drafting"] in ("tree", "x")\n'
                           '    c = f"{1 if m != \'jacobi\' else 2}"\n    return a, b, c, "dynamic-tree" in m\n',
                 "def g(mode):\n    return isinstance(mode, (StaticTree, int)) or isinstance(mode, Chain)\n")
    found = name_comparisons(root)
    assert sorted(s for _, s in found) == ["chain", "dynamic-tree", "jacobi", "tree"]
    assert [c for _, c in mode_isinstance(root)] == ["StaticTree", "Chain"]


def test_the_scans_pass_a_clean_tree(tmp_path):
    root = _tree(tmp_path, 'def f(method):\n    return method == "ar" or method == "vanilla"\n',
                 "def g(x):\n    return isinstance(x, int)\n")
    assert name_comparisons(root) == [] and mode_isinstance(root) == []


def _spec(argv, capsys):
    import argparse

    from coolsd.options import add_drafting_args, drafting_spec

    p = argparse.ArgumentParser()
    p.add_argument("--draft")
    p.add_argument("--method", default="vanilla")
    add_drafting_args(p)
    spec = drafting_spec(p.parse_args(argv), 49)
    return spec, capsys.readouterr().err


@pytest.mark.parametrize("old,new", [(["--draft", "jacobi", "--window", "8"], ["--mode", "jacobi", "--window", "8"]),
                                     (["--draft", "sjd-pac-p"], ["--mode", "sjd-pac-p"]),
                                     (["--tree", "dynamic", "--tree-total", "12"], ["--mode", "dynamic", "--tree-total", "12"])])
def test_older_spellings_work_with_one_line_naming_the_new(old, new, capsys):
    a, err = _spec(old, capsys)
    b, quiet = _spec(new, capsys)
    assert a.kind == b.kind and a.options == b.options and a.identity() == b.identity()
    assert err == f"coolsd: {old[0]} {old[1]} is deprecated: use --mode {b.kind}\n" and quiet == ""


def test_static_trees_and_chains_need_no_mode(capsys):
    assert _spec(["--tree", "eagle25"], capsys) == (_spec(["--mode", "tree", "--tree", "eagle25"], capsys)[0]
                                                    .__class__("tree", (("tree", "eagle25"),), "--tree eagle25"), "")
    assert _spec([], capsys)[0].kind == "chain" and _spec(["--tree", "chain", "--L", "5"], capsys)[0].max_depth == 5
