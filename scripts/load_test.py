#!/usr/bin/env python
"""Load-test a running server over HTTP: concurrent streaming /v1/tts requests at several levels.

    python launch.py --random-weights &                  # or a real checkpoint
    python scripts/load_test.py --url http://127.0.0.1:7860 --levels 1,4,16,64 --json out/load.json --html out/load.html
    python scripts/load_test.py --in-process --weights random --levels 64     # the same requests, no HTTP

--in-process sends the same requests straight to an engine started in this process (parsed by the
API's own request model, then TTSEngine.synthesize_stream), to tell the HTTP layer's cost apart;
--engine-option FIELD=VALUE sets its EngineConfig (e.g. decode_priority=false), for A/B runs.

At each level, that many clients at once each send --requests-per-client streaming requests (raw
PCM) back to back (--length-spread varies their lengths). Texts are unique; a third of the requests use one of two saved voices (shared:
their prefix is reused), a third carry their own inline reference clip (distinct voices; --distinct-clips N reuses N of them; each run
makes its clips from a --clip-seed of its own, so a second run against the same server sends none it has heard), and the
rest use the model's own voice; each level also reports its percentiles per kind of voice. Per request: time to first audio (first PCM bytes at the client),
real-time factor (wall time / audio duration), audio seconds, underrun (how long a listener who
starts playing at the first audio would wait for more), and the error if any (429 answers are
counted as rejected), and the engine's stages until the first audio (from the engine in process, over
HTTP from the answer's Server-Timing header). Per level: audio-seconds per second overall and
percentiles, and where the engine's GPUs are this machine's (in process, or a server at a loopback
address) their SM clock, temperature and power while the level ran (nvidia-smi), to tell a slower
level from a GPU that lowered its clocks.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

SCRIPTS = Path(__file__).resolve().parent
# The engine (--in-process), and this folder's options and reports shared with the other scripts.
sys.path[:0] = [str(SCRIPTS.parent), str(SCRIPTS)]
from gpu_monitor import GPUMonitor, describe  # noqa: E402
from reports import environment, level_summary, stream_record, write_reports  # noqa: E402
from weight_options import add_weight_options, settle_weights, weight_config  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest."
SHARED_VOICES = ("loadtest-voice-a", "loadtest-voice-b")
WARM_REQUESTS = 4  # requests 0..3: each kind of voice, both saved voices


def tone_wav(seconds: float, pitch: float, seed: int | list[int]) -> bytes:
    """A voiced-like test signal as WAV bytes (stands in for a recording: the server only needs audio)."""
    import soundfile as sf

    t = np.arange(int(44100 * seconds)) / 44100
    rng = np.random.default_rng(seed)
    signal = 0.3 * np.sin(2 * np.pi * (pitch + 30 * np.sin(2 * np.pi * 0.5 * t)) * t) + 0.02 * rng.standard_normal(len(t))
    buffer = io.BytesIO()
    sf.write(buffer, signal.astype(np.float32), 44100, format="WAV")
    return buffer.getvalue()


# Request n's voice: a saved voice (its prefix cached after first use), a clip of its own sent inline
# (encoded by the codec on arrival), or the model's own voice.
VOICE_KINDS = ("saved_voice", "inline_clip", "no_voice")


def voice_kind(n: int) -> str:
    return VOICE_KINDS[n % 3]


# The clips: the saved voice number `index`, and request n's own clip (with their transcripts).
SHARED_TRANSCRIPT, INLINE_TRANSCRIPT = "A shared reference voice.", "A distinct reference clip."


def shared_voice_clip(index: int, seconds: float) -> bytes:
    return tone_wav(seconds, 140 + 60 * index, index)


def inline_clip(n: int, seconds: float, clip_seed: int) -> bytes:
    return tone_wav(seconds, 110 + (n % 50) * 3, [clip_seed, n])


def clip_number(n: int, distinct_clips: int) -> int:
    """Which clip request n sends: its own (distinct_clips 0), or one of `distinct_clips` clips taken
    in turn by the requests that send one (every third: see voice_kind)."""
    return n if not distinct_clips else 3 * ((n // 3) % distinct_clips) + 1


def frames_for(n: int, args) -> int:
    """Request n's max_new_tokens: --max-new-tokens, spread by up to +-length_spread of it (the same
    for n on every run). Random weights rarely sample the end of speech (2 of 512 requests a level, after
    6-7 frames), so nearly every request would run to the same length, and the requests admitted
    together would end together."""
    if not args.length_spread:
        return args.max_new_tokens
    offset = np.random.default_rng(n).uniform(-1, 1)
    return max(1, round(args.max_new_tokens * (1 + args.length_spread * offset)))


def request_body(n: int, args) -> dict:
    body = {"text": f"{TEXT} This is request number {n}.", "streaming": True, "format": "pcm",
            "max_new_tokens": frames_for(n, args), "seed": n}
    kind = voice_kind(n)
    if kind == "saved_voice":
        body["reference_id"] = SHARED_VOICES[n % 2]
    elif kind == "inline_clip":
        clip = inline_clip(clip_number(n, args.distinct_clips), args.reference_seconds, args.clip_seed)
        body["references"] = [{"audio": base64.b64encode(clip).decode(), "text": INLINE_TRANSCRIPT}]
    return body


def encoded_body(n: int, args) -> bytes:
    return json.dumps(request_body(n, args)).encode()


class RequestFailed(Exception):
    def __init__(self, status: int | None, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class ServerTarget:
    """The running server, over HTTP."""

    def __init__(self, client):
        self.client = client

    def add_voice(self, voice: str, clip: bytes, transcript: str) -> None:
        self.client.delete("/v1/references/delete", params={"reference_id": voice})  # a rerun starts clean
        response = self.client.post("/v1/references/add", data={"id": voice, "text": transcript},
                                    files={"audio": (f"{voice}.wav", clip, "audio/wav")})
        if response.status_code != 200:
            raise SystemExit(f"could not save voice {voice}: {response.status_code} {response.text[:300]}")

    def stream(self, body: bytes, stats: dict):
        """Seconds of audio in each read of the streamed answer; `stats` gets the engine's stages until
        the first audio (timeline_ms) from the answer's Server-Timing header, where the server sends one."""
        with self.client.stream("POST", "/v1/tts", content=body, headers={"Content-Type": "application/json"}) as response:
            if response.status_code != 200:
                raise RequestFailed(response.status_code, response.read().decode(errors="replace")[:200])
            timeline = server_timing(response.headers.get("server-timing", ""))
            if timeline:
                stats["timeline_ms"] = timeline
            rate = int(response.headers.get("x-sample-rate", 44100))
            for piece in response.iter_bytes():
                if piece:
                    yield len(piece) / 2 / rate


