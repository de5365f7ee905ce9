"""Drafter-free decoding: Speculative Jacobi Decoding (SJD, Teng et al., ICLR 2025) and the coupled drafts of
Speculative Coupled Decoding (SCD, arXiv 2510.24211), as one more step kind of ``real.decode.engine.generate``.

The draft of a round is the previous Jacobi iteration's own samples (docs/theory.md section 12). For an image
with n committed tokens the window holds S = W - 1 drafts x_0..x_{S-1} for positions n..n+S-1 and the rows
q_0..q_{S-1} they were drawn from. One round (``jacobi_step``):

  1. one target forward over [x_{n-1}; x_0..x_{L'-1}] (L' = min(S, T - n - 1) per image, ragged as the chain
     rounds of ``real.decode.steps``) gives the current rows P_0..P_{L'} (P_k = P(.|committed, x_<k));
  2. the drafts are verified with any chain verifier, ``theory.rules.chain.verify_chain(P, q, x, ...,
     n_drafted=L')``: tau accepted drafts plus the resampled (or bonus) token are committed;
  3. the positions past the commit are re-drafted from the rows just computed: y_k ~ P_k with q'_k = P_k
     (k = tau + 1..L'), shifted to the window's front; the slots left over are initialised (``INITS``);
  4. the KV cache keeps [x_{n-1}; accepted drafts] only (rolled back by L' - tau), as a chain round.

Window W is the release's ``max_num_new_tokens``: target rows per call, so at most W tokens per call (W = 1:
plain AR). Default 16 for SJD (tyshiwo1/Accelerating-T2I-AR-with-SJD at b389cfb2b6aa228efab32190f98bc13c3fd4b8e6,
``test_lumina_mgpt.py`` and the sampler's own default) and 32 with an SCD coupling (junhyukso/SCD at
7322379df906785094bd35aa2006791ba9acc8b0: ``lumina1/test_SCD_GS.py``, ``test_SCD_MC.py`` and its ``test_SJD.py`` baseline
all set ``max_num_new_tokens = 32``; its ``janus_pro/test_scd.py`` defaults to 16).

Plain tail (``plain_tail``): the last image tokens sampled plainly, windows never drafting into them. Both releases
run Lumina-mGPT with ``jacobi_loop_interval_l = 3`` and ``jacobi_loop_interval_r = (size // 16)**2 + size // 16 - 10``
(SJD ``test_lumina_mgpt.py``; SCD ``lumina1/test_*.py``); the loop drafts ``min(max_num_new_tokens, r - g)`` rows when
``l <= g < r`` (g tokens generated after the prompt, structural ones included) and one plain token otherwise. The
first 3 generated tokens are Lumina-mGPT's header (boi, height, width: inside the adapter here, not image codes); the
plain tail is the last 13 generated tokens before eoi, i.e. 12 codes and the last newline at every size
(``real.adapters.chameleon.sjd_plain_tail``; ``coolsd`` sets it for ``--model lumina-mgpt``). Initialisation of new slots (the release's ``multi_token_init_scheme``; q one-hot at the token):
``random`` (default): a uniform image token; ``repeat_horizon``: the last known token (last carried draft, else
the last committed token) except at the first column of an image row, which stays random;
``sample_horizon``: the mode of the row that last known token was drawn from (P_{L'}), same columns.

Couplings of consecutive iterations' drafts (``COUPLINGS``; SCD's release, lumina1/scheduler):
``scd-mc``: maximal coupling: past the first rejection, y_k keeps the old draft x_k with probability
min(1, P_k(x_k) / q_k(x_k)), else y_k ~ Norm([P_k - q_k]_+); so y_k ~ P_k. As released, the row kept as q'_k is
q_k where x_k was kept and P_k elsewhere: not lossless (docs/theory.md section 12 works an example; the law
test measures it). ``scd-mc-p`` (ours): the same coupling with q'_k = P_k everywhere, lossless.
``scd-gs``: Gumbel coupling: y_k = argmax_v P_k(v) / E_{n+k}(v) (Gumbel-max as an exponential race) with a
fixed noise table E indexed by absolute position, i.e. shifted by the committed count each round; lossless
(the noise of position j is independent of everything at positions < j).

Uniforms come from the images' streams (``real.decode.rng``), purposes ``JACOBI + j`` (``_DRAFT`` ... below).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from theory import rules
from real.protocol import Proposal

from . import rng as R
from .sampling import sample

__all__ = ["Jacobi", "Window", "INITS", "COUPLINGS", "DEFAULT_WINDOW", "SCD_WINDOW", "draft_rows", "JACOBI_REASON"]

JACOBI_REASON = ("exact likelihood of Jacobi drafting is not tractable: a draft's q is the target's row from the "
                 "previous iteration, conditioned on window tokens that are not in the output, so the hidden state "
                 "holds up to W - 1 stale tokens (docs/theory.md section 12); score a drafter's chain runs instead")
DEFAULT_WINDOW = 16                                   # SJD's max_num_new_tokens (Lumina-mGPT, LlamaGen)
SCD_WINDOW = 32                                       # SCD's (lumina1 scripts), the default with a coupling
INITS = ("random", "repeat_horizon", "sample_horizon")
COUPLINGS = ("none", "scd-mc", "scd-mc-p", "scd-gs")

# purposes of the rounds' uniforms (disjoint offsets inside the JACOBI range of real.decode.rng)
_DRAFT = R.JACOBI + 0      # re-drafting: one uniform per window row, keyed by the round's committed length
_INIT = R.JACOBI + 1       # random initialisation of window slot i
_MC_ACC = R.JACOBI + 2     # maximal coupling: keep-the-old-draft uniforms
_MC_RES = R.JACOBI + 3     # maximal coupling: residual draws
_GUMBEL = R.JACOBI + 4     # Gumbel coupling: the fixed noise table, keyed by ABSOLUTE position (not the round)


@dataclass(frozen=True)
class Jacobi:
    """The Jacobi drafting mode (``real.protocol.Drafting``): ``window`` W (target rows per call, W - 1 drafts; None:
    16, or 32 with a coupling, as released), ``init`` (``INITS``), ``coupling`` (``COUPLINGS``), ``width`` (tokens per
    image row, for the horizon initialisations) and ``plain_tail`` (the last image tokens sampled plainly, as the
    releases on Lumina-mGPT). Drafter-free: ``generate``'s draft must be None; the window lives in ``run.state``."""
    window: int | None = None
    init: str = "random"
    coupling: str = "none"
    width: int | None = None
    plain_tail: int = 0
    needs_draft = False
    trees = False

    def __post_init__(self):
        if self.window is None:
            object.__setattr__(self, "window", DEFAULT_WINDOW if self.coupling == "none" else SCD_WINDOW)

    @property
    def slots(self) -> int:
        """S = W - 1 draft slots in the window."""
        return self.window - 1

    @property
    def max_depth(self) -> int:
        return self.slots

    def check(self, target, draft, num_tokens, verifier, processing, batch_size) -> None:
        """``check_jacobi`` and no draft model."""
        if draft is not None:
            raise ValueError("jacobi drafting drafts from the target itself: give no draft model")
        check_jacobi(self, num_tokens, processing)

    def from_prefill(self, run) -> bool:
        return False

    def start(self, run) -> Window:
        """Every slot initialised after the committed tokens (round 0 gave one)."""
        S, V = self.slots, int(run.target.vocab_size)
        last = run.last_tokens()[:, 0]
        win = Window(torch.zeros((run.B, S), dtype=torch.long, device=run.dev),
                     torch.zeros((run.B, S, V), dtype=run.proc.dtype, device=run.dev))
        _init_slots(run, self, win, torch.zeros(run.B, dtype=torch.long, device=run.dev), last, None)
        return win

    def propose(self, run, depth: np.ndarray) -> Proposal:
        """The window's first max_b L'_b drafts and the rows they were drawn from (law "sampled")."""
        Lr = int(depth.max())
        win = run.state
        x = win.tokens[:, :Lr]
        return Proposal(torch.cat([run.last_tokens(), x], 1), draft_rows(win, Lr), "sampled", None,
                        np.arange(Lr + 1), None, 0)

    def advance(self, run, prop, verdict, p, n0) -> None:
        """Re-draft the positions past the commit from the round's rows ``p`` (B, Lr + 1, V) (keyed by the round's
        committed lengths ``n0``), carry them to the window's front, initialise the slots left over (keyed by the new
        lengths)."""
        win, S, V = run.state, self.slots, p.shape[-1]
        Lr = prop.tokens.shape[1] - 1
        act = n0 < run.T
        Lb = np.where(act, np.clip(np.minimum(S, run.T - self.plain_tail - n0 - 1), 0, None), 0)
        tau = np.asarray(verdict.accepted)
        y, qn = _redraft(run, self, p, prop.tokens[:, 1:], prop.q, n0)
        tau_t = torch.as_tensor(tau, device=run.dev)
        carried = torch.as_tensor(np.where(act, Lb - tau, 0), device=run.dev)
        idx = (tau_t[:, None] + 1 + torch.arange(S, device=run.dev)).clamp_(max=Lr)       # (B, S)
        win.tokens = y.gather(1, idx)
        win.q = qn.gather(1, idx[..., None].expand(-1, -1, V)).to(win.q.dtype)
        last_row = p.gather(1, torch.as_tensor(Lb, device=run.dev)[:, None, None].expand(-1, 1, V))[:, 0]
        last_tok = torch.where(carried > 0, y.gather(1, torch.as_tensor(Lb, device=run.dev)[:, None])[:, 0],
                               torch.as_tensor(verdict.next_token, device=run.dev))
        _init_slots(run, self, win, carried, last_tok, last_row)

    def params(self) -> dict:
        return {"draft": "jacobi", "window": self.window, "L": self.slots, "init": self.init, "coupling": self.coupling,
                "plain_tail": self.plain_tail}


