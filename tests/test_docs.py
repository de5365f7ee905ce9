"""The documentation is tested: the site builds with ``mkdocs build --strict`` (no broken link or anchor, no
missing reference, no warning) and holds the generated reference and one page per committed study; every block
marked runnable in the README and the pages under docs/ runs and succeeds; the CLI reference is the parsers' help
(regenerate with ``python scripts/docs_reference.py``); the README stays under 15,000 bytes.

A runnable block is a fenced ``bash`` or ``python`` block directly after the line ``<!-- runnable -->`` (run in
this file's fast tests) or ``<!-- runnable: slow -->`` (run under the ``slow`` marker). A ``bash`` block holds
``coolsd`` commands only, one per line (``# ...`` lines and trailing comments are ignored); each runs as
``python -m coolsd ...``. The commands of one block share a fresh working directory, in order. The runnable
``python`` blocks of one page run as one script, in page order (a reader runs a page top to bottom: a later block
may use an earlier one's names); the test names the block that failed."""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from scriptload import load

ROOT = pathlib.Path(__file__).resolve().parents[1]
MARK = re.compile(r"^<!-- runnable(?P<slow>: slow)? -->\n```(?P<lang>[a-z]*)\n(?P<body>.*?)\n```", re.M | re.S)
ANY_MARK = re.compile(r"^<!-- runnable", re.M)


def _docs_reference():
    return load("scripts/docs_reference.py")


def runnable_blocks(files):
    """(id, slow, lang, body) of every marked block; a marker not followed by a bash / python fence is an error."""
    out = []
    for f in files:
        text = f.read_text()
        found = list(MARK.finditer(text))
        if len(found) != len(ANY_MARK.findall(text)):
            raise ValueError(f"{f}: a '<!-- runnable -->' marker is not directly followed by a fenced block")
        for m in found:
            if m.group("lang") not in ("bash", "python"):
                raise ValueError(f"{f}: runnable blocks are bash or python, got {m.group('lang')!r}")
            line = text[:m.start()].count("\n") + 1
            name = f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f.name}:{line}"
            out.append((name, bool(m.group("slow")), m.group("lang"), m.group("body")))
    return out


def doc_files():
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def run_block(lang, body, cwd, timeout=1800):
    """Run one block in ``cwd``; returns (returncode, output of the failing or last step). The timeout only stops a
    hung command: the quick demo took 584 s on the 2 shared cores under load 7 (about a minute on a quiet machine)."""
    if lang == "python":
        return run_python([("block", body)], cwd, timeout)
    r = None
    for raw in body.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if not line.startswith("coolsd "):
            return 1, f"a runnable bash block holds coolsd commands only: {line!r}"
        r = subprocess.run([sys.executable, "-m", "coolsd", *shlex.split(line)[1:]], cwd=cwd, env=_env(),
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            return r.returncode, f"$ {line}\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
    return (0, "") if r is None else (0, r.stdout[-500:])


def run_python(blocks, cwd, timeout=1800):
    """Run (name, code) blocks in order in one interpreter and one namespace; (returncode, output)."""
    script = "import sys\n_ns = {}\n" + "".join(
        f"print('>>> block', {name!r}, flush=True)\nexec(compile({code!r}, {name!r}, 'exec'), _ns)\n"
        for name, code in blocks)
    r = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=_env(), capture_output=True, text=True,
                       timeout=timeout)
    return r.returncode, r.stdout[-3000:] + r.stderr[-3000:]


BLOCKS = runnable_blocks(doc_files())


def _cases():
    """One case per bash block, one per page for its python blocks (slow if any of them is)."""
    cases, pages = [], {}
    for name, slow, lang, body in BLOCKS:
        if lang == "bash":
            cases.append(pytest.param("bash", [(name, body)], id=name, marks=[pytest.mark.slow] if slow else []))
        else:
            pages.setdefault(name.rsplit(":", 1)[0], []).append((name, slow, body))
    for page, blocks in pages.items():
        slow = any(s for _, s, _ in blocks)
        cases.append(pytest.param("python", [(n, b) for n, _, b in blocks], id=f"{page}:python",
                                  marks=[pytest.mark.slow] if slow else []))
    return cases


@pytest.mark.parametrize("lang,blocks", _cases())
def test_runnable_blocks(lang, blocks, tmp_path):
    if lang == "bash":
        (name, body), = blocks
        rc, out = run_block("bash", body, tmp_path)
    else:
        name = blocks[0][0].rsplit(":", 1)[0] + " (python blocks in order)"
        rc, out = run_python(blocks, tmp_path)
    assert rc == 0, f"runnable block {name} failed:\n{out}"


def test_the_readme_and_guides_have_runnable_blocks():
    names = [n for n, *_ in BLOCKS]
    readme = [n for n in names if n.startswith("README.md")]
    # generate, sweep, tune and demo examples of the README; guides: getting started, fidelity, train-drafter, tuning
    assert len(readme) == 4
    for page in ("getting-started.md", "guide/fidelity.md", "guide/train-drafter.md", "guide/tuning.md"):
        assert any(n.startswith(f"docs/{page}") for n in names), page


