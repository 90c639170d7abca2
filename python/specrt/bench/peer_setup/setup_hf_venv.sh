#!/usr/bin/env bash
# A separate virtual environment with torch + transformers for `specrt bench --peers hf` (Hugging Face assisted
# generation on the CPU). specrt itself never imports torch. Usage: bash setup_hf_venv.sh DIR
#
# On Linux x86_64 PyPI's torch is the CUDA build: this pulls the nvidia-* / cuda-* wheels too (about 5.6 GB
# installed, ~80 s here). It runs on a machine without a GPU (torch.cuda.is_available() is False); its CPU speed was
# not compared with the CPU-only build, which lives on PyTorch's own index (not reachable from our machines). Where that
# index is reachable this script takes the CPU-only build from there (about 200 MB).
#
# Shipped in the specrt package (specrt/bench/peer_setup/); `specrt bench --setup-peer hf` runs it with DIR = the
# venv the bench looks for (benches/out/venv-hf in a checkout, <specrt cache>/bench/venv-hf when installed),
# as does a checkout's benches/peers/setup_hf_venv.sh.
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: bash $0 DIR (the venv to create; \`specrt bench --setup-peer hf\` picks the bench's default)" >&2
  exit 2
fi
venv="$1"
# Only a new or empty folder, or a venv already: `python3 -m venv` over another folder (/usr, say) takes it over.
if [[ -e "$venv" && ! -f "$venv/pyvenv.cfg" && -n "$(ls -A "$venv" 2>/dev/null)" ]]; then
  echo "$venv exists and is not a virtual environment: refusing to make a venv over it (pick a new DIR)" >&2
  exit 2
fi
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