@dataclass
class Window:
    """Per-image window state between rounds: ``tokens`` (B, S) drafts for positions n_b..n_b + S - 1 and ``q``
    (B, S, V) the rows they were drawn from (one-hot at initialised slots)."""
    tokens: torch.Tensor
    q: torch.Tensor


def check_jacobi(spec, num_tokens: int, processing) -> Jacobi:
    """ValueError naming the option unless ``spec`` is a valid ``Jacobi`` for images of ``num_tokens`` tokens and
    ``processing`` (a coupling needs sampled rows: not with greedy, one-hot rows)."""
    if not isinstance(spec, Jacobi):
        raise ValueError(f"jacobi must be a real.decode.jacobi.Jacobi, got {type(spec).__name__}")
    W = spec.window
    if isinstance(W, bool) or not isinstance(W, (int, np.integer)) or W < 1:
        raise ValueError(f"window must be an int >= 1 (target rows per call), got {W!r}")
    if W > num_tokens:
        raise ValueError(f"window {W} is larger than the image ({num_tokens} tokens)")
    if spec.init not in INITS:
        raise ValueError(f"jacobi init must be one of {', '.join(INITS)}, got {spec.init!r}")
    if spec.coupling not in COUPLINGS:
        raise ValueError(f"coupling must be one of {', '.join(COUPLINGS)}, got {spec.coupling!r}")
    if spec.init != "random" and (isinstance(spec.width, bool) or not isinstance(spec.width, (int, np.integer))
                                  or spec.width < 1):
        raise ValueError(f"jacobi init {spec.init!r} needs the image row width (an int >= 1), got {spec.width!r}")
    pt = spec.plain_tail
    if isinstance(pt, bool) or not isinstance(pt, (int, np.integer)) or not 0 <= pt < num_tokens:
        raise ValueError(f"plain_tail must be an int in [0, {num_tokens}) (image tokens sampled plainly at the end), "
                         f"got {pt!r}")
    if spec.coupling != "none" and processing.greedy:
        raise ValueError(f"coupling {spec.coupling!r} couples sampled drafts; greedy decoding has one-hot rows "
                         "(every coupling is the identity): use coupling 'none'")
    return spec


