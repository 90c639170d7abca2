#!/usr/bin/env bash
# A separate virtual environment with torch + transformers for `specrt bench --peers hf` (Hugging Face assisted
# generation on the CPU). specrt itself never imports torch. Usage: bash benches/peers/setup_hf_venv.sh [DIR]
#
# On Linux x86_64 PyPI's torch is the CUDA build: this pulls the nvidia-* / cuda-* wheels too (about 5.6 GB
# installed, ~80 s here). It runs on a machine without a GPU (torch.cuda.is_available() is False); its CPU speed was
# not compared with the CPU-only build, which lives on PyTorch's own index (not reachable from our machines). Where that
# index is reachable this script takes the CPU-only build from there (about 200 MB).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${1:-$here/benches/out/venv-hf}"
python3 -m venv "$venv"
# The CPU-only torch first, where PyTorch's index is reachable; otherwise PyPI's (the CUDA build), said out loud.
if "$venv/bin/pip" install --quiet --timeout 15 --retries 0 torch --index-url https://download.pytorch.org/whl/cpu 2>/dev/null; then
  echo "torch: the CPU-only build from download.pytorch.org"
else
  echo "torch: PyTorch's CPU index is not reachable; installing PyPI's torch (the CUDA build, ~5.6 GB; runs on the CPU)"
  "$venv/bin/pip" install --quiet torch
fi
"$venv/bin/pip" install --quiet "transformers>=4.46" gguf numpy
"$venv/bin/python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
echo "$venv/bin/python"
