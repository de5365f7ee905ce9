"""SJD-PAC's bookkeeping per round against its release's (issue 55): the target replaced by random logits (a stub
whose forward costs one randn), batch 1, K = 3, D = 3, one torch thread; per round, the drafting (the window's update)
plus the verification, in ms, at V = 512 and 16,384 and windows W = 16 and 64, for sjd-pac (the release's verdict) and
sjd-pac-p. The reference, timed in the same run and interleaved with ours: the release's sampler and window
push-forward between two target forwards, re-implemented at the same shapes and operations
(``_sjd_pac_release.ReleaseRound``; its docstring says what it does and leaves out). The ratio is ours over it, both
in CPU time of this thread at one torch thread (``_timing.single_thread_clock``: the time slices other processes
take on a shared machine do not count; ours: the engine's draft + verify phase clocks, read from that clock for the
run, plus the round's uniforms hashed ahead (``Streams.begin_round``, which runs before the round's first phase clock),
see ``_phase_clock``; the reference: its call), the fastest of ``--reps`` interleaved repeats. The issue's own
figures of the release on its author's idle CPU (1.42 / 0.56 / 24.4 / 3.9 ms at (512, 64) / (512, 16) / (16,384, 64)
/ (16,384, 16)) are printed beside, a check of the reference.

  python benchmarks/bench_sjd_pac.py [--short] [--tokens 256] [--reps 3] [--json FILE] [--vocab 512]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import types

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _sjd_pac_release import ReleaseRound  # noqa: E402
from _timing import single_thread_clock, write_ratios  # noqa: E402

import torch  # noqa: E402

from real.decode import engine  # noqa: E402
from real.decode import round as round_mod  # noqa: E402
from real.decode.rng import Streams  # noqa: E402
from real.decode.sjd_pac import SJDPAC  # noqa: E402
from real.protocol import ModelOutput  # noqa: E402
from theory import rules  # noqa: E402

RELEASE_MS = {(512, 64): 1.42, (512, 16): 0.56, (16384, 64): 24.4, (16384, 16): 3.9}


class RandomTarget:
    """Random logits (N(0, 2^2)) for every position: a batched target whose forward is one randn."""
    batched, needs_features, row_masks, extra_slots, prefix_len = True, False, False, None, 1

    def __init__(self, V: int, seed: int = 0):
        self.vocab_size = V
        self.g = torch.Generator().manual_seed(seed)
        self._lens = np.zeros(1, np.int64)
        self._last = 0

    @property
    def cache_lens(self):
        return self._lens

    def cache_bytes(self, rows):
        return 0

    def _logits(self, B, S):
        return torch.randn(B, S, self.vocab_size, generator=self.g) * 2.0

    def prefill(self, conds, tokens=None, *, cfg=False, return_hidden=False):
        B, S = len(conds), 0 if tokens is None else tokens.shape[1]
        self._lens = np.full(B, 1 + S, np.int64)
        self._last = S
        return ModelOutput(self._logits(B, 1 + S))

    def forward(self, tokens, *, position_ids=None, attn_mask=None, return_hidden=False):
        self._lens = self._lens + tokens.shape[1]
        self._last = tokens.shape[1]
        return ModelOutput(self._logits(*tokens.shape[:2]))

    def rollback(self, counts):
        self._lens = self._lens - np.broadcast_to(np.asarray(counts), self._lens.shape)

    def keep(self, indices, counts=None):
        k = np.asarray(indices).shape[-1] if counts is None else np.asarray(counts)
        self._lens = self._lens - self._last + k


@contextlib.contextmanager
def _phase_clock(clock, spent: list):
    """The engine's round phases (``real.decode.round``'s ``time.perf_counter`` reads) timed by ``clock`` meanwhile;
    the round's uniforms hashed ahead (``Streams.begin_round``, called before the round's first phase clock, so in no
    phase) timed on the same clock and added to ``spent`` [0]: work between two target forwards, as the release's."""
    saved, begin = round_mod.time, Streams.begin_round

    def timed_begin(self, n):
        t0 = clock()
        begin(self, n)
        spent[0] += clock() - t0
    round_mod.time = types.SimpleNamespace(perf_counter=clock)
    Streams.begin_round = timed_begin
    try:
        yield
    finally:
        round_mod.time, Streams.begin_round = saved, begin


