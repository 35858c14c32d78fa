"""One frame from the slow transformer's last hidden state, for every row of a batch.

`next_frame` samples codebook 0 from the slow head and codebooks 1..9 from the fast transformer:
11 ints per row. It is the unit the decode step batches and captures (decode_step records the frame
with the rest of its bookkeeping); `StepOps` names the pieces it repeats, which the step runner
swaps for compiled versions. tests/reference_generation.py drives it one sequence at a time, the
plain path the fast ones are checked against.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model.dual_ar import DualARTransformer, TokenLayout, call_block, embed_and_rotation, norm_then_linear
from .kv_cache import KVCache
from .sampling import REPETITION_WINDOW, SamplingTensors, noise_counter, sample

try:  # the compiled step's sampler: one kernel per codebook
    from . import sampling_kernel
except ImportError:  # no Triton (or a broken one, as engine.compilation treats it): Inductor compiles sample()
    sampling_kernel = None


@dataclass
class FrameHistory:
    """The last REPETITION_WINDOW frames of each row: (B, num_codebooks, W) ids, and frames seen (B,).

    Row 0 holds slow-head vocabulary ids (codebook 0 as tokens), rows 1.. hold codes 1..9.
    """

    ids: Tensor
    generated: Tensor

    @classmethod
    def empty(cls, batch: int, num_codebooks: int, device) -> "FrameHistory":
        return cls(torch.zeros(batch, num_codebooks, REPETITION_WINDOW, dtype=torch.int64, device=device),
                   torch.zeros(batch, dtype=torch.int64, device=device))

    def valid(self) -> Tensor:
        return torch.arange(REPETITION_WINDOW, device=self.ids.device) < self.generated[:, None]

    def push(self, frame: Tensor, advance: Tensor | int = 1) -> None:
        """Record frame (B, 1 + num_codebooks): its token and codes 1..9 (code 0 is the token).
        advance (B,) 0 for rows that stand still (their entry is rewritten next time)."""
        slot = (self.generated % REPETITION_WINDOW)[:, None, None].expand(-1, self.ids.shape[1], 1)
        entry = torch.cat([frame[:, :1], frame[:, 2:]], dim=1).unsqueeze(-1)
        self.ids.scatter_(2, slot, entry)
        self.generated += advance


class FullVocabHead:
    """Codebook 0 sampled over the whole vocabulary, as the reference does."""

    def __init__(self, model: DualARTransformer):
        self.model = model
        self.first_padding_id = model.layout.semantic_end_id + 1

    def logits(self, hidden: Tensor, run_head=None) -> Tensor:
        """run_head is ignored: this exact mode always runs the plain vocabulary-wide head."""
        logits = self.model.slow_logits(hidden)[:, -1]
        # Padding rows past the last semantic id are not tokens; never sample them.
        logits[:, self.first_padding_id:].fill_(float("-inf"))  # on the device (`= -inf` copies a host scalar)
        return logits

    def index_of(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        return tokens, torch.ones_like(tokens, dtype=torch.bool)

    def token_of(self, indices: Tensor) -> Tensor:
        return indices


def semantic_code(tokens: Tensor, layout: TokenLayout) -> Tensor:
    """Codebook 0's code of each token: its offset among the semantic tokens, 0 for others."""
    is_semantic = (tokens >= layout.semantic_begin_id) & (tokens <= layout.semantic_end_id)
    return torch.where(is_semantic, tokens - layout.semantic_begin_id, torch.zeros_like(tokens))


