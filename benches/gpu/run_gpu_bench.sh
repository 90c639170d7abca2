#!/usr/bin/env bash
# The GPU machine's run (benches/README.md, "GPU bench"): one command per call, every check in priority order, each
# bounded in time, failures collected (the run goes on), a short table last. Assembles onnxruntime-gpu's libraries
# from the pieces benches/gpu/prepare.sh made (copied into $GPU_PIECES, default /tmp/c, by the calls before this one)
# and installs the wheels that came with them. Never imports the image's `onnxruntime` package: specrt loads the
# library itself (one ONNX Runtime per process) and preloads the image's CUDA / cuDNN libraries (nvidia/*/lib).
#
#   bash benches/gpu/run_gpu_bench.sh --background-models   # first call (after .gpu1): wheels, extension, then the
#                                                           # random-weight models written in the background (setsid)
#   bash benches/gpu/run_gpu_bench.sh                       # last call (after the last piece): the checks below
#
# Checks, in order (time limits in seconds, environment overrides):
#   1. one-ort (30)        a CUDA forward in a process where the image's onnxruntime is importable: no `onnxruntime`
#                          module and no onnxruntime_pybind11_state mapped afterwards, one libonnxruntime mapped
#   2. pytest (GPU_TEST_S=180)  tests/gpu/test_gpu.py and the gpu test of tests/gpu/test_bench_cuda.py (CUDA graphs included)
#   3. graph-speed (GPU_SPEED_S=160)  benches/gpu/graph_speed.py on the Qwen2.5-Coder 1.5B / 0.5B shapes: step costs
#                          with graphs off / on / on with ONNX Runtime copies, t(n), predictions, end-to-end runs
#   4. graph-speed-7b (GPU_7B_S=100)  the 7B target's costs and the prediction with the 0.5B draft's costs of step 3
#   5. bench-cuda-graph (GPU_BENCH_S=80)  `specrt bench --cuda-graph` on the random pair (--quick): runs to its end
# Writes (in $OUT, packed into $OUT/run.tgz on the GPU machine) NAME.log per check, graph-speed*.json,
# bench-cuda-graph.json, models.log, summary.txt. Exit status: the number of failed checks.
#
# Environment: OUT (default /tmp/gpu-out), GPU_PIECES, PYTHON (default python3), SPECRT_CACHE_DIR (default
# /tmp/specrt-cache: the random-weight models stay there while the machine is up), GPU_BENCH_DRY=1 (a dry run on this
# machine's CPU: no pieces, tiny shapes, the CPU mode of the graph steps; checks the script, not the GPU).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
T=${GPU_PIECES:-/tmp/c}
OUT=${OUT:-/tmp/gpu-out}
PY=${PYTHON:-python3}
DRY=${GPU_BENCH_DRY:-0}
# Logs and reports go to $L: $OUT itself in a dry run; on the GPU machine /tmp/gpu-run, packed into $OUT/run.tgz after
# every check (a call brings back at most 8 files, and what a call that ran out of time left under $OUT).
if [[ $DRY == 1 ]]; then L=$OUT; else L=/tmp/gpu-run; rm -rf "$L"; fi
mkdir -p "$OUT" "$L"
cd "$root"
export PYTHONUNBUFFERED=1 OUT L SPECRT_CACHE_DIR=${SPECRT_CACHE_DIR:-/tmp/specrt-cache}
if [[ $DRY == 1 ]]; then
  pair=tiny pair7=tiny prov=cpu
  export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
else
  pair=qwen2.5-coder pair7=qwen2.5-coder-7b prov=cuda
  export PYTHONPATH=/tmp/site:$root/python
fi

