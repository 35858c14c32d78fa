"""Session s42: why test_codec_harvests_waiting_on_the_host_decode_like_lone_decoders failed on the H100
(row 3). The test's plan under four settings; each chunk's largest difference from a lone decoder,
relative to the lone row's peak. Run from the repository root on a CUDA machine, at 6639992: the
codec runner's max_in_flight (EngineConfig.codec_calls_in_flight) was removed after this session's
calls."""
import sys

import numpy as np
import torch

sys.path.insert(0, ".")
from engine.config import EngineConfig  # noqa: E402
from engine.loader import load_models  # noqa: E402
from engine.model.codec_stream import StreamingDecoder  # noqa: E402
from engine.runtime.codec_runner import CodecRunner  # noqa: E402
from engine.runtime.scheduler import Harvest  # noqa: E402

codec = load_models(EngineConfig(demo=True, device="cuda")).codec
gen = torch.Generator().manual_seed(3)
streams = {row: torch.cat([torch.randint(0, 4096, (1, 12), generator=gen),
                           torch.randint(0, 1024, (9, 12), generator=gen)]).cuda() for row in range(4)}
plan = [(row, 0, 4) for row in range(4)] + [(row, 4, 8) for row in range(4)]
lone = {}
for row, codes in streams.items():
    d = StreamingDecoder(codec)
    lone[row] = [d.decode(codes[None, :, a:a + n])[0, 0].cpu().numpy() for r, a, n in plan if r == row]


def run(max_in_flight, sleep, overwrite, clone_all=False):
    runner = CodecRunner(codec, rows=4, max_frames=256, max_in_flight=max_in_flight)
    runner.prepare()
    calls = []
    decode = runner._decode
    runner._decode = lambda codes, rows, last=False: calls.append(list(rows)) or decode(codes, rows, last)
    frames = torch.zeros(4, 10, 12, dtype=torch.long, device="cuda")
    pieces = {row: [] for row in range(4)}
    with torch.inference_mode():
        if sleep:
            with torch.cuda.stream(runner.stream):
                torch.cuda._sleep(200_000_000)
        for row, start, n in plan:
            frames[row, :, start:start + n].copy_(streams[row][:, start:start + n])
            view = frames[row, :, start:start + n]
            runner.submit([Harvest(row, row, view.clone() if clone_all else view, first=start == 0, final=False)])
            if overwrite:
                frames[row].fill_(7)
        while runner.pending:
            for item in runner.completed(wait=True):
                pieces[item.owner].append(item.audio)
    errors = {row: [round(float(np.abs(g - w).max() / np.abs(np.concatenate(lone[row])).max()), 4)
                    for g, w in zip(pieces[row], lone[row])] for row in range(4)}
    print(f"in flight {max_in_flight} sleep {sleep} overwrite {overwrite} clone_all {clone_all}: calls {calls}\n  errors {errors}",
          flush=True)


for setting in [(1, True, True), (1, True, True), (1, True, False), (1, True, True, True), (1, False, True),
                (0, True, True), (0, False, True), (0, False, False)]:
    run(*setting)