def draft_rows(window: Window, Lr: int) -> torch.Tensor:
    """The q rows (B, Lr, V) the round's Lr drafts are verified with: the rows the drafts were drawn from in the
    previous iteration (one place, so that a test can swap in other rows as a negative control)."""
    return window.q[:, :Lr]


def _init_slots(run, spec: Jacobi, win: Window, first_free: torch.Tensor, last_tok: torch.Tensor,
                last_row: torch.Tensor | None) -> None:
    """Fill window slots i >= first_free (B,) in place for images at committed lengths ``run.n``: ``random`` a
    uniform token; horizon schemes copy ``last_tok`` (B,) (``repeat``) or the mode of ``last_row`` (B, V)
    (``sample``; the token itself when None) except at the first column of an image row. q: one-hot."""
    B, S = win.tokens.shape
    if S == 0:
        return
    V = win.q.shape[-1]
    i = torch.arange(S, device=run.dev)
    u = run.rng.uniform(run.n, _INIT, (S,)).to(run.dev)
    new = (u * V).long().clamp_(max=V - 1)                                            # (B, S) uniform tokens
    if spec.init != "random":
        fill = last_tok if (spec.init == "repeat_horizon" or last_row is None) else last_row.argmax(-1)
        col = (torch.as_tensor(run.n, device=run.dev)[:, None] + i) % int(spec.width)
        new = torch.where(col >= 1, fill[:, None].expand(-1, S), new)
    free = i[None, :] >= first_free[:, None]
    win.tokens = torch.where(free, new, win.tokens)
    hot = torch.nn.functional.one_hot(new, V).to(win.q.dtype)
    win.q = torch.where(free[..., None], hot, win.q)


