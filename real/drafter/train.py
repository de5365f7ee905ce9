"""The one EAGLE-1 training loop of the toolkit (``coolsd train-drafter``; ``real.models.eagle.train_eagle`` on tensors in
memory is the same step), data-parallel under torchrun, resumable bitwise.

Objective (EAGLE-1, as LANTERN's trainer uses it): on the pairs p that predict image tokens x_1 .. x_{T-1}
(``real.models.eagle.eagle_pairs``),
    loss = v_w * SmoothL1(f_p, h_{p+1}) + p_w * CE(softmax(head(h_{p+1})), log_softmax(head(f_p))),
f_p the drafter's output, h the target's features, head the target's frozen LM head; the inputs h_p are perturbed by
uniform noise of width ``noise``. AdamW (0.9, 0.95), linear warm-up then a constant rate, gradient clipping.

Batches: the global batch of ``batch_size`` sequences is drawn on every rank from one generator (a group of equal
prefix length P chosen in proportion to its size, then sequences with replacement) together with its noise; rank r
trains on sequences r, r + world, ...; gradients are averaged over ranks (one all-reduce of the flattened
gradients) and over ``accum`` micro-batches. Every sequence scores T - 1 pairs, so the average of the ranks' and
micro-batches' means is the global batch's mean: the run equals one process up to float summation order.

State (``--resume``): drafter, optimiser, generator and step, saved atomically every ``save_every`` steps and on
Ctrl-C; a resumed run replays the same batches, so its final weights equal an uninterrupted run's (bitwise on CPU
at the same thread count).

Validation (``evaluate``): on held-out sequences, teacher-forced: top-1 agreement of drafter and target, the vanilla
acceptance rate sum_x min(p, q) (temperature 1, no CFG, the stored row's condition), and the tokens per call
predicted for a chain of L = 4 (T2 with the per-position rates, ``theory.likelihood.speed``: a round after x_n
accepts x_{n+1} .. x_{n+i} with probability prod_j alpha_{n+j}; teacher forcing makes it an optimistic estimate for
i >= 2, where the drafter reads its own features).
"""
from __future__ import annotations

import math
import os
import pathlib
import time
from dataclasses import dataclass

import numpy as np
import torch

from real.models.eagle import eagle_loss, eagle_pairs

