"""Reference clips waiting for their codes: one encode per clip however many requests ask for it,
the clips waiting when the encoder frees up encoded together in batches, and the requests waiting
for them.

One batch runs on the GPU at a time. A reference encode is a few hundred graph launches per chunk;
batches queued at once would fill the GPU's command buffer, after which every launch, the decode
steps' too, waits for the encodes to drain. The clips that arrive while a batch runs wait for the
next one, so a burst of new voices costs a few batched passes instead of one pass per clip.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
from loguru import logger

from .references import ReferenceCodeCache
from .request import ReferenceClip
from .runtime.reference_encoder import EncodeHandle, ReferenceEncoder
from .runtime.worker import Job

ENCODE_POLL_S = 0.001  # how often an otherwise idle worker checks whether an encode has finished


class ClipEncode:
    """One reference clip's encode: waiting for its batch until started, then running on the GPU."""

    def __init__(self, samples: np.ndarray):
        self.samples: np.ndarray | None = samples
        self.handle: EncodeHandle | None = None
        self.error: Exception | None = None

    @property
    def started(self) -> bool:
        return self.handle is not None or self.error is not None

    def ready(self) -> bool:
        return self.error is not None or (self.handle is not None and self.handle.ready())

    def result(self) -> torch.Tensor:
        """The clip's codes; raises the encode's error. Only once ready()."""
        if self.error is not None:
            raise self.error
        return self.handle.result()


