"""GPU fast paths against the plain eager path (run on a CUDA machine; skipped elsewhere)."""

import dataclasses

import numpy as np
import pytest
import torch

from engine.compilation import CompilePolicy
from engine.config import EngineConfig
from engine.loader import load_models
from engine.model.dual_ar import TokenLayout, call_block
from engine.model.loading import load_dual_ar
from reference_generation import generate
from engine.runtime.kv_cache import KVCache
from engine.runtime.sampling import SamplingTensors
from engine.runtime.prefix_cache import PrefixCache
from engine.runtime.decode_loop import DecodeLoop
from engine.runtime.scheduler import SequenceSpec
from engine.runtime.step_runner import StepRunner
from scheduling import Collector, assert_same_kv, run_until_idle

pytestmark = pytest.mark.gpu

EAGER = CompilePolicy(False, False, "test: plain eager")
EAGER_GRAPHS = CompilePolicy(False, True, "test: eager step in CUDA graphs")
COMPILED_GRAPHS = CompilePolicy(True, True, "test: compiled step in CUDA graphs")
SETTINGS = [(1.0, 1e-6, 1.0, 0), (0.8, 0.8, 1.2, 5)]  # greedy, and sampled with a penalty


@pytest.fixture(scope="module")
def tiny_model(s1_dir, s1_expected):
    ids = s1_expected["special_ids"]
    layout = TokenLayout(ids["semantic_begin"], ids["semantic_end"], ids["im_end"])
    return load_dual_ar(s1_dir, layout, "cuda", torch.float32)


@pytest.fixture(scope="module")
def prepared_runner(tiny_model):
    """A prepared (compiled and captured) StepRunner of the tiny model per (policy, slots,
    exact_vocab), built by the first test that asks and shared by the others: building one takes
    up to tens of seconds, and a runner serves one scheduler after another as the engine's serves
    request after request (each test runs its own Scheduler over it)."""
    runners = {}

    def get(policy: CompilePolicy, slots: int = 1, exact_vocab: bool = False) -> StepRunner:
        key = (policy, slots, exact_vocab)
        if key not in runners:
            runners[key] = StepRunner(tiny_model, new_cache(tiny_model, slots), policy, exact_vocab=exact_vocab)
            runners[key].prepare()
        return runners[key]

    return get


def new_cache(model, slots=1):
    c = model.config
    w = model.output.weight
    return KVCache(c.n_layer, slots, c.n_local_heads, c.max_seq_len, c.head_dim, w.dtype, w.device)


def run(runner, prompt, setting, frames=40):
    """Every column (token row and codes) of one sequence run alone through the decode loop."""
    t, top_p, rp, seed = setting
    scheduler = DecodeLoop.over(runner)
    owner = Collector()
    scheduler.submit(SequenceSpec(prompt, t, top_p, rp, seed, frames, stop_at_end=False), owner)
    run_until_idle(scheduler)
    return runner.state.frames[0, :, :frames].clone()


@pytest.mark.parametrize("setting", SETTINGS)
def test_graphed_step_matches_plain_generation(tiny_model, s1_expected, prepared_runner, setting):
    prompt = s1_expected["prompt_b"].cuda()
    t, top_p, rp, seed = setting
    plain = generate(tiny_model, prompt, SamplingTensors.build([t], [top_p], [rp], [seed], "cuda"),
                     max_new_tokens=30, cache=new_cache(tiny_model))
    runner = prepared_runner(EAGER_GRAPHS, exact_vocab=True)
    graphed = run(runner, prompt.long(), setting, frames=plain.tokens.shape[1])
    assert torch.equal(graphed, plain.tokens.long())


@pytest.mark.parametrize("setting", SETTINGS)
def test_compiled_graphed_step_matches_eager_step(tiny_model, s1_expected, prepared_runner, setting):
    prompt = s1_expected["prompt_b"].long().cuda()
    eager = run(StepRunner(tiny_model, new_cache(tiny_model), EAGER), prompt, setting)
    assert torch.equal(run(prepared_runner(COMPILED_GRAPHS), prompt, setting), eager)