__all__ = ["TrainConfig", "train", "evaluate", "predicted_tokens_per_call", "Data"]


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation options (defaults: EAGLE-1's loss weights and head depth; our rates for small models)."""
    steps: int = 2000
    batch_size: int = 32          # global sequences per step
    accum: int = 1                # micro-batches per rank and step
    lr: float = 1e-3
    warmup: int = 0
    p_w: float = 0.1              # token cross-entropy weight (EAGLE's p_w)
    v_w: float = 1.0              # feature regression weight (EAGLE's v_w)
    noise: float = 0.2            # uniform feature-noise width
    grad_clip: float = 0.5
    seed: int = 0
    eval_every: int = 250
    save_every: int = 100

    def __post_init__(self):
        for k in ("steps", "batch_size", "accum"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"--{k.replace('_', '-')} must be an int >= 1, got {v!r}")
        for k in ("warmup", "eval_every", "save_every", "seed"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"--{k.replace('_', '-')} must be an int >= 0, got {v!r}")
        for k in ("lr", "p_w", "v_w", "noise", "grad_clip"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"--{k.replace('_', '-')} must be a finite number >= 0, got {v!r}")
        if self.lr == 0 or self.grad_clip == 0:
            raise ValueError("--lr and --grad-clip must be > 0")
        if self.p_w == 0 and self.v_w == 0:
            raise ValueError("--p-w and --v-w are both 0: nothing to train")


class Data:
    """The training sequences of a ``real.drafter.features.FeatureCache`` (its shards opened memory-mapped), grouped
    by prefix length, and the held-out ones (the last ``heldout`` sequences)."""

    def __init__(self, shards: list[dict], heldout: int):
        self.shards = shards
        sizes = np.array([len(s["tokens"]) for s in shards])
        total = int(sizes.sum())
        if heldout < 0 or heldout >= total:
            raise ValueError(f"--heldout {heldout}: must leave training sequences (the cache holds {total})")
        self.shard_of = np.repeat(np.arange(len(shards)), sizes)
        self.row_of = np.concatenate([np.arange(n) for n in sizes])
        P = np.array([s["P"] for s in shards])[self.shard_of]
        train = np.arange(total - heldout)
        self.groups = [train[P[train] == p] for p in np.unique(P[train])]
        self.group_P = [int(P[g[0]]) for g in self.groups]
        self.heldout = np.arange(total - heldout, total)
        self.T = int(shards[0]["tokens"].shape[1])
        self.D = int(shards[0]["features"].shape[-1])

    def batch(self, idx: np.ndarray):
        """tokens (n, T) int64 and features (n, M, D) float32 of global sequences ``idx`` (one prefix length)."""
        toks, feats = [], []
        order = np.argsort(self.shard_of[idx], kind="stable")
        for k in np.unique(self.shard_of[idx]):   # a loop over the (few) shards a batch touches
            rows = self.row_of[idx[order][self.shard_of[idx[order]] == k]]
            toks.append(self.shards[k]["tokens"][rows])
            feats.append(np.asarray(self.shards[k]["features"][rows], np.float32))
        inv = np.argsort(order, kind="stable")
        return torch.from_numpy(np.concatenate(toks)[inv]), torch.from_numpy(np.concatenate(feats)[inv])

    def draw(self, g: torch.Generator, B: int) -> tuple[np.ndarray, int]:
        """A global batch: B sequences of one group (chosen in proportion to its size), with replacement -> (idx, P)."""
        sizes = torch.tensor([len(x) for x in self.groups], dtype=torch.float64)
        gi = int(torch.multinomial(sizes, 1, generator=g)) if len(self.groups) > 1 else 0
        pick = torch.randint(0, len(self.groups[gi]), (B,), generator=g).numpy()
        return self.groups[gi][pick], self.group_P[gi]


def _world():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _average_grads(params: list, world: int, loss: float) -> float:
    """Average the gradients and the step's loss over ranks: one all-reduce of [flattened gradients; loss]. Returns
    the global batch's loss."""
    if world == 1:
        return loss
    import torch.distributed as dist

    flat = torch.cat([p.grad.reshape(-1) for p in params] +
                     [torch.tensor([loss], dtype=params[0].grad.dtype, device=params[0].grad.device)])
    dist.all_reduce(flat)
    flat /= world
    o = 0
    for p in params:   # a loop over the parameter tensors (a handful)
        n = p.numel()
        p.grad.copy_(flat[o:o + n].view_as(p))
        o += n
    return float(flat[-1])


def _save_state(path: pathlib.Path, blob: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(blob, tmp)
    os.replace(tmp, path)


def train(drafter, data: Data, cfg: TrainConfig, *, state_path=None, meta: dict | None = None, resume: bool = False,
          log=print, progress: bool = True, autocast: bool = False) -> dict:
    """Train ``drafter`` on ``data`` as ``cfg`` says (module docstring); returns {"history": [validation dicts],
    "final_loss", "steps", "seconds"}. ``state_path``: the resumable state file (rank 0 writes it); ``meta``: what a
    resumed run must match (refused otherwise); ``autocast``: bf16 autocast (CUDA)."""
    from tqdm import tqdm

    rank, world = _world()
    if cfg.batch_size % (world * cfg.accum):
        raise ValueError(f"--batch-size {cfg.batch_size} must be a multiple of ranks x --accum = {world * cfg.accum}")
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(cfg.seed)
    step, history, losses, seconds = 0, [], [], 0.0
    state_path = None if state_path is None else pathlib.Path(state_path)
    if resume:
        if state_path is None or not state_path.is_file():
            raise ValueError(f"--resume: no training state at {state_path}")
        blob = torch.load(state_path, weights_only=False, map_location="cpu")
        if blob["meta"] != (meta or {}):
            diff = sorted(k for k in set(blob["meta"]) | set(meta or {}) if blob["meta"].get(k) != (meta or {}).get(k))
            raise ValueError(f"--resume: {state_path} was written by another run (differs in {', '.join(diff)}); "
                             "resume with the same model, data and options, or start afresh in another --out")
        drafter.load_state_dict(blob["drafter"], strict=False)
        opt.load_state_dict(blob["opt"])
        g.set_state(blob["gen"])
        step, history, losses, seconds = blob["step"], blob["history"], blob["losses"], blob["seconds"]
        log(f"resumed from {state_path} at step {step}")

    def save():
        if rank == 0 and state_path is not None:
            trained = {k: v for k, v in drafter.state_dict().items() if k != "embed_tokens.weight"}
            _save_state(state_path, {"meta": meta or {}, "drafter": trained, "opt": opt.state_dict(),
                                     "gen": g.get_state(), "step": step, "history": history, "losses": losses,
                                     "seconds": seconds})

    dev = drafter.device
    t0 = time.perf_counter() - seconds
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress or rank != 0, desc="train drafter", unit="step")
    drafter.train()
    try:
        while step < cfg.steps:
            idx, P = data.draw(g, cfg.batch_size)
            noise = (torch.rand((cfg.batch_size, P + data.T - 1, data.D), generator=g) - 0.5) * cfg.noise
            mine = np.arange(rank, cfg.batch_size, world)
            lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) if cfg.warmup else cfg.lr
            for grp in opt.param_groups:
                grp["lr"] = lr
            opt.zero_grad(set_to_none=False)
            total = 0.0
            for part in np.array_split(mine, cfg.accum):   # a loop over the micro-batches
                tok, feat = data.batch(idx[part])
                ids, inp, tgt, mask = eagle_pairs(tok.to(dev), feat.to(dev), P)
                x = (inp + noise[part].to(dev)).to(drafter.dtype)
                with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
                    loss, _ = eagle_loss(drafter, ids, x, tgt, mask, cfg.p_w, cfg.v_w, P)
                (loss / cfg.accum).backward()
                total += float(loss.detach()) / cfg.accum
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            total = _average_grads(params, world, total)
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            step += 1
            losses.append(total)
            bar.update(1)
            bar.set_postfix(loss=f"{total:.4f}")
            seconds = time.perf_counter() - t0
            if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps) and len(data.heldout):
                v = dict(evaluate(drafter, data), step=step, loss=float(np.mean(losses[-cfg.eval_every:])))
                history.append(v)
                if rank == 0:
                    bar.write(_line(v))
                drafter.train()
            if cfg.save_every and step % cfg.save_every == 0:
                save()
    except KeyboardInterrupt:
        save()
        bar.close()
        raise
    bar.close()
    save()
    drafter.eval()
    return {"history": history, "final_loss": float(np.mean(losses[-min(len(losses), 50):])), "steps": step,
            "seconds": seconds, "losses": losses}


