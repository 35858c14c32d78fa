"""The reference generator the tests check the engine against: one sequence, eagerly, frame by
frame, with the plain full-vocabulary head (the reference implementation's loop)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor

from engine.model.dual_ar import DualARTransformer
from engine.runtime.frame_sampler import FrameHistory, FullVocabHead, StepOps, next_frame
from engine.runtime.kv_cache import KVCache
from engine.runtime.sampling import SamplingTensors
from engine.runtime.scheduler import frame_budget


def new_fast_cache(model: DualARTransformer, batch: int) -> KVCache:
    c = model.config
    param = model.fast_output.weight
    return KVCache(c.n_fast_layer, batch, c.fast_n_local_heads, c.num_codebooks, c.fast_head_dim,
                   param.dtype, param.device)


def sample_frame(model: DualARTransformer, head, hidden: Tensor, params: SamplingTensors, history: FrameHistory,
                 fast_cache: KVCache, ops: StepOps = StepOps(), advance: Tensor | int = 1) -> Tensor:
    """hidden (B, 1, dim): slow residual stream at the last position -> frame (B, 1 + num_codebooks)
    int64, recorded in history (advance: see FrameHistory.push)."""
    frame = next_frame(model, head, hidden, params, history, fast_cache, ops)
    history.push(frame, advance)
    return frame


def iter_frames(model: DualARTransformer, prompt: Tensor, params: SamplingTensors, *, max_new_tokens: int,
                cache: KVCache) -> Iterator[Tensor]:
    """Yield frames (1 + num_codebooks,) for one prompt (1 + num_codebooks, L) in cache slot 0, the
    last being `<|im_end|>` if the model stopped within the budget."""
    device = prompt.device
    prompt_len = prompt.shape[1]
    budget = frame_budget(prompt_len, max_new_tokens, cache.capacity)
    history = FrameHistory.empty(1, model.config.num_codebooks, device)
    fast_cache = new_fast_cache(model, 1)
    head = FullVocabHead(model)

    positions = torch.arange(prompt_len, device=device)[None]
    hidden = model.forward_slow(prompt[None].long(), cache.views(positions, prompt_len))[:, -1:]
    for i in range(budget):
        frame = sample_frame(model, head, hidden, params, history, fast_cache)
        yield frame[0]
        if int(frame[0, 0]) == model.layout.im_end_id or i == budget - 1:
            return
        position = prompt_len + i
        positions = torch.tensor([[position]], device=device)
        hidden = model.forward_slow(frame[:, :, None], cache.views(positions, position + 1))


@dataclass
class Generation:
    tokens: Tensor  # (1 + num_codebooks, N) every generated column
    stopped_on_im_end: bool

    @property
    def codes(self) -> Tensor:
        """(num_codebooks, N - 1) int32: every column but the last, as the reference returns them
        (the last is `<|im_end|>` when the model stopped, and is dropped either way)."""
        return self.tokens[1:, :-1].to(torch.int32)


@torch.inference_mode()
def generate(model: DualARTransformer, prompt: Tensor, params: SamplingTensors, *, max_new_tokens: int,
             cache: KVCache) -> Generation:
    frames = list(iter_frames(model, prompt, params, max_new_tokens=max_new_tokens, cache=cache))
    tokens = torch.stack(frames, dim=1)
    return Generation(tokens.to(torch.int32), bool(tokens[0, -1] == model.layout.im_end_id))
