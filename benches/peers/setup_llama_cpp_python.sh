#!/usr/bin/env bash
# llama.cpp as an independent oracle for tests/convert/test_llama_cpp_oracle.py: llama-cpp-python built from its
# sdist on PyPI (the llama.cpp it vendors is the version `specrt bench --peers llama.cpp` builds, same cached sdist)
# into its own venv, CPU only and portable: GGML_NATIVE=OFF alone would still assume AVX2/FMA/F16C/BMI2
# (x86-64-v3), so those are off too (baseline x86-64; speed does not matter for tiny models); no llava/mtmd, no tools.
# The test imports llama_cpp only in a subprocess of this venv (tests/convert/llama_cpp_worker.py), never itself.
# Cached under <specrt cache>/llama-cpp-python/<version>/venv ($SPECRT_CACHE_DIR, default ~/.cache/specrt); a finished
# build (the marker file `built`) is reused. Prints the venv's python.
# Usage: bash benches/peers/setup_llama_cpp_python.sh [VERSION]   (about 10 minutes on 2 cores the first time)
set -euo pipefail
version="${1:-0.3.36}"
cache="${SPECRT_CACHE_DIR:-$HOME/.cache/specrt}"
root="$cache/llama-cpp-python/$version"
venv="$root/venv"
if [[ -f "$root/built" && -x "$venv/bin/python" ]]; then
  echo "$venv/bin/python"
  exit 0
fi
mkdir -p "$root"
# The sdist setup_llama_cpp.sh and tests/text/test_chat_template.py share.
sdist_dir="$cache/llama.cpp/$version"
sdist="$sdist_dir/llama_cpp_python-$version.tar.gz"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
if [[ ! -f "$sdist" ]]; then
  mkdir -p "$sdist_dir"
  # --no-binary for this package only: --no-binary=:all: would also build pip's build tools from source.
  "$venv/bin/pip" download --quiet --no-deps --no-binary=llama-cpp-python "llama-cpp-python==$version" -d "$sdist_dir"
fi
cmake_args=(
  -DGGML_NATIVE=OFF -DGGML_SSE42=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_BMI2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF
  -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF
  -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
)
CMAKE_ARGS="${cmake_args[*]}" \
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$venv/bin/pip" install --no-cache-dir "$sdist" >"$root/build.log" 2>&1 \
  || { tail -c 3000 "$root/build.log" >&2; exit 1; }
"$venv/bin/python" -c "import llama_cpp, numpy; print(llama_cpp.__version__)" >>"$root/build.log"
touch "$root/built"
echo "$venv/bin/python"
