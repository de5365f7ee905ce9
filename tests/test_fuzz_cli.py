"""Issue 50's CLI fuzz (tests/fuzz_cli.py): every option of every subcommand, found by walking the parser, given the
bad values of its kind; a sample per run (fixed seed, every option once), every case with ``COOLSD_FUZZ=all``. A
planted unchecked option must be caught (negative control)."""
from __future__ import annotations

import pytest

import fuzz_cli as fz

SAMPLE = 400          # cases per run (a few ms each in-process, every option at least once); COOLSD_FUZZ=all: all
SECONDS = 10.0         # per case, generous on a loaded 2-core machine


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return fz.input_files(tmp_path_factory.mktemp("fuzz_inputs"))


def test_every_subcommand_has_a_base_and_its_work():
    cmds = fz.leaf_parsers()
    assert set(cmds) == set(fz.BASE) and set(cmds) <= set(fz.WORK), sorted(set(cmds) ^ set(fz.BASE))
    kinds = [k for c in cmds.values() for _, _, k, _ in fz.option_kinds(c)]
    assert kinds.count("number") > 60 and kinds.count("path") > 15, (kinds.count("number"), kinds.count("path"))


def test_bases_reach_the_work(files, tmp_path, monkeypatch, capsys):
    """Each base invocation is valid: it passes the checks and reaches its work (so a refusal is the bad value's)."""
    from coolsd.cli import main

    for cmd, base in fz.BASE.items():
        d = tmp_path / cmd.replace(" ", "_")
        d.mkdir()
        monkeypatch.chdir(d)
        fz.patch_work(monkeypatch, cmd)
        try:
            rc = main(cmd.split() + [a.replace("{f}", str(files)) for a in base])
        except fz.WorkBegan:
            rc = "work"
        finally:
            monkeypatch.undo()
        assert rc == "work", (cmd, rc, capsys.readouterr().err)


def test_cli_fuzz(files, tmp_path, monkeypatch, capsys):
    all_cases = fz.cases(fz.leaf_parsers())
    chosen = fz.sample(all_cases, SAMPLE)
    failures = []
    for i, case in enumerate(chosen):
        d = tmp_path / f"c{i}"
        d.mkdir()
        why = fz.run_case(case, files, d, monkeypatch, capsys, SECONDS)
        if why:
            failures.append(why)
    print(f"CLI fuzz: {len(chosen)} of {len(all_cases)} cases, {len(failures)} failures")
    assert not failures, f"{len(failures)} of {len(chosen)} cases:\n" + "\n".join(failures[:40])


def _planted(files, tmp_path, monkeypatch, capsys, layer=True) -> dict:
    """{(flag, bad value): the fuzz's verdict (None: allowed)} for two options planted in generate without a check
    (a float rate and a file); ``layer=False`` also switches the parser's generic value checks off."""
    from coolsd import cli
    from coolsd.commands import generate

    real_register = generate.register

    def register(sub):
        real_register(sub)
        sub.choices["generate"].add_argument("--planted-rate", type=float, default=None)
        sub.choices["generate"].add_argument("--planted-file", default=None)

    caught = {}
    with monkeypatch.context() as m:
        m.setattr(generate, "register", register)
        planted = [c for c in fz.cases(fz.leaf_parsers()) if c[1] in ("--planted-rate", "--planted-file")]
    assert {c[3] for c in planted} == {"number", "path"}            # the walk found them and typed them
    for i, case in enumerate(planted):
        d = tmp_path / f"p{i}"
        d.mkdir()
        with monkeypatch.context() as m:
            m.setattr(generate, "register", register)
            if not layer:
                m.setattr(cli, "_bad_value", lambda a, x: None)
            caught[(case[1], case[5])] = fz.run_case(case, files, d, m, capsys, SECONDS)
    return caught


def test_cli_fuzz_catches_a_planted_unchecked_option(files, tmp_path, monkeypatch, capsys):
    """Negative control: options added to generate without a check are found by the walk and caught: a huge rate and
    a FIFO / /dev/zero file are accepted (the work began); the values the parser refuses for every option (nan, inf,
    empty) are refused for them too."""
    caught = _planted(files, tmp_path, monkeypatch, capsys)
    for key in (("--planted-rate", "huge"), ("--planted-file", "fifo"), ("--planted-file", "devzero")):
        assert caught[key] and "accepted (the work began)" in caught[key], (key, caught[key])
    for key in (("--planted-rate", "nan"), ("--planted-rate", "inf"), ("--planted-rate", "empty"),
                ("--planted-file", "empty")):
        assert caught[key] is None, (key, caught[key])


def test_cli_fuzz_catches_nan_without_the_parser_layer(files, tmp_path, monkeypatch, capsys):
    """Negative control of the generic layer (coolsd.cli.Parser): switched off, a planted float takes nan and inf."""
    caught = _planted(files, tmp_path, monkeypatch, capsys, layer=False)
    for key in (("--planted-rate", "nan"), ("--planted-rate", "inf"), ("--planted-file", "empty")):
        assert caught[key] and "accepted (the work began)" in caught[key], (key, caught[key])
