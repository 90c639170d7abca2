#!/usr/bin/env bash
# A checkout's way to llama.cpp for `specrt bench --peers llama.cpp`: runs the setup script shipped in the package
# (python/specrt/bench/peer_setup/setup_llama_cpp.sh, what `specrt bench --setup-peer llama.cpp` runs), which builds
# into <specrt cache>/llama.cpp/<version>/build/bin. Usage: bash benches/peers/setup_llama_cpp.sh [VERSION]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exec bash "$root/python/specrt/bench/peer_setup/setup_llama_cpp.sh" "$@"
