"""One request on the GPU worker: reference codes, prompts per text chunk, frames, audio.

Long text is split into chunks at sentence boundaries and generated in order. Every chunk is
prompted with the same voice: the given references, or, without any, the first chunk's own
output as the reference for the rest (so an unprompted voice stays the same across chunks).
Frames are decoded to audio as they arrive, by a streaming codec decoder whose output equals a
whole-chunk decode. Chunks are joined with short fades so that no click appears at a seam.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .compilation import CompilePolicy
from .errors import InputError
from .loader import LoadedModels
from .model.codec_stream import StreamingDecoder, encode_chunked
from .params import SamplingParams
from .references import ReferenceCodeCache
from .runtime.kv_cache import KVCache
from .runtime.step_runner import StepRunner
from .runtime.worker import Job
from .text.prompt import build_prompt

# Prompts must leave this much context for generation (the reference demands 2048 of its 8192).
MIN_GENERATION_ROOM = 1024
SEAM_FADE_SECONDS = 0.01
REFERENCE_CHUNK_FRAMES = 64  # ~3 s of reference audio encoded at a time


@dataclass
class PreparedRequest:
    chunks: list[str]
    references: list[tuple[np.ndarray, str]]  # (44.1 kHz mono samples, transcript)
    params: SamplingParams
    seed: int


@dataclass
class AudioChunk:
    samples: np.ndarray  # float32 mono
    frames: int
    text_chunk: int


class Synthesizer:
    def __init__(self, models: LoadedModels, reference_cache: ReferenceCodeCache, policy: CompilePolicy,
                 exact_sampling: bool, max_context: int):
        self.models = models
        self.reference_cache = reference_cache
        c = models.model.config
        self.capacity = min(c.max_seq_len, max_context or c.max_seq_len)
        cache = KVCache(c.n_layer, 1, c.n_local_heads, self.capacity, c.head_dim,
                        models.placement.dtype, models.placement.device)
        self.runner = StepRunner(models.model, cache, policy, exact_vocab=exact_sampling)
        self.decoder = StreamingDecoder(models.codec)

    @property
    def sample_rate(self) -> int:
        return self.models.codec.config.sample_rate

    def encode_reference(self, samples: np.ndarray) -> torch.Tensor:
        """Runs on the worker thread (via the cache): 44.1 kHz samples -> (num_codebooks, T) codes.

        In chunks with carried state: the same codes as one whole encode, with the activations of
        one chunk at a time (fp32, like the reference)."""
        audio = torch.from_numpy(samples).to(self.models.placement.device).view(1, 1, -1)
        with torch.inference_mode():
            return encode_chunked(self.models.codec, audio, REFERENCE_CHUNK_FRAMES)[0].cpu()

    def run(self, request: PreparedRequest, job: Job) -> None:
        voice = [(text, self.reference_cache.get_codes(samples)) for samples, text in request.references]
        last = len(request.chunks) - 1
        for index, text in enumerate(request.chunks):
            fader = SeamFader(int(SEAM_FADE_SECONDS * self.sample_rate), fade_in=index > 0, fade_out=index < last)
            self.decoder.reset()
            blocks = []
            for block in self._generate_chunk(text, voice, request, index, job):
                blocks.append(block)
                with torch.inference_mode():
                    audio = self.decoder.decode(block[None])[0, 0].cpu().numpy()
                job.emit(AudioChunk(fader.push(audio), block.shape[1], index))
            job.emit(AudioChunk(fader.finish(), 0, index))
            if not request.references and index == 0 and blocks:
                voice = [(text, torch.cat(blocks, dim=1).cpu())]

    def _generate_chunk(self, text: str, voice, request: PreparedRequest, index: int, job: Job):
        """Yield (num_codebooks, n) code blocks on the device as the model produces them."""
        m = self.models
        prompt = build_prompt(m.tokenizer, text, voice, num_codebooks=m.model.config.num_codebooks)
        limit = self.capacity - MIN_GENERATION_ROOM
        if prompt.shape[1] > limit:
            raise InputError(
                f"the prompt (reference audio and transcript plus text) is {prompt.shape[1]} positions long, "
                f"over this model's limit of {limit}; use a shorter reference clip or a smaller chunk_length"
            )
        p = request.params
        with torch.inference_mode():
            for frames in self.runner.generate(
                    prompt.to(m.placement.device), temperature=p.temperature, top_p=p.top_p,
                    repetition_penalty=p.repetition_penalty, noise_key=_chunk_noise_key(request.seed, index),
                    max_new_tokens=p.max_new_tokens, check_cancelled=job.check_cancelled):
                if frames.shape[1]:
                    yield frames[1:]


def _chunk_noise_key(seed: int, index: int) -> int:
    return (seed ^ (index * 0x9E3779B9)) & 0xFFFFFFFF


class SeamFader:
    """Fades the first and last few milliseconds of a text chunk's audio as it streams past, so
    chunks join without clicks; holds back the last `n` samples until it knows whether they end
    the chunk."""

    def __init__(self, n: int, *, fade_in: bool, fade_out: bool):
        self.n, self.fade_out = n, fade_out
        self._ramp = np.linspace(0.0, 1.0, n, dtype=np.float32)
        self._faded_in = not fade_in
        self._held = np.zeros(0, dtype=np.float32)

    def push(self, audio: np.ndarray) -> np.ndarray:
        audio = np.concatenate([self._held, audio])
        if not self._faded_in and len(audio):
            m = min(self.n, len(audio))
            audio[:m] *= self._ramp[:m]
            self._faded_in = True
        split = max(len(audio) - self.n, 0)
        self._held = audio[split:]
        return audio[:split]

    def finish(self) -> np.ndarray:
        tail, self._held = self._held, np.zeros(0, dtype=np.float32)
        if self.fade_out and len(tail):
            tail = tail * self._ramp[::-1][-len(tail):]
        return tail
