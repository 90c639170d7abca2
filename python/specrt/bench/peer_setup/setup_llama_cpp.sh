#!/usr/bin/env bash
# llama.cpp as a peer of `specrt bench --peers llama.cpp`: built from the llama.cpp source vendored in
# llama-cpp-python's sdist on PyPI (no other network), with cmake and ninja from PyPI, cached under
# <specrt cache>/llama.cpp/<version> (the cache is $SPECRT_CACHE_DIR, default ~/.cache/specrt, as specrt's).
# Prints the folder holding llama-bench, llama-speculative-simple, llama-server (the serving peer of
# benches/bench_serve_peers.py and benches/bench_structured.py) and llama-completion (the peer's target-only
# fallback where `llama-bench -d` fails; llama-cli in llama.cpp versions without llama-completion).
# Usage: bash setup_llama_cpp.sh [VERSION]   (about 8-10 minutes on 2 cores the first time)
# Shipped in the specrt package (specrt/bench/peer_setup/); `specrt bench --setup-peer llama.cpp` runs it, as does a
# checkout's benches/peers/setup_llama_cpp.sh.
set -euo pipefail
version="${1:-0.3.36}"
# SPECRT_CACHE: the name this script read before it followed specrt's SPECRT_CACHE_DIR.
root="${SPECRT_CACHE_DIR:-${SPECRT_CACHE:-$HOME/.cache/specrt}}/llama.cpp/$version"
bin="$root/build/bin"
# The instruction sets: GGML_NATIVE (-march=native), except on CPUs with AMX, where llama.cpp's AMX matrix product
# (ggml_backend_amx_mul_mat, chosen for Q4_K weights when AMX is compiled in) crashed with SIGSEGV on the first
# pass of Qwen2.5-Coder-1.5B Q4_K_M (2-core Xeon VM with amx_int8, 2026-12-05; --no-repack avoided it at half the
# speed): there the same native set is named flag by flag, AMX left out, so the AVX-512 repacked kernels run.
flavour=native
isa=(-DGGML_NATIVE=ON)
if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
  flavour=native-without-amx
  isa=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  for pair in sse4_2:SSE42 f16c:F16C fma:FMA bmi2:BMI2 avx:AVX avx2:AVX2 avx_vnni:AVX_VNNI avx512f:AVX512 \
              avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    if grep -qw "${pair%%:*}" /proc/cpuinfo; then isa+=("-DGGML_${pair##*:}=ON"); else isa+=("-DGGML_${pair##*:}=OFF"); fi
  done
fi
if [[ -x "$bin/llama-bench" && -x "$bin/llama-speculative-simple" && -x "$bin/llama-server" \
      && ( -x "$bin/llama-completion" || -x "$bin/llama-cli" ) \
      && "$(cat "$root/build/specrt-flavour" 2>/dev/null || echo native)" == "$flavour" ]]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$root"
tools="$root/tools"
[[ -x "$tools/bin/cmake" ]] || { python3 -m venv "$tools" && "$tools/bin/pip" install --quiet cmake ninja; }
sdist="$root/llama_cpp_python-$version.tar.gz"
if [[ ! -f "$sdist" ]]; then
  # --no-binary for this package only: --no-binary=:all: would also build pip's build tools from source.
  "$tools/bin/pip" download --quiet --no-deps --no-binary=llama-cpp-python "llama-cpp-python==$version" -d "$root"
fi
src="$root/src"
if [[ ! -f "$src/CMakeLists.txt" ]]; then
  rm -rf "$src" "$root/extract"
  mkdir -p "$root/extract"
  tar -xzf "$sdist" -C "$root/extract" "llama_cpp_python-$version/vendor/llama.cpp"
  mv "$root/extract/llama_cpp_python-$version/vendor/llama.cpp" "$src"
  rm -f "$src/.git"  # a submodule pointer into the sdist's missing .git/modules
  rm -rf "$root/extract"
fi
PATH="$tools/bin:$PATH" cmake -S "$src" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON \
  "${isa[@]}" >"$root/cmake.log"
PATH="$tools/bin:$PATH" ninja -C "$root/build" llama-bench llama-speculative-simple llama-server >"$root/ninja.log"
# The target-only fallback: llama-completion, or llama-cli where this llama.cpp predates llama-completion.
PATH="$tools/bin:$PATH" ninja -C "$root/build" llama-completion >>"$root/ninja.log" 2>&1 \
  || PATH="$tools/bin:$PATH" ninja -C "$root/build" llama-cli >>"$root/ninja.log" 2>&1 \
  || echo "neither llama-completion nor llama-cli built (see $root/ninja.log): no target-only fallback" >&2
echo "$flavour" >"$root/build/specrt-flavour"
echo "$bin"
