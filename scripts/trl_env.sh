#!/usr/bin/env bash
# Build (or reuse) a separate virtual environment with TRL for benchmarks/vs_trl.py (#27). TRL is
# not a dependency of this project: the environment sees this one's packages (torch, transformers,
# the editable ftis_flwr, and TRL's own dependencies, which the project's already bring: accelerate
# through peft, pandas and pyarrow through datasets) through a site directory, also where this one
# is itself a virtual environment, and adds TRL alone (--no-deps: never a second, CUDA, torch).
#
#   scripts/trl_env.sh                 # build or reuse .venv/trl
#   .venv/trl/bin/python -m benchmarks.vs_trl --model smollm2 --repeats 3
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
"$PY" -m venv "$VENV"
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
VSITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "import site; site.addsitedir('$SITE')" > "$VSITE/ftis-parent-env.pth"
"$VENV/bin/pip" install -q --no-deps "$SPEC"
"$VENV/bin/python" -c "import trl, ftis_flwr; print('trl env: trl', trl.__version__, 'in $VENV')"
echo "$SPEC" > "$MARK"