@pytest.mark.parametrize("policy", [EAGER_GRAPHS, COMPILED_GRAPHS], ids=["eager-graphs", "compiled-graphs"])
def test_a_sequence_gets_the_same_codes_alone_or_in_a_full_graphed_batch(s1_expected, prepared_runner, policy):
    prompts = [s1_expected["prompt_b"].long().cuda(), s1_expected["prompt_a"].long().cuda()]
    plan = [(prompts[i % 2], (0.8, 0.8, 1.2, 40 + i)) for i in range(6)]  # 6 sequences, 4 slots: some wait

    def graphed_scheduler(slots):
        runner = prepared_runner(policy, slots)
        return DecodeLoop.over(runner, PrefixCache(runner.cache, 1 << 30))

    batched = graphed_scheduler(4)
    owners = [Collector() for _ in plan]
    for (prompt, (t, top_p, rp, seed)), owner in zip(plan, owners, strict=True):
        batched.submit(SequenceSpec(prompt, t, top_p, rp, seed, 48, stop_at_end=False), owner)
    run_until_idle(batched)
    single = graphed_scheduler(1)
    for (prompt, (t, top_p, rp, seed)), owner in zip(plan, owners, strict=True):
        alone = Collector()
        single.submit(SequenceSpec(prompt, t, top_p, rp, seed, 48, stop_at_end=False), alone)
        run_until_idle(single)
        assert torch.equal(owner.codes, alone.codes)


@pytest.fixture(scope="module")
def one_stream_codes(tiny_model, s1_expected):
    """Codes of one sequence over 100 frames from the compiled graphed step with codebook 0's head
    and sampler on the main stream (no side stream), for the side-stream tests to compare with."""
    runner = StepRunner(tiny_model, new_cache(tiny_model, 4), COMPILED_GRAPHS)
    runner._side_stream = lambda: None
    runner.prepare()
    assert runner.ops.side_stream is None
    return codebook_0_codes(runner, s1_expected)


def codebook_0_codes(runner, s1_expected):
    scheduler, owner = DecodeLoop.over(runner), Collector()
    scheduler.submit(SequenceSpec(s1_expected["prompt_b"].long().cuda(), 0.8, 0.8, 1.2, 60, 100, stop_at_end=False),
                     owner)
    run_until_idle(scheduler)
    return owner.codes


@pytest.mark.parametrize("delayed", [False, True], ids=["as-is", "side-branch-delayed"])
def test_codebook_0_beside_fast_position_0_gives_the_codes_of_one_stream(tiny_model, s1_expected, prepared_runner,
                                                                         one_stream_codes, delayed):
    """The compiled graphed step runs codebook 0's head and sampler on a second stream beside fast
    position 0 at batch 1 (StepOps.side_stream): one sequence over 100 frames gets the codes of the same
    step on one stream. Delayed, the side branch spins before its sampler, so that a missing or
    misplaced join would hand fast position 1 an unfinished embedding."""
    if delayed:
        runner = StepRunner(tiny_model, new_cache(tiny_model, 4), COMPILED_GRAPHS)
        sample_first = runner.ops.sample_first
        runner.ops = dataclasses.replace(
            runner.ops, sample_first=lambda *args: (torch.cuda._sleep(1_000_000), sample_first(*args))[1])
        runner.prepare()
    else:
        runner = prepared_runner(COMPILED_GRAPHS, 4)
    assert runner.ops.side_stream is not None
    assert torch.equal(codebook_0_codes(runner, s1_expected), one_stream_codes)


