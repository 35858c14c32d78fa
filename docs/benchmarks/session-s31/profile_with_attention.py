"""profile_step.py with decode_attention's module settings replaced (NAME=VALUE before the profile_step
arguments), e.g. NUM_WARPS=2 ONE_ROW_SPLIT_KEYS=32.

    python profile_with_attention.py [NAME=VALUE ...] [profile_step arguments]
"""
import sys
sys.path.insert(0, "."); sys.path.insert(0, "scripts")
from engine.model import decode_attention as A
import profile_step

args = sys.argv[1:]
while args and "=" in args[0] and not args[0].startswith("-"):
    name, value = args.pop(0).split("=")
    assert hasattr(A, name), name
    setattr(A, name, int(value))
print("attention:", {k: getattr(A, k) for k in ("SPLIT_KEYS", "ONE_ROW_SPLIT_KEYS", "BLOCK_KEYS", "NUM_WARPS", "NUM_STAGES")}, flush=True)
raise SystemExit(profile_step.main(args))
