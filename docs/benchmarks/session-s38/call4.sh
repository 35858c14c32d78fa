python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
timeout 200 python .s38/kv_layout.py 2>&1 | grep -v Warn
(cd .fp8 && timeout 150 python kv_layout.py fp8 2>&1 | grep -v Warn)
date -u
