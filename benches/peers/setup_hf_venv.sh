#!/usr/bin/env bash
# A checkout's way to the hf peer's venv (`specrt bench --peers hf`): runs the setup script shipped in the
# package, python/specrt/bench/peer_setup/setup_hf_venv.sh (what `specrt bench --setup-peer hf` runs), with
# DIR defaulting to benches/out/venv-hf, where a bench run from a checkout looks.
# Usage: bash benches/peers/setup_hf_venv.sh [DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exec bash "$root/python/specrt/bench/peer_setup/setup_hf_venv.sh" "${1:-$root/benches/out/venv-hf}"
