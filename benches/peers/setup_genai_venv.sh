#!/usr/bin/env bash
# A separate virtual environment with onnxruntime-genai 0.18 (and the onnxruntime it pulls) for
# `specrt bench --peers genai`. specrt itself never imports it. Usage: bash benches/peers/setup_genai_venv.sh [DIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${1:-$here/benches/out/venv-genai}"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet "onnxruntime-genai==0.18.*" numpy
# specrt's own runtime dependencies, for benches/bench_int4.py (which imports specrt from python/ in this venv)
"$venv/bin/pip" install --quiet tokenizers onnx gguf safetensors jinja2 tqdm
"$venv/bin/python" -c "import onnxruntime_genai as og, onnxruntime as ort; print('onnxruntime-genai', og.__version__, 'onnxruntime', ort.__version__)"
echo "$venv/bin/python"
