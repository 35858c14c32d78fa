"""profile_step.py with fused-rows.diff applied and fused_linear.TUNED_ROWS filled from a bench_fused_linear
--rows JSON (the fastest setting of each shape):

    python profile_with_rows.py bfl.json [profile_step arguments]
"""
import json, sys
sys.path.insert(0, "."); sys.path.insert(0, "scripts")
from engine.model import fused_linear as F
import bench_fused_linear as B
import profile_step

report = json.load(open(sys.argv[1]))
for case in report["cases"]:
    depth, columns, _, gated, _ = B.SHAPES[case["shape"]]
    F.TUNED_ROWS[(depth, columns, gated)] = F.RowsLaunch(**case["best"])
print("rows settings:", F.TUNED_ROWS, flush=True)
raise SystemExit(profile_step.main(sys.argv[2:]))
