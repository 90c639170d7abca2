#!/usr/bin/env bash
# A separate virtual environment with torch + transformers for `specrt bench --peers hf` (Hugging Face assisted
# generation on the CPU). specrt itself never imports torch. Usage: bash benches/peers/setup_hf_venv.sh [DIR]
#
# On Linux x86_64 PyPI's torch is the CUDA build: this pulls the nvidia-* / cuda-* wheels too (about 5.6 GB
# installed, ~80 s here). It runs on a machine without a GPU (torch.cuda.is_available() is False) with the same CPU
# kernels as the CPU-only build, which lives on PyTorch's own index (not reachable from our machines). Where that
# index is reachable, `pip install torch --index-url https://download.pytorch.org/whl/cpu` first saves the space.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${1:-$here/benches/out/venv-hf}"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet torch "transformers>=4.46" gguf numpy
"$venv/bin/python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
echo "$venv/bin/python"
