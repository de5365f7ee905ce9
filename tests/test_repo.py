"""Repository hygiene: the README's test command is what CI runs; theory imports nothing of ours."""
from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    assert "coolsd demo" in blocks[0] and "pytest" in blocks[1]
    assert blocks[1].strip() in (ROOT / ".ci" / "run").read_text()


def _imports(pkg):
    out = set()
    for f in (ROOT / pkg).rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                out |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
    return out


def test_dependency_direction():
    ours = {"theory", "sim", "real", "coolsd"}
    assert not (_imports("theory") & (ours - {"theory"}))
    assert not (_imports("sim") & (ours - {"theory", "sim"}))
    assert not (_imports("real") & {"coolsd"})


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    assert blocks
    ns: dict = {}
    for b in blocks:
        exec(compile(b, "README.md", "exec"), ns)
    if "mine" in ns:  # the custom verifier runs through the theory engine
        from theory.markov import chains
        from theory import markov

        P, Q = chains.random_pair(5, seed=1)
        F, G = markov.rule_tables(P, Q, 3, ns["mine"])
        assert markov.exact_tv(P, Q, F, G, 0) <= markov.tv_bound(P, Q, F, G, 0) + 1e-12


OUR_PACKAGES = ("theory", "sim", "real", "coolsd")


def _private_cross_imports(root=ROOT):
    """(file, what) for every use of another package's private name: ``from pkg._mod import x``,
    ``from pkg.mod import _x``, ``import pkg._mod`` and ``mod._x`` where ``mod`` was imported from
    another of our packages. Private = a name component starting with one underscore."""
    def private(name):
        return any(c.startswith("_") and not c.startswith("__") for c in name.split("."))

    bad = []
    for pkg in OUR_PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(f.read_text())
            foreign = {}  # local name -> module path, for modules imported from another package
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    top = node.module.split(".")[0]
                    if top in OUR_PACKAGES and top != pkg:
                        for a in node.names:
                            if private(node.module) or private(a.name):
                                bad.append((f.relative_to(root).as_posix(), f"{node.module}.{a.name}"))
                            foreign[a.asname or a.name] = f"{node.module}.{a.name}"
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        top = a.name.split(".")[0]
                        if top in OUR_PACKAGES and top != pkg:
                            if private(a.name):
                                bad.append((f.relative_to(root).as_posix(), a.name))
                            if a.asname:
                                foreign[a.asname] = a.name
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                        and node.value.id in foreign and private(node.attr)):
                    bad.append((f.relative_to(root).as_posix(), f"{foreign[node.value.id]}.{node.attr}"))
    return bad


def test_no_package_uses_another_packages_private_names():
    assert _private_cross_imports() == []


def test_private_import_check_detects_a_violation(tmp_path):
    (tmp_path / "theory").mkdir()
    (tmp_path / "theory" / "markov.py").write_text("def _check_F(F): return F\n")
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "a.py").write_text("from theory import markov\nmarkov._check_F(1)\n")
    (tmp_path / "sim" / "b.py").write_text("from theory._xp import gather\nfrom theory.markov import _check_F\n")
    for p in ("real", "coolsd"):
        (tmp_path / p).mkdir()
    found = sorted(w for _, w in _private_cross_imports(tmp_path))
    assert found == ["theory._xp.gather", "theory.markov._check_F", "theory.markov._check_F"]


