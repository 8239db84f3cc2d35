#!/usr/bin/env bash
# Hold the vLLM engine's calls to the source of the released vLLM 0.33.0 (tests/test_vllm_source.py):
# fetch the wheel once (no dependencies, 336 MB, from the package registry), keep its Python files
# (55 MB) in the cache, drop the wheel, run the test file. Nothing of vLLM is installed or imported.
#
#   scripts/vllm_source.sh              # fetch if needed, then test
#   scripts/vllm_source.sh --no-test    # fetch only
#
# Environment: FTIS_VLLM_SOURCE (default ~/.cache/ftis-flwr/vllm-0.33.0), the folder the test reads.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.33.0
export FTIS_VLLM_SOURCE=${FTIS_VLLM_SOURCE:-$HOME/.cache/ftis-flwr/vllm-$VERSION}
MARK="$FTIS_VLLM_SOURCE/.complete"
if [[ -f "$MARK" ]]; then
  echo "vllm source: reusing $FTIS_VLLM_SOURCE"
else
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "vllm source: fetching vllm==$VERSION (wheel only, no dependencies)"
  python -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "vllm==$VERSION"
  rm -rf "$FTIS_VLLM_SOURCE"
  mkdir -p "$FTIS_VLLM_SOURCE"
  python - "$tmp" "$FTIS_VLLM_SOURCE" <<'PY'
import sys, zipfile
from pathlib import Path
wheel = next(Path(sys.argv[1]).glob("vllm-*.whl"))
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")]
    z.extractall(sys.argv[2], members=names)
print(f"vllm source: {len(names)} Python files from {wheel.name}")
PY
  echo "$VERSION" > "$MARK"
fi
if [[ "${1:-}" != "--no-test" ]]; then
  python -m pytest -q tests/test_vllm_source.py
fi
