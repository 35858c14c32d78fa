"""Runs the batched decode step: eager, or as CUDA graphs captured per (batch, kv-length) bucket.

All graphs are captured up front by `prepare()` (at warm-up, on the worker thread): warm-up calls
mutate the decode state, which must not happen while sequences are running. Attention reads only
the first kv bucket of positions, the smallest bucket holding every live position.
"""

from __future__ import annotations

import time
from typing import Iterator

import torch
from loguru import logger
from torch import Tensor

from ..compilation import CompilePolicy
from ..model.dual_ar import DualARTransformer, call_block
from .decode_step import DecodeState, decode_step
from .generate import FullVocabHead, SemanticHead, StepOps, frame_budget
from .kv_cache import KVCache
from .sampling import sample

MIN_KV_BUCKET = 256
# Frames are handed out (and end-of-speech looked for, the only host syncs) after FIRST_BLOCK
# frames, for an early first audio, then every BLOCK frames.
FIRST_BLOCK = 4
BLOCK = 16


def buckets_up_to(limit: int, start: int) -> list[int]:
    sizes, size = [], start
    while size < limit:
        sizes.append(size)
        size *= 2
    return sizes + [limit]


def bucket_for(n: int, sizes: list[int]) -> int:
    for size in sizes:
        if size >= n:
            return size
    raise ValueError(f"{n} exceeds the largest bucket {sizes[-1]}")


def _length_generic(compiled_block):
    """Mark the sequence length of a prefill block's inputs dynamic before calling it."""

    def run(layer, x, rope, kv):
        for tensor, dim in ((x, 1), (rope, 1), (kv.positions, 1), (kv.key_positions, 0)):
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
        if kv.mask is not None:
            torch._dynamo.maybe_mark_dynamic(kv.mask, 2)
            torch._dynamo.maybe_mark_dynamic(kv.mask, 3)
        return compiled_block(layer, x, rope, kv)

    return run