def server_timing(header: str) -> dict[str, float]:
    """{stage: ms} of a Server-Timing header ("prepared;dur=7.1, started;dur=0.4, ..."); entries
    without a duration are left out."""
    stages = {}
    for entry in header.split(","):
        name, *params = [part.strip() for part in entry.split(";")]
        durations = [value for key, _, value in (p.partition("=") for p in params) if key == "dur"]
        try:
            if name and durations:
                stages[name] = float(durations[0])
        except ValueError:  # not a number: not ours
            continue
    return stages


class EngineTarget:
    """An engine in this process: the body read as the server reads it, then streamed."""

    def __init__(self, engine):
        self.engine = engine

    def add_voice(self, voice: str, clip: bytes, transcript: str) -> None:
        if self.engine.voices.exists(voice):
            self.engine.voices.delete(voice)
        self.engine.voices.add(voice, clip, transcript)

    def stream(self, body: bytes, stats: dict):
        """As ServerTarget.stream; `stats` gets the engine's figures of the request as it ends."""
        from app.api_schema import TTSRequest
        from app.body import validate
        from app.errors import problem_for
        from app.speech import Voice

        try:
            request = validate(TTSRequest, json.loads(body))  # as the server reads a JSON body
            for chunk in self.engine.synthesize_stream(request.text, params=request.sampling_params(), stats=stats,
                                                       **Voice.of(request).engine_kwargs()):
                if len(chunk):
                    yield len(chunk) / self.engine.sample_rate
        except Exception as exc:  # the status the API would have answered
            problem = problem_for(exc)
            raise RequestFailed(problem.status, problem.message) from exc


def one_request(target, n: int, body: bytes) -> dict:
    """body: encoded_body(n, ...), made before the clock starts (a client has its clip ready; made
    here, 64 threads synthesising and encoding 1.2 MB clips at once delayed their own requests)."""
    started, arrivals, stats = time.perf_counter(), [], {}
    try:
        for seconds in target.stream(body, stats):
            arrivals.append((time.perf_counter(), seconds))
    except RequestFailed as exc:
        return {"n": n, "status": exc.status, "error": exc.message}
    except Exception as exc:  # a broken connection is a result of the test, not a crash of it
        return {"n": n, "status": None, "error": repr(exc)}
    # Each read's arrival (s after the request) and audio (s): where a listener would have waited.
    timeline = [[round(at - started, 4), round(seconds, 4)] for at, seconds in arrivals]
    record = {"n": n, "status": 200, **stream_record(started, arrivals), "arrivals": timeline}
    if "timeline_ms" in stats:  # the engine's stages until the first audio
        record["stages_ms"] = {stage: round(ms, 2) for stage, ms in stats["timeline_ms"].items()}
    return record


