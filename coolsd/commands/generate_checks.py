"""`coolsd generate`'s options into a ``Plan``, in one direction (issue 47): ``plan`` takes the argparse Namespace
once, checks every option, file and combination before any model is built (``coolsd.validate.run_config``: issue 26 / 41), builds
the models (``real.registry.build`` refuses more tokens than an image holds), checks GSD's memory, then makes the mode, the processing, the verifier and, with
--fidelity, the scoring rule. The last stage, ``coolsd.commands.generate_run``, reads the frozen ``Plan`` alone."""
from __future__ import annotations

import dataclasses

from coolsd.validate import RunConfig, run_config


@dataclasses.dataclass(frozen=True)
class Plan:
    """A validated, built ``coolsd generate`` run. ``cfg``: the frozen ``coolsd.validate.RunConfig``; ``bundle``: the
    ``real.registry.Bundle``; ``spec``: the ``coolsd.options.DraftingSpec``; ``method``: the method's name, lower case
    ("ar": plain decoding); ``mode``: the ``real.protocol.Drafting`` mode (None for "ar"); ``proc``: the
    ``real.decode.sampling.Processing``; ``verifier``: the engine's verifier (None for "ar"); ``rule``: --fidelity's
    host verifier (None without --fidelity or for "ar"); ``scored``: the drafting the mode's likelihood hook gave
    (``ModeDef.likelihood``; what ``real.decode.score`` scores)."""
    cfg: RunConfig
    bundle: object
    spec: object
    method: str
    mode: object
    proc: object
    verifier: object
    rule: object = None
    scored: object = None


def plan(args) -> Plan:
    """``coolsd generate``'s Namespace ``args`` read once and validated (``coolsd.validate.run_config``), then built
    (``build_plan``). ValueError naming the option before any model is built where the options alone show it."""
    cfg = run_config(args)
    return build_plan(cfg)


def build_plan(cfg: RunConfig) -> Plan:
    """The models, the drafting mode, the processing and the verifier of a validated run ``cfg``; with --fidelity the
    run's rule on the host (the likelihood is float64 theory code) and the mode's likelihood hook, so a construction
    without an exact likelihood (e.g. sampled tree candidates above the cost guard at this V) is refused before
    anything is generated. GSD's vectors are made once, for the verifier and the rule alike."""
    import torch
    from theory.core import checks

    from real.decode.embeddings import gsd_vectors
    from real.decode.methods import method_processing, resolved_verifiers
    from real.decode.sampling import Processing
    from real.nn.blocks import compile_models
    from real.protocol import NO_DRAFT
    from real.registry import BuildOptions, build
    from real.specs import model_facts

    threads = cfg.threads if cfg.threads is not None else (1 if "tiny" in cfg.model else None)
    if threads is not None:
        torch.set_num_threads(threads)
    spec, method = cfg.drafting, cfg.method.lower()
    opts = BuildOptions.from_namespace(cfg)             # the frozen options, read as attributes
    bundle = build(cfg.model, opts if spec.mode.needs_draft else dataclasses.replace(opts, draft=NO_DRAFT))
    facts = model_facts(bundle, cfg.model)              # what the built model tells the mode, read from its spec
    if cfg.method_def is not None and cfg.method_def.needs_embeddings:    # GSD's groups: (rows, V, 2w) tokens
        V, window = int(bundle.target.vocab_size), int(cfg.method_params["window"])     # per verified position
        rows = (cfg.batch_size or cfg.num_images) * 2 * (cfg.drafting.max_depth + 1)     # CFG doubles the rows
        checks.check_memory("--gsd-window", rows * V * 2 * min(window, 2 * V) * 40.0, checks.MAX_BYTES,
                            f"--gsd-window {window} on V = {V}: use a smaller window (the release uses 7) or fewer "
                            "images per batch (--batch-size)")
    mode = spec.build(facts)                            # its image-bound options (--L) within the image, first
    if cfg.compile:
        compile_models({"target": bundle.target, "draft": bundle.draft}, cfg.compile,
                       getattr(bundle.target, "device", "cpu"))
    cfg_scale = bundle.cfg_scale if cfg.cfg_scale is None else cfg.cfg_scale
    top_k = getattr(bundle, "top_k", 0) if cfg.top_k is None else cfg.top_k
    proc = Processing(cfg.temperature, top_k, cfg.top_p, cfg_scale)
    if method == "ar":
        return Plan(cfg, bundle, spec, method, None, proc, None)
    proc = method_processing(method, proc)
    gsd = cfg.method_def.needs_embeddings
    gsd_emb, gsd_table = gsd_vectors(bundle, cfg.gsd_table) if gsd else (None, None)
    if gsd_table is not None:
        bundle.info["gsd_table"] = gsd_table
    verifier, *host = resolved_verifiers(method, dict(cfg.method_params), bundle.neighbors, gsd_emb, L=mode.max_depth,
                                         device=getattr(bundle.target, "device", None),
                                         host_L=spec.max_depth if cfg.fidelity else None)   # the engine's, the rule's
    if not cfg.fidelity:
        return Plan(cfg, bundle, spec, method, mode, proc, verifier)
    rule = host[0]
    try:
        scored = spec.mode.likelihood(mode, rule, int(bundle.target.vocab_size), proc)
    except NotImplementedError as e:
        raise ValueError(f"--fidelity with {spec.named}: {e}") from None
    return Plan(cfg, bundle, spec, method, mode, proc, verifier, rule, scored)

