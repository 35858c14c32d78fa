"""Throwaway probe (session s41): does torch.cuda.synchronize() wait for work on a green context's
stream, and do events and wait_stream order it? Each case queues ~0.5 s of GPU sleep and then a fill
on a green stream of half the SMs, then reads the tensor the way the case names."""
import json
import time

import torch
from torch.cuda.green_contexts import GreenContext

sms = torch.cuda.get_device_properties(0).multi_processor_count
context = GreenContext.create(num_sms=sms // 2, device_id=0)
green = context.Stream()
x = torch.zeros(1, device="cuda")
torch.cuda.synchronize()
CYCLES = int(1e9)  # ~0.5 s at the H100's ~1.98 GHz


def queue(value: float) -> None:
    with torch.cuda.stream(green):
        torch.cuda._sleep(CYCLES)
        x.fill_(value)


results = {"driver": torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None,
           "torch": torch.__version__, "sms": sms}
for case, value in (("device_synchronize", 1.0), ("stream_synchronize", 2.0), ("event_synchronize", 3.0),
                    ("wait_stream", 4.0)):
    green.synchronize()
    torch.cuda.synchronize()
    queue(value)
    started = time.perf_counter()
    if case == "device_synchronize":
        torch.cuda.synchronize()
        seen = x.item()
    elif case == "stream_synchronize":
        green.synchronize()
        seen = x.item()
    elif case == "event_synchronize":
        event = torch.cuda.Event()
        event.record(green)
        event.synchronize()
        seen = x.item()
    else:
        torch.cuda.current_stream().wait_stream(green)
        seen = x.clone().item()
    results[case] = {"waited_s": round(time.perf_counter() - started, 3), "saw": seen, "expected": value,
                     "green_done_after": green.query()}
print(json.dumps(results))