def length_bucket(frames: int, chunk_frames: int) -> int:
    """Clips of one bucket batch together: their chunk counts lie within a factor of two, so padding
    to the longest at most doubles a batch's work."""
    return (-(-frames // chunk_frames) - 1).bit_length()


def start_batch(encoder: ReferenceEncoder, batch: list[ClipEncode]) -> None:
    """Start encoding the clips of `batch` together; a failure to start fails each of them (their
    requests fail with it, see VoiceWaiter.try_start)."""
    try:
        handles = encoder.start([encode.samples for encode in batch])
    except Exception as exc:
        handles = [None] * len(batch)
        for encode in batch:
            encode.error = exc
    for encode, handle in zip(batch, handles):
        encode.handle, encode.samples = handle, None


class VoiceWaiter(Protocol):
    """A request waiting for its clips' codes (core.RequestRun), or a CodesWaiter."""

    @property
    def encodes(self) -> list[ClipEncode]: ...  # its clips' encodes still to finish

    def try_start(self) -> bool: ...  # starts once every encode is ready; raises an encode's error

    def fail(self, exc: BaseException) -> None: ...


class CodesWaiter:
    """A clip's codes asked for by themselves (the codec's encode endpoint), not as a request's
    voice: a VoiceWaiter that emits them to its job and finishes it."""

    def __init__(self, codes: torch.Tensor | ClipEncode, job: Job):
        self._codes, self.job = codes, job

    @property
    def encodes(self) -> list[ClipEncode]:
        return [self._codes] if isinstance(self._codes, ClipEncode) else []

    def try_start(self) -> bool:
        """Emit the codes once they are there (raising the encode's error); False until then."""
        if any(not encode.ready() for encode in self.encodes):
            return False
        codes = self._codes.result().clone() if self.encodes else self._codes  # the cache keeps the result
        self.job.emit(codes)
        self.job.finish()
        return True

    def fail(self, exc: BaseException) -> None:
        self.job.finish(exc)


class ClipEncodeQueue:
    def __init__(self, encoder: ReferenceEncoder, cache: ReferenceCodeCache,
                 before_batch: Callable[[], None] = lambda: None):
        """before_batch: called before each batch starts, when no encode runs (the engine captures
        the encoder's graphs there, when they are missing and nothing else runs)."""
        self.encoder, self.cache, self.before_batch = encoder, cache, before_batch
        self._encoding: dict[str, ClipEncode] = {}  # clips being encoded or waiting to, by cache key
        self._awaiting: list[VoiceWaiter] = []  # requests waiting for their clips' codes
        self.batches = 0  # batches started, and the clips in them (stats)
        self.clips = 0

    @property
    def busy(self) -> bool:
        """Encodes running or requests waiting for them: the worker keeps stepping."""
        return bool(self._encoding or self._awaiting)

    def codes(self, clip: ReferenceClip) -> torch.Tensor | ClipEncode:
        """A reference clip's codes from the cache, or its encode, which `poll` caches once done.

        The encode runs in chunks with carried state: the same codes as one whole encode, with the
        activations of one chunk at a time (fp32, like the reference)."""
        key = clip.key
        codes = self.cache.cached_copy(key)
        if codes is not None:
            return codes
        if key not in self._encoding:
            self._encoding[key] = ClipEncode(clip.samples)
            self._start_next()
            encode = self._encoding[key]
            if encode.ready() and encode.error is None:  # encoded at once (CPU, or a clip too long for the graphs)
                del self._encoding[key]
                return self.cache.put(key, encode.result()).clone()
        return self._encoding[key]

    def await_voice(self, run: VoiceWaiter) -> None:
        """`run` starts once its reference clips are encoded (see `poll`)."""
        self._awaiting.append(run)

    def poll(self, idle: bool) -> list[VoiceWaiter]:
        """Cache the codes of finished encodes and start the requests whose clips all are; returns
        the requests that stopped waiting (started, or finished meanwhile). idle=True (nothing else
        to step or decode): sleep a millisecond first when no encode has finished, rather than spin,
        or block the worker's queue on an encode."""
        if idle and self._encoding and not any(encode.ready() for encode in self._encoding.values()):
            time.sleep(ENCODE_POLL_S)
        for key, encode in list(self._encoding.items()):
            try:
                if encode.ready():
                    del self._encoding[key]
                    self.cache.put(key, encode.result())
            except Exception:  # its requests fail as they read it (VoiceWaiter.try_start)
                self._encoding.pop(key, None)
                logger.exception("encoding a reference clip failed")
        waiting, started = [], []
        for run in self._awaiting:
            try:
                (started if run.try_start() else waiting).append(run)
            except Exception as exc:  # a failed encode, or its prompt is too long: that request alone fails
                run.fail(exc)
        self._awaiting = waiting
        # A clip still waiting for its batch whose requests have all gone (cancelled) is not encoded.
        wanted = {id(encode) for run in waiting for encode in run.encodes}
        for key, encode in list(self._encoding.items()):
            if not encode.started and id(encode) not in wanted:
                del self._encoding[key]
        self._start_next()
        return started

    def _start_next(self) -> None:
        """Once no batch runs: start the oldest waiting clip with the others of its length bucket, up
        to the largest batch, in the smallest batch bucket that holds them; a clip longer than the
        batched encoders take encodes alone. A pass's time grows slowly with its rows (4 clips take
        about twice one clip's time), so a spare row of silence costs less than a clip left for the
        next pass, whose requests wait a pass longer."""
        if any(encode.started and not encode.ready() for encode in self._encoding.values()):
            return
        waiting = [encode for encode in self._encoding.values() if not encode.started]
        if not waiting:
            return
        encoder = self.encoder
        frames = {id(encode): encoder.frames_of(len(encode.samples)) for encode in waiting}
        first = waiting[0]
        if frames[id(first)] > encoder.max_frames:
            batch = [first]
        else:
            bucket = length_bucket(frames[id(first)], encoder.chunk_frames)
            batch = [encode for encode in waiting if 0 < frames[id(encode)] <= encoder.max_frames
                     and length_bucket(frames[id(encode)], encoder.chunk_frames) == bucket][:encoder.max_batch]
            if first not in batch:  # an empty clip: alone, so that its error is its own
                batch = [first]
        self.batches += 1
        self.clips += len(batch)
        self.before_batch()
        start_batch(encoder, batch)
