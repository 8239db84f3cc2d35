#!/usr/bin/env bash
# Build (or reuse) a separate virtual environment with TRL for benchmarks/vs_trl.py (#27). TRL is
# not a dependency of this project: the environment sees this one's packages (torch, transformers,
# the editable ftis_flwr) through --system-site-packages and adds only TRL and what it pulls.
#
#   scripts/trl_env.sh                 # build or reuse .venv/trl
#   .venv/trl/bin/python benchmarks/vs_trl.py --model smollm2 --repeats 3
#
# Environment: TRL_VENV (default .venv/trl), PYTHON (default python3.11 or python3).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TRL_VENV:-.venv/trl}
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
SPEC="trl==1.16.0"
MARK="$VENV/.ftis-complete"
if [[ -f "$MARK" && "$(cat "$MARK")" == "$SPEC" ]] && "$VENV/bin/python" -c "import trl, ftis_flwr" 2>/dev/null; then
  echo "trl env: reusing $VENV"
  exit 0
fi
"$PY" -c "import torch, transformers, ftis_flwr" || {
  echo "trl env: install this project first (the README's first line), then run this script" >&2; exit 2; }
rm -rf "$VENV"
"$PY" -m venv --system-site-packages "$VENV"
"$VENV/bin/pip" install -q "$SPEC"
"$VENV/bin/python" -c "import trl, ftis_flwr; print('trl env: trl', trl.__version__, 'in $VENV')"
echo "$SPEC" > "$MARK"