def test_graphed_batched_codec_decodes_each_stream_like_a_lone_decoder():
    """Streams starting at different times, decoded together by the codec runner (graphs for the
    chunk lengths 4 and 16 and for a padded last chunk, eager for an odd length mid-stream),
    against each stream decoded alone and eagerly in the same pieces."""
    from engine.model.codec_stream import StreamingDecoder
    from engine.runtime.codec_runner import CodecRunner
    from engine.runtime.decode_loop import Harvest

    codec = load_models(EngineConfig(demo=True, device="cuda")).codec
    runner = CodecRunner(codec, rows=4, max_frames=256)
    runner.prepare()
    gen = torch.Generator().manual_seed(0)
    streams = {slot: torch.cat([torch.randint(0, 4096, (1, 60), generator=gen),
                                torch.randint(0, 1024, (9, 60), generator=gen)]).cuda() for slot in (0, 2, 3)}
    # (slot, start, length, final): slot 2 starts later; slot 0 ends with 9 frames (padded to 16).
    plan = [[(0, 0, 4, False)], [(0, 4, 16, False), (2, 0, 4, False)],
            [(0, 20, 16, False), (2, 4, 16, False), (3, 0, 7, False)],
            [(0, 36, 9, True), (2, 20, 16, False), (3, 7, 16, False)]]
    pieces = {slot: [] for slot in streams}
    with torch.inference_mode():
        for harvest in plan:
            runner.submit([Harvest(slot, slot, streams[slot][:, a:a + n], first=a == 0, final=final)
                           for slot, a, n, final in harvest])
            while runner.pending:
                for item in runner.completed(wait=True):
                    pieces[item.owner].append(item.audio)
        for slot, code in streams.items():
            lone = StreamingDecoder(codec)
            alone = np.concatenate([lone.decode(code[None, :, a:a + n])[0, 0].cpu().numpy()
                                    for h in plan for s, a, n, _ in h if s == slot])
            got = np.concatenate(pieces[slot])
            assert got.shape == alone.shape
            # bf16 convolutions batched with other rows may round differently; nothing more.
            assert np.abs(got - alone).max() <= 2e-2 * np.abs(alone).max(), f"stream {slot}"


def test_padded_codec_replays_keep_the_spare_rows_position_bounded():
    """Rows a graph's bucket does not use point at one spare stream, which never ends an utterance.
    Each padded replay advances its transformer position, so without a reset a server running long
    enough gathers RoPE rows past the table's end (a device-side assert that kills the process after
    a few hundred requests under sustained load). Each replay starts the spare row afresh."""
    from engine.runtime.codec_runner import CodecRunner
    from engine.runtime.decode_loop import Harvest

    codec = load_models(EngineConfig(demo=True, device="cuda")).codec
    runner = CodecRunner(codec, rows=8, max_frames=256)
    runner.prepare()
    codes = torch.zeros(10, 16, dtype=torch.long, device="cuda")
    with torch.inference_mode():
        for call in range(12):  # five streams in a bucket of six: one padded row each replay
            runner.submit([Harvest(slot, slot, codes, first=call == 0, final=False) for slot in range(5)])
            while runner.pending:
                runner.completed(wait=True)
    positions = runner.decoder.positions.tolist()
    assert positions[:5] == [192] * 5  # the real streams went on, none reset
    assert positions[runner.rows] <= 16, positions  # 12 x 16 = 192 before the fix