def _ours_ms(t, spec, n: int, T: int, seed: int, clock) -> tuple:
    """Our ms per round over ``n`` images of ``T`` tokens, on ``clock``: the engine's draft + verify phase clocks plus
    the round's uniform hashing (``begin_round``, in no phase); that hashing alone; tokens per call."""
    spent = [0.0]
    with _phase_clock(clock, spent):
        gens = engine.generate(t, None, [0] * n, num_tokens=T, verifier=rules.vanilla(), drafting=spec, seed=seed,
                               batch_size=1)
    s = engine.summarize(gens)
    r = s["rounds"]
    ms = 1e3 * (s["time_draft_s"] + s["time_verify_s"] + spent[0]) / r
    return ms, 1e3 * spent[0] / r, s["tokens_per_target_call"]


def _release_ms(ref: ReleaseRound, rounds: int, g: torch.Generator, clock) -> float:
    """The reference's ms per round over ``rounds`` rounds (its rows, the softmax of random logits, made untimed)."""
    total = 0.0
    for _ in range(rounds):
        probs = (torch.randn(ref.P, ref.M, ref.V, generator=g) * 2.0).softmax(-1)
        t0 = clock()
        ref(probs)
        total += clock() - t0
    return 1e3 * total / rounds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--short", action="store_true", help="128 tokens, one image, 3 repeats")
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--images", type=int, default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--vocab", type=int, action="append", default=None, help="only this V (repeatable; default all)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    clock = single_thread_clock()
    T = a.tokens or (128 if a.short else 256)
    n = a.images or (1 if a.short else 3)
    ratios = {}
    for (V, W), rel in RELEASE_MS.items():
        if a.vocab and V not in a.vocab:
            continue
        for release in (True, False):
            spec = SJDPAC(window=W, release=release)
            t = RandomTarget(V)
            ref = ReleaseRound(W, spec.tree_width, spec.tree_depth, V)
            g = torch.Generator().manual_seed(1)
            engine.generate(t, None, [0], num_tokens=T, verifier=rules.vanilla(), drafting=spec, seed=99)  # warm-up
            _release_ms(ref, 3, g, clock)
            ours, ref_ms, hashing = float("inf"), float("inf"), float("inf")
            for r in range(a.reps):          # interleaved: a load spike hits both alike
                ms, ms_begin, tpc = _ours_ms(t, spec, n, T, r, clock)
                ours, hashing = min(ours, ms), min(hashing, ms_begin)
                ref_ms = min(ref_ms, _release_ms(ref, 40, g, clock))
            name = spec.name
            print(f"{name:9s} V={V:5d} W={W:2d}  draft+verify {ours:6.2f} ms/round, release (same run) {ref_ms:6.2f}: "
                  f"{ours / ref_ms:4.2f}x  (the issue's release figure {rel:5.2f} ms: {ours / rel:4.2f}x)  "
                  f"{tpc:.2f} tokens/call; ours includes {hashing:.3f} ms of begin_round (without it: "
                  f"{(ours - hashing) / ref_ms:4.2f}x)", flush=True)
            ratios[f"{name}_over_release_V{V}_W{W}"] = {
                "value": ours / ref_ms, "better": "lower",
                "what": f"{name} draft + verify (+ begin_round) ms per round / the release's bookkeeping per round "
                        f"re-implemented (_sjd_pac_release), same run, thread CPU time, V = {V}, W = {W}, batch 1"}
    write_ratios(a.json, ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
