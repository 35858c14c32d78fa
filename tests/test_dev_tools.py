"""tools/profile_step.py, tools/profile_codec_calls.py and tools/profile_reference_encodes.py: their
pure parts on the CPU, a clear refusal without CUDA, and a run on the demo model on a GPU (a check of
the tools, not a measurement). tools/profile_startup.py: its summary of py-spy's samples, and a cold
start and a restart of the demo model on any device. tools/profile_clip_prepare.py: a short run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import profile_codec_calls  # noqa: E402
import profile_reference_encodes  # noqa: E402
import profile_startup  # noqa: E402
import profile_step  # noqa: E402


def run_tool(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_the_codec_graphs_are_prepared_in_the_engines_steps():
    class Runner:
        row_buckets = [1, 2, 3, 4, 6, 8]

        def prepare(self, up_to):
            return float(up_to)

    assert profile_codec_calls.prepare_like_the_engine(Runner()) == {2: 2.0, 3: 3.0, 4: 4.0, 6: 6.0, 8: 8.0}
    Runner.row_buckets = [1]
    assert profile_codec_calls.prepare_like_the_engine(Runner()) == {1: 1.0}


def test_the_codec_fit_recovers_a_fixed_cost_and_a_cost_per_row():
    points = [(rows, 2.4 + 1.3 * rows) for rows in (1, 2, 4, 8, 16)]
    fixed, per_row = profile_codec_calls.fit_fixed_and_per_row(points)
    assert fixed == pytest.approx(2.4) and per_row == pytest.approx(1.3)
    assert profile_codec_calls.fit_fixed_and_per_row([(4, 3.0), (4, 5.0)]) == (4.0, 0.0)  # one bucket


def test_profile_step_sets_the_inductor_config_it_is_given():
    import torch._inductor.config as config

    # torch's own patch() puts them back: pytest's monkeypatch on a torch config module hides the
    # setting from torch for the rest of the process on torch 2.14. These two exist in every
    # supported torch (others come and go between releases).
    with config.patch({"triton.cudagraphs": False, "max_autotune": False}):
        profile_step.set_inductor_config("triton.cudagraphs=True")
        profile_step.set_inductor_config("max_autotune=True")
        assert config.triton.cudagraphs is True and config.max_autotune is True
    with pytest.raises(SystemExit, match="no triton.no_such_setting"):
        profile_step.set_inductor_config("triton.no_such_setting=1")
    with pytest.raises(SystemExit, match="no no_such_group.setting"):
        profile_step.set_inductor_config("no_such_group.setting=1")
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        profile_step.set_inductor_config("max_autotune")


def test_the_encode_batches_are_distinct_sizes_of_at_least_one():
    assert profile_reference_encodes.parse_batches("8,1,4,4") == [1, 4, 8]
    for bad in ("0,2", "one", "1,,2"):
        with pytest.raises(ValueError, match="--batches"):
            profile_reference_encodes.parse_batches(bad)


def test_encode_kernels_are_told_apart_by_kind():
    kinds = {
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4": "fp32 matmul on CUDA cores",
        "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>": "fp32 matmul on CUDA cores",
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize64x64x32_warpgroupsize1x1x1": "TF32 matmul",
        "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32": "convolution",
        "void implicit_convolve_sgemm<float, float, 1024, 5, 5, 3, 3, 3, 1, false, false, true>": "convolution",
        "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>": "cuDNN layout copy",
        "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float>": "attention",
        "triton_poi_fused__scaled_dot_product_efficient_attention_add_constant_pad_nd_expand": "compiled (Inductor)",
        "triton_poi_fused_add_cat_mul_pow_reciprocal_sin_0": "compiled (Inductor)",
        "void at::native::elementwise_kernel<128, 2, at::native::CUDAFunctor_add<float>>": "other",
    }
    assert {name: profile_reference_encodes.kernel_kind(name) for name in kinds} == kinds


def test_the_kernel_kinds_are_counted_per_call_and_sorted_by_time():
    class Kernel:
        def __init__(self, name, device_time):
            self.name, self.device_time = name, device_time

    kernels = [Kernel("mm", 10.0), Kernel("norm", 1.0), Kernel("mm", 10.0), Kernel("attn", 30.0)]
    assert profile_step.kernel_kinds(kernels, calls=2) == [("attn", 0.5, 15.0), ("mm", 1.0, 10.0), ("norm", 0.5, 0.5)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("tool", ["tools/profile_step.py", "tools/profile_codec_calls.py",
                                  "tools/profile_reference_encodes.py"])
def test_without_cuda_each_tool_says_it_needs_a_gpu(tool):
    run = run_tool(tool, "--weights", "demo", timeout=120)
    assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr


def test_profile_clip_prepare_times_each_format_as_the_engine_reads_uploads_and_from_a_file_object(tmp_path):
    out = tmp_path / "clips.json"
    run = run_tool("tools/profile_clip_prepare.py", "--seconds", "1", "--repeats", "1", "--formats", "wav,flac",
                   "--json", str(out), timeout=120)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert list(report["formats"]) == ["wav", "flac"] and report["busy_threads"] == 1
    for row in report["formats"].values():
        assert row["bytes"] > 0
        for key in ("engine_alone_ms", "engine_beside_busy_ms", "file_object_alone_ms", "file_object_beside_busy_ms"):
            assert row[key]["max"] >= row[key]["p50"] > 0
    assert "wav (" in run.stdout and "beside 1 busy thread" in run.stdout


def test_profile_clip_prepare_refuses_an_unknown_format():
    run = run_tool("tools/profile_clip_prepare.py", "--formats", "wav,aiff", timeout=60)
    assert run.returncode == 2 and "--formats takes" in run.stderr


def test_profile_reference_encodes_refuses_a_chunk_of_no_frames():
    run = run_tool("tools/profile_reference_encodes.py", "--weights", "demo", "--chunk-frames", "0", timeout=120)
    assert run.returncode == 2 and "--chunk-frames must be at least 1" in run.stderr


@pytest.mark.gpu
def test_profile_step_times_and_profiles_the_demo_models_step(tmp_path):
    out = tmp_path / "step.json"
    run = run_tool("tools/profile_step.py", "--weights", "demo", "--compile", "off", "--batch", "2", "--frames", "3",
                   "--json", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["batch"] == 2 and report["kv_bucket"] == 512 and report["graphed_frames_per_s"] > 0
    assert report["kernels_per_frame"] > 0 and report["top_kernels"] and report["frame_kernels"]
    first, last = report["profiled_positions"]
    assert last - first + 1 == 3  # every profiled step moves a row one position on


@pytest.mark.gpu
def test_profile_codec_calls_times_each_bucket_and_the_parts_of_a_call(tmp_path):
    out = tmp_path / "codec.json"
    run = run_tool("tools/profile_codec_calls.py", "--weights", "demo", "--rows", "2", "--row-buckets", "1,2",
                   "--parts", "1x4", "--cache-dir", str(tmp_path / "caches"), "--json", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {c["rows"] for c in report["calls"]} == {1, 2} and all(c["ms"] > 0 for c in report["calls"])
    assert list(report["prepare_s"]) == ["2"] and report["prepare_s"]["2"] > 0  # rows 1 and 2 in one step
    assert report["fits"]
    (part,) = report["parts"]
    assert (part["rows"], part["frames"]) == (1, 4)
    for name in ("vq", "post_transformer", "upsample", "decoder"):
        assert part[name]["ms"] > 0 and part[name]["kernels"] > 0


@pytest.mark.gpu
def test_profile_reference_encodes_times_each_batch_and_compares_the_paths(tmp_path):
    out = tmp_path / "encodes.json"
    run = run_tool("tools/profile_reference_encodes.py", "--weights", "demo", "--seconds", "1", "--batches", "1,2",
                   "--chunk-frames", "8", "--compare", "--top", "5", "--json", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [row["batch"] for row in report["batches"]] == [1, 2]
    assert all(row["ms_per_pass"] > 0 and row["ms_per_clip"] == row["ms_per_pass"] / row["batch"] for row in report["batches"])
    assert report["kernels_per_chunk"] > 0 and report["prepare_s"] > 0 and report["chunk_frames"] == 8
    assert "8-frame chunk" in run.stdout
    assert set(report["equal_codes"]) == {"1", "2"} and all(0 <= share <= 1 for share in report["equal_codes"].values())
    times = [row["ms"] for row in report["top_kernels"]]
    assert 0 < len(times) <= 5 and times == sorted(times, reverse=True)
    assert sum(report["ms_by_kind"].values()) == pytest.approx(report["chunk_kernel_ms"])


def test_the_startup_samples_are_summed_by_thread_stage_and_calling_region():
    raw = "\n".join([
        "thread (0x1): MainThread;<module> (a.py:1);_find_and_load (<frozen>:1) 10",
        "thread (0x2): s1-gpu-worker;GraphCapture.prepare (g.py:1);decode_step (d.py:1);next_frame (f.py:2);"
        "_StoredRegion.__call__ (r.py:3);compile_fx_inner (c.py:4) 30",
        "thread (0x2): s1-gpu-worker;decode_step (d.py:1);next_frame (f.py:2);_StoredRegion.__call__ (r.py:3);"
        "fx_codegen_and_compile (c.py:9);CudaLauncher.__init__ (t.py:5) 20",
        "thread (0x2): s1-gpu-worker;GPUWorker._loop (w.py:1);Condition.wait (t.py:1) 5",
        "",
    ])
    summary = profile_startup.summarise(raw, rate=10)
    assert list(summary["threads"]) == ["s1-gpu-worker", "MainThread"]  # costliest first
    worker = summary["threads"]["s1-gpu-worker"]
    # a sample counts once, for its first stage in STAGES' order: the launcher build inside codegen
    assert worker == {"sampled_s": 5.5, "stages": {"inductor codegen": 3.0, "triton launcher build (C compiler)": 2.0,
                                                   "other": 0.5}}
    assert summary["threads"]["MainThread"] == {"sampled_s": 1.0, "stages": {"imports": 1.0}}
    assert summary["regions_by_caller"] == {"decode_step > next_frame": 5.0}


def _py_spy_refusal() -> str | None:
    """Why py-spy cannot sample a child process here (not installed, or not allowed to read its
    memory), or None when it can."""
    py_spy = profile_startup.find_py_spy()
    if py_spy is None:
        return "py-spy is not installed"
    run = subprocess.run([py_spy, "record", "--nonblocking", "--format", "raw", "--output", "/dev/null", "--",
                          sys.executable, "-c", "import time; time.sleep(0.5)"], capture_output=True, text=True,
                         timeout=60)
    return None if run.returncode == 0 else f"py-spy cannot sample here: {run.stderr.strip()[-300:]}"


def test_profile_startup_profiles_a_cold_start_and_a_restart_of_the_demo_model(tmp_path):
    refusal = _py_spy_refusal()
    if refusal:
        pytest.skip(refusal)
    out, raw = tmp_path / "startup.json", tmp_path / "raw"
    run = run_tool("tools/profile_startup.py", "--weights", "demo", "--restarts", "1", "--keep", str(raw),
                   "--json", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert list(report) == ["cold", "restart1"]
    for start in report.values():
        assert start["phase"]["to_first_audio_s"] > 0 and start["threads"]["MainThread"]["sampled_s"] > 0
    assert (raw / "cold.txt").is_file() and (raw / "restart1.txt").is_file()
    assert "restart1: first audio after" in run.stdout


def test_profile_startup_starts_the_benchmark_with_or_without_compile_helpers(tmp_path, monkeypatch):
    """py-spy samples the engine's process only: --compile-helpers off profiles a cold start whose
    engine compiles everything."""
    commands = []
    phase = {"to_first_audio_s": 1.0, "compile_s": 1.0, "to_all_graphs_s": 1.0}
    monkeypatch.setattr(profile_startup, "profile_start", lambda argv, *rest: commands.append(argv) or
                        {"phase": phase, "threads": {}, "regions_by_caller": {}})
    profile_startup.main(["--weights", "demo", "--restarts", "0", "--compile-helpers", "off"])
    profile_startup.main(["--weights", "demo", "--restarts", "0"])
    assert commands == [["--weights", "demo", "--compile-helpers", "off"], ["--weights", "demo", "--compile-helpers", "on"]]
