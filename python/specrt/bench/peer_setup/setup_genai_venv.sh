#!/usr/bin/env bash
# A separate virtual environment with onnxruntime-genai 0.18 (and the onnxruntime it pulls) for
# `specrt bench --peers genai`. specrt itself never imports it. Usage: bash setup_genai_venv.sh DIR
#
# Shipped in the specrt package (specrt/bench/peer_setup/); `specrt bench --setup-peer genai` runs it with DIR = the
# venv the bench looks for (benches/out/venv-genai in a checkout, <specrt cache>/bench/venv-genai when installed),
# as does a checkout's benches/peers/setup_genai_venv.sh.
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: bash $0 DIR (the venv to create; \`specrt bench --setup-peer genai\` picks the bench's default)" >&2
  exit 2
fi
venv="$1"
# Only a new or empty folder, or a venv already: `python3 -m venv` over another folder (/usr, say) takes it over.
if [[ -e "$venv" && ! -f "$venv/pyvenv.cfg" && -n "$(ls -A "$venv" 2>/dev/null)" ]]; then
  echo "$venv exists and is not a virtual environment: refusing to make a venv over it (pick a new DIR)" >&2
  exit 2
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet "onnxruntime-genai==0.18.*" numpy
# specrt's own runtime dependencies, for benches/bench_int4.py (which imports specrt from python/ in this venv)
"$venv/bin/pip" install --quiet tokenizers onnx gguf safetensors jinja2 tqdm
"$venv/bin/python" -c "import onnxruntime_genai as og, onnxruntime as ort; print('onnxruntime-genai', og.__version__, 'onnxruntime', ort.__version__)"
echo "$venv/bin/python"
