"""Which harvested frames go to the codec now, and which wait a few iterations for company.

Under sustained load sequences start at different steps, so their blocks fall due a few rows at a
time: 64 streams in process on an H100 made ~51 codec calls a second of ~6 rows each, and a call
costs a fixed ~3 ms however few rows it has (docs/PERFORMANCE.md). A harvest no listener is short
of, a full BLOCK in mid-stream (its listener has at least the ramp's audio ahead) or a stream's
last frames, waits up to `max_hold` iterations, or until `target_rows` rows wait, and then decodes
in one call with the others. First hand-outs and the ramp's go at once: they set the time to first
audio and the lead a listener starts with.

A row decodes its frames in order: a harvest for a row that already has one waiting sends the
waiting ones first (a stream's last frames soon after its held block, or a new stream in the row
of a held last chunk, whose first frames reset the row).
"""

from __future__ import annotations

from dataclasses import replace

from .scheduler import BLOCK, Harvest


class CodecBatcher:
    def __init__(self, max_hold: int, target_rows: int):
        self.max_hold = max_hold
        self.target_rows = target_rows
        self._held: list[Harvest] = []
        self._waited = 0  # iterations the oldest held harvest has waited

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def route(self, harvests: list[Harvest], company: int) -> list[list[Harvest]]:
        """The codec submissions to make now, in order, for one iteration's harvests (call it every
        iteration: waiting counts iterations); company: the sequences still running, whose later
        harvests could join the held ones (with fewer than two, nothing waits)."""
        calls = []
        held_rows = {h.slot for h in self._held}
        if any(h.slot in held_rows for h in harvests):
            calls.append(self._release())
        elif self._held:
            self._waited += 1
        may_wait = self.max_hold > 0 and company >= 2
        now = [h for h in harvests if not (may_wait and _can_wait(h))]
        # The slots move on before the next iteration: a held harvest keeps a copy of its frames.
        self._held += [replace(h, codes=h.codes.clone()) for h in harvests if may_wait and _can_wait(h)]
        if self._held and (not may_wait or len(self._held) >= self.target_rows or self._waited >= self.max_hold):
            now += self._release()  # one call: no row is in both (see above), equal lengths share a decode
        if now:
            calls.append(now)
        return calls

    def discard(self) -> list:
        """Forget the held harvests (after a failure); returns their owners."""
        owners = [h.owner for h in self._held]
        self._release()
        return owners

    def _release(self) -> list[Harvest]:
        held, self._held, self._waited = self._held, [], 0
        return held


def _can_wait(harvest: Harvest) -> bool:
    """Nobody listening is short of it: a stream's last frames, or a full block after the ramp."""
    return not harvest.first and (harvest.final or harvest.codes.shape[1] == BLOCK)