def run_level(target, clients: int, args, offset: int) -> dict:
    numbers = [[offset + index * args.requests_per_client + r for r in range(args.requests_per_client)]
               for index in range(clients)]
    bodies = {n: encoded_body(n, args) for ns in numbers for n in ns}

    def client_loop(index):
        return [one_request(target, n, bodies[n]) for n in numbers[index]]

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        records = [r for batch in pool.map(client_loop, range(clients)) for r in batch]
    wall = time.perf_counter() - started
    ok = [r for r in records if r["status"] == 200 and r["audio_s"]]
    return {"streams": clients, "requests": len(records), "ok": len(ok),
            "rejected": sum(r["status"] == 429 for r in records),
            "errors": sum(r["status"] != 200 for r in records),
            "audio_s_per_s": sum(r["audio_s"] for r in ok) / wall, "wall_s": wall, **level_summary(ok),
            "by_voice": {kind: level_summary([r for r in ok if voice_kind(r["n"]) == kind]) for kind in VOICE_KINDS},
            "records": records}


def add_shared_voices(target, args) -> None:
    for i, voice in enumerate(SHARED_VOICES):
        target.add_voice(voice, shared_voice_clip(i, args.reference_seconds), SHARED_TRANSCRIPT)


def write_html(path: Path, report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [lv for lv in report["levels"] if lv.get("ok")]
    streams = [lv["streams"] for lv in levels]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot(streams, [lv["audio_s_per_s"] for lv in levels], marker="o")
    axes[0].set_title("audio-seconds per second")
    axes[1].plot(streams, [lv["ttfa_ms_p50"] for lv in levels], marker="o", label="p50")
    axes[1].plot(streams, [lv["ttfa_ms_p95"] for lv in levels], marker="s", label="p95")
    axes[1].set_title("time to first audio (ms)")
    axes[1].legend()
    axes[2].plot(streams, [lv["rtf_p50"] for lv in levels], marker="o", label="p50")
    axes[2].plot(streams, [lv["rtf_max"] for lv in levels], marker="s", label="max")
    axes[2].axhline(1.0, color="gray", ls="--", label="real time")
    axes[2].set_title("real-time factor per request")
    axes[2].legend()
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    image = base64.b64encode(buffer.getvalue()).decode()
    rows = "".join(
        f"<tr><td>{lv['streams']}</td><td>{lv['requests']}</td><td>{lv['errors']}</td>"
        f"<td>{lv['audio_s_per_s']:.1f}</td><td>{lv.get('ttfa_ms_p50', float('nan')):.0f}</td>"
        f"<td>{lv.get('ttfa_ms_p95', float('nan')):.0f}</td><td>{lv.get('rtf_p50', float('nan')):.3f}</td>"
        f"<td>{lv.get('rtf_max', float('nan')):.3f}</td><td>{lv.get('streams_with_underrun', 0)}</td>"
        + "".join(f"<td>{lv['by_voice'].get(kind, {}).get('ttfa_ms_p50', float('nan')):.0f}</td>" for kind in VOICE_KINDS)
        + "</tr>" for lv in report["levels"])
    voice_headers = "".join(f"<th>TTFA p50 ms, {kind.replace('_', ' ')}</th>" for kind in VOICE_KINDS)
    env = report["environment"]
    path.write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>S1-mini load test</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:4px 10px;border-bottom:1px solid #ddd}}</style></head>
<body><h1>S1-mini Studio load test</h1><p>{report['url']} · client commit {env['commit']} · {env['date']}<br>
<code>{env['command']}</code></p>
<table><tr><th>streams</th><th>requests</th><th>errors</th><th>audio-s/s</th><th>TTFA p50 ms</th><th>TTFA p95 ms</th>
<th>RTF p50</th><th>RTF max</th><th>streams with an underrun</th>{voice_headers}</tr>{rows}</table><img src="data:image/png;base64,{image}"></body></html>""")


def wait_for_all_slots(client, limit_s: float = 900.0) -> None:
    """A server captures its reference encoder's and larger batches' graphs after it is ready;
    measure once it has them all."""
    deadline = time.monotonic() + limit_s
    while True:
        ready = client.get("/ready").json()
        if ready.get("slots_ready") is None or (ready["slots_ready"] >= ready["slots"] and not ready.get("capturing")):
            return
        if not ready.get("capturing", True):
            raise SystemExit(f"the server runs at most {ready['slots_ready']} of {ready['slots']} sequences at once: "
                             "capturing a larger batch's graphs failed; see its log")
        if time.monotonic() > deadline:
            raise SystemExit(f"the server is still capturing graphs after {limit_s:.0f} s ({ready['slots_ready']} "
                             f"of {ready['slots']} sequences at once so far, then the reference encoder's); see its log")
        print(f"waiting for the server's graphs: {ready['slots_ready']} of {ready['slots']} sequences at once so far, "
              "then the reference encoder's", file=sys.stderr)
        time.sleep(2.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:7860")
    p.add_argument("--api-key", help="bearer token, when the server was started with one")
    p.add_argument("--in-process", action="store_true",
                   help="no server: start an engine here (--weights, --checkpoint, --cache-dir) and send it the requests")
    add_weight_options(p, demo=True)
    p.add_argument("--cache-dir", help="with --in-process: the engine's cache dir (default: the engine's)")
    p.add_argument("--engine-option", action="append", default=[], metavar="FIELD=VALUE",
                   help="with --in-process: an EngineConfig field, e.g. decode_priority=false (repeatable)")
    p.add_argument("--levels", default="1,4,16,64")
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=215, help="frames per request at most (~10 s)")
    p.add_argument("--length-spread", type=float, default=0.0,
                   help="spread each request's --max-new-tokens uniformly by up to this share of it, fixed per "
                        "request (e.g. 0.2: 80-120%%), as real speech varies; with random weights nearly every request "
                        "otherwise runs to the same length")
    p.add_argument("--reference-seconds", type=float, default=10.0)
    p.add_argument("--distinct-clips", type=int, default=0,
                   help="inline clips cycle through this many (0: every request sends a clip the server has not "
                        "heard, encoded on arrival; N: after the first N, the server has each one's codes, as for "
                        "API clients that send their own voice with every request)")
    p.add_argument("--clip-seed", type=int,
                   help="the inline clips' seed (default: a new one each run, written to the report): the same seed "
                        "sends the same clips again, which a server that heard them has cached")
    p.add_argument("--json", type=Path)
    p.add_argument("--html", type=Path)
    args = p.parse_args(argv)
    if args.clip_seed is None:
        args.clip_seed = secrets.randbelow(2**32)
    if not args.in_process and (args.weights or args.checkpoint or args.cache_dir or args.engine_option):
        p.error("--weights, --checkpoint, --cache-dir and --engine-option set up the engine of --in-process; "
                "a server has its own")
    try:
        args.engine_options = engine_options(args.engine_option)
    except ValueError as exc:
        p.error(str(exc))
    if args.distinct_clips < 0:
        p.error(f"--distinct-clips must be 0 or more, got {args.distinct_clips}")
    if not 0 <= args.length_spread < 1:
        p.error(f"--length-spread must be at least 0 and below 1, got {args.length_spread}")
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    if args.in_process:
        results = run_in_process(settle_weights(p, args), levels)
    else:
        results = run_against_server(args, levels)
    report = {"environment": environment(), "url": "in-process" if args.in_process else args.url,
              "clip_seed": args.clip_seed, "levels": results}
    write_reports(report, args.json, args.html, write_html)
    return 0


def engine_options(pairs: list[str]) -> dict[str, str]:
    """FIELD=VALUE strings as the S1_MINI_<FIELD> variables EngineConfig.from_env reads (which parses
    and checks each value as the launcher's environment would); ValueError for a field this script
    does not take this way."""
    import dataclasses

    from engine.config import EngineConfig
    from engine.errors import InputError

    # Set by this script's own options (--weights, --checkpoint, --cache-dir) or by it (voices_dir).
    own = {"checkpoint", "demo", "random_weights", "cache_dir", "voices_dir"}
    fields = [f.name for f in dataclasses.fields(EngineConfig) if f.name not in own]
    variables = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or name not in fields:
            raise ValueError(f"--engine-option {pair!r}: give FIELD=VALUE with one of EngineConfig's fields "
                             f"{', '.join(fields)} (the others have options of their own)")
        variables[f"S1_MINI_{name.upper()}"] = value
    try:
        EngineConfig.from_env(variables)
    except InputError as exc:
        raise ValueError(f"--engine-option: {exc} (the option sets that variable's field)") from None
    return variables


def run_against_server(args, levels: list[int]) -> list[dict]:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    # Idle connections expire before a server with uvicorn's default keep-alive (5 s) closes them: a
    # request sent on a connection the server is closing fails with "Server disconnected".
    limits = httpx.Limits(max_connections=max(levels) + 4, keepalive_expiry=2.0)
    with httpx.Client(base_url=args.url, headers=headers, timeout=600, limits=limits) as client:
        ready = client.get("/ready")
        if ready.status_code != 200:
            raise SystemExit(f"{args.url} is not ready ({ready.status_code}); start the server first")
        wait_for_all_slots(client)
        return run_levels(ServerTarget(client), args, levels)


def run_in_process(args, levels: list[int]) -> list[dict]:
    import gc
    import tempfile

    from engine.config import EngineConfig
    from engine.facade import TTSEngine

    with tempfile.TemporaryDirectory(prefix="s1-load-test-voices-") as voices:  # not the user's saved voices
        config = EngineConfig.from_env(args.engine_options, **weight_config(args.weights, args.checkpoint),
                                       cache_dir=args.cache_dir, voices_dir=voices)
        engine = TTSEngine.from_config(config)
        try:
            engine.warmup()
            engine.capture_all()  # as the server is measured: once every batch graph is captured
            # and its start-up heap frozen (launch.freeze_heap_once_captured): otherwise Python's full
            # collections stop every thread for ~0.4 s within a level
            gc.collect()
            gc.freeze()
            return run_levels(EngineTarget(engine), args, levels)
        finally:
            gc.unfreeze()  # main() may be called by a longer-lived process (the tests)
            engine.close()


def run_levels(target, args, levels: list[int]) -> list[dict]:
    add_shared_voices(target, args)
    # Warm: one request of each kind, both saved voices encoded once, as a running server would have.
    # Their numbers are not used again: every measured request has its own text and clip.
    for n in range(WARM_REQUESTS):
        warm = one_request(target, n, encoded_body(n, args))
        if warm["status"] != 200:
            raise SystemExit(f"the warm-up request failed: {warm}")
    results, offset, local = [], WARM_REQUESTS, engine_gpus_are_here(args)
    for clients in levels:
        with GPUMonitor(enabled=local) as gpus:
            level = run_level(target, clients, args, offset)
        if (gpu := gpus.summary()) is not None:
            level["gpu"] = gpu
        elif gpus.problem:
            level["gpu_problem"] = gpus.problem
        results.append(level)
        offset += clients * args.requests_per_client
        s = results[-1]
        print(f"{clients:>4} streams: {s['audio_s_per_s']:7.1f} audio-s/s  TTFA p50 {s.get('ttfa_ms_p50', 0):6.0f} ms "
              f"p95 {s.get('ttfa_ms_p95', 0):6.0f} ms  RTF p50 {s.get('rtf_p50', 0):.3f} max "
              f"{s.get('rtf_max', 0):.3f} ({s.get('rtf_max_audio_s', 0):.2f} s of audio)  underruns {s.get('streams_with_underrun', 0)}  errors {s['errors']} "
              f"(rejected {s['rejected']})")
        print("      TTFA p50 / p95 by voice: " + ", ".join(
            f"{kind} {summary['ttfa_ms_p50']:.0f} / {summary['ttfa_ms_p95']:.0f} ms"
            for kind, summary in s["by_voice"].items() if summary)
            + f"; before the first audio: {s.get('before_first_audio_pct', 0):.1f} % of the requests' time")
        for kind, summary in s["by_voice"].items():
            if summary.get("stages_ms"):
                print(f"      {kind} until the first audio, ms p50 / p95: " + ", ".join(
                    f"{stage} {p['p50']:.0f} / {p['p95']:.0f}" for stage, p in summary["stages_ms"].items()))
        for gpu in s.get("gpu", []):
            print(f"      {describe(gpu)}")
        if s.get("gpu_problem"):
            print(f"      no GPU samples: nvidia-smi said {s['gpu_problem']!r}")
    return results


def engine_gpus_are_here(args) -> bool:
    """The engine runs on this machine's GPUs: in process, or a server at a loopback address."""
    if args.in_process:
        return True
    host = urlsplit(args.url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


if __name__ == "__main__":
    sys.exit(main())
