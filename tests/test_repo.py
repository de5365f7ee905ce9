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
        from theory import chains, markov

        P, Q = chains.random_pair(5, seed=1)
        F, G = markov.rule_tables(P, Q, 3, ns["mine"])
        assert markov.exact_tv(P, Q, F, G, 0) <= markov.tv_bound(P, Q, F, G, 0) + 1e-12
