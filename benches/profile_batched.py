"""Per-operator time of one pass of a model folder on ONNX Runtime's CPU provider (its profiler), for the batched
layout (``-B`` folders: B rows on ragged caches) and the GQA layout alike.

    python benches/profile_batched.py MODEL_FOLDER --batch 4 --tokens 5            # a 4-row, 5-token pass
    python benches/profile_batched.py MODEL_FOLDER --batch 1 --tokens 256 --logits 1

Feeds B rows of ``--tokens`` new tokens each on caches of capacity ``--capacity`` (640) with past lengths 60, 100,
420, 80, 200, 50, 300, 120 (the first B; batch 1 uses 60), random small cache values (timing does not depend on
them), ``num_logits_to_keep`` = ``--logits`` (0 = every position; the verification pass keeps all K + 1).
Prints the wall time per pass (mean of ``--repeats`` after 3 warm-up passes, the profiler on) and the summed kernel
time per operator type per pass. Used in benches/RESULTS.md ("Batched rounds ... where B = 4 stops").
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort  # its own CPU sessions only: no specrt session in this process (one ONNX Runtime per process)

PAST = [60, 100, 420, 80, 200, 50, 300, 120]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path, help="model folder (model.onnx inside), or an .onnx file (e.g. prefill.onnx)")
    ap.add_argument("--batch", type=int, default=4, help="rows (batched layout; 1 for a GQA model)")
    ap.add_argument("--tokens", type=int, default=1, help="new tokens per row")
    ap.add_argument("--logits", type=int, default=0, help="num_logits_to_keep (0 = all positions)")
    ap.add_argument("--capacity", type=int, default=640, help="KV capacity per row")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if not 1 <= a.batch <= len(PAST) or a.tokens < 1 or a.repeats < 1 or not 0 <= a.logits <= a.tokens:
        ap.error("expected 1 <= --batch <= 8, --tokens >= 1, --repeats >= 1, 0 <= --logits <= --tokens")
    b, s = a.batch, a.tokens
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "trace")
        so.log_severity_level = 3
        model_file = a.model if a.model.suffix == ".onnx" else a.model / "model.onnx"
        sess = ort.InferenceSession(str(model_file), so, providers=["CPUExecutionProvider"])
        past = np.array(PAST[:b], dtype=np.int64)
        rng = np.random.default_rng(0)
        feeds: dict[str, np.ndarray] = {}
        for i in sess.get_inputs():
            if i.name == "input_ids":
                feeds[i.name] = np.full((b, s), 100, np.int64)
            elif i.name == "positions":
                feeds[i.name] = past[:, None] + np.arange(s)[None, :]
            elif i.name == "past_lengths":
                feeds[i.name] = past
            elif i.name.startswith("past_key_values"):
                shape = [b if d == "batch_size" else a.capacity if d == "max_sequence_length" else d for d in i.shape]
                feeds[i.name] = (rng.random(shape) * 0.1).astype(np.float32)
            else:
                ap.error(f"input {i.name} {i.shape} is not one of the batched contract's (use a -B folder)")
        if any(o.name == "num_logits_to_keep" for o in sess.get_overridable_initializers()):
            feeds["num_logits_to_keep"] = np.array(a.logits, np.int64)
        for _ in range(3):
            sess.run(None, feeds)
        t0 = time.perf_counter()
        for _ in range(a.repeats):
            sess.run(None, feeds)
        wall = (time.perf_counter() - t0) / a.repeats * 1e3
        events = json.loads(Path(sess.end_profiling()).read_text())
    per_op: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"]
    runs = 3 + a.repeats
    print(f"B={b} S={s} logits={a.logits or s}: wall {wall:.1f} ms, kernels {sum(per_op.values()) / runs / 1e3:.1f} ms")
    for op, us in per_op.most_common(12):
        print(f"  {op:34s} {us / runs / 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
