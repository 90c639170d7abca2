#!/usr/bin/env bash
# `specrt bench --provider cuda` on the GPU machine (benches/README.md, "GPU bench"). Assembles onnxruntime-gpu's
# libraries from the pieces benches/gpu/prepare.sh made (copied into $GPU_PIECES, default /tmp/c, by the transfers
# before this one), installs the wheels that came with them, runs the GPU tests (tests/test_gpu.py and the gpu test of
# tests/test_bench_cuda.py), then the bench on random-weight models in the Qwen2.5-Coder shapes with settings that
# should take about 3 minutes on an H200 (an estimate: not yet run there; budget: 8). Uses the checkout it lies in:
# python/ (its extension from the pieces when the tree has none), tests/, benches/prompts.json. Extra arguments go to
# `specrt bench`.
#
# Writes $OUT/pytest.log, $OUT/bench.log, $OUT/gpu-bench.json (the report: README "GPU bench" says what is in it),
# then $OUT/profile.log and $OUT/profile-{target,draft}.json (benches/profile_step.py on the bench's models).
# Exit status: 0 when the tests and the bench passed, else the first failure's.
#
# Environment: OUT (default /tmp/gpu-out), GPU_PIECES, PYTHON (default python3), SPECRT_CACHE_DIR (default
# /tmp/specrt-cache: the random-weight models stay there while the machine is up), GPU_TEST_S / GPU_BENCH_S /
# GPU_PROFILE_S (time limits, default 150 / 420 / 60 s per model), GPU_BENCH_DRY=1 (a dry run of the same steps on
# this machine's CPU: no pieces, tiny shapes, --quick; checks the script, not the GPU).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
T=${GPU_PIECES:-/tmp/c}
OUT=${OUT:-/tmp/gpu-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
cd "$root"
export PYTHONUNBUFFERED=1 OUT SPECRT_CACHE_DIR=${SPECRT_CACHE_DIR:-/tmp/specrt-cache}

if [[ ${GPU_BENCH_DRY:-0} == 1 ]]; then
  export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
  bench_args=(--provider cpu --random-shapes tiny --quick --verify-ns 1-6 --threads 1)
else
  set -x
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  mkdir -p /tmp/ort /tmp/site
  ls -la "$T"
  unxz() { "$PY" -c "import lzma,sys,shutil; shutil.copyfileobj(lzma.LZMAFile(sys.stdin.buffer), sys.stdout.buffer, 1<<22)"; }
  ort_lib=$(awk '{print $2}' "$T/SHA256SUMS" | grep '^libonnxruntime.so')
  [[ -s /tmp/ort/libonnxruntime_providers_cuda.so ]] || cat "$T"/cuda.xz.part* | unxz > /tmp/ort/libonnxruntime_providers_cuda.so
  [[ -s /tmp/ort/$ort_lib ]] || unxz < "$T/ort.xz" > "/tmp/ort/$ort_lib"
  cp "$T/libonnxruntime_providers_shared.so" /tmp/ort/
  if ! (cd /tmp/ort && sha256sum -c "$T/SHA256SUMS"); then
    rm -f /tmp/ort/libonnxruntime_providers_cuda.so "/tmp/ort/$ort_lib"  # a later call reassembles them
    echo "onnxruntime-gpu libraries incomplete: a piece is missing (send every .gpuI first)" >&2
    exit 3
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$T"/wheels/*.whl
  [[ -f python/specrt/_specrt.abi3.so ]] || cp "$T/_specrt.abi3.so" python/specrt/
  # The image's CUDA 13 / cuDNN 9 libraries live in its Python packages (nvidia/*/lib): let the CUDA provider find them.
  NV=$("$PY" -c "import glob,site,os; print(':'.join(sorted({os.path.dirname(p) for sp in site.getsitepackages() for p in glob.glob(sp+'/nvidia/**/lib*.so*', recursive=True)})))")
  export LD_LIBRARY_PATH=$NV:/tmp/ort:${LD_LIBRARY_PATH:-}
  ldd /tmp/ort/libonnxruntime_providers_cuda.so | grep -i "not found"
  export SPECRT_ORT_LIBRARY=/tmp/ort/$ort_lib PYTHONPATH=/tmp/site:$root/python
  tok=()
  [[ -f $T/tok/tokenizer.json ]] && tok=(--random-tokenizer "$T/tok")
  bench_args=(--provider cuda --random-shapes qwen2.5-coder "${tok[@]}" --verify-repeats 10)
  set +x
fi

status=0
timeout "${GPU_TEST_S:-150}" "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py tests/test_bench_cuda.py \
  2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
# 5: every test deselected or skipped (no GPU in a dry run) is not a failure.
if [[ $rc != 0 && $rc != 5 ]]; then status=$rc; fi

timeout "${GPU_BENCH_S:-420}" "$PY" benches/bench_e2e.py "${bench_args[@]}" --prompts-file benches/prompts.json \
  --out-dir "$OUT" --name "${GPU_BENCH_NAME:-gpu-bench}" --no-progress "$@" 2>&1 | tee "$OUT/bench.log"
rc=${PIPESTATUS[0]}
if [[ $rc != 0 && $status == 0 ]]; then status=$rc; fi

# "Profile first" (the speed issue): where one step of the bench's random-weight target and draft goes (wall vs ONNX
# Runtime's run vs kernel events; 1 and K + 1 tokens on a 512-token cache), in the form the bench used.
if [[ ${GPU_BENCH_DRY:-0} == 1 ]]; then shapes=tiny-fp32 prov=cpu ctx=64; else shapes=qwen2.5-coder-fp16 prov=cuda ctx=512; fi
[[ " $* " == *" --cuda-graph "* ]] && shapes=$shapes-G
for m in target draft; do
  timeout "${GPU_PROFILE_S:-60}" "$PY" benches/profile_step.py "$SPECRT_CACHE_DIR/random/$shapes/$m" --provider "$prov" \
    --context "$ctx" --repeats 20 --json "$OUT/profile-$m.json" 2>&1 | tee -a "$OUT/profile.log"
  rc=${PIPESTATUS[0]}
  if [[ $rc != 0 && $status == 0 ]]; then status=$rc; fi
done
ls -la "$OUT"
echo "run_gpu_bench.sh: exit status $status (tests, bench, then profiles; 124 = a time limit)"
exit "$status"