class StepRunner:
    def __init__(self, model: DualARTransformer, cache: KVCache, policy: CompilePolicy, *, exact_vocab: bool = False):
        c = model.config
        device = model.output.weight.device
        self.model, self.cache, self.policy = model, cache, policy
        self.head = FullVocabHead(model) if exact_vocab else SemanticHead(model)
        self.fast_cache = KVCache(c.n_fast_layer, cache.n_slots, c.fast_n_local_heads, c.num_codebooks,
                                  c.fast_head_dim, cache.k.dtype, device)
        self.state = DecodeState.allocate(cache.n_slots, c.num_codebooks, cache.capacity, device)
        self.key_positions = torch.arange(cache.capacity, device=device)
        self.kv_buckets = buckets_up_to(cache.capacity, min(MIN_KV_BUCKET, cache.capacity))
        self.batch_buckets = buckets_up_to(cache.n_slots, 1)
        self._views = {b: self.state.rows(b) for b in self.batch_buckets}
        self._step = self._build_step()
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._pool = None

    def _build_step(self):
        # Regional compilation: one compiled transformer block serves all 28 slow layers (and one
        # the 4 fast ones), one compiled sampler every codebook; the eager glue between them is
        # captured in the same CUDA graph, so it costs no launch overhead at replay.
        ops = StepOps()
        self.prefill_block = call_block
        if self.policy.compile:
            mode = self.policy.torch_compile_mode
            ops = StepOps(torch.compile(call_block, fullgraph=True, mode=mode),
                          torch.compile(sample, fullgraph=True, mode=mode))
            # Prefill lengths vary: a default-mode compile (autotuning every length would take minutes),
            # length-generic from its first call (one compile instead of a static one, then another).
            self.prefill_block = _length_generic(torch.compile(call_block, fullgraph=True))
        self.ops = ops

        def step(state: DecodeState, key_positions: Tensor) -> None:
            decode_step(self.model, self.head, self.cache, self.fast_cache, state, key_positions, ops)

        return step

    # ---- graphs -------------------------------------------------------------------------------

    def prepare(self, batch_sizes: list[int] | None = None) -> float:
        """Compile prefill and capture every (batch, kv) bucket; returns the seconds it took."""
        if not self.policy.cuda_graphs:
            return 0.0
        started = time.perf_counter()
        if self.policy.compile:
            self.prefill(0, torch.zeros(self.model.config.num_codebooks + 1, 17, dtype=torch.long,
                                        device=self.key_positions.device))
            logger.info("prefill compiled in {:.1f} s", time.perf_counter() - started)
        for batch in batch_sizes or self.batch_buckets:
            for kv in self.kv_buckets:
                bucket_started = time.perf_counter()
                self._capture(batch, kv)
                logger.debug("graph for batch {} kv {} in {:.2f} s", batch, kv, time.perf_counter() - bucket_started)
        self.state.positions.zero_()
        seconds = time.perf_counter() - started
        logger.info("captured {} CUDA graphs ({}) in {:.1f} s", len(self._graphs), self.policy.describe(), seconds)
        return seconds

    def _capture(self, batch: int, kv: int) -> None:
        args = (self._views[batch], self.key_positions[:kv])
        if self.policy.compile:
            torch._dynamo.maybe_mark_dynamic(args[1], 0)  # one compiled slow block for every kv bucket
        self.state.positions.zero_()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(2):  # compiles on first use; the second run settles lazy initialisation
                self._step(*args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool), torch.inference_mode():
            self._step(*args)
        self._pool = graph.pool()
        self._graphs[(batch, kv)] = graph

    # ---- running ------------------------------------------------------------------------------

    def step(self, batch: int, kv_needed: int) -> None:
        """One frame for slots 0..batch-1; kv_needed: highest position written this step + 1."""
        b, kv = bucket_for(batch, self.batch_buckets), bucket_for(kv_needed, self.kv_buckets)
        graph = self._graphs.get((b, kv))
        if graph is not None:
            graph.replay()
            return
        if self.policy.cuda_graphs:
            raise RuntimeError(f"no CUDA graph for batch {b}, kv {kv}: prepare() must capture it first")
        with torch.inference_mode():
            self._step(self._views[b], self.key_positions[:kv])

    def prefill(self, slot: int, prompt: Tensor) -> None:
        """Write all but the last prompt column into the slot's KV cache (the first step feeds the last)."""
        length = prompt.shape[1] - 1
        if length > 0:
            positions = torch.arange(length, device=prompt.device)[None]
            with torch.inference_mode():
                self.model.forward_slow(prompt[None, :, :length].long(), self.cache.views(positions, length, slot),
                                        self.prefill_block)

    def generate(self, prompt: Tensor, *, temperature: float, top_p: float, repetition_penalty: float,
                 noise_key: int, max_new_tokens: int, check_cancelled=lambda: None,
                 stop_at_end: bool = True) -> Iterator[Tensor]:
        """One sequence in slot 0: yields (1 + num_codebooks, n) blocks of new frames (copies, on the
        device) every few frames, ending at `<|im_end|>` (excluded) or the frame budget.
        stop_at_end=False runs the whole budget whatever is sampled (benchmarks of random weights)."""
        prompt_len = prompt.shape[1]
        budget = frame_budget(prompt_len, max_new_tokens, self.cache.capacity)
        self.prefill(0, prompt)
        self.state.start(0, prompt[:, -1], prompt_len - 1, temperature, top_p, repetition_penalty, noise_key)
        emitted, next_yield = 0, FIRST_BLOCK
        for i in range(budget):
            self.step(1, prompt_len + i)
            if i + 1 < min(next_yield, budget):
                continue
            next_yield += BLOCK
            check_cancelled()
            produced = i + 1
            frames = self.state.frames[0, :, emitted:produced]
            ends = (frames[0] == self.model.layout.im_end_id).nonzero() if stop_at_end else ()
            if len(ends):
                yield frames[:, : int(ends[0])].clone()
                return
            yield frames.clone()
            emitted = produced