setup_python() {
  [[ $DRY == 1 ]] && return 0
  mkdir -p /tmp/site
  [[ -f /tmp/site/.done ]] || { "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
    "$T"/wheels/*.whl && touch /tmp/site/.done; }
  [[ -f python/specrt/_specrt.abi3.so ]] || cp "$T/_specrt.abi3.so" python/specrt/
}

write_models() {
  # The graph-form random pair (target, 0.5B draft, 4-layer truncated target), then the 7B target.
  local tok=()
  [[ -f $T/tok/tokenizer.json ]] && tok=(--tokenizer "$T/tok")
  "$PY" - "$pair" "$pair7" "$([[ $DRY == 1 ]] && echo fp32 || echo fp16)" "${tok[@]}" <<'EOF'
import sys, time
from specrt.bench.random_models import ensure_random_models
pair, pair7, dtype = sys.argv[1:4]
tok = sys.argv[5] if len(sys.argv) > 5 else None
for name in dict.fromkeys([pair, pair7]):
    t0 = time.time()
    m = ensure_random_models(name, dtype, attention="gqa-graph", tokenizer=tok, log=lambda s: print(s, flush=True))
    print(f"{name}: ready in {time.time() - t0:.0f} s at {m.root}", flush=True)
    (m.root / "READY").write_text("ok")
EOF
}

if [[ ${1:-} == --background-models ]]; then
  setup_python || exit 1
  if [[ $DRY == 1 ]]; then write_models > "$L/models.log" 2>&1; exit $?; fi
  export -f write_models; export PY T DRY pair pair7
  setsid nohup bash -c write_models > /tmp/models.log 2>&1 < /dev/null &
  echo $! > /tmp/models.pid
  echo "writing the random models in the background (log: /tmp/models.log)"
  exit 0
fi

if [[ $DRY != 1 ]]; then
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  mkdir -p /tmp/ort
  unxz() { "$PY" -c "import lzma,sys,shutil; shutil.copyfileobj(lzma.LZMAFile(sys.stdin.buffer), sys.stdout.buffer, 1<<22)"; }
  ort_lib=$(awk '{print $2}' "$T/SHA256SUMS" | grep '^libonnxruntime.so')
  [[ -s /tmp/ort/libonnxruntime_providers_cuda.so ]] || cat $(ls "$T"/cuda.xz.part* | sort -V) | unxz > /tmp/ort/libonnxruntime_providers_cuda.so
  [[ -s /tmp/ort/$ort_lib ]] || unxz < "$T/ort.xz" > "/tmp/ort/$ort_lib"
  cp "$T/libonnxruntime_providers_shared.so" /tmp/ort/
  if ! (cd /tmp/ort && sha256sum -c "$T/SHA256SUMS"); then
    rm -f /tmp/ort/libonnxruntime_providers_cuda.so "/tmp/ort/$ort_lib"  # a later call reassembles them
    echo "onnxruntime-gpu libraries incomplete: a piece is missing (send every .gpuI first)" >&2
    exit 100
  fi
  setup_python || exit 101
  export SPECRT_ORT_LIBRARY=/tmp/ort/$ort_lib
  "$PY" -c "import onnxruntime; print('the image has onnxruntime', onnxruntime.__version__, '(specrt must not import it)')" || true
fi

declare -a names=() results=()
pack() { [[ $DRY == 1 ]] || tar czf "$OUT/run.tgz" -C "$L" . 2>/dev/null; }
check() {  # check NAME SECONDS CMD...: run bounded, log to $L/NAME.log, record the result
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "=== $name (limit ${limit} s)"
  if [[ $(type -t "$1") == function ]]; then
    timeout "$limit" bash -c "$1" > "$L/$name.log" 2>&1
  else
    timeout "$limit" "$@" > "$L/$name.log" 2>&1
  fi
  local rc=$?
  tail -n 25 "$L/$name.log"
  names+=("$name"); results+=("rc=$rc $((SECONDS - t0))s")
  [[ $DRY == 1 ]] || cp /tmp/models.log "$L/" 2>/dev/null
  pack
  return 0
}

one_ort() {
  "$PY" - "$prov" <<'EOF'
import sys
import numpy as np
import tempfile, pathlib
from specrt import _specrt
from specrt._ort import find_ort_library
from specrt.convert import convert
from specrt.convert.tiny import write_tiny_gguf
prov = sys.argv[1]
lib = find_ort_library(prov)
d = pathlib.Path(tempfile.mkdtemp())
m = convert(write_tiny_gguf(d / "t.gguf", arch="qwen2", seed=3), d / "m", dtype="fp16" if prov == "cuda" else "fp32",
            progress=False)
model = _specrt.OrtModel(m, ort_library=lib, provider=prov, max_seq_len=64)
print("providers", model.providers, "logits", np.asarray(model.forward(list(range(1, 9)), 0, 1)).shape)
maps = pathlib.Path("/proc/self/maps").read_text()
libs = sorted({line.split()[-1] for line in maps.splitlines() if "libonnxruntime.so" in line})
bad = [k for k in sys.modules if k == "onnxruntime" or k.startswith("onnxruntime.")]
print("libonnxruntime mapped:", libs, "| onnxruntime modules:", bad, "| pybind state mapped:",
      "onnxruntime_pybind11_state" in maps)
assert not bad and "onnxruntime_pybind11_state" not in maps and len(libs) == 1
EOF
}

export -f one_ort write_models
export PY T DRY pair pair7 prov
check one-ort 30 one_ort
if [[ $DRY != 1 && ${results[0]} != rc=0* ]]; then
  # specrt's own preload (specrt._ort.preload_cuda_dlls) did not make CUDA work: put the image's CUDA / cuDNN
  # folders on LD_LIBRARY_PATH for the other checks, so that they still measure something (the summary says so).
  NV=$("$PY" -c "import glob,site,os; print(':'.join(sorted({os.path.dirname(p) for sp in site.getsitepackages() for p in glob.glob(sp+'/nvidia/**/lib*.so*', recursive=True)})))")
  export LD_LIBRARY_PATH=$NV:${LD_LIBRARY_PATH:-}
  names+=("LD_LIBRARY_PATH fallback"); results+=("rc=1 (specrt's preload failed; later checks ran with it)")
fi
if [[ $DRY == 1 ]]; then
  check pytest "${GPU_TEST_S:-180}" "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gpu.py tests/gpu/test_bench_cuda.py
else
  check pytest "${GPU_TEST_S:-180}" "$PY" -m pytest -m gpu -q -p no:cacheprovider -x --timeout 120 tests/gpu/test_gpu.py \
    tests/gpu/test_bench_cuda.py
fi
wait_ready() {  # wait until the background writer marked a pair ready (bounded by the check's limit)
  # (or until the writer is gone: graph_speed.py then writes what is missing itself, or fails naming it)
  local dir=$SPECRT_CACHE_DIR/random/$1-$2-G
  until [[ -f $dir/READY ]] || ! kill -0 "$(cat /tmp/models.pid 2>/dev/null)" 2>/dev/null; do sleep 2; done
}
dt=$([[ $DRY == 1 ]] && echo fp32 || echo fp16)
[[ $DRY == 1 && ! -f $SPECRT_CACHE_DIR/random/$pair-$dt-G/READY ]] && write_models > "$L/models.log" 2>&1
tok=()
[[ -f $T/tok/tokenizer.json ]] && tok=(--tokenizer "$T/tok")
export tok_dir=${tok[1]:-}
speed() { wait_ready "$pair" "$dt" && "$PY" benches/gpu/graph_speed.py --pair "$pair" --provider "$prov" \
  ${tok_dir:+--tokenizer "$tok_dir"} --json "$L/graph-speed.json"; }
export -f wait_ready speed
export dt
check graph-speed "${GPU_SPEED_S:-160}" speed
speed7() { wait_ready "$pair7" "$dt" && "$PY" benches/gpu/graph_speed.py --pair "$pair7" --provider "$prov" \
  ${tok_dir:+--tokenizer "$tok_dir"} --target-only --draft-costs "$L/graph-speed.json" --json "$L/graph-speed-7b.json"; }
export -f speed7
check graph-speed-7b "${GPU_7B_S:-100}" speed7
bench_args=(--provider "$prov" --random-shapes "$pair" --quick --no-progress --out-dir "$L" --name bench-cuda-graph)
[[ $DRY != 1 ]] && bench_args+=(--cuda-graph)
[[ -n $tok_dir ]] && bench_args+=(--random-tokenizer "$tok_dir")
[[ $DRY == 1 ]] && bench_args+=(--threads 1 --verify-ns 1-6)
check bench-cuda-graph "${GPU_BENCH_S:-80}" "$PY" benches/bench_e2e.py "${bench_args[@]}" --prompts-file benches/prompts.json

failed=0
for r in "${results[@]}"; do [[ $r == rc=0* ]] || failed=$((failed + 1)); done
{
  echo "| check | result |"
  echo "|---|---|"
  for i in "${!names[@]}"; do echo "| ${names[$i]} | ${results[$i]} |"; done
  grep -h "^| " "$L/graph-speed.log" "$L/graph-speed-7b.log" 2>/dev/null
  grep -h -E "passed|failed" "$L/pytest.log" 2>/dev/null | tail -n 2
} | tee "$L/summary.txt"
[[ $DRY == 1 ]] || cp "$L/summary.txt" "$OUT/"
pack
exit "$failed"
