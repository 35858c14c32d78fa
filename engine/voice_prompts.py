"""The prompt columns every chunk of a voice starts with, kept by the voice's clips.

Building a voice prompt (`voice_prefix`) is ~50 tensor operations, each of which waits for the GIL
beside a busy event loop, so the engine keeps the prompts of recent voices: ~13 KB each for a 10 s
clip.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import torch

from .request import ReferenceClip
from .text.prompt import voice_prefix
from .text.tokenizer import S1Tokenizer

VOICE_PROMPTS_KEPT = 256


class VoicePromptCache:
    def __init__(self, tokenizer: S1Tokenizer, num_codebooks: int, kept: int = VOICE_PROMPTS_KEPT):
        self.tokenizer, self.num_codebooks, self.kept = tokenizer, num_codebooks, kept
        self._prompts: OrderedDict[tuple, tuple[torch.Tensor, str]] = OrderedDict()

    def get(self, references: list[ReferenceClip], codes: list[torch.Tensor] | None = None
            ) -> tuple[torch.Tensor, str] | None:
        """The prompt columns every chunk voiced by `references` starts with and their key, kept by
        the clips' keys and transcripts: built from `codes` (each clip's) the first time, else None
        when not kept."""
        key = tuple((clip.key, clip.transcript) for clip in references)
        kept = self._prompts.get(key)
        if kept is not None:
            self._prompts.move_to_end(key)
            return kept
        if codes is None:
            return None
        kept = self._prompts[key] = self.build([clip.transcript for clip in references], codes)
        while len(self._prompts) > self.kept:
            self._prompts.popitem(last=False)
        return kept

    def build(self, transcripts: list[str], codes: list[torch.Tensor]) -> tuple[torch.Tensor, str]:
        """A voice prompt (not kept) and its key, the hash of its columns."""
        prefix = voice_prefix(self.tokenizer, list(zip(transcripts, codes, strict=True)), self.num_codebooks)
        return prefix, hashlib.sha1(prefix.numpy().tobytes()).hexdigest()