def _line(v: dict) -> str:
    return (f"step {v['step']}: loss {v['loss']:.4f} | held-out top-1 {v['top1']:.4f}, acceptance "
            f"{v['acceptance']:.4f} +- {v['acceptance_se']:.4f}, predicted tokens/call (chain L=4) "
            f"{v['tokens_per_call_L4']:.3f}")


def predicted_tokens_per_call(alpha: np.ndarray, L: int = 4, per_row: int | None = None) -> float:
    """Tokens per target call of a chain of ``L`` predicted by T2 from per-position acceptance rates alpha (N, T - 1)
    of tokens x_1 .. x_{T-1} (module docstring), through ``theory.likelihood.speed`` (EAGLE: the first round is the
    prefill's single step)."""
    from theory.likelihood.speed import expected_rounds, survival_by_row

    a = np.asarray(alpha, np.float64)
    N, Tm1 = a.shape
    T = Tm1 + 1
    per_row = per_row or (math.isqrt(T) if math.isqrt(T) ** 2 == T else T)
    pad = np.concatenate([a, np.zeros((N, L))], 1)                 # alpha of x_{n+j}: pad[:, n + j - 1]
    starts = np.arange(T - 1)                                       # rounds after x_n, n = 0 .. T - 2
    acc = np.empty((N, T - 1, L))
    live = np.empty((N, T - 1, L))
    run = np.ones((N, T - 1))
    for i in range(L):   # a loop over the L draft positions
        run = run * pad[:, starts + i]
        acc[..., i] = run
        live[..., i] = (starts + i + 1 <= T - 1)[None, :]
    S = survival_by_row(acc.reshape(-1, L), live.reshape(-1, L), np.tile(starts, N), T=T, per_row=per_row)
    return float(expected_rounds(S, L, True, T=T, per_row=per_row)["tokens_per_call"])


@torch.no_grad()
def evaluate(drafter, data: Data, max_sequences: int = 256, batch: int = 16) -> dict:
    """Teacher-forced validation on the held-out sequences (module docstring): {"top1", "acceptance",
    "acceptance_se", "tokens_per_call_L4", "sequences"}."""
    drafter.eval()
    idx = data.heldout[:max_sequences]
    P_of = np.array([s["P"] for s in data.shards])[data.shard_of]
    alphas, top1 = [], []
    dev = drafter.device
    for p in np.unique(P_of[idx]):     # a loop over prefix lengths, then over held-out batches
        sel = idx[P_of[idx] == p]
        for b in range(0, len(sel), batch):
            tok, feat = data.batch(sel[b:b + batch])
            ids, inp, tgt, mask = eagle_pairs(tok.to(dev), feat.to(dev), int(p))
            f = drafter.train_forward(ids, inp.to(drafter.dtype), int(p))
            sl = slice(int(p) - 1, int(p) - 1 + data.T - 1)     # the pairs predicting x_1 .. x_{T-1}
            pr = torch.softmax(drafter.head(tgt[:, sl]), -1)
            q = torch.softmax(drafter.head(f[:, sl]), -1)
            alphas.append(torch.minimum(pr, q).sum(-1).double().cpu().numpy())
            top1.append((pr.argmax(-1) == q.argmax(-1)).double().cpu().numpy())
    a = np.concatenate(alphas)
    per_seq = a.mean(1)
    return {"top1": float(np.concatenate(top1).mean()), "acceptance": float(a.mean()),
            "acceptance_se": float(per_seq.std(ddof=1) / math.sqrt(len(per_seq))) if len(per_seq) > 1 else float("nan"),
            "tokens_per_call_L4": predicted_tokens_per_call(a), "sequences": int(len(per_seq))}
