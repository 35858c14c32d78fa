"""build_prompt: the (num_codebooks + 1, L) int32 prompt matrix the reference feeds S1-mini.

Layout (s1-mini.md §6.1): `<|interleave|>`; per reference: BPE("<|speaker:0|>"), BPE(transcript),
its VQ frames, `<|im_end|>`; then BPE("<|speaker:0|>"), BPE(text). Each part is tokenized on its own
so BPE merges never cross part boundaries. Text columns carry zeros in the code rows; a VQ frame
carries semantic_begin + c0 in row 0 and c0..c9 below.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..errors import InputError
from .tokenizer import NUM_SEMANTIC_TOKENS, S1Tokenizer

SPEAKER_TAG = "<|speaker:0|>"  # plain text to the BPE, not a special token
RESIDUAL_CODEBOOK_SIZE = 1024  # codes c1..c9 index 1024-entry codebooks


def build_prompt(
    tokenizer: S1Tokenizer,
    text: str,
    references: Sequence[tuple[str, torch.Tensor]] = (),
    num_codebooks: int = 10,
    max_length: int | None = None,
) -> torch.Tensor:
    """Prompt for `text`, optionally voiced after `references` of (transcript, codes (num_codebooks, T)).

    `max_length`, when given, is the longest prompt the model accepts (max_seq_len - 2048 for the
    reference decode loop); a longer prompt raises InputError.
    """
    prompt = torch.cat([voice_prefix(tokenizer, references, num_codebooks), text_part(tokenizer, text, num_codebooks)], 1)
    if max_length is not None and prompt.shape[1] > max_length:
        raise InputError(
            f"the prompt is {prompt.shape[1]} tokens long but the model takes at most {max_length}; "
            "use shorter text or a shorter reference clip"
        )
    return prompt


def voice_prefix(tokenizer: S1Tokenizer, references: Sequence[tuple[str, torch.Tensor]] = (),
                 num_codebooks: int = 10) -> torch.Tensor:
    """The leading columns of every prompt voiced by `references`: `<|interleave|>` and the references.

    Attention is causal, so the KV of these columns is the same whatever text follows them; the
    runtime computes it once per voice and reuses it."""
    columns = [_text_columns([tokenizer.interleave_id], num_codebooks)]
    for index, (transcript, codes) in enumerate(references):
        frames = _check_codes(codes, index, num_codebooks)
        columns.append(_text_columns(tokenizer.encode(SPEAKER_TAG) + tokenizer.encode(transcript), num_codebooks))
        columns.append(_frame_columns(frames, tokenizer.semantic_begin_id))
        columns.append(_text_columns([tokenizer.im_end_id], num_codebooks))
    return torch.cat(columns, dim=1)


def text_part(tokenizer: S1Tokenizer, text: str, num_codebooks: int = 10) -> torch.Tensor:
    """The columns after the voice prefix: the text to speak."""
    return _text_columns(tokenizer.encode(SPEAKER_TAG) + tokenizer.encode(text), num_codebooks)


def _text_columns(ids: list[int], num_codebooks: int) -> torch.Tensor:
    block = torch.zeros((num_codebooks + 1, len(ids)), dtype=torch.int32)
    block[0] = torch.tensor(ids, dtype=torch.int32)
    return block


def _frame_columns(codes: torch.Tensor, semantic_begin_id: int) -> torch.Tensor:
    codes = codes.to(device="cpu", dtype=torch.int32)
    return torch.cat([codes[:1] + semantic_begin_id, codes], dim=0)


def _check_codes(codes, index: int, num_codebooks: int) -> torch.Tensor:
    where = f"reference {index + 1}"
    if not isinstance(codes, torch.Tensor):
        raise InputError(f"{where}: codes must be a torch.Tensor, got {type(codes).__name__}")
    if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
        raise InputError(f"{where}: codes must be integers, got {codes.dtype}")
    if codes.dim() != 2 or codes.shape[0] != num_codebooks:
        raise InputError(f"{where}: codes must have shape ({num_codebooks}, frames), got {tuple(codes.shape)}")
    if codes.shape[1] == 0:
        raise InputError(f"{where}: codes hold no frames; the reference clip is empty")
    # One check for all rows (a few tensor operations, not a few per row: each waits for the GIL on
    # the GPU worker, where a new voice's prompt is built), then the first bad row for the message.
    limits = torch.tensor([NUM_SEMANTIC_TOKENS] + [RESIDUAL_CODEBOOK_SIZE] * (num_codebooks - 1), device=codes.device)
    bad_rows = ((codes < 0) | (codes >= limits[:, None])).any(dim=1)
    if bool(bad_rows.any()):
        row = int(bad_rows.nonzero()[0])
        values = codes[row]
        raise InputError(
            f"{where}: codebook {row} codes must be in [0, {int(limits[row])}), got values from "
            f"{int(values.min())} to {int(values.max())}; the codes do not come from the S1-mini codec"
        )
    return codes