def test_a_failing_runnable_block_fails(tmp_path):
    # control: a marked block that cannot succeed is found and reported as a failure
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- runnable -->\n```bash\ncoolsd generate --model no-such-model --json\n```\n\n"
                    "<!-- runnable -->\n```python\nraise SystemExit(3)\n```\n")
    blocks = runnable_blocks([page])
    assert [(slow, lang) for _, slow, lang, _ in blocks] == [(False, "bash"), (False, "python")]
    for _, _, lang, body in blocks:
        assert run_block(lang, body, tmp_path)[0] != 0
    # python blocks of a page share one namespace in order: a name defined later is not there earlier
    assert run_python([("a", "x = 1"), ("b", "assert x == 1")], tmp_path)[0] == 0
    rc, out = run_python([("a", "assert y == 2"), ("b", "y = 2")], tmp_path)
    assert rc != 0 and ">>> block a\n" in out and "NameError" in out
    assert run_block("bash", "ls -l", tmp_path)[0] != 0        # only coolsd commands
    page.write_text("<!-- runnable -->\n\n```bash\ncoolsd --help\n```\n")
    with pytest.raises(ValueError, match="not directly followed"):
        runnable_blocks([page])


def test_readme_is_at_most_15_kb():
    assert len((ROOT / "README.md").read_bytes()) <= 15_000


# ---------------------------------------------------------------- the CLI and API reference


def test_cli_reference_matches_the_parsers():
    ref = _docs_reference()
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    how = "regenerate with: python scripts/docs_reference.py"
    assert ref.missing_from_page(page) == [], f"docs/reference/cli.md is stale; {how}"
    recorded = re.search(r"\(Python (\d+\.\d+),", page).group(1)
    if recorded == f"{sys.version_info.major}.{sys.version_info.minor}":   # argparse's layout is per Python version
        assert page == ref.cli_page() + "\n", f"docs/reference/cli.md is stale; {how}"


def test_cli_reference_check_detects_a_new_flag(monkeypatch):
    # control: a flag added to `coolsd generate` without regenerating is caught by both checks
    ref = _docs_reference()
    from coolsd import cli

    real = cli.build_parser

    def planted():
        ap = real()
        sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices["generate"].add_argument("--planted-flag", help="not in the committed page")
        return ap

    monkeypatch.setattr(cli, "build_parser", planted)
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert ref.missing_from_page(page) == ["coolsd generate --planted-flag"]
    assert ref.cli_page() + "\n" != page
    assert ref.main(["--check"]) == 1


def test_api_reference_covers_every_module():
    ref = _docs_reference()
    listed = {m for _, _, pkgs in ref.API_PAGES for pkg in pkgs for m in ref._modules(pkg)}
    found = set()
    for pkg in ("theory", "sim", "real", "coolsd"):
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            if any(p.startswith("_") for p in parts[:-1]) or (parts[-1].startswith("_") and parts[-1] != "__init__"):
                continue
            found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert found - listed == set(), "add the package to API_PAGES in scripts/docs_reference.py"
    for page, text in ref.pages().items():
        assert page.exists() and page.read_text() == text, \
            f"{page.relative_to(ROOT)} is stale; regenerate with: python scripts/docs_reference.py"


# ---------------------------------------------------------------- the site


def mkdocs_build(config_dir, site):
    """``mkdocs build --strict`` as the suite runs it; (returncode, output). Not ``-q``: quiet mode hides the
    warnings from the strict-mode count, so a broken link would pass."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=config_dir,
                       env=env, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout + r.stderr


def _need_mkdocs():
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")


def test_mkdocs_build_strict(tmp_path):
    _need_mkdocs()
    site = tmp_path / "site"
    rc, out = mkdocs_build(ROOT, site)
    warnings = [line for line in out.splitlines() if line.startswith("WARNING")]
    assert rc == 0 and warnings == [], out[-5000:]
    assert (site / "reference" / "cli.html").exists()
    for page in (ROOT / "docs" / "reference" / "api").glob("*.md"):
        assert (site / "reference" / "api" / f"{page.stem}.html").exists()
    # the API pages are rendered from the docstrings, not left as ':::' lines
    theory = (site / "reference" / "api" / "theory.html").read_text()
    assert "theory.markov.tables" in theory and ":::" not in theory and "expected_accepted" in theory
    studies = sorted(d.name for d in (ROOT / "docs" / "results").iterdir() if d.is_dir())
    assert studies and [s for s in studies if not (site / "results" / f"{s}.html").exists()] == []


def test_mkdocs_build_strict_fails_on_a_broken_link(tmp_path):
    # control: the same invocation on a two-page site with a link to a missing page and one to a missing anchor
    _need_mkdocs()
    cfg = (ROOT / "mkdocs.yml").read_text()
    keep = cfg[cfg.index("validation:"):]                      # the repository's link checks
    (tmp_path / "docs").mkdir()
    (tmp_path / "mkdocs.yml").write_text("site_name: t\nstrict: true\n" + keep)
    (tmp_path / "docs" / "index.md").write_text("# t\n\n[fine](other.md)\n")
    (tmp_path / "docs" / "other.md").write_text("# o\n")
    assert mkdocs_build(tmp_path, tmp_path / "site")[0] == 0
    for bad in ("[broken](no-such-page.md)", "[broken](other.md#no-such-anchor)"):
        (tmp_path / "docs" / "index.md").write_text(f"# t\n\n{bad}\n")
        rc, out = mkdocs_build(tmp_path, tmp_path / "site")
        assert rc != 0 and "WARNING" in out, bad
