"""Logit gap and decode speed of quantized conversions vs the fp32 one, per weight-storage plan.

Usage: python benches/quant_sweep.py GGUF FP32_FOLDER TAG [PLAN ...] (plans: see PLANS); writes /tmp/TAG_PLAN
folders and prints, per plan, max |dlogit|, top-1 agreement and mean KL(fp32 || plan) over three teacher-forced
prompts, and single-token decode ms through specrt._specrt.OrtModel.
"""

import sys
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from specrt import _specrt
from specrt._ort import find_ort_library
from specrt.convert import INT4_PLAN, INT8_PLAN, convert
from specrt.convert.weights import WeightPlan


def compare(ref_dir: Path, dirs: list[Path]) -> None:
    lib = find_ort_library()
    tok = Tokenizer.from_file(str(ref_dir / "tokenizer.json"))
    texts = [
        'def quicksort(arr):\n    """Sort a list in place."""\n    if len(arr) <= 1:\n        return arr\n'
        "    pivot = arr[len(arr) // 2]\n",
        "<|im_start|>user\nExplain what a mutex is in two paragraphs.<|im_end|>\n<|im_start|>assistant\n"
        "A mutex (mutual exclusion) is a synchronization primitive that",
        "The quick brown fox jumps over the lazy dog. " * 4,
    ]

    def logsm(x):
        x = x.astype(np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    for d in [ref_dir, *dirs]:
        m = _specrt.OrtModel(str(d), ort_library=lib, max_seq_len=512)
        outs = []
        for t in texts:
            # the model's own special tokens (Gemma's BOS; Qwen and SmolLM2 add none)
            ids = np.array(tok.encode(t).ids, np.int64)
            outs.append(m.forward(ids, 0, len(ids)).copy())
        if d == ref_dir:
            ref = outs
            print(d.name, "reference", [o.shape for o in ref])
            continue
        maxd = max(np.abs(a - b).max() for a, b in zip(outs, ref, strict=False))
        scale = max(np.abs(b).max() for b in ref)
        top1 = np.mean(np.concatenate([a.argmax(-1) == b.argmax(-1) for a, b in zip(outs, ref, strict=False)]))
        kl = np.mean(
            np.concatenate(
                [(np.exp(logsm(b)) * (logsm(b) - logsm(a))).sum(-1) for a, b in zip(outs, ref, strict=False)]
            )
        )
        # decode speed: 64 single-token steps after a 32-token prefill
        ids = np.array(tok.encode(texts[0], add_special_tokens=False).ids, np.int64)
        m.forward(ids, 0, 1)
        n = len(ids)
        t0 = time.perf_counter()
        steps = 64
        for i in range(steps):
            m.forward(np.array([int(ids[i % len(ids)])], np.int64), n + i, 1)
        dt = (time.perf_counter() - t0) / steps
        print(
            f"{d.name:20s} max|dlogit| {maxd:.3f} (logit scale {scale:.1f})  top1 agree {top1:.3f}  "
            f"mean KL {kl:.4f}  decode {1 / dt:.1f} tok/s ({dt * 1e3:.1f} ms)"
        )


src = sys.argv[1]
ref = sys.argv[2]
tag = sys.argv[3]
PLANS = {
    "all4_acc4": WeightPlan(attn="int4", mlp="int4", head="int4", embed="int4"),
    "all4_acc1": WeightPlan(attn="int4", mlp="int4", head="int4", embed="int4", accuracy_level=1),
    "mlp4_attn8_head8_emb8": WeightPlan(attn="int8", mlp="int4", head="int8", embed="int8"),
    "all8_acc4": WeightPlan(attn="int8", mlp="int8", head="int8", embed="int8"),
    "mlp4": WeightPlan(mlp="int4"),
    "attn4": WeightPlan(attn="int4"),
    "head4": WeightPlan(head="int4"),
    "emb4": WeightPlan(embed="int4"),
    "int4": INT4_PLAN,  # convert(dtype="int4")
    "int8": INT8_PLAN,  # convert(dtype="int8")
    "fp16": WeightPlan(dtype="fp16"),  # convert(dtype="fp16")
}
sel = sys.argv[4:] or list(PLANS)
outs = []
for k in sel:
    t = time.time()
    dtype = k if k in ("int4", "int8", "fp16") else "int4"
    convert(src, f"/tmp/{tag}_{k}", plan=PLANS[k], dtype=dtype, force=True, progress=False)
    print(k, "converted", round(time.time() - t, 1), flush=True)
    outs.append(f"/tmp/{tag}_{k}")
compare(Path(ref), [Path(o) for o in outs])