def _module_name(f, root):
    parts = list(f.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(root=ROOT):
    """module -> set of our modules it imports, at module level or inside functions (an import inside a
    function still closes a circle, it only hides it until the call). ``from a import b`` points at the
    submodule ``a.b`` when there is one, else at ``a``; ``import a.b.c`` at the longest prefix that is one
    of our modules. Implicit imports of parent packages are not counted (every submodule would otherwise
    form a circle with its package's ``__init__``)."""
    files = {}
    for pkg in OUR_PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            files[_module_name(f, root)] = f
    mods = set(files)

    def longest(name):
        parts = name.split(".")
        for k in range(len(parts), 0, -1):
            if ".".join(parts[:k]) in mods:
                return ".".join(parts[:k])
        return None

    graph = {}
    for mod, f in files.items():
        package = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                out |= {longest(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    out.add(sub if sub in mods else longest(target))
        graph[mod] = out - {None, mod}
    return graph


def _import_circles(root=ROOT):
    """The strongly connected components of the import graph with more than one module, each sorted
    (Tarjan's algorithm, iterative)."""
    graph = _import_graph(root)
    index, low, stack, on, circles = {}, {}, [], set(), []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start), on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        u = stack.pop()
                        on.discard(u)
                        comp.append(u)
                        if u == v:
                            break
                    if len(comp) > 1:
                        circles.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w), on.add(w)
                work.append((w, iter(sorted(graph.get(w, ())))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return sorted(circles)


def test_no_import_circles():
    assert _import_circles() == []


def test_import_circle_check_detects_a_circle(tmp_path):
    # a -> b at module level, b -> c inside a function, c -> a by a relative import: one circle of three;
    # d imports a but nothing imports d, so it is outside the circle
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "__init__.py").write_text("")
    (tmp_path / "sim" / "a.py").write_text("from sim import b\n")
    (tmp_path / "sim" / "b.py").write_text("def f():\n    import sim.c\n    return sim.c\n")
    (tmp_path / "sim" / "c.py").write_text("from .a import thing\n")
    (tmp_path / "sim" / "d.py").write_text("from . import a\n")
    for p in ("theory", "real", "coolsd"):
        (tmp_path / p).mkdir()
    assert _import_circles(tmp_path) == [["sim.a", "sim.b", "sim.c"]]


# The boundaries of real/ (real/__init__.py): which of our modules each part may import. A prefix allows the
# module and everything below it. The registry and the zoo compose models and may import anything of ours
# except coolsd (test_dependency_direction).
REAL_RULES = {
    "real.protocol": ("theory",),
    "real.decode": ("theory", "real.protocol", "real.nn", "real.decode"),
    "real.nn": ("real.protocol", "real.nn"),
    "real.models": ("theory", "real.protocol", "real.nn", "real.models"),
    "real.adapters": ("theory", "real.protocol", "real.nn", "real.models", "real.adapters"),
}


# The rooms of theory/ (theory/__init__.py): which of our modules each room may import (its own included).
THEORY_RULES = {
    "theory.core": ("theory.core",),
    "theory.rules": ("theory.core", "theory.rules"),
    "theory.tree": ("theory.core", "theory.rules", "theory.tree"),
    "theory.markov": ("theory.core", "theory.rules", "theory.tree", "theory.markov"),
    "theory.likelihood": ("theory.core", "theory.rules", "theory.tree", "theory.likelihood"),
}


def _layering_violations(root=ROOT, rules=REAL_RULES, top="real"):
    """(module, imported module) for every import of ours that a part of ``top`` may not make (``rules``: part ->
    allowed prefixes); package ``__init__`` imports of ``top`` itself are ignored (importing a submodule runs them
    anyway). A module of ``top`` outside every part is a violation too (it would escape the rules)."""
    bad = []
    for mod, deps in sorted(_import_graph(root).items()):
        if mod != top and not mod.startswith(top + "."):
            continue
        part = next((p for p in rules if mod == p or mod.startswith(p + ".")), None)
        if part is None:
            if top == "theory" and mod != top:
                bad.append((mod, "(outside every room)"))
            continue
        for d in sorted(deps):
            if d == top or not d.split(".")[0] in OUR_PACKAGES:
                continue
            if not any(d == a or d.startswith(a + ".") for a in rules[part]):
                bad.append((mod, d))
    return bad


# coolsd/'s layers: the library rooms below the studies, the studies below the commands (no arrow back up)
COOLSD_RULES = {
    "coolsd.io": ("theory", "sim", "real"), "coolsd.npzstream": ("theory", "sim", "real", "coolsd.io"),
    "coolsd.validate": ("theory", "sim", "real", "coolsd.io", "coolsd.options"),
    "coolsd.options": ("theory", "sim", "real"), "coolsd.quality": ("theory", "sim", "real", "coolsd.quality"),
    "coolsd.workers": (),
    "coolsd.studies": ("theory", "sim", "real", "coolsd.io", "coolsd.npzstream", "coolsd.options", "coolsd.quality",
                       "coolsd.studies", "coolsd.workers"),
    "coolsd.commands": ("theory", "sim", "real", "coolsd"), "coolsd.cli": ("theory", "sim", "real", "coolsd"),
    "coolsd.__main__": ("coolsd",),
}


def test_coolsd_layers_have_no_arrow_back_up():
    assert _layering_violations(rules=COOLSD_RULES, top="coolsd") == []


def test_theory_rooms():
    assert _layering_violations(rules=THEORY_RULES, top="theory") == []
    assert sorted(p.name for p in (ROOT / "theory").iterdir() if p.is_dir() and p.name != "__pycache__") == \
        sorted(r.split(".")[1] for r in THEORY_RULES)


def test_theory_room_check_detects_a_forbidden_import(tmp_path):
    # rules importing markov (a room above it), core importing rules, a module outside every room: three
    # violations; tree importing rules and core, markov importing tree: allowed
    for d in ("sim", "real", "coolsd", "theory", "theory/core", "theory/rules", "theory/tree", "theory/markov"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "theory" / "core" / "xp.py").write_text("from theory.rules import verifiers\n")
    (tmp_path / "theory" / "rules" / "verifiers.py").write_text("from ..core import xp\nfrom ..markov import tables\n")
    (tmp_path / "theory" / "tree" / "shapes.py").write_text("from theory.rules import verifiers\nfrom ..core import xp\n")
    (tmp_path / "theory" / "markov" / "tables.py").write_text("from ..tree import shapes\n")
    (tmp_path / "theory" / "flat.py").write_text("")
    assert _layering_violations(tmp_path, THEORY_RULES, "theory") == [
        ("theory.core.xp", "theory.rules.verifiers"), ("theory.flat", "(outside every room)"),
        ("theory.rules.verifiers", "theory.markov.tables")]


def test_real_layering():
    assert _layering_violations() == []


def test_layering_check_detects_a_forbidden_import(tmp_path):
    # the decoder importing a model (absolute and relative), a layer importing the decoder: three violations;
    # the decoder importing theory and the protocol, a model importing real.nn: allowed
    for d in ("theory", "sim", "coolsd", "real", "real/decode", "real/nn", "real/models"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "theory" / "verify.py").write_text("")
    (tmp_path / "real" / "protocol.py").write_text("")
    (tmp_path / "real" / "models" / "llamagen.py").write_text("from real.nn import layers\n")
    (tmp_path / "real" / "nn" / "layers.py").write_text("def f():\n    from real.decode import engine\n")
    (tmp_path / "real" / "decode" / "engine.py").write_text(
        "from theory import verify\nfrom real.protocol import x\nfrom real.models import llamagen\n")
    (tmp_path / "real" / "decode" / "steps.py").write_text("from ..models.llamagen import LlamaGen\n")
    assert _layering_violations(tmp_path) == [("real.decode.engine", "real.models.llamagen"),
                                              ("real.decode.steps", "real.models.llamagen"),
                                              ("real.nn.layers", "real.decode.engine")]


def test_modules_stay_under_500_lines():
    long = {f.relative_to(ROOT).as_posix(): n for pkg in OUR_PACKAGES for f in (ROOT / pkg).rglob("*.py")
            if (n := len(f.read_text().splitlines())) > 500}
    assert long == {}
