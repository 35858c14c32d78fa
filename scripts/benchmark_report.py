"""The benchmark's console table and HTML report (plots as an inline PNG, the JSON below them)."""

from __future__ import annotations

import json
from pathlib import Path

# fish-speech d3df505 compiled with its CUDA graphs, batch 1, on an H100 (docs/PERFORMANCE.md has the
# reference side by side on other GPUs).
REFERENCE_FRAMES_PER_S = 212


def print_table(results: list[dict]) -> None:
    rows = [
        ("frames/s (single stream)", lambda r: r["single_stream"]["frames_per_s"], "{:.0f}"),
        ("x real time", lambda r: r["single_stream"]["x_real_time"], "{:.1f}"),
        ("prefill ms", lambda r: r["single_stream"]["prefill_ms"], "{:.1f}"),
        ("TTFA ms p50 (streaming)", lambda r: r["single_stream"]["ttfa_ms_p50"], "{:.0f}"),
        ("TTFA ms p50, 10 s voice clone", lambda r: r["single_stream"]["ttfa_clone_ms_p50"], "{:.0f}"),
        ("codec ms / audio s", lambda r: r["codec"]["decode_ms_per_audio_s"], "{:.1f}"),
        ("cold compile s", lambda r: r.get("startup", {}).get("cold_compile_s"), "{:.1f}"),
        ("warm restart s", lambda r: r.get("startup", {}).get("warm_restart_s"), "{:.1f}"),
        ("memory after load GB", lambda r: r["memory"]["after_load_gb"], "{:.2f}"),
        ("memory peak GB", lambda r: r["memory"]["peak_gb"], "{:.2f}"),
        ("latency p50 ms short", lambda r: r["latency_ms"]["short_text"]["p50"], "{:.0f}"),
        ("latency p99 ms short", lambda r: r["latency_ms"]["short_text"]["p99"], "{:.0f}"),
        ("latency p50 ms clone", lambda r: r["latency_ms"]["voice_clone_10s"]["p50"], "{:.0f}"),
    ]
    names = [r["name"] for r in results]
    print(f"{'':28}" + "".join(f"{n:>22}" for n in names))
    for label, get, fmt in rows:
        cells = []
        for r in results:
            value = get(r)
            cells.append("-" if value is None else fmt.format(value))
        print(f"{label:28}" + "".join(f"{c:>22}" for c in cells))
    for r in results:
        if r.get("concurrency"):
            print(f"\nconcurrency sweep ({r['name']}): streams  audio-s/s  TTFA p50/p95 ms  RTF p50/max  underruns  errors")
            for level in r["concurrency"]:
                print(f"{level['streams']:>38} {level['audio_s_per_s']:>10.1f} {level['ttfa_ms_p50']:>8.0f}/"
                      f"{level['ttfa_ms_p95']:<6.0f} {level['rtf_p50']:>7.3f}/{level['rtf_max']:<6.3f} "
                      f"{level['streams_with_underrun']:>9} {level['errors']:>6}")


def write_html(path: Path, report: dict) -> None:
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = report["configurations"]
    names = [c["name"] for c in configs]
    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    axes[0].bar(names, [c["single_stream"]["frames_per_s"] for c in configs], color="#4a7")
    axes[0].axhline(REFERENCE_FRAMES_PER_S, color="gray", ls="--",
                    label=f"reference, compiled, H100 ({REFERENCE_FRAMES_PER_S})")
    axes[0].set_title("single-stream frames/s")
    axes[0].legend()
    for c in configs:
        kinds = list(c["latency_ms"])
        axes[1].plot(["p50", "p95", "p99"], [c["latency_ms"][kinds[0]][q] for q in ("p50", "p95", "p99")],
                     marker="o", label=f"{c['name']}: {kinds[0]}")
        axes[1].plot(["p50", "p95", "p99"], [c["latency_ms"][kinds[1]][q] for q in ("p50", "p95", "p99")],
                     marker="s", ls="--", label=f"{c['name']}: {kinds[1]}")
    axes[1].set_title("request latency (ms)")
    axes[1].legend(fontsize=7)
    axes[2].bar(names, [c["memory"]["peak_gb"] or 0 for c in configs], color="#a74")
    axes[2].set_title("peak GPU memory (GB)")
    for c in configs:
        levels = c.get("concurrency") or []
        if levels:
            streams = [lv["streams"] for lv in levels]
            axes[3].plot(streams, [lv["audio_s_per_s"] for lv in levels], marker="o", label=f"{c['name']}: audio-s/s")
            axes[3].plot(streams, [lv["ttfa_ms_p50"] for lv in levels], marker="s", ls="--",
                         label=f"{c['name']}: TTFA p50 ms")
    axes[3].set_xscale("log", base=2)
    axes[3].set_xlabel("concurrent streams")
    axes[3].set_title("continuous batching (codec included)")
    axes[3].legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    image = base64.b64encode(buffer.getvalue()).decode()
    env = report["environment"]
    rows = "".join(
        f"<tr><td>{c['name']}</td><td>{c['single_stream']['frames_per_s']:.0f}</td>"
        f"<td>{c['single_stream']['ttfa_ms_p50']:.0f}</td><td>{c['single_stream']['prefill_ms']:.1f}</td>"
        f"<td>{c['codec']['decode_ms_per_audio_s']:.1f}</td>"
        f"<td>{c.get('startup', {}).get('cold_compile_s', float('nan')):.1f}</td>"
        f"<td>{c.get('startup', {}).get('warm_restart_s', float('nan')):.1f}</td>"
        f"<td>{c['memory']['after_load_gb'] or 0:.2f}</td><td>{c['memory']['peak_gb'] or 0:.2f}</td></tr>"
        for c in configs)
    path.write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>S1-mini benchmark</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:4px 10px;border-bottom:1px solid #ddd}}</style></head>
<body><h1>S1-mini Studio benchmark</h1>
<p>{env['device']} · torch {env['torch']} · commit {env['commit']} · {env['date']}<br><code>{env['command']}</code></p>
<table><tr><th>config</th><th>frames/s</th><th>TTFA p50 ms</th><th>prefill ms</th><th>codec ms/audio s</th>
<th>cold compile s</th><th>warm restart s</th><th>mem after load GB</th><th>mem peak GB</th></tr>{rows}</table>
<img src="data:image/png;base64,{image}"><pre>{json.dumps(report, indent=2)}</pre></body></html>""")
