"""This machine's GPUs while a load runs: SM clock, temperature and power, sampled by nvidia-smi's
loop mode. A level that ran slower than another on the same machine can so be told apart from a GPU
that lowered its clocks (its heat or its power cap). Where nvidia-smi is missing, nothing is sampled.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading

# nvidia-smi's names for what is sampled, in the order of its output's columns.
FIELDS = ("index", "clocks.sm", "clocks.max.sm", "temperature.gpu", "power.draw")
INTERVAL_MS = 500


def parse_sample(line: str) -> dict | None:
    """One line of `nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits` as numbers (None for
    a value it reports as not available); None for a line that is not such a sample."""
    values = [value.strip() for value in line.split(",")]
    if len(values) != len(FIELDS):
        return None
    sample = {}
    for field, value in zip(FIELDS, values):
        try:
            sample[field] = float(value)
        except ValueError:
            if "N/A" not in value:
                return None
            sample[field] = None
    return sample if sample["index"] is not None else None


def summarize(samples: list[dict]) -> list[dict]:
    """Per GPU: the samples' count, SM clock (lowest, median, and the most the GPU allows), highest
    temperature and power."""

    def known(values):
        return [v for v in values if v is not None]

    gpus = []
    for index in sorted({s["index"] for s in samples}):
        mine = [s for s in samples if s["index"] == index]
        clocks, allowed = known(s["clocks.sm"] for s in mine), known(s["clocks.max.sm"] for s in mine)
        temperatures, power = known(s["temperature.gpu"] for s in mine), known(s["power.draw"] for s in mine)
        gpus.append({"index": int(index), "samples": len(mine),
                     "sm_clock_mhz_min": min(clocks, default=None),
                     "sm_clock_mhz_p50": statistics.median(clocks) if clocks else None,
                     "sm_clock_mhz_allowed": max(allowed, default=None),
                     "temperature_c_max": max(temperatures, default=None),
                     "power_w_max": max(power, default=None)})
    return gpus


def describe(gpu: dict) -> str:
    """One GPU's summary as a line of text."""
    def number(key, unit):
        return f"{gpu[key]:.0f} {unit}" if gpu.get(key) is not None else "n/a"

    return (f"GPU {gpu['index']}: SM clock {number('sm_clock_mhz_p50', 'MHz')} p50, lowest "
            f"{number('sm_clock_mhz_min', 'MHz')} (at most {number('sm_clock_mhz_allowed', 'MHz')}); up to "
            f"{number('temperature_c_max', 'C')}, {number('power_w_max', 'W')} ({gpu['samples']} samples)")


class GPUMonitor:
    """Samples every INTERVAL_MS inside a with-block; `summary()` afterwards (None when nothing was
    sampled: no nvidia-smi, not enabled, or nvidia-smi failed, whose first words `problem` gives)."""

    def __init__(self, enabled: bool = True, command: str = "nvidia-smi", interval_ms: int = INTERVAL_MS):
        self.enabled, self.command, self.interval_ms = enabled, command, interval_ms
        self._samples: list[dict] = []
        self._other_lines: list[str] = []
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> "GPUMonitor":
        path = shutil.which(self.command) if self.enabled else None
        if path is not None:
            self._process = subprocess.Popen(
                [path, "--query-gpu=" + ",".join(FIELDS), "--format=csv,noheader,nounits",
                 f"--loop-ms={self.interval_ms}"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self._reader = threading.Thread(target=self._read, name="gpu-monitor", daemon=True)
            self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._process.stdout:
            sample = parse_sample(line)
            if sample is not None:
                self._samples.append(sample)
            elif line.strip() and len(self._other_lines) < 5:
                self._other_lines.append(line.strip())

    def __exit__(self, *exc) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=5)
        self._process.stdout.close()

    def summary(self) -> list[dict] | None:
        return summarize(self._samples) if self._samples else None

    @property
    def problem(self) -> str | None:
        """What nvidia-smi printed instead of samples, when it gave none (e.g. a field its version
        does not know)."""
        return " ".join(self._other_lines) if self._other_lines and not self._samples else None
