"""Compile helpers: on a first start, other processes compile parts of the engine's graphs meanwhile.

A first start is mostly compiling (Dynamo, AOTAutograd, Inductor's codegen: Python, on one thread),
one compiled region after another. The compiled regions' store (compiled_regions) keeps each
region's graphs as a package that any process of the same configuration installs, whatever its KV
slot count. So on a first start the engine starts a helper process per part in PARTS whose regions
have no package: a small engine of the same configuration (HELPER_SLOTS KV slots) that compiles the
part's regions and saves their packages into the engine's store, and only those (each region has
one writer). Meanwhile the engine compiles the decode step's graphs, of one row then of two; before
a part's regions it waits for that part's helper, and their first calls install its packages. A
helper that fails or runs past WAIT_S costs only time: the engine compiles that part itself (one
warning).

Helpers need CPUs and GPU memory beside the engine's: they start only with MIN_CPUS or more and
HELPER_GPU_BYTES free per helper after the engine allocated its KV cache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import torch
from loguru import logger

from . import compiled_regions
from .config import EngineConfig
from .model import codec_convs, codec_transformer
from .runtime import step_runner

# Each part's compiled regions, which its helper alone saves: the prefill's, and the codec's (its
# decoder and the reference encoder share them).
PARTS = {
    "prefill": (step_runner._prefill_block, step_runner._batched_prefill_block),
    "codec": (codec_transformer.layer_forward, codec_convs.context_snake, codec_convs.biased_snake,
              codec_convs.biased_residual),
}
HELPER_SLOTS = 2  # the graphs of two rows serve every larger batch
MIN_CPUS = 8  # three processes compile at once, each with Inductor's pool of compile workers
HELPER_GPU_BYTES = 8 << 30  # weights, two slots of KV cache, compiling activations, with room
WAIT_S = 240.0  # a helper takes ~50 s on an H100 host of 16 CPUs; one stuck past this is stopped
LOG_TAIL_CHARS = 2000
NAME_OFFSET = 10**9  # helper i numbers Dynamo's globals from (i + 1) * NAME_OFFSET (store_only)


class CompileHelpers:
    """The helper processes of one start, by part. Without helpers, wait() returns at once."""

    def __init__(self, processes: dict[str, tuple[subprocess.Popen, object]] | None = None):
        self._processes = processes or {}  # part -> (process, its log file)
        self._started = time.perf_counter()
        self._ended: dict[str, float] = {}  # part -> seconds after the start its helper ended
        for part, (process, _) in self._processes.items():
            threading.Thread(target=self._note_end, args=(part, process), daemon=True,
                             name=f"s1-compile-helper-{part}").start()

    def _note_end(self, part: str, process: subprocess.Popen) -> None:
        process.wait()
        self._ended[part] = time.perf_counter() - self._started

    @classmethod
    def start(cls, config: EngineConfig, device: torch.device) -> "CompileHelpers":
        """Start a helper for each part whose regions the store lacks, if the machine has room for
        them (see the module doc); otherwise none."""
        parts = [part for part, functions in PARTS.items()
                 if any(compiled_regions.installed(fn) is False for fn in functions)]
        reason = _reason_against(config, device, parts)
        if reason:
            logger.debug("no compile helpers: {}", reason)
            return cls()
        helper_config = config_to_json(dataclasses.replace(config, max_batch_size=HELPER_SLOTS, compile_helpers=False))
        processes = {}
        try:
            for part in parts:
                processes[part] = spawn([sys.executable, "-m", "engine.compile_helper_process", part, helper_config])
        except OSError as exc:  # no Python to run them (a frozen app), no processes left to start
            cls(processes).close()
            logger.warning("compile helpers could not start ({}: {}); the engine compiles everything itself",
                           type(exc).__name__, exc)
            return cls()
        logger.info("first start: {} helper processes compile the {} graphs meanwhile", len(processes),
                    " and ".join(parts))
        return cls(processes)

    def running(self) -> bool:
        """Whether a helper has not been waited for yet."""
        return bool(self._processes)

    def wait(self, part: str) -> None:
        """Until `part`'s helper has ended (at once if there is none, or it ended before). A helper
        still running WAIT_S after the start is stopped."""
        entry = self._processes.pop(part, None)
        if entry is None:
            return
        process, log = entry
        try:
            code = process.wait(timeout=max(0.0, WAIT_S - (time.perf_counter() - self._started)))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = None
        tail = _tail(log)
        if code is None:
            logger.warning("the compile helper of the {} graphs ran past {:.0f} s and was stopped; the engine "
                           "compiles them itself", part, WAIT_S)
        elif code != 0:
            logger.warning("the compile helper of the {} graphs failed (exit {}); the engine compiles them itself. "
                           "Its last output:\n{}", part, code, tail)
        else:
            waited = time.perf_counter() - self._started
            logger.info("the compile helper of the {} graphs ended {:.1f} s after the start (the engine went on "
                        "at {:.1f} s)", part, self._ended.get(part, waited), waited)

    def close(self) -> None:
        """Stop the helpers still running (the engine closes before it needed them)."""
        for process, log in self._processes.values():
            process.kill()
            process.wait()
            log.close()
        self._processes.clear()


def config_to_json(config: EngineConfig) -> str:
    return json.dumps(dataclasses.asdict(config))


def config_from_json(text: str) -> EngineConfig:
    return EngineConfig(**json.loads(text))


def spawn(command: list[str]) -> tuple[subprocess.Popen, object]:
    """A helper process running `command`, its output in a temporary file: (process, file)."""
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env=_helper_environment())
    return process, log


def _reason_against(config: EngineConfig, device: torch.device, parts: list[str]) -> str | None:
    if not config.compile_helpers:
        return "turned off (compile_helpers)"
    if not parts:
        return "the store holds every part's graphs, or the compiled regions' store is off"
    cpus = usable_cpus()
    if cpus < MIN_CPUS:
        return f"{cpus} CPUs (helpers need {MIN_CPUS})"
    free, _ = torch.cuda.mem_get_info(device)
    if free < len(parts) * HELPER_GPU_BYTES:
        return (f"{free / 1e9:.1f} GB of GPU memory free ({len(parts)} helpers need "
                f"{len(parts) * HELPER_GPU_BYTES / 1e9:.0f} GB)")
    return None


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's cpuset), where the OS says."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _tail(log) -> str:
    log.seek(0, os.SEEK_END)
    log.seek(max(0, log.tell() - LOG_TAIL_CHARS))
    text = log.read().decode(errors="replace")
    log.close()
    return text


def _helper_environment() -> dict[str, str]:
    """This process's environment (its cache dirs, its GPU), with this package importable and the
    Hugging Face hub offline: the engine has fetched the checkpoint into the hub's cache already, and
    a helper must not wait on the network to find it there."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
