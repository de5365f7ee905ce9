"""`coolsd generate` in one direction (issue 47): ``generate_checks.plan`` reads the Namespace once and returns a frozen
``Plan`` that the later steps read; the Namespace is left as parsed. Scoring checks its inputs once
(``real.decode.forced_rows.scoring_inputs``). Each check has a negative control."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from coolsd import validate
from coolsd.cli import build_parser
from coolsd.commands.generate_checks import Plan, plan
from real.decode.forced_rows import scoring_inputs
from real.protocol import OneRow


def _changed(args, step) -> list:
    """The Namespace attributes ``step(args)`` added, removed or changed."""
    before = copy.deepcopy(vars(args))
    step(args)
    after = vars(args)
    return sorted(k for k in before.keys() | after.keys() if k not in before or k not in after or before[k] != after[k])


TREE = ["--mode", "tree", "--tree", "eagle25", "--tree-candidates", "topk", "--draft", "eagle"]


@pytest.mark.parametrize("extra", [[], ["--fidelity", *TREE], ["--method", "ar"]])
def test_plan_leaves_the_namespace_as_parsed_and_is_frozen(extra):
    args = build_parser().parse_args(["generate", "--model", "mnist", "--num-images", "2", "--num-tokens", "6", *extra])
    got = {}
    assert _changed(args, lambda a: got.setdefault("p", plan(a))) == []
    p = got["p"]
    assert isinstance(p, Plan) and p.cfg.num_images == 2 and len(p.bundle.conds) == 2
    assert (p.mode is None) == (p.method == "ar") and (p.verifier is None) == (p.method == "ar")
    assert (p.rule is not None) == ("--fidelity" in extra) and (p.scored is not None) == ("--fidelity" in extra)
    assert (p.cfg.method_def is None) == (p.method == "ar")          # the registry entry, read once in validation
    assert p.method == "ar" or p.cfg.method_def.name.lower() == p.method
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.verifier = None
    with pytest.raises(TypeError):
        p.cfg.options["seed"] = 1                      # the options are a read-only mapping


def test_namespace_check_sees_a_planted_write():
    """The control: a step that writes onto the Namespace (as generate once did: ``args._drafting``) is caught."""
    args = build_parser().parse_args(["generate", "--model", "mnist"])
    assert _changed(args, lambda a: setattr(a, "_drafting", "chain")) == ["_drafting"]
    assert _changed(args, lambda a: setattr(a, "seed", 5)) == ["seed"]


@pytest.mark.parametrize("command", [["generate"], ["sweep", "--out", "unused_store"]])
def test_run_options_reads_the_shared_layer_in_one_pass(command):
    """``validate.run_options`` (sweep; generate reads its two steps, ``model_spec_options`` and ``model_inputs``, with
    its mode and method between them): the model's spec, the schedule files and the dtype; the device
    before the numbers (``theory.core.checks``), the numbers before the model's spec, and an option the model does not
    read refused as such before its file is looked up (not "not an existing path"), one error each. Controls: the
    same options one fault at a time, and none."""
    def parse(*extra):
        return build_parser().parse_args([*command, "--model", "mnist", *extra])

    s, schedules, dtype = validate.run_options(parse(), available=False)
    assert (s.name, schedules, dtype) == ("mnist", {}, "float32")
    for extra, match in [(("--device", "gpu0", "--seed", "-1", "--vq-ckpt", "x"), "^--device"),
                         (("--seed", "-1", "--vq-ckpt", "x"), "^--seed"),
                         (("--vq-ckpt", "x"), "--vq-ckpt does not apply to --model mnist")]:
        with pytest.raises(ValueError, match=match):
            validate.run_options(parse(*extra), available=False)


class _Model:
    row_masks = False

    def __init__(self, V, batched=True):
        self.vocab_size, self.batched = V, batched


@pytest.mark.parametrize("draft, conds, tokens, match", [
    (None, [0, 1], torch.zeros(2, 3), "int"),                       # floats
    (None, [0, 1], torch.zeros(3, 3, dtype=torch.long), "3 images but 2"),
    (None, [0, 1], torch.zeros(2, 0, dtype=torch.long), "columns"),
    (None, [0, 1], torch.full((2, 3), 7), r"\[0, V = 5\)"),
    (_Model(6), [0, 1], torch.zeros(2, 3, dtype=torch.long), "vocabularies differ"),
    (None, [], torch.zeros(0, 3, dtype=torch.long), "no condition"),
])
def test_scoring_inputs_refuse_in_one_line(draft, conds, tokens, match):
    with pytest.raises(ValueError, match=match) as e:
        scoring_inputs(_Model(5), draft, conds, tokens)
    assert "\n" not in str(e.value)


def test_scoring_inputs_refuse_a_bad_processing():
    with pytest.raises(ValueError, match="processing must be"):
        scoring_inputs(_Model(5), None, [0], torch.zeros(1, 3, dtype=torch.long), processing="greedy")


def test_scoring_inputs_pass_good_input():
    """The control: valid conditions and tokens come back as a list and int64 (n, T), with the models as the scorers
    call them (``Forced``: batched models as they are, a one-length model through ``OneRow``, read once)."""
    t, d = _Model(5), _Model(5)
    m, conds, tok = scoring_inputs(t, d, 3, torch.tensor([[0, 4, 2]], dtype=torch.int32))
    assert conds == [3] and tok.dtype == torch.long and tok.tolist() == [[0, 4, 2]]
    assert m.target is t and m.draft is d and m.batched and not m.row_masks and not m.features
    m, _, _ = scoring_inputs(t, _Model(5, batched=False), 3, torch.tensor([[0, 4, 2]]))
    assert isinstance(m.draft, OneRow) and m.draft.model.vocab_size == 5 and not m.batched


def test_built_mode_checks_its_image_bound_options_against_the_built_image():
    """A spec that does not know its tokens (llamagen with a checkpoint, emu3, ...) leaves --L unchecked before the
    build; ``DraftingSpec.build`` checks it against the built image (``model_facts``' num_tokens). Control: an
    image that holds it builds."""
    from coolsd.options import DraftingSpec

    spec = DraftingSpec("chain", (("L", 10),), "--mode chain")
    with pytest.raises(ValueError, match="--L 10 is larger than the image .8 tokens"):
        spec.build({"num_tokens": 8, "width": None})
    assert spec.build({"num_tokens": 16, "width": 4}).max_depth == 10
