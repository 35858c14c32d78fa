"""Runs the batched decode step: eager, or as CUDA graphs captured per (batch, kv-length) bucket.

Graphs are captured by `prepare()` on the worker thread, one batch bucket (all its kv buckets) at
a time: batch 1 at warm-up, the larger buckets when the engine is idle or the scheduler has drained
for them (see Scheduler.needs_capture). Capture's warm-up calls mutate the decode state, so it runs
only while no sequence is running. Attention reads only the first kv bucket of positions, the
smallest bucket holding every live position.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import torch
from loguru import logger
from torch import Tensor
from torch.nn.attention import sdpa_kernel

from ..compilation import CompilePolicy, raise_recompile_limit
from ..compiled_regions import Mark, compile_region
from ..device import copy_may_overlap
from ..model.dual_ar import (DualARTransformer, KVView, call_block, embed_and_rotation, fused_norm_then_linear,
                              norm_then_linear)
from ..model.layers import PLAN_FREE_ATTENTION
from .cuda_graphs import capture
from .decode_step import DecodeState, decode_step, record_frame
from .frame_sampler import FullVocabHead, SemanticHead, StepOps, sample_and_embed, sample_first_code, sampling_inputs
from .kv_cache import KVCache
from .prefill_graphs import PrefillGraphs, PrefillRow

MIN_KV_BUCKET = 256
# Prompt columns of all rows of one batched prefill, padding included: bounds its activations
# (~0.4 GB at full size in bf16) and how long running sequences wait for it.
PREFILL_COLUMNS = 8192
# Graphs per compiled region: sizes 1 and above-1 of the batch and kv length, each head's width.
RECOMPILE_LIMIT = 32


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


def _length_marks(batch: bool = False) -> Mark:
    """Marks the sequence length of a prefill block's inputs dynamic, and with batch=True their
    batch size too. The KV storage's length is dynamic as well: the slots' and the prefill graphs'
    staging rows (PrefillGraphs) differ, and share one compiled graph."""

    def mark(args) -> list[Tensor]:
        _, x, rope, kv = args
        dims = [(x, 1), (rope, 1), (kv.positions, 1), (kv.key_positions, 0), (kv.k, 2), (kv.v, 2)]
        if kv.mask is not None:
            dims += [(kv.mask, 2), (kv.mask, 3)]
        if batch:
            dims += [(tensor, 0) for tensor in (x, rope, kv.positions, kv.k, kv.v, kv.mask) if tensor is not None]
        for tensor, dim in dims:
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
        return [tensor for tensor, _ in dims]

    return mark


# Four compiled regions that run the same block call. Dynamo keeps compiled graphs per code object,
# so each region needs a function of its own to keep its own graphs and recompile budget.
def _slow_block(layer, x, rope, kv):
    return layer(x, rope, kv)


def _fast_block(layer, x, rope, kv, kv_only=False):
    return layer(x, rope, kv, kv_only)


def _head(norm, weight, x):
    return norm_then_linear(norm, weight, x)


def _prefill_block(layer, x, rope, kv):
    return layer(x, rope, kv)


def _batched_prefill_block(layer, x, rope, kv):
    return layer(x, rope, kv)


def _tensors(value):
    if isinstance(value, Tensor):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _tensors(getattr(value, f.name))


def _mark_leading_dims(args) -> list[Tensor]:
    """Marks dim 0 of every tensor argument dynamic when it is above 1.

    Dim 0 is the batch (or, for key positions, the kv length): one compiled graph then serves every
    batch bucket and kv bucket instead of one per size (size 1 keeps its own specialised graph, and
    so does a kv length equal to the cache capacity)."""
    marked = []
    for arg in args:
        for tensor in _tensors(arg):
            if tensor.dim() and tensor.shape[0] > 1:
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
                marked.append(tensor)
        if isinstance(arg, KVView) and arg.mask is not None and arg.mask.shape[-1] > 1:
            torch._dynamo.maybe_mark_dynamic(arg.mask, 3)  # the kv length, like key_positions
            marked.append(arg.mask)
    return marked


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
        self._prefill_compiled = False
        self.prefill_graphs: PrefillGraphs | None = None  # captured with the first batch above one
        self._prefill_graphs_tried = False
        # Rows that can step together now: every slot when eager, else the largest batch bucket up to
        # which every bucket's graphs are captured (set by prepare()).
        self.ready_slots = 0 if policy.cuda_graphs else cache.n_slots
        self.capture_stopped = False  # a capture failed: the batches captured before it are all there will be
        self._pool = None
        self._capture_stream = None  # every step graph is captured on this one stream (see cuda_graphs.capture)

    def _build_step(self):
        # Regional compilation: one compiled transformer block serves all 28 slow layers, one the 4
        # fast ones, one compiled sampler codebook 0 and one the others; the frame's input embeddings,
        # its sampling inputs and its bookkeeping at the end are regions too. The eager glue left
        # between them is captured in the same CUDA graph (no launch overhead at replay), but each
        # eager kernel breaks the chain of programmatic dependent launches.
        ops = StepOps()
        # Rows admitted together run the eager call until prepare() has compiled theirs (it takes
        # the pending one, once, whether it compiles or fails).
        self.prefill_block = self.batched_prefill_block = call_block
        self._pending_batched_prefill = None
        if self.policy.compile:
            backend = self.policy.inductor_backend()
            raise_recompile_limit(RECOMPILE_LIMIT)

            def compiled(fn):
                return compile_region(fn, backend, _mark_leading_dims)

            # The heads run between the blocks' regions: uncompiled, a head's norm is seven eager kernels.
            head = compiled(_head)
            ops = StepOps(compiled(_slow_block), compiled(_fast_block), compiled(sample_first_code),
                          compiled(sample_and_embed), head=head, embed=compiled(embed_and_rotation),
                          record=compiled(record_frame), sampling_inputs=compiled(sampling_inputs))
            if self.policy.fused_projections:
                fused = self.model.use_fused_projections()
                if fused:  # a lone row's heads as one fused kernel each, several rows' compiled
                    ops = dataclasses.replace(ops, head=functools.partial(fused_norm_then_linear, otherwise=head))
                logger.info("decode projections: {}", "fused Triton kernels" if fused else "compiled matmuls "
                            "(fused kernels need Triton and plain or int8 weights)")
            attention = self.model.use_decode_kernels()
            logger.info("decode attention: {}", "one Triton kernel per layer" if attention else "compiled PyTorch ops")
            # Prefill lengths vary: no max-autotune (autotuning every length would take minutes),
            # length-generic from its first call (one compile instead of a static one, then another).
            prefill_backend = dataclasses.replace(self.policy, mode="default").inductor_backend()
            self.prefill_block = compile_region(_prefill_block, prefill_backend, _length_marks())
            self._pending_batched_prefill = compile_region(_batched_prefill_block, prefill_backend,
                                                           _length_marks(batch=True))
        self.ops = ops  # gains its side stream with the graph stream (_graph_stream)

        def step(state: DecodeState, key_positions: Tensor) -> None:
            decode_step(self.model, self.head, self.cache, self.fast_cache, state, key_positions, self.ops)

        return step

    # ---- graphs -------------------------------------------------------------------------------

    def prepare(self, batch_sizes: list[int] | None = None, prefill: bool = True) -> float:
        """Compile prefill (first call; the batched prefill with the first batch above one) and
        capture every kv bucket of the given batch buckets (all by default), then, with the first
        batch above one, the prefill graphs; returns the seconds it took. prefill=False leaves the
        prefill's part to a later prepare_prefill() (its compile helper's: compile_helpers). Only
        while no sequence is running: the compiling calls write slots 0 and 1."""
        if not self.policy.cuda_graphs:
            return 0.0
        started = time.perf_counter()
        batch_sizes = batch_sizes or self.batch_buckets
        if prefill:
            self.compile_prefill(batched=max(batch_sizes) > 1)
        captured = len(self._graphs)
        try:
            for batch in batch_sizes:
                for kv in self.kv_buckets:
                    bucket_started = time.perf_counter()
                    self._capture(batch, kv)
                    logger.debug("graph for batch {} kv {} in {:.2f} s", batch, kv, time.perf_counter() - bucket_started)
                self._update_ready_slots()
        except Exception:
            self.stop_capturing()
            raise
        finally:
            self.state.positions.zero_()
        if prefill and max(batch_sizes) > 1:
            self._capture_prefill_graphs()
        seconds = time.perf_counter() - started
        logger.info("captured {} CUDA graphs ({}) in {:.1f} s", len(self._graphs) - captured, self.policy.describe(),
                    seconds)
        return seconds

    def compile_prefill(self, batched: bool) -> None:
        """Compile the prefill of one row (once), and with `batched` that of rows admitted together."""
        started = time.perf_counter()
        if self.policy.compile and not self._prefill_compiled:
            self.prefill(0, self._compile_prompt())
            self._prefill_compiled = True
            logger.info("prefill compiled in {:.1f} s", time.perf_counter() - started)
        if self._pending_batched_prefill is not None and batched:
            self._compile_batched_prefill()

    def prepare_prefill(self) -> None:
        """The prefill's part of prepare() calls made with prefill=False: compile it, and once
        batches above one are captured, the batched prefill and the prefill graphs."""
        if not self.policy.cuda_graphs:
            return
        self.compile_prefill(batched=self.ready_slots > 1)
        if self.ready_slots > 1:
            self._capture_prefill_graphs()

    def _capture_prefill_graphs(self) -> None:
        """Capture the prefill graphs (after the engine is ready: a few seconds). If that fails,
        prefill keeps its compiled calls: slower admission beside a busy event loop, the same KV. Tried
        once: after a failure too."""
        if self._prefill_graphs_tried:
            return
        self._prefill_graphs_tried = True
        graphs = PrefillGraphs(self.cache, self.cache.n_slots, self.model.config.num_codebooks + 1)
        try:
            graphs.capture(self._prefill_graph_call, self._graph_stream())
        except Exception:
            logger.exception("capturing the prefill graphs failed; prefill keeps its compiled calls")
            return
        self.prefill_graphs = graphs

    def _prefill_graph_call(self, rows: int, columns: Tensor, views: list) -> Tensor:
        block = self.prefill_block if rows == 1 else self.batched_prefill_block
        with torch.inference_mode(), sdpa_kernel(PLAN_FREE_ATTENTION):
            return self.model.forward_slow(columns, views, block)

    @property
    def pending_batches(self) -> list[int]:
        """Batch buckets still to capture (none without CUDA graphs, or once capturing stopped)."""
        if not self.policy.cuda_graphs or self.capture_stopped:
            return []
        return [b for b in self.batch_buckets if b > self.ready_slots]

    def stop_capturing(self) -> None:
        """After a failed capture: serve with the batches captured so far."""
        self.capture_stopped = True

    def _update_ready_slots(self) -> None:
        ready = 0
        for batch in self.batch_buckets:
            if not all((batch, kv) in self._graphs for kv in self.kv_buckets):
                break
            ready = batch
        self.ready_slots = ready

    def _graph_stream(self) -> torch.cuda.Stream:
        """The stream every graph of this runner is captured on. A graph's kernels keep the priority
        of the stream they were captured on (torch >= 2.10 instantiates graphs with node priorities):
        the caller's, so that they rank as its other work does."""
        if self._capture_stream is None:
            self._capture_stream = torch.cuda.Stream(priority=torch.cuda.current_stream().priority)
            if self.policy.compile:
                self.ops = dataclasses.replace(self.ops, side_stream=self._side_stream())
        return self._capture_stream

    def _side_stream(self) -> torch.cuda.Stream | None:
        """The stream codebook 0's head and sampler run on beside fast position 0 in the compiled step
        (StepOps.side_stream), made with the graph stream and of its priority: a graph's kernels keep
        the priority of the stream they were captured on."""
        return torch.cuda.Stream(priority=self._capture_stream.priority)

    def _capture(self, batch: int, kv: int) -> None:
        args = (self._views[batch], self.key_positions[:kv])
        self.state.positions.zero_()
        with torch.inference_mode():  # the first warm-up call compiles this bucket's regions
            graph, _ = capture(lambda: self._step(*args), self._graph_stream(), self._pool)
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

    def prefill_many(self, rows: list[tuple[int, Tensor, int]]) -> None:
        """Prefill several sequences, each row (slot, prompt, start) as `prefill(slot, prompt, start)`
        would, in as few calls as it can: once captured, the prefill graphs take the rows that fit
        them, a few at a time. The others: rows in consecutive slots go through together, their
        prompts padded on the right (a padded column writes KV past its row's prompt, where the row's
        own decode steps write before they read), up to PREFILL_COLUMNS columns a call.

        A lone row runs the compiled prefill; rows together run their own compiled prefill once
        prepare() has compiled it with the larger batches' graphs (after the engine is ready: it
        costs ~10 s), eagerly before (an eager call spent ~45 ms of host time launching its ~2,000
        operations, during which running sequences did not step)."""
        rows = [row for row in rows if row[1].shape[1] - 1 > row[2]]
        if self.prefill_graphs is not None:
            left = self.prefill_graphs.run([PrefillRow(slot, prompt, start, prompt.shape[1] - 1)
                                            for slot, prompt, start in rows])
            rows = [(row.slot, row.prompt, row.start) for row in left]
        rows.sort(key=lambda row: row[0])
        for group in self._prefill_groups(rows):
            if len(group) == 1:
                self.prefill(*group[0])
            else:
                self._prefill_rows(group)

    def _prefill_groups(self, rows: list[tuple[int, Tensor, int]]) -> list[list[tuple[int, Tensor, int]]]:
        groups: list[list[tuple[int, Tensor, int]]] = []
        width = last_start = 0
        for row in rows:
            slot, prompt, start = row
            group = groups[-1] if groups else []
            new_width = max(width, prompt.shape[1] - 1 - start)
            fits = (group and group[-1][0] == slot - 1 and new_width * (len(group) + 1) <= PREFILL_COLUMNS
                    and max(last_start, start) + new_width <= self.cache.capacity)
            if fits:
                group.append(row)
                width, last_start = new_width, max(last_start, start)
            else:
                groups.append([row])
                width, last_start = prompt.shape[1] - 1 - start, start
        return groups

    def _compile_batched_prefill(self) -> None:
        """Compile the prefill of rows admitted together (two rows, in slots 0 and 1). If that fails,
        such rows keep the eager call: slower admission, the same KV, and the batch graphs are still
        captured."""
        started = time.perf_counter()
        block, self._pending_batched_prefill = self._pending_batched_prefill, None
        try:
            self._prefill_rows([(0, self._compile_prompt(), 0), (1, self._compile_prompt(), 0)], block)
        except Exception:
            logger.exception("compiling the batched prefill failed; rows admitted together prefill eagerly")
            return
        self.batched_prefill_block = block
        logger.info("batched prefill compiled in {:.1f} s", time.perf_counter() - started)

    def _compile_prompt(self) -> Tensor:
        """A prompt of zeros for the compiling prefill calls."""
        return torch.zeros(self.model.config.num_codebooks + 1, 17, dtype=torch.long, device=self.key_positions.device)

    def _prefill_rows(self, rows: list[tuple[int, Tensor, int]], block=None) -> None:
        """One model call for rows in consecutive slots (rows[0]'s slot first), through `block`
        (default: batched_prefill_block, compiled once prepare() has compiled it, else eager)."""
        parts = [prompt[:, start:-1].T for _, prompt, start in rows]  # (columns, 1 + num_codebooks) each
        columns = torch.nn.utils.rnn.pad_sequence(parts, batch_first=True).transpose(1, 2).long()
        device = columns.device
        # From pageable memory without waiting (torch.tensor(..., device=cuda) waits for the stream).
        starts = torch.tensor([start for _, _, start in rows]).to(device, non_blocking=copy_may_overlap(device))
        positions = starts[:, None] + torch.arange(columns.shape[2], device=device)
        kv_len = max(start for _, _, start in rows) + columns.shape[2]
        with torch.inference_mode(), sdpa_kernel(PLAN_FREE_ATTENTION):
            self.model.forward_slow(columns, self.cache.views(positions, kv_len, rows[0][0]),
                                    block or self.batched_prefill_block)

    def prefill(self, slot: int, prompt: Tensor, start: int = 0, end: int | None = None) -> None:
        """Write prompt columns start..end-1 into the slot's KV cache at their positions; the columns
        before `start` must be there already. end defaults to all but the last column, which the
        first decode step feeds. A prefill graph runs it if one fits, else the compiled call."""
        end = prompt.shape[1] - 1 if end is None else end
        if end <= start:
            return
        if self.prefill_graphs is not None and not self.prefill_graphs.run([PrefillRow(slot, prompt, start, end)]):
            return  # a graph prefilled it
        positions = torch.arange(start, end, device=prompt.device)[None]
        with torch.inference_mode(), sdpa_kernel(PLAN_FREE_ATTENTION):
            self.model.forward_slow(prompt[None, :, start:end].long(), self.cache.views(positions, end, slot),
                                    self.prefill_block)
