"""`coolsd generate --draft jacobi`: the Jacobi drafting options (``real.decode.jacobi``), their checks before any
work, and the ``Jacobi`` spec for a built model."""
from __future__ import annotations


def _flag(dest: str) -> str:
    """The command-line spelling of an argparse dest (shared with ``coolsd generate``'s checks)."""
    return "--" + dest.replace("_", "-")


def _given(args, dest: str) -> bool:
    """Whether option ``dest`` was given (not None, not an empty list, not False)."""
    v = getattr(args, dest, None)
    return v is not None and v != [] and v is not False


def add_jacobi_args(g) -> None:
    """The --window / --jacobi-init / --coupling options of ``coolsd generate``."""
    j = g.add_argument_group("Jacobi drafting (--draft jacobi)")
    j.add_argument("--window", type=int, default=None,
                   help="target rows per call W: W - 1 Jacobi drafts, at most W tokens per call (default 16, the SJD "
                        "release's)")
    j.add_argument("--jacobi-init", default=None, choices=["random", "repeat_horizon", "sample_horizon"],
                   help="initialisation of new window slots, as the SJD release's schemes (default random)")
    j.add_argument("--coupling", default=None, choices=["none", "scd-mc", "scd-mc-p", "scd-gs"],
                   help="couple consecutive iterations' drafts (SCD): scd-mc maximal coupling as released (not "
                        "lossless), scd-mc-p the same with the current rows as q (lossless), scd-gs Gumbel coupling "
                        "(default none: plain SJD)")


def jacobi_spec(args):
    """``--draft jacobi``'s ``real.decode.jacobi.Jacobi`` (the row width is filled in by ``jacobi_for`` once the
    model is built), or None for other drafts."""
    if getattr(args, "draft", None) != "jacobi":
        return None
    from real.decode.jacobi import DEFAULT_WINDOW, Jacobi

    return Jacobi(DEFAULT_WINDOW if args.window is None else args.window, args.jacobi_init or "random",
                  args.coupling or "none")


def jacobi_for(jac, bundle):
    """The Jacobi spec for the built model: the image row width (``info['grid']``, else the side of a square image)
    and the window checked against the image length (ValueError naming --window)."""
    import dataclasses
    import math as _m

    grid = (bundle.info or {}).get("grid")
    T = int(bundle.num_tokens)
    width = int(grid[1]) if grid else (_m.isqrt(T) if _m.isqrt(T) ** 2 == T else None)
    if jac.window > T:
        raise ValueError(f"--window {jac.window} is larger than the image ({T} tokens)")
    if jac.init != "random" and width is None:
        raise ValueError(f"--jacobi-init {jac.init} needs the image row width; --model's images have no known grid")
    return dataclasses.replace(jac, width=width)


JACOBI_ONLY = ("window", "jacobi_init", "coupling")
DRAFTER_OPTIONS = ("drafter_dir", "draft_ckpt", "draft_pretrained", "draft_size", "draft_layers")


def validate_jacobi(args, checks) -> None:
    """--draft jacobi and its options: no drafter options, no --L / --tree, a window >= 1 (and within --num-tokens),
    a coupling only with a sampling verifier; the Jacobi options only with --draft jacobi."""
    if getattr(args, "draft", None) != "jacobi":
        extra = [_flag(d) for d in JACOBI_ONLY if _given(args, d)]
        if extra:
            raise ValueError(f"{', '.join(extra)} configure Jacobi drafting: add --draft jacobi")
        return
    bad = [_flag(d) for d in DRAFTER_OPTIONS if _given(args, d)]
    if bad:
        raise ValueError(f"--draft jacobi drafts from the target itself: {', '.join(bad)} load(s) a drafter")
    for d in ("L", "tree"):
        if _given(args, d):
            raise ValueError(f"--draft jacobi sets its draft length with --window, not {_flag(d)}")
    if args.window is not None:
        checks.integer("--window", args.window, lo=1)
        if args.num_tokens is not None and args.window > args.num_tokens:
            raise ValueError(f"--window {args.window} is larger than the image (--num-tokens {args.num_tokens})")
    method = str(args.method).lower()
    if method == "ar":
        raise ValueError("--draft jacobi needs a speculative method (not ar)")
    if (args.coupling or "none") != "none" and method == "greedy":
        raise ValueError(f"--coupling {args.coupling} couples sampled drafts; --method greedy has one-hot rows "
                         "(every coupling is the identity): drop --coupling")
