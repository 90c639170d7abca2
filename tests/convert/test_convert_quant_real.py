"""int4 / int8 / fp16 conversions of real models stay close to their fp32 conversion, run through specrt's own
ONNX Runtime backend (``specrt._specrt.OrtModel``, the Rust shared-KV-buffer path).

Measured gaps (benches/RESULTS.md "int4 / fp16 conversion"; three prompts, every position, teacher-forced):
SmolLM2-135M (Q4_1 GGUF) int4: top-1 agreement ~0.7, mean KL ~0.45 (a 135M model whose GGUF is already 4-bit
loses much to a second 4-bit rounding); int8: ~0.99 / ~0.005; fp16: 1.0 / <1e-4. Qwen2.5-Coder int4: 0.5B (Q5_0 /
Q8_0 GGUF) ~0.88 / ~0.07, 1.5B (Q4_K_M) ~0.97 / ~0.06. The thresholds below leave room around those figures so
that only a real regression fails.

SmolLM2 runs in CI (``model``); the Qwen pair is ``model`` + ``slow`` + ``qwen`` (``SPECRT_TEST_QWEN=1``).
"""

from __future__ import annotations

import numpy as np
import pytest

TEXTS = [
    'def quicksort(arr):\n    """Sort a list in place."""\n    if len(arr) <= 1:\n        return arr\n',
    "<|im_start|>user\nExplain what a mutex is in two paragraphs.<|im_end|>\n<|im_start|>assistant\nA mutex is",
    "The quick brown fox jumps over the lazy dog. " * 3,
]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def logit_gap(name: str, dtype: str) -> dict[str, float]:
    """Teacher-forced comparison of ``dtype`` with fp32 on :data:`TEXTS`: every position's logits.

    Returns:
        ``top1`` (fraction of positions with the same argmax), ``kl`` (mean KL(fp32 || dtype) in nats),
        ``max_abs`` (largest logit difference), ``logit_scale`` (largest |fp32 logit|).
    """
    from tokenizers import Tokenizer

    from specrt import _specrt, models
    from specrt._ort import find_ort_library

    ref_dir, dir_ = models.pull(name, "fp32", progress=False), models.pull(name, dtype, progress=False)
    tok = Tokenizer.from_file(str(ref_dir / "tokenizer.json"))
    lib = find_ort_library()
    ref_model = _specrt.OrtModel(str(ref_dir), ort_library=lib, max_seq_len=256)
    model = _specrt.OrtModel(str(dir_), ort_library=lib, max_seq_len=256)
    top1, kl, max_abs, scale = [], [], 0.0, 0.0
    for text in TEXTS:
        ids = np.array(tok.encode(text, add_special_tokens=False).ids, np.int64)
        ref = ref_model.forward(ids, 0, len(ids)).copy()  # [S, vocab] float32
        got = model.forward(ids, 0, len(ids)).copy()
        assert got.dtype == np.float32 and got.shape == ref.shape and np.isfinite(got).all()
        top1.append(got.argmax(-1) == ref.argmax(-1))
        lp_ref, lp = _log_softmax(ref), _log_softmax(got)
        kl.append((np.exp(lp_ref) * (lp_ref - lp)).sum(-1))
        max_abs, scale = max(max_abs, float(np.abs(got - ref).max())), max(scale, float(np.abs(ref).max()))
    out = {
        "top1": float(np.concatenate(top1).mean()),
        "kl": float(np.concatenate(kl).mean()),
        "max_abs": max_abs,
        "logit_scale": scale,
    }
    print(f"{name} {dtype} vs fp32: " + ", ".join(f"{k} {v:.4f}" for k, v in out.items()))
    return out


@pytest.mark.model
@pytest.mark.parametrize(
    ("dtype", "min_top1", "max_kl"), [("int4", 0.6, 0.8), ("int8", 0.95, 0.02), ("fp16", 0.99, 1e-3)]
)
def test_smollm2_quantized_logits_stay_close_to_fp32(dtype: str, min_top1: float, max_kl: float) -> None:
    gap = logit_gap("smollm2-135m-instruct", dtype)
    assert gap["top1"] >= min_top1 and gap["kl"] <= max_kl, gap


@pytest.mark.model
def test_smollm2_int4_and_fp16_cache_prefill_plus_chunk_equals_one_prefill() -> None:
    from tokenizers import Tokenizer

    from specrt import _specrt, models
    from specrt._ort import find_ort_library

    for dtype, tol in (("int4", 0.05), ("fp16", 0.1)):
        folder = models.pull("smollm2-135m-instruct", dtype, progress=False)
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        ids = np.array(tok.encode(TEXTS[0], add_special_tokens=False).ids, np.int64)
        lib = find_ort_library()
        full = _specrt.OrtModel(str(folder), ort_library=lib, max_seq_len=128).forward(ids, 0, len(ids)).copy()
        m = _specrt.OrtModel(str(folder), ort_library=lib, max_seq_len=128)
        m.forward(ids[:10], 0, 10)
        chunk = m.forward(ids[10:14], 10, 4).copy()  # a verify of 3 drafts + 1 on top of the cache
        np.testing.assert_allclose(chunk, full[10:14], atol=tol)
        m.forward(np.array([7, 8, 9], np.int64), 14, 1)  # tokens to be rolled back
        again = m.forward(ids[12:], 12, len(ids) - 12).copy()  # rollback to 12: as if never seen
        np.testing.assert_allclose(again, full[12:], atol=tol)


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.qwen
@pytest.mark.parametrize(
    ("name", "min_top1"), [("qwen2.5-coder-0.5b-instruct", 0.8), ("qwen2.5-coder-1.5b-instruct", 0.9)]
)
def test_qwen_int4_logits_stay_close_to_fp32(name: str, min_top1: float) -> None:
    from specrt import models

    try:
        gap = logit_gap(name, "int4")
    except (models.PackageUnavailableError, models.DownloadError) as e:
        pytest.skip(f"Qwen pair unavailable on PyPI ({e})")
    assert gap["top1"] >= min_top1 and gap["kl"] <= 0.15, gap