def _redraft(run, spec: Jacobi, P: torch.Tensor, x: torch.Tensor, q: torch.Tensor, n: np.ndarray):
    """Samples y (B, Lr+1) of the current rows P (B, Lr+1, V) and the rows q' (B, Lr+1, V) kept as their q:
    independent draws (none), coupled with the old drafts x (B, Lr) drawn from q (B, Lr, V) (scd-mc, scd-mc-p),
    or Gumbel-coupled through the noise table of the absolute positions (scd-gs); uniforms keyed by the round's
    committed lengths n (B,)."""
    B, K, V = P.shape
    Lr = K - 1
    if spec.coupling == "scd-gs":
        ys = []
        for k in range(K):   # a loop over the window's rows: row k's noise is keyed by its absolute position n + k
            E = run.rng.uniform(n + k, _GUMBEL, (V,)).to(run.dev).log_().neg_()      # Exp(1), (B, V)
            ys.append((P[:, k].double() / E).argmax(-1))      # argmax p / E  ==  argmax log p + Gumbel
        return torch.stack(ys, 1), P
    y = sample(P, run.rng.uniform(n, _DRAFT, (K,), P.dtype))
    if spec.coupling == "none" or Lr == 0:
        return y, P
    van = rules.vanilla()
    pk = P[:, :Lr]
    f = van.accept(pk, q, 1)                                                         # min(1, P_k / q_k)
    keep = run.rng.uniform(n, _MC_ACC, (Lr,)).to(run.dev, P.dtype) < f.gather(-1, x[..., None])[..., 0]
    res = sample(van.resample(pk, q, f), run.rng.uniform(n, _MC_RES, (Lr,), P.dtype))     # Norm([P_k - q_k]_+)
    y = torch.cat([torch.where(keep, x, res), y[:, Lr:]], 1)
    if spec.coupling == "scd-mc":   # as released: the old row stays where the old draft was kept
        return y, torch.cat([torch.where(keep[..., None], q, pk), P[:, Lr:]], 1)
    return y, P
