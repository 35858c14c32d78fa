#!/usr/bin/env bash
# Install what the tests need, then run them (CPU only; GPU tests skip without CUDA).
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

# OS tools: espeak-ng + sox make real test speech, ffmpeg encodes mp3/opus, chromium drives the UI test.
need=()
for tool in espeak-ng sox ffmpeg chromium; do command -v "$tool" >/dev/null || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    packages=(espeak-ng sox ffmpeg chromium chromium-driver)  # Debian's names; Ubuntu ships chromium as a snap
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null 2>&1; then
      for package in "${packages[@]}"; do  # one missing package fails them all: each on its own
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null 2>&1 \
          || echo "note: apt has no $package here; tests that need it are skipped" >&2
      done
    fi
  else
    echo "note: ${need[*]} not found; tests that need them are skipped (apt-get install espeak-ng sox ffmpeg chromium)" >&2
  fi
fi

python3 -m pip install -q -r requirements-dev.txt
exec python3 -m pytest -q "$@"