def test_the_decode_loop_and_codec_never_wait_for_the_gpu_outside_their_read_backs(s1_expected, prepared_runner):
    """With torch's sync debug mode raising, sequences are admitted, stepped in graphs, handed out,
    one cancelled and the rest retired, and a padded last chunk goes through a codec graph: nothing
    in that loop may wait for a stream (a host scalar written into a device tensor does: the GPU
    drains its queued steps while the host works). The loop's own waits are CUDA events, which the
    mode does not count."""
    from engine.runtime.codec_runner import CodecRunner
    from engine.runtime.decode_loop import Harvest

    runner = prepared_runner(EAGER_GRAPHS, 4)
    codec_runner = CodecRunner(load_models(EngineConfig(demo=True, device="cuda")).codec, rows=4, max_frames=256)
    codec_runner.prepare()
    prompt = s1_expected["prompt_b"].long().cuda()
    scheduler, owners = DecodeLoop.over(runner), [Collector() for _ in range(4)]
    for seed, (owner, frames) in enumerate(zip(owners, (20, 33, 45, 40)), 1):
        scheduler.submit(SequenceSpec(prompt, 0.8, 0.8, 1.2, seed, frames, stop_at_end=False), owner)
    codes = torch.zeros(10, 9, dtype=torch.long, device="cuda")  # 9 frames: padded to a graphed length

    def cancel_one(i):
        owners[3].cancelled = i >= 12

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            run_until_idle(scheduler, cancel_one)
            codec_runner.submit([Harvest(slot, slot, codes, first=True, final=True) for slot in range(3)])
            while codec_runner.pending:
                codec_runner.completed(wait=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert [o.finished for o in owners[:3]] == [True] * 3 and owners[3].error is not None
    assert [o.codes.shape[1] for o in owners[:3]] == [20, 33, 45]


def attention_ops(fn) -> set[str]:
    """The names of the attention ops that fn() runs (torch.profiler, in inference mode)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, torch.inference_mode():
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if "attention" in e.name}


def test_prefill_attention_builds_no_cudnn_plan_per_prompt_length(s1_dir, s1_expected):
    """Prompt lengths vary per request, and cuDNN attention builds an execution plan for each new
    length (and compiles its first ones for up to ~1 s), so the runner's prefill keeps
    to the attention backends that need none. Checked in bf16, where SDPA would pick cuDNN here."""
    ids = s1_expected["special_ids"]
    model = load_dual_ar(s1_dir, TokenLayout(ids["semantic_begin"], ids["semantic_end"], ids["im_end"]), "cuda",
                         torch.bfloat16)
    prompt = s1_expected["prompt_b"].cuda().long()
    length = prompt.shape[1] - 1

    positions = torch.arange(length, device="cuda")[None]
    unrestricted = attention_ops(lambda: model.forward_slow(prompt[None, :, :length], new_cache(model).views(positions, length)))
    if not any("cudnn" in name for name in unrestricted):
        pytest.skip(f"SDPA picks no cuDNN kernel for this prefill on this GPU ({unrestricted}): nothing to avoid")
    runner = StepRunner(model, new_cache(model), COMPILED_GRAPHS)
    used = attention_ops(lambda: runner.prefill(0, prompt))
    assert used and not any("cudnn" in name for name in used), used


def test_codec_attention_builds_no_cudnn_plan_per_shape():
    """The codec's graphs run its transformer layers at a shape per row count and chunk length, and
    cuDNN attention would build a plan for each at every start, so its transformers keep to the
    backends that need none: streamed with layer_forward eager and compiled, and whole. Checked on
    the full-size quantizer transformer in bf16 (the decode path's dtype) with a streamed chunk's
    window mask, where SDPA would pick cuDNN."""
    from engine.model.codec_config import CodecConfig
    from engine.model.codec_streamers import compiled_layer_forward, streamer_for
    from engine.model.codec_transformer import WindowLimitedTransformer

    cfg = CodecConfig.s1_mini().quantizer_transformer
    torch.manual_seed(0)
    transformer = WindowLimitedTransformer(cfg, 2).cuda().to(torch.bfloat16)
    for p in transformer.parameters():
        torch.nn.init.normal_(p, std=0.02)
    rows, n, w1 = 4, 16, cfg.window_size - 1
    chunk = torch.randn(rows, cfg.dim, n, device="cuda", dtype=torch.bfloat16)

    slots, steps = torch.arange(w1 + n, device="cuda"), torch.arange(n, device="cuda")
    mask = ((slots[None, :] >= steps[:, None]) & (slots[None, :] <= steps[:, None] + w1)).expand(rows, 1, n, w1 + n)
    q = torch.randn(rows, cfg.n_head, n, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(rows, cfg.n_local_heads, w1 + n, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    unrestricted = attention_ops(lambda: torch.nn.functional.scaled_dot_product_attention(
        q, kv, kv, attn_mask=mask, enable_gqa=cfg.n_head != cfg.n_local_heads))
    if not any("cudnn" in name for name in unrestricted):
        pytest.skip(f"SDPA picks no cuDNN kernel for the codec's attention on this GPU ({unrestricted}): nothing to avoid")
    calls = {"whole": lambda: transformer(chunk)}
    for name, layer in (("streamed", None), ("streamed, compiled", compiled_layer_forward(COMPILED_GRAPHS.inductor_backend()))):
        transformer.stream_layers_with(layer)
        streamer = streamer_for(transformer, rows, cfg.rope_base)
        calls[name] = lambda streamer=streamer: streamer.step(chunk, None)
    for name, call in calls.items():
        used = attention_ops(call)
        assert used and not any("cudnn" in op for op in used), (name, used)


def test_compiled_batched_prefill_writes_the_kv_of_the_eager_one(tiny_model, s1_expected):
    """Rows prefilled together through the batched prefill that prepare() compiles (batch and length
    generic: compiled with two rows of 16 columns) equal the same rows prefilled eagerly."""
    prompt_a, prompt_b = s1_expected["prompt_a"].long().cuda(), s1_expected["prompt_b"].long().cuda()
    rows = [(0, prompt_b, 0), (1, prompt_a, 0), (2, prompt_b, 5)]  # slot 2's first 5 columns already there
    compiled = StepRunner(tiny_model, new_cache(tiny_model, 4), COMPILED_GRAPHS)
    compiled.prepare([1, 2])
    eager = StepRunner(tiny_model, new_cache(tiny_model, 4), EAGER)
    assert compiled.batched_prefill_block is not call_block and eager.batched_prefill_block is call_block
    for runner in (compiled, eager):
        runner.prefill(2, prompt_b, 0, 5)
        runner.prefill_many(rows)
    assert_same_kv(compiled.cache, eager.cache, rows, 1e-4)


@pytest.mark.parametrize("lone_chunk_frames", [8, 16, 64])
def test_graphed_reference_encoder_gives_the_eager_codes(lone_chunk_frames):
    """The reference encoder's chunk graph against the same encoder run eagerly, clip after clip (the
    state is reset between clips; the last chunk is padded), in the chunks of a lone clip's pass (64:
    one chunk longer than the longest clip the graph takes, as the engine's 128 frames can be). The
    55-frame clip is longer than the graph reserves, so both encoders run it eagerly: what it checks is
    the clip after it, that the graph still gives the eager codes once a fresh encoder has handled a
    long clip."""
    from engine.runtime.reference_encoder import ReferenceEncoder

    codec = load_models(EngineConfig(demo=True, device="cuda")).codec
    frame_length = codec.config.frame_length
    graphed, eager = (ReferenceEncoder(codec, 8, max_frames=40, lone_chunk_frames=lone_chunk_frames) for _ in range(2))
    graphed.prepare()
    gen = np.random.default_rng(0)
    for frames in (3, 17.5, 40, 55, 24):
        clip = (0.3 * gen.standard_normal(int(frames * frame_length))).astype(np.float32)
        expected = eager.encode(clip)
        assert expected.shape[-1] == int(np.ceil(frames))
        assert torch.equal(graphed.encode(clip), expected), frames


def test_batched_encodes_give_the_codes_of_single_encodes():
    """The graphed encoder's batch buckets against its batch-1 graph, clip by clip: clips of
    different lengths in one pass (a bucket of 4 with 3 rows, then full buckets of 4 and 8) get the
    codes each gets alone. cuDNN picks its convolution algorithms per shape, and in TF32 (torch's default for
    convolutions) their rounding differs by more than a VQ near-tie; in fp32 the codes are the same
    up to the order of sums."""
    from codec_codes import NEAR_TIE, assert_same_codes_but_near_ties, vq_margins
    from engine.runtime.reference_encoder import ReferenceEncoder

    codec = load_models(EngineConfig(demo=True, device="cuda")).codec
    frame_length = codec.config.frame_length
    gen = np.random.default_rng(1)
    clips = [(0.3 * gen.standard_normal(int(frames * frame_length))).astype(np.float32)
             for frames in (17.5, 24, 9, 40, 33, 31, 8, 12, 39, 1, 20, 27, 35, 16, 5)]
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        encoder = ReferenceEncoder(codec, 8, max_frames=40, max_batch=8)
        encoder.prepare()
        batched = [h.result() for part in (clips[:3], clips[3:7], clips[7:]) for h in encoder.start(part)]
        for clip, codes in zip(clips, batched):
            with torch.inference_mode():
                margins = vq_margins(codec, torch.from_numpy(clip).cuda().view(1, 1, -1))
            assert_same_codes_but_near_ties(codes, encoder.encode(clip), margins, NEAR_TIE)


def test_full_size_bf16_compiled_logits_close_to_eager(full_size_cuda_model):
    """Full-size random weights: a compiled bf16 slow step + head is no further from the fp32 result
    than the eager bf16 step is (compilation adds no error beyond bf16's own). Compiled as the engine
    compiles its step: one graph for a block, which serves all 28 layers, and one for the head."""
    import copy

    bf16 = full_size_cuda_model
    fp32 = copy.deepcopy(bf16).float()
    prompt = torch.randint(0, 4000, (11, 64), device="cuda")
    prompt[1:] = prompt[1:] % 1024
    args = (prompt[None, :, -1:], torch.tensor([[63]], device="cuda"), torch.arange(256, device="cuda"))

    def logits_fn(model, compiled=False):
        runner = StepRunner(model, new_cache(model), EAGER)
        run_block, head = call_block, runner.head.logits
        if compiled:
            run_block, head = torch.compile(call_block, fullgraph=True), torch.compile(head, fullgraph=True)

        def step_logits(columns, positions, key_positions):
            hidden = model.forward_slow(columns, runner.cache.views(positions, key_positions), run_block)
            return head(hidden).float()

        runner.prefill(0, prompt)
        return step_logits

    with torch.inference_mode():
        reference = logits_fn(fp32)(*args)
        eager = logits_fn(bf16)(*args)
        compiled = logits_fn(bf16, compiled=True)(*args)
    eager_error = (eager - reference).norm()
    compiled_error = (compiled - reference).norm()
    assert compiled_error <= 1.5 * eager_error + 1e-3 * reference.norm()
    assert eager_error <= 0.05 * reference.norm()  # bf16 itself stays close


def test_a_graph_collected_during_another_capture_does_not_break_it():
    """A graph that becomes unreachable garbage (a reference cycle, as a dropped runner's graphs are)
    while another graph is captured: an automatic collection inside that capture destroyed it there
    and failed the capture ("operation failed due to a previous error during capture"), seen as a
    flaky test in this file; capture() keeps the collector off until the capture ends."""
    import gc

    from engine.runtime.cuda_graphs import capture

    class Cycle:
        def __init__(self, graph):
            self.graph, self.me = graph, self

    stray, _ = capture(lambda: torch.zeros(1, device="cuda"), torch.cuda.Stream())
    holder = [stray]
    del stray
    out = torch.zeros(1, device="cuda")

    def step():
        # The stray graph's last reference becomes a new garbage cycle inside the capture (young, so
        # the next automatic collection of the youngest generation would destroy it).
        Cycle(holder.pop())
        [Cycle(None) for _ in range(100)]  # allocations that trigger automatic collections
        return out.add_(1)

    thresholds = gc.get_threshold()
    gc.set_threshold(1)  # a collection of the youngest generation at (almost) every allocation
    try:
        graph, _ = capture(step, torch.cuda.Stream(), warmup=0)  # the first call is the captured one
    finally:
        gc.set_threshold(*thresholds)
        gc.collect()  # the stray graph goes now, outside any capture
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert out.item() == 1
