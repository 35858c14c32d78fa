"""Does the KV cache's layout change the decode attention kernel's time? (TLB reach hypothesis)
Same work (64 rows, 8 kv heads, head dim 128, rows at position P) on caches laid out differently."""
import sys, torch
sys.path.insert(0, "scripts"); sys.path.insert(0, ".")
from engine.model import decode_attention as kernel
from engine.model import dual_ar
from graph_timing import microseconds_per_call

B, H, D, L = 64, 8, 128, 28
def run(layout, cap, pos, dtype=torch.bfloat16):
    gen = torch.Generator(device="cuda").manual_seed(0)
    attn = dual_ar.Attention(2048, 16, 8, 128, 1e-6, True, False, False).cuda().bfloat16()
    qkv = torch.randn(B, 4096, device="cuda", generator=gen).bfloat16()
    positions = torch.full((B,), pos, device="cuda") if pos > 0 else torch.randint(64, -pos, (B,), device="cuda", generator=gen)
    rope = dual_ar.rope_table(cap, 128, 1e6).cuda()[positions].reshape(B, -1)
    def make():
        if layout == "slot-head-pos":   # (B, H, cap, D): today's
            t = torch.empty(B, H, cap, D, device="cuda", dtype=dtype)
            return t
        if layout == "slot-pos-head":   # (B, cap, H, D)
            return torch.empty(B, cap, H, D, device="cuda", dtype=dtype).permute(0, 2, 1, 3)
        if layout == "pos-slot-head":   # (cap, B, H, D)
            return torch.empty(cap, B, H, D, device="cuda", dtype=dtype).permute(1, 2, 0, 3)
        raise ValueError(layout)
    caches = []
    for _ in range(L):
        k, v = make(), make()
        k.zero_(); v.zero_()
        caches.append((k, v))
    norms = attn.kernel_norms()
    n_keys = max(512, int(positions.max()) + 1)
    n_keys = 1 << (n_keys - 1).bit_length()
    def call(i):
        return kernel.decode_attention(qkv, *norms, rope, caches[i][0], caches[i][1], positions, n_keys, 16)
    us = microseconds_per_call(call, L)
    live = int(positions.sum() + B) * H * D * 2 * (2 if dtype == torch.bfloat16 else 1)
    print(f"{layout:14s} cap {cap:5d} pos {pos:5d} {str(dtype)[6:]:14s}: {us:6.1f} us/layer  {live/us/1e6:.2f} TB/s", flush=True)
    del caches; torch.cuda.empty_cache()

fp8 = sys.argv[1:] == ["fp8"]
for pos in (255, 511, -1000):
    if fp8:
        run("slot-head-pos", 4096, pos, torch.float8_e4m3fn)
        run("slot-head-pos", 1024, pos, torch.float8_e4m3fn)
        run("pos-slot-head", 4096, pos, torch.float8_e4m3fn)
    else:
        run("slot-head-pos", 4096, pos)
        run("slot-head-pos", 1024, pos)
        run("slot-pos-head", 4096, pos)
        run("pos-slot-head", 4096, pos)
