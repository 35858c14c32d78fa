"""Carries the scheduler's plans out on the device: frees slots, prefills and starts admitted
sequences, steps the batch, and copies the frame counts back to the host.

Admitted sequences prefill together: their voice prefixes first (copied from the prefix cache when
it is there; the prefixes of new voices prefilled in one batched call, one sequence per voice, and
stored at once, so that the admission's other sequences of those voices copy them), then every
prompt's text in one batched call, then their rows of the decode state in one call. A call that
fails for several sequences is tried for each alone, so that only a sequence whose own call fails
fails.
"""

from __future__ import annotations

from typing import Any

import torch
from loguru import logger
from torch import Tensor

from .prefix_cache import PrefixCache
from .scheduler import Admission, SequenceSpec
from .step_runner import StepRunner

# A prefix shorter than this is cheaper to prefill than to look up and copy.
MIN_PREFIX = 16


class FrameCounts:
    """Per-slot frame counts and end flags being copied to the host after one step."""

    def __init__(self, host: Tensor, ready):
        self.host = host  # (2, S) int64: frames before <|im_end|>, and done
        self.ready = ready  # a CUDA event recorded after the copy, or None when the copy was synchronous

    def wait(self) -> tuple[list[int], list[int]]:
        if self.ready is not None:
            self.ready.synchronize()
        length, done = self.host.tolist()
        return length, done


class BatchRunner:
    def __init__(self, runner: StepRunner, prefix_cache: PrefixCache | None, read_back_lag: int):
        self.step_runner, self.prefix_cache = runner, prefix_cache
        self.state = runner.state
        pinned = self.state.length.device.type == "cuda"
        # One buffer more than the read-backs left unread after a step: a step's counts are written
        # while those are still to be read.
        n_slots = runner.cache.n_slots
        self._host = [torch.zeros(2, n_slots, dtype=torch.int64, pin_memory=pinned) for _ in range(read_back_lag + 1)]
        self._next_host = 0

    def stop(self, slots: list[int]) -> None:
        for slot in slots:
            self.state.stop(slot)

    def admit(self, admissions: list[Admission]) -> tuple[list[Admission], list[tuple[Any, BaseException]]]:
        """Prefill and start the admitted sequences; returns those that started and the failures."""
        failed: list[tuple[Any, BaseException]] = []
        text_start = {a.slot: self._usable_prefix(a.spec) for a in admissions}  # the first column the text prefill writes
        stored: dict[int, tuple[Tensor, Tensor]] = {}  # by slot: the cached voice prefixes to place
        fill: dict[str, Admission] = {}  # by voice: the admission that prefills a prefix nobody stored
        for a in admissions:
            if text_start[a.slot] and a.spec.prefix_key not in fill:
                cached = self.prefix_cache.get(a.spec.prefix_key, text_start[a.slot])
                if cached is None:
                    fill[a.spec.prefix_key] = a
                else:
                    stored[a.slot] = cached
        filled = _together_or_alone(list(fill.values()), self._prefill_prefixes, "prefilling voice prefixes", failed)
        admitted = []
        for a in admissions:
            if not text_start[a.slot] or a.slot in stored or a in filled:
                admitted.append(a)
            elif fill[a.spec.prefix_key] is not a:  # another admission of this voice prefilled it: copy it
                try:
                    cached = self._stored_prefix(a)
                except Exception as exc:  # this sequence's own prefill failed: it alone fails
                    failed.append((a.owner, exc))
                    continue
                if cached is not None:
                    stored[a.slot] = cached
                admitted.append(a)

        def place(group: list[Admission]) -> None:
            self.prefix_cache.place([(stored[a.slot], a.slot) for a in group])

        def prefill(group: list[Admission]) -> None:
            self.step_runner.prefill_many([(a.slot, a.spec.prompt, text_start[a.slot]) for a in group])

        def start(group: list[Admission]) -> None:
            self.state.start_many([(a.slot, a.spec.prompt[:, -1], a.spec.prompt.shape[1] - 1, a.spec.temperature,
                                    a.spec.top_p, a.spec.repetition_penalty, a.spec.noise_key) for a in group])

        placed = {a.slot for a in _together_or_alone([a for a in admitted if a.slot in stored], place,
                                                     "placing voice prefixes", failed)}
        admitted = [a for a in admitted if a.slot not in stored or a.slot in placed]
        prefilled = _together_or_alone(admitted, prefill, "prefilling texts", failed)
        return _together_or_alone(prefilled, start, "starting decode rows", failed), failed

    def step(self, rows: int, kv_needed: int) -> None:
        self.step_runner.step(rows, kv_needed)

    def copy_counts(self) -> FrameCounts:
        """Queue a copy of every slot's frame count and end flag behind the steps launched so far."""
        host = self._host[self._next_host]
        self._next_host = (self._next_host + 1) % len(self._host)
        pinned = host.is_pinned()  # else (MPS, CPU) the copy must be done when wait() reads it
        host[0].copy_(self.state.length, non_blocking=pinned)
        host[1].copy_(self.state.done, non_blocking=pinned)
        ready = None
        if pinned:
            ready = torch.cuda.Event()
            ready.record()
        return FrameCounts(host, ready)

    def frames(self, slot: int, start: int, end: int) -> Tensor:
        """Codes (num_codebooks, end - start) of the slot's frames start..end-1, a view valid until the
        slot's next sequence writes them."""
        return self.state.frames[slot, 1:, start:end]

    def _usable_prefix(self, spec: SequenceSpec) -> int:
        """The length of the sequence's voice prefix when the prefix cache serves it, else 0. The
        prefix is always prefilled on its own, hit or miss, so a sequence's KV (and so its frames)
        does not depend on whether its voice was cached."""
        prefix = spec.prefix_length
        usable = (self.prefix_cache is not None and spec.prefix_key is not None
                  and MIN_PREFIX <= prefix < spec.prompt.shape[1])
        return prefix if usable else 0

    def _prefill_prefixes(self, group: list[Admission]) -> None:
        """Prefill the voice prefixes of new voices in their slots, in one call, and store each."""
        self.step_runner.prefill_many([(a.slot, a.spec.prompt[:, :a.spec.prefix_length + 1], 0) for a in group])
        for a in group:
            self.prefix_cache.store(a.spec.prefix_key, a.slot, a.spec.prefix_length)

    def _stored_prefix(self, admission: Admission) -> tuple[Tensor, Tensor] | None:
        """The voice prefix another admission of the same step prefilled and stored. When that one
        failed, or the prefix is too large to keep, this one prefills its own in its slot (None:
        nothing to copy)."""
        spec = admission.spec
        cached = self.prefix_cache.get(spec.prefix_key, spec.prefix_length)
        if cached is None:
            self._prefill_prefixes([admission])
        return cached


def _together_or_alone(group: list[Admission], call, what: str,
                       failed: list[tuple[Any, BaseException]]) -> list[Admission]:
    """call(group) once; if it raises, call([one]) for each (a lone admission is not tried twice),
    so that only an admission whose own call fails fails (added to `failed`). Returns the
    admissions that went through."""
    if not group:
        return []
    try:
        call(group)
        return group
    except Exception as exc:
        if len(group) == 1:
            failed.append((group[0].owner, exc))
            return []
        logger.warning("{} for {} sequences together failed ({}): one at a time", what, len(group), exc)
    went_through = []
    for one in group:
        try:
            call([one])
            went_through.append(one)
        except Exception as exc:
            failed.append((one.owner, exc))
    return went_through
