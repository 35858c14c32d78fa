"""One request's progress on the GPU worker: its voice, then its text chunks one after another.

Every chunk is prompted with the same voice: the given references, or, without any, the first
chunk's own output as the reference for the rest (so that an unprompted voice stays the same across
chunks). Each chunk is one sequence for the scheduler; the engine submits the sequence a run has
queued (`next_sequence`), and hands the run its frames and audio back. Chunks are joined with short
fades (SeamFader).
"""

from __future__ import annotations

import numpy as np
import torch

from .clip_encodes import ClipEncode, ClipEncodeQueue
from .errors import InputError
from .request import AudioChunk, PreparedRequest
from .runtime.scheduler import SequenceSpec
from .runtime.worker import Job
from .seam_fader import SEAM_FADE_SECONDS, SeamFader
from .voice_prompts import VoicePromptCache

# Prompts must leave this much context for generation (the reference demands 2048 of its 8192).
MIN_GENERATION_ROOM = 1024


class RequestRun:
    """The owner of a request's sequences: cancelled with its job, failed through it."""

    def __init__(self, request: PreparedRequest, job: Job, *, prompts: VoicePromptCache, encodes: ClipEncodeQueue,
                 sample_rate: int, capacity: int, device: torch.device):
        """capacity: KV positions per sequence; device: where prompts go."""
        self.request, self.job = request, job
        self.prompts, self.encodes_queue = prompts, encodes
        self.sample_rate, self.capacity, self.device = sample_rate, capacity, device
        self.index = 0
        self.fader: SeamFader | None = None
        self.prefix: torch.Tensor | None = None  # the voice's prompt columns (voice_prefix)
        self.prefix_key = ""
        self._voice: list[tuple[str, torch.Tensor | ClipEncode]] = []  # (transcript, codes) per reference
        self._first_chunk_codes: list[torch.Tensor] = []
        self._queued: SequenceSpec | None = None

    @property
    def cancelled(self) -> bool:
        return self.job.cancelled

    def fail(self, exc: BaseException) -> None:
        self.job.finish(exc)

    def next_sequence(self) -> SequenceSpec | None:
        """The sequence of the chunk this run has queued, for the engine to submit (once)."""
        spec, self._queued = self._queued, None
        return spec

    @property
    def continues(self) -> bool:
        """The queued chunk is a later one: its listener is waiting (see Scheduler.submit's front)."""
        return self.index > 0

    def begin(self) -> bool:
        """Resolve the voice (starting the encodes of new clips) and queue the first chunk; False while
        a clip is being encoded (then `try_start` once it is)."""
        self.job.mark("started")
        kept = self.prompts.get(self.request.references)
        if kept is not None:
            self.prefix, self.prefix_key = kept
        else:
            self._voice = [(clip.transcript, self.encodes_queue.codes(clip)) for clip in self.request.references]
        return self.try_start()

    @property
    def encodes(self) -> list[ClipEncode]:
        """The encodes of this request's clips that were not cached when it began."""
        return [codes for _, codes in self._voice if isinstance(codes, ClipEncode)]

    def try_start(self) -> bool:
        """Queue the first text chunk once every reference clip's codes are there; False while a
        clip is still being encoded."""
        if self.job.finished:
            return True
        if self.cancelled:
            self.job.finish()
            return True
        if not all(encode.ready() for encode in self.encodes):
            return False
        if self.prefix is None:
            self.prefix, self.prefix_key = self.prompts.get(
                self.request.references, [codes.result() if isinstance(codes, ClipEncode) else codes
                                          for _, codes in self._voice])
        self.job.mark("voice_ready")
        self._queue_chunk(0)
        return True

    def harvested(self, codes: torch.Tensor) -> None:
        """The chunk's next frames (num_codebooks, n), as they leave the scheduler."""
        self.job.mark("first_frames")
        if not self.request.references and self.index == 0 and len(self.request.chunks) > 1:
            self._first_chunk_codes.append(codes.clone())  # the voice of the next chunks (a device copy)

    def deliver(self, samples: np.ndarray, frames: int, final: bool) -> None:
        """Audio for the chunk's next `frames` frames; `final` ends the chunk (and queues the next)."""
        if self.job.finished:  # failed or cancelled meanwhile: nobody listens
            return
        self.job.emit(AudioChunk(self.fader.push(samples), frames, self.index))
        if not final:
            return
        self.job.emit(AudioChunk(self.fader.finish(), 0, self.index))
        if self.index + 1 == len(self.request.chunks):
            self.job.finish()
        else:
            self._queue_chunk(self.index + 1)

    def _queue_chunk(self, index: int) -> None:
        if index == 1 and self._first_chunk_codes:
            codes = torch.cat(self._first_chunk_codes, dim=1).cpu()
            if codes.shape[1]:  # a first chunk that ended at once leaves the next ones unvoiced like it
                self.prefix, self.prefix_key = self.prompts.build([self.request.chunks[0]], [codes])
        self.index = index
        last = len(self.request.chunks) - 1
        self.fader = SeamFader(int(SEAM_FADE_SECONDS * self.sample_rate), fade_in=index > 0, fade_out=index < last)
        prompt = torch.cat([self.prefix, self.request.text_parts[index]], dim=1)
        limit = self.capacity - MIN_GENERATION_ROOM
        if prompt.shape[1] > limit:
            raise InputError(
                f"the prompt (reference audio and transcript plus text) is {prompt.shape[1]} positions long, "
                f"over this model's limit of {limit}; use a shorter reference clip or a smaller chunk_length"
            )
        p = self.request.params
        # From pageable memory without waiting for the worker's queued steps (a blocking copy would).
        self._queued = SequenceSpec(prompt.to(self.device, non_blocking=True), p.temperature, p.top_p,
                                    p.repetition_penalty, chunk_noise_key(self.request.seed, index), p.max_new_tokens,
                                    prefix_key=self.prefix_key, prefix_length=self.prefix.shape[1])


def chunk_noise_key(seed: int, index: int) -> int:
    return (seed ^ (index * 0x9E3779B9)) & 0xFFFFFFFF
