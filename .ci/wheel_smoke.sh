#!/usr/bin/env bash
# Check the built wheel as a user without Rust would use it (issue: "a wheel that installs without Rust"):
#   1. auditwheel: the wheel is consistent with a manylinux tag of glibc 2.28 or older, and is tagged so;
#   2. a clean virtual environment with no Rust toolchain on PATH installs it with the CPU extra from PyPI;
#   3. `specrt generate` there answers a question with SmolLM2-135M (pulled into ~/.cache/specrt once).
# Usage: .ci/wheel_smoke.sh dist/specrt-*.whl   (run from the repository root; `make wheel` builds the wheel)
set -euo pipefail
wheel=$(realpath "$1")
venv=${WHEEL_SMOKE_VENV:-/tmp/specrt-wheel-smoke}

echo "--- auditwheel show $(basename "$wheel")"
report=$(.venv/bin/auditwheel show "$wheel")
echo "$report"
tag=$(echo "$report" | tr '\n' ' ' | sed -n 's/.*consistent with the following platform tag: *"\(manylinux_[0-9]*_[0-9]*_x86_64\)".*/\1/p')
[[ -n "$tag" ]] || { echo "auditwheel found no manylinux tag" >&2; exit 1; }
minor=$(echo "$tag" | cut -d_ -f3)
major=$(echo "$tag" | cut -d_ -f2)
if (( major != 2 || minor > 28 )); then echo "platform tag $tag is newer than manylinux_2_28" >&2; exit 1; fi
[[ "$(basename "$wheel")" == *"-abi3-${tag}.whl" || "$(basename "$wheel")" == *"-abi3-manylinux_2_"*"_x86_64.whl" ]] \
  || { echo "wheel file name is not an abi3 manylinux wheel: $(basename "$wheel")" >&2; exit 1; }

echo "--- clean venv $venv, no Rust on PATH"
rm -rf "$venv"
python3 -m venv "$venv"
clean_path="$venv/bin:/usr/local/bin:/usr/bin:/bin"
run() { env -i HOME="$HOME" PATH="$clean_path" LANG=C.UTF-8 ${SPECRT_CACHE_DIR:+SPECRT_CACHE_DIR="$SPECRT_CACHE_DIR"} "$@"; }
if run bash -c 'command -v cargo || command -v rustc'; then echo "Rust is on the clean PATH" >&2; exit 1; fi
run "$venv/bin/python" -m pip install -q --upgrade pip
run "$venv/bin/python" -m pip install -q "${wheel}[cpu]"
run "$venv/bin/python" -c "import specrt, specrt._specrt, sys; print('specrt', specrt.__version__, 'from', specrt.__file__)"

echo "--- specrt generate (SmolLM2-135M, greedy, speculative with itself as the draft)"
out=$(cd /tmp && run "$venv/bin/specrt" generate --target smollm2-135m-instruct --draft smollm2-135m-instruct --chat \
  --prompt "What is the capital of France? Answer in one word." --max-new-tokens 16 --temperature 0 \
  --num-speculative-tokens 4 --stats)
echo "$out"
grep -qi "paris" <<<"$out" || { echo "the answer does not name Paris" >&2; exit 1; }
echo "wheel smoke test passed"
