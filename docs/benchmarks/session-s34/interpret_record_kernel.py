"""record-kernel.diff's _record_rows in Triton's interpreter (CPU) against decode_step.record_frame's plain ops, on
states with idle rows, a row ending on <|im_end|>, a row already done, and history windows that wrap around:

    TRITON_INTERPRET=1 PYTHONPATH=<triton 3.6.0> python docs/benchmarks/session-s34/interpret_record_kernel.py
"""
import copy
import sys
sys.path.insert(0, ".")
import torch
from engine.runtime import record_kernel  # needs record-kernel.diff applied
from engine.runtime.decode_step import DecodeState, record_frame

failures = 0
for seed in range(6):
    g = torch.Generator().manual_seed(seed)
    batch, codebooks, capacity, im_end = 5, 10, 64, 4099
    state = DecodeState.allocate(batch, codebooks, capacity, "cpu")
    for slot in range(batch - 1):  # the last slot stays idle
        state.start(slot, torch.randint(0, 4096, (codebooks + 1,), generator=g), 20 + slot, 0.7, 0.8, 1.1, slot)
    state.history.generated[:] = torch.randint(0, 40, (batch,), generator=g) * state.active
    state.done[1] = True  # ended earlier: length stays
    state.length[:] = torch.randint(0, 30, (batch,), generator=g)
    for _ in range(3):  # three frames in a row
        frame = torch.randint(0, 4096, (batch, codebooks + 1), generator=g)
        frame[2, 0] = im_end if seed % 2 else frame[2, 0]
        expected = copy.deepcopy(state)
        record_frame(expected, frame, im_end)
        h = state.history
        record_kernel.record_rows(frame, state.active, h.ids, h.generated, state.frames, state.done, state.length,
                                  state.columns, state.positions, im_end)
        for name in ("columns", "positions", "frames", "done", "length", "active"):
            ok = torch.equal(getattr(state, name), getattr(expected, name))
            failures += not ok
            if not ok:
                print("seed", seed, name, "DIFFERS")
        for name in ("ids", "generated"):
            ok = torch.equal(getattr(state.history, name), getattr(expected.history, name))
            failures += not ok
            if not ok:
                print("seed", seed, "history", name, "DIFFERS")
print("FAILURES", failures)