class SemanticHead:
    """Codebook 0 sampled over the 4096 semantic tokens and `<|im_end|>` only.

    Reads 4097 rows of the output matrix instead of the whole vocabulary (8 MB instead of 319 MB per
    frame at full size). Text tokens, which the reference could sample (and then feed back as a
    frame without codes), are never chosen; a real checkpoint gives them negligible probability
    after speech has started.
    """

    def __init__(self, model: DualARTransformer):
        layout = model.layout
        self.model = model
        self.begin, self.n_semantic = layout.semantic_begin_id, layout.semantic_end_id - layout.semantic_begin_id + 1
        self.im_end = layout.im_end_id
        weight = model.output.weight
        self.weight = torch.cat([weight[self.begin: self.begin + self.n_semantic], weight[self.im_end:self.im_end + 1]])
        self.ids = torch.cat([torch.arange(self.begin, self.begin + self.n_semantic, device=weight.device),
                              torch.tensor([self.im_end], device=weight.device)])

    def logits(self, hidden: Tensor, run_head=norm_then_linear) -> Tensor:
        return run_head(self.model.norm, self.weight, hidden[:, -1])

    def index_of(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        is_semantic = (tokens >= self.begin) & (tokens < self.begin + self.n_semantic)
        index = torch.where(is_semantic, tokens - self.begin, torch.full_like(tokens, self.n_semantic))
        return index, is_semantic | (tokens == self.im_end)

    def token_of(self, indices: Tensor) -> Tensor:
        return self.ids[indices]


def sampling_inputs(history: FrameHistory, n_codebooks: int) -> tuple[Tensor, Tensor]:
    """A frame's sampling inputs from each row's history: which entries are valid (B, W) and every
    codebook's noise counter (B, n_codebooks); one unit, so that a compiled step makes both in one
    or two kernels."""
    codebooks = torch.arange(n_codebooks, device=history.generated.device)
    return history.valid(), noise_counter(history.generated[:, None], codebooks)


def _sampled_by_kernel(logits: Tensor, params: SamplingTensors, history: Tensor, valid: Tensor, counter: Tensor,
                      embeddings: Tensor, id_begin: int, n_ids: int, extra_id: int) -> tuple[Tensor, Tensor, Tensor] | None:
    """sampling_kernel.sample_rows's (ids, codes, embeddings (B, 1, dim)) in a compiled CUDA step of
    more than one row (sample() and the bookkeeping around it in one kernel), else None: the caller
    runs the plain ops, which Inductor compiles faster for one row (see sampling_kernel)."""
    if sampling_kernel is None or logits.shape[0] == 1 or not (logits.is_cuda and torch.compiler.is_compiling()) \
            or not sampling_kernel.supports(logits.shape[-1]):
        return None
    ids, codes, embedded = sampling_kernel.sample_rows(
        logits, history, valid, params.temperature, params.top_p, params.repetition_penalty, params.noise_key,
        counter, embeddings, id_begin, n_ids, extra_id)
    return ids, codes, embedded.unsqueeze(1)


def sample_first_code(head, logits: Tensor, params: SamplingTensors, history: Tensor, valid: Tensor,
                      counter: Tensor, embeddings: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Codebook 0 from the slow head's logits: the sampled tokens (B,), their codes (B,) and the codes'
    fast embeddings (B, 1, dim), the input of fast position 1. history (B, W): the tokens before.
    One unit, so that a compiled step does the head's bookkeeping in its sampling kernels."""
    if isinstance(head, SemanticHead):  # index i is token begin + i, index n_semantic is <|im_end|>
        by_kernel = _sampled_by_kernel(logits, params, history, valid, counter, embeddings,
                                       head.begin, head.n_semantic, head.im_end)
        if by_kernel is not None:
            return by_kernel
    seen, known = head.index_of(history)
    tokens = head.token_of(sample(logits, params, seen, valid & known, counter))
    codes = semantic_code(tokens, head.model.layout)
    return tokens, codes, F.embedding(codes, embeddings).unsqueeze(1)


def sample_and_embed(logits: Tensor, params: SamplingTensors, history: Tensor, valid: Tensor, counter: Tensor,
                     embeddings: Tensor) -> tuple[Tensor, Tensor]:
    """A fast codebook's sampled codes (B,) and their embeddings (B, 1, dim), the next fast position's
    input: one unit, so that a compiled step gathers the embeddings in its sampling kernels' region."""
    by_kernel = _sampled_by_kernel(logits, params, history, valid, counter, embeddings, 0, logits.shape[-1], -1)
    if by_kernel is not None:
        codes, _, embedded = by_kernel
        return codes, embedded
    codes = sample(logits, params, history, valid, counter)
    return codes, F.embedding(codes, embeddings).unsqueeze(1)


@dataclass(frozen=True)
class StepOps:
    """The pieces a decode step repeats, swappable for compiled versions (regional compilation:
    one compiled block serves every layer, which keeps compile time short). Slow and fast blocks
    are separate regions: their shapes differ, and each keeps its own small set of compiled graphs."""

    slow_block: Callable = call_block
    fast_block: Callable = call_block
    sample_first: Callable = sample_first_code  # codebook 0
    sample_code: Callable = sample_and_embed  # codebooks 1..9
    head: Callable = norm_then_linear  # (norm, weight, x) -> logits: codebook 0's (SemanticHead) and the fast one's
    embed: Callable = embed_and_rotation  # the slow transformer's inputs from the columns
    record: Callable | None = None  # decode_step.record_frame's replacement (None: that function itself)
    sampling_inputs: Callable = sampling_inputs  # the frame's valid history entries and noise counters
    # A CUDA stream for codebook 0's head and sampler, which then run beside fast position 0 at batch 1
    # (None: one stream). Fast position 0 reads neither: it only fills the fast KV cache from the slow state.
    side_stream: torch.cuda.Stream | None = None


def next_frame(model: DualARTransformer, head, hidden: Tensor, params: SamplingTensors, history: FrameHistory,
               fast_cache: KVCache, ops: StepOps = StepOps()) -> Tensor:
    """sample_frame without recording the frame in history (the caller does)."""
    layout, n_codebooks = model.layout, model.config.num_codebooks
    batch = hidden.shape[0]
    valid, counters = ops.sampling_inputs(history, n_codebooks)
    # Every fast position's rotation, made once per frame.
    fast_rope = model.rope_fast[None, :n_codebooks].expand(batch, -1, -1, -1).contiguous()

    # One row only: a second stream saves a little time per frame at batch 1 and costs more than it
    # saves at larger batches.
    side = ops.side_stream if hidden.is_cuda and batch == 1 else None
    if side is not None:  # two branches (of the captured graph), joined before fast position 1
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        token, code, first_input = ops.sample_first(head, head.logits(hidden, ops.head), params, history.ids[:, 0],
                                                    valid, counters[:, 0], model.fast_embeddings.weight)
    codes = [code]
    x = hidden
    for k in range(n_codebooks):
        # Fast position k reads exactly positions 0..k, all visible: no mask.
        views = fast_cache.views(*fast_cache.codebook_positions(batch, k), all_visible=True)
        # Position 0 only fills the fast cache; codes 1..9 use the first residual_codebook_size logits.
        n_logits = 0 if k == 0 else layout.residual_codebook_size
        fast_logits = model.forward_fast(x, views, n_logits, ops.fast_block, ops.head, fast_rope[:, k:k + 1])
        if k == 0:
            if side is not None:
                # What the side stream made is used here on, and freed, only before the next frame's
                # fork: its blocks are not handed out again while this stream still reads them.
                torch.cuda.current_stream().wait_stream(side)
            x = first_input
        else:
            code, x = ops.sample_code(fast_logits[:, 0], params, history.ids[:, k], valid, counters[:, k],
                                      model.fast_embeddings.weight)
            codes.append(code)
    return torch.stack([token] + codes, dim=1)
