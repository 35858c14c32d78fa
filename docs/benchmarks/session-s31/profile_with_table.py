"""profile_step.py with fused_linear launch settings per projection shape taken from a bench_fused_linear
--json sweep: the fastest setting of each shape among those with early_launch (`early`), without it
(`plain`), or either (`best`); `none` keeps main's Launch() everywhere.

    python profile_with_table.py bfl.json {early,plain,best,none} [profile_step arguments]
"""
import json, sys
sys.path.insert(0, "."); sys.path.insert(0, "scripts")
from engine.model import fused_linear as FL
from bench_fused_linear import SHAPES
import profile_step

sweep, kind, *rest = sys.argv[1:]
for case in json.load(open(sweep))["cases"]:
    depth, columns, _, gated, _ = SHAPES[case["shape"]]
    pick = [s for _, s in case["settings"] if kind == "best" or s["early_launch"] == (kind == "early")]
    if kind != "none":
        FL.TUNED[(depth, columns, gated)] = FL.Launch(**pick[0])
print("table:", {k: (v.block_n, v.block_k, v.num_warps, v.early_launch) for k, v in FL.TUNED.items()}, flush=True)
raise SystemExit(profile_step.main(rest))
