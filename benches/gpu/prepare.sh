#!/usr/bin/env bash
# Prepare, on a machine with network, what a GPU machine without network needs for benches/gpu/run_gpu_bench.sh:
# onnxruntime-gpu's libraries (xz, split into pieces small enough for one transfer each), the specrt extension built
# here (abi3: the GPU machine's Python 3.12 loads it; the Python sources travel with the working tree), the wheels the
# tree's code and tests import that the GPU image lacks (gguf; pytest, pytest-timeout, hypothesis and their
# dependencies), and a Qwen2.5 tokenizer for the random-weight models. Adapted from ../shared/tools/gpu/prepare.sh.
#
# Usage, from the project's root after a build that leaves python/specrt/_specrt.abi3.so (make install):
#   bash benches/gpu/prepare.sh [PIECE_MIB]     # default 56: leaves room for the working tree (~6 MB) in each transfer
# It writes .gpu1/ .. .gpuN/ at the project root (.gpu1: the small files and the provider's first bytes) and adds `/.gpu*/` to git's info/exclude: ignored folders never reach
# git, and travel to the GPU machine only when a transfer names them (they would exceed a transfer's 64 MiB if they
# travelled with every one). Send .gpu1 .. .gpuN in N back-to-back transfers (the machine is given back after ~30 s
# idle), each copying its folder into /tmp/c (`mkdir -p /tmp/c && cp -r .gpuI/* /tmp/c/`); the last one then runs
# `bash benches/gpu/run_gpu_bench.sh`. See benches/README.md, "GPU bench".
#
# Environment: ORT_GPU_VERSION (default 1.31.1, the build checked on the H200), SPECRT_GPU_CACHE (downloads, default
# ~/.cache/specrt-gpu), QWEN_TOKENIZER_DIR (a folder with tokenizer.json; default: ../shared/reference/tokenizers/
# qwen2.5-coder, else the converted Qwen2.5-Coder 1.5B in specrt's cache), PYTHON (default: .venv/bin/python).
set -euo pipefail
piece_mib=${1:-56}
root=$(git rev-parse --show-toplevel)
cache=${SPECRT_GPU_CACHE:-$HOME/.cache/specrt-gpu}
ort_version=${ORT_GPU_VERSION:-1.31.1}
py=${PYTHON:-$root/.venv/bin/python}
[[ -x $py ]] || py=python3
mkdir -p "$cache"
so=$root/python/specrt/_specrt.abi3.so
[[ -f $so ]] || { echo "no $so: build specrt first (make install)" >&2; exit 1; }

if [[ ! -f $cache/cuda-$ort_version.xz ]]; then
  echo "downloading onnxruntime-gpu $ort_version and compressing its libraries (a few minutes, once)"
  tmp=$(mktemp -d)
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$tmp" "onnxruntime-gpu==$ort_version"
  (cd "$tmp" && unzip -q -o onnxruntime_gpu-*.whl 'onnxruntime/capi/libonnxruntime.so.*' \
     'onnxruntime/capi/libonnxruntime_providers_cuda.so' 'onnxruntime/capi/libonnxruntime_providers_shared.so')
  capi=$tmp/onnxruntime/capi
  (cd "$capi" && sha256sum libonnxruntime_providers_cuda.so libonnxruntime.so.* libonnxruntime_providers_shared.so \
     > "$cache/SHA256SUMS-$ort_version")
  xz -T2 -9 -c "$capi/libonnxruntime.so.$ort_version" > "$cache/ort-$ort_version.xz"
  cp "$capi/libonnxruntime_providers_shared.so" "$cache/shared-$ort_version.so"
  xz -T2 -9 -c "$capi/libonnxruntime_providers_cuda.so" > "$cache/cuda-$ort_version.xz.tmp"
  mv "$cache/cuda-$ort_version.xz.tmp" "$cache/cuda-$ort_version.xz"
  rm -rf "$tmp"
fi

# Pure-Python wheels the GPU image lacks (it has numpy, onnx, tokenizers, safetensors, jinja2, tqdm), at the versions
# this checkout is tested with where the index has them.
pins=$("$py" - <<'EOF'
from importlib.metadata import PackageNotFoundError, version

names = ["gguf", "pytest", "pluggy", "iniconfig", "packaging", "pytest-timeout", "hypothesis", "attrs",
         "sortedcontainers"]
out = []
for name in names:
    try:
        out.append(f"{name}=={version(name)}")
    except PackageNotFoundError:
        out.append(name)
print(" ".join(out))
EOF
)

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu*/' "$exclude" 2>/dev/null || echo '/.gpu*/' >> "$exclude"
rm -rf "$root"/.gpu[0-9]*
# .gpu1: everything but the CUDA provider (the first call installs it and starts writing the random models in the
# background), then as much of the provider as fits; .gpu2 ..: the rest of the provider.
first=$root/.gpu1
mkdir -p "$first/wheels"
cp "$cache/ort-$ort_version.xz" "$first/ort.xz"
cp "$cache/shared-$ort_version.so" "$first/libonnxruntime_providers_shared.so"
cp "$cache/SHA256SUMS-$ort_version" "$first/SHA256SUMS"
wheel() { "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
            --platform any -d "$first/wheels" "$1"; }
for pin in $pins; do
  wheel "$pin" 2>/dev/null || { echo "no $pin wheel in the index: taking its latest"; wheel "${pin%%==*}"; }
done
cp "$so" "$first/_specrt.abi3.so"
tok=${QWEN_TOKENIZER_DIR:-}
if [[ -z $tok ]]; then
  for cand in "$root/../shared/reference/tokenizers/qwen2.5-coder" \
              "${SPECRT_CACHE_DIR:-$HOME/.cache/specrt}"/models/qwen2.5-coder-1.5b-instruct/*; do
    if [[ -f $cand/tokenizer.json ]]; then tok=$cand; break; fi
  done
fi
if [[ -n $tok ]]; then
  mkdir -p "$first/tok"
  for f in tokenizer.json tokenizer_config.json chat_template.jinja; do
    if [[ -f $tok/$f ]]; then cp "$tok/$f" "$first/tok/"; fi
  done
  echo "tokenizer: $tok"
else
  echo "no Qwen2.5 tokenizer found (QWEN_TOKENIZER_DIR): the bench will use a byte-level stand-in" >&2
fi
piece=$((piece_mib << 20))
small=$(du -sb "$first" | cut -f1)
head_bytes=$((piece - small))
(( head_bytes > 0 )) || { echo "PIECE_MIB $piece_mib is smaller than .gpu1's other files ($small bytes)" >&2; exit 1; }
parts=$(mktemp -d)
head -c "$head_bytes" "$cache/cuda-$ort_version.xz" > "$first/cuda.xz.part0"
tail -c +$((head_bytes + 1)) "$cache/cuda-$ort_version.xz" | split -b "$piece" -d -a 1 - "$parts/cuda.xz.rest"
n=1
for p in "$parts"/cuda.xz.rest*; do
  n=$((n + 1)); mkdir -p "$root/.gpu$n"; mv "$p" "$root/.gpu$n/cuda.xz.part$((n - 1))"
done
rm -rf "$parts"
du -sh "$root"/.gpu[0-9]*
echo "send .gpu1 .. .gpu$n in order (each: mkdir -p /tmp/c && cp -r .gpuI/* /tmp/c/); the first call also starts"
echo "the random models: ... && bash benches/gpu/run_gpu_bench.sh --background-models; the last call:"
echo "  mkdir -p /tmp/c && cp -r .gpu$n/* /tmp/c/ && bash benches/gpu/run_gpu_bench.sh"
