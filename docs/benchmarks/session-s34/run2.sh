# Run 2: attend_and_project at 16 warps (128 registers a thread, two programs an SM), 8 and 16 columns a program.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
profile() {
  local tree=$1; shift
  (cd $tree && timeout 60 python scripts/profile_step.py --weights random --frames 40 "$@") > /tmp/ps.txt 2>&1
  echo "$* $tree rc $? $(grep graphed /tmp/ps.txt) | $(grep -E '_attend|_fused_linear|_merge' /tmp/ps.txt | tr -s ' ' | tr '\n' ' ')"
}
for tree in .w16 .w16b16 .w16 .w16b16; do profile $tree; done
