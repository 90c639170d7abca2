"""The CUDA path on a GPU: every allocator and binding choice of ``MemoryPlan`` for CUDA runs here.

Marked ``gpu``; each test skips unless the installed ONNX Runtime is the CUDA build and its CUDA provider registers
(an NVIDIA GPU with driver, CUDA runtime and cuDNN). Run on a GPU machine with ``pytest -m gpu tests/gpu/test_gpu.py``.

Models: a tiny random model converted to fp16 (CUDA) and fp32 (the CPU reference), always; the real SmolLM2-135M in
fp16 when its folder is present (``$SPECRT_GPU_SMOLLM2`` or the ``specrt models pull smollm2-135m-instruct --dtype
fp16`` cache), with its 8-layer truncated draft (``$SPECRT_GPU_SMOLLM2_DRAFT`` or the cache).

Tolerances (CUDA fp16 against CPU fp32 logits): fp16 rounds every stored activation and weight to a relative error of
at most 2^-11 (4.9e-4); the matrix products accumulate in fp32, so the error of a logit grows with the depth, not
with the width. We allow ``2^-11 * 8 * (n_layers + 1)`` times the logit scale (max |logit|), i.e. eight roundings of
full scale per layer; argmax must agree wherever the CPU top-2 gap exceeds twice that.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from specrt import _specrt
from specrt._ort import cuda_provider_library, find_ort_library

pytestmark = pytest.mark.gpu

FP16_UNIT_ROUNDOFF = 2.0**-11


def _cuda_available() -> tuple[bool, str]:
    try:
        lib = find_ort_library("cuda")
    except FileNotFoundError as e:
        return False, str(e)
    if cuda_provider_library(lib) is None:
        return False, "the CPU build of ONNX Runtime is installed (pip install 'specrt[cuda]' on a GPU machine)"
    try:
        _specrt.OrtModel.check_cuda(lib, 0)
    except Exception as e:
        return False, f"CUDA provider does not register: {e}"
    return True, ""


_OK, _WHY = _cuda_available()
if not _OK:
    pytest.skip(f"no usable CUDA GPU: {_WHY}", allow_module_level=True)

LIB = find_ort_library("cuda")


def _tolerance(n_layers: int, scale: float) -> float:
    return FP16_UNIT_ROUNDOFF * 8 * (n_layers + 1) * max(1.0, scale)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from specrt.convert import convert
    from specrt.convert.tiny import write_tiny_gguf

    root = tmp_path_factory.mktemp("tiny-gpu")
    gguf = write_tiny_gguf(root / "t.gguf", arch="qwen2", seed=3, context=1024)
    return {
        "fp16": convert(gguf, root / "fp16", dtype="fp16", progress=False),
        "fp32": convert(gguf, root / "fp32", dtype="fp32", progress=False),
        # The graph form (ARCHITECTURE.md "Graph form") of the same fp16 model, and its 1-layer copy (a draft that
        # disagrees with it at times: rejections, rollbacks and full rounds).
        "fp16_graph": convert(gguf, root / "fp16-graph", dtype="fp16", progress=False, attention="gqa-graph"),
        "fp16_graph_l1": convert(
            gguf, root / "fp16-graph-L1", dtype="fp16", progress=False, attention="gqa-graph", num_layers=1
        ),
    }


def _smollm2(env: str, num_layers: int | None) -> Path | None:
    from specrt import models

    if os.environ.get(env):
        return Path(os.environ[env])
    name = "smollm2-135m-instruct"
    folder = models.model_dir(name, "fp16")
    if num_layers is not None:
        folder = folder.parent / f"fp16-L{num_layers}"
    return folder if (folder / "model.onnx").is_file() else None


def _compare_steps(fp16: Path, fp32: Path, n_layers: int, vocab_tokens: int) -> list[str]:
    """Prefill, a 5-token chunk on the cache, a rollback by length, a 1-token step: CUDA fp16 vs CPU fp32."""
    cuda = _specrt.OrtModel(fp16, ort_library=LIB, provider="cuda", max_seq_len=256)
    cpu = _specrt.OrtModel(fp32, ort_library=LIB, provider="cpu", max_seq_len=256)
    assert cuda.providers[0] == "CUDAExecutionProvider"
    assert cuda.memory_plan == _specrt.OrtModel.planned_memory("cuda")
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, vocab_tokens, size=24, dtype=np.int64)
    steps = [("prefill", tokens[:12], 0), ("chunk", tokens[12:17], 12), ("rollback", tokens[14:18], 14)]
    steps.append(("one token", tokens[18:19], 18))
    report = []
    kv_before = cuda.kv_buffer_addresses()
    for name, toks, n_past in steps:
        got = np.asarray(cuda.forward(toks, n_past, len(toks)))
        ref = np.asarray(cpu.forward(toks, n_past, len(toks)))
        scale = float(np.abs(ref).max())
        tol = _tolerance(n_layers, scale)
        diff = float(np.abs(got - ref).max())
        report.append(f"{name}: max|diff| {diff:.2e} (tolerance {tol:.2e}, scale {scale:.2f})")
        assert diff <= tol, report
        top2 = np.sort(ref, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 2 * tol
        assert (got.argmax(1) == ref.argmax(1))[clear].all(), (name, report)
    assert cuda.kv_buffer_addresses() == kv_before, "the device KV cache was reallocated"
    return report


def test_cuda_fp16_logits_match_cpu_fp32_on_a_tiny_model(tiny: dict[str, Path]) -> None:
    print(_compare_steps(tiny["fp16"], tiny["fp32"], n_layers=2, vocab_tokens=200))


def test_cuda_fp16_logits_match_cpu_fp32_on_smollm2(tmp_path: Path) -> None:
    fp16 = _smollm2("SPECRT_GPU_SMOLLM2", None)
    if fp16 is None:
        pytest.skip("SmolLM2-135M fp16 folder not present")
    from specrt import models
    from specrt.convert import convert

    fp32 = models.model_dir("smollm2-135m-instruct", "fp32")
    if not (fp32 / "model.onnx").is_file():
        gguf = next(fp16.parent.parent.rglob("*.gguf"), None)
        if gguf is None:
            pytest.skip("no fp32 SmolLM2 folder and no GGUF to convert one")
        fp32 = convert(gguf, tmp_path / "fp32", dtype="fp32", progress=False)
    print(_compare_steps(fp16, fp32, n_layers=30, vocab_tokens=49152))


def _decoder(target: Path, draft: Path | None):
    import specrt

    return specrt.Decoder(target, draft=draft, provider="cuda", ort_library=LIB, max_seq_len=1024)


def _top2_gap(target: Path, prefix: list[int]) -> float:
    m = _specrt.OrtModel(target, ort_library=LIB, provider="cuda", max_seq_len=1024)
    row = np.asarray(m.forward(np.asarray(prefix, np.int64), 0, 1))[0]
    top = np.sort(row)[-2:]
    return float(top[1] - top[0])


def _greedy_parity(target: Path, draft: Path, prompt: list[int], n: int) -> str:
    dec = _decoder(target, draft)
    ref = dec.generate(prompt, max_new_tokens=n, temperature=0, num_speculative_tokens=0, ignore_eos=True)
    lines = []
    for k in (1, 4, 8):
        out = dec.generate(prompt, max_new_tokens=n, temperature=0, num_speculative_tokens=k, ignore_eos=True)
        if out.token_ids == ref.token_ids:
            lines.append(f"K={k}: identical ({n} tokens)")
            continue
        i = next(j for j, (a, b) in enumerate(zip(out.token_ids, ref.token_ids, strict=False)) if a != b)
        gap = _top2_gap(target, prompt + ref.token_ids[:i])
        lines.append(f"K={k}: first divergence at token {i}, top-2 logit gap there {gap:.4f}")
        # fp16 kernels for a (K+1)-token pass and a 1-token pass round differently: only a near-tie may flip.
        assert gap < 0.05, lines
    return "; ".join(lines)


def test_greedy_speculative_equals_target_only_on_cuda_tiny(tiny: dict[str, Path]) -> None:
    print(_greedy_parity(tiny["fp16"], tiny["fp16"], list(range(1, 9)), 64))


def test_greedy_speculative_equals_target_only_on_cuda_smollm2() -> None:
    target, draft = _smollm2("SPECRT_GPU_SMOLLM2", None), _smollm2("SPECRT_GPU_SMOLLM2_DRAFT", 8)
    if target is None or draft is None:
        pytest.skip("SmolLM2-135M fp16 and its 8-layer draft not present")
    dec = _decoder(target, None)
    prompt = dec.tokenizer.encode("The capital of France is").ids
    print(_greedy_parity(target, draft, prompt, 48))


def test_self_draft_at_temperature_one_accepts_every_token_and_seeds_repeat(tiny: dict[str, Path]) -> None:
    dec = _decoder(tiny["fp16"], tiny["fp16"])
    kw = {"max_new_tokens": 40, "temperature": 1.0, "num_speculative_tokens": 4, "seed": 11, "ignore_eos": True}
    a = dec.generate(list(range(1, 9)), **kw)
    assert a.stats.n_drafted > 0 and a.stats.n_accepted == a.stats.n_drafted, a.stats
    b = dec.generate(list(range(1, 9)), **kw)
    assert a.token_ids == b.token_ids


def _gpu_memory_used_bytes() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        smi = shutil.which("nvidia-smi")
        assert smi, "neither nvidia-ml-py nor nvidia-smi"
        out = subprocess.run(
            [smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return int(out.strip()) << 20


def test_no_device_allocation_per_round_in_steady_state(tiny: dict[str, Path]) -> None:
    dec = _decoder(tiny["fp16"], tiny["fp16"])
    kw = {"temperature": 0, "num_speculative_tokens": 4, "ignore_eos": True}
    dec.generate(list(range(1, 9)), max_new_tokens=100, **kw)  # warm-up: the arena reaches its steady size
    before = _gpu_memory_used_bytes()
    out = dec.generate(list(range(1, 9)), max_new_tokens=600, **kw)
    after = _gpu_memory_used_bytes()
    assert out.stats.n_rounds >= 100, out.stats
    # nvidia-smi reports whole MiB; NVML bytes. Any growth of the arena is at least one 2 MiB chunk.
    assert after - before < 1 << 20, f"device memory grew by {after - before} bytes over {out.stats.n_rounds} rounds"


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["no-graph", "cuda-graph"])
def test_graph_form_on_cuda_gives_the_default_forms_greedy_tokens(tiny: dict[str, Path], cuda_graph: bool) -> None:
    """The graph form on CUDA, with argmax-only rounds (``logprobs=False``: K + 1 ids reach the host) and with
    log-probabilities, and with each decode step replayed from a CUDA graph: the default form's greedy tokens (fp16
    kernels of different shapes may flip a near-tie: the first divergence is reported with its top-2 gap)."""
    import specrt

    prompt = list(range(1, 9))
    ref = _decoder(tiny["fp16"], tiny["fp16"]).generate(
        prompt, max_new_tokens=64, temperature=0, num_speculative_tokens=0, ignore_eos=True
    )
    dec = specrt.Decoder(
        tiny["fp16_graph"],
        draft=tiny["fp16_graph"],
        provider="cuda",
        ort_library=LIB,
        max_seq_len=1024,
        cuda_graph=cuda_graph,
    )
    for k in (0, 1, 4):
        for logprobs in (False, True):
            out = dec.generate(
                prompt, max_new_tokens=64, temperature=0, num_speculative_tokens=k, ignore_eos=True, logprobs=logprobs
            )
            if out.token_ids != ref.token_ids:
                i = next(j for j, (a, b) in enumerate(zip(out.token_ids, ref.token_ids, strict=False)) if a != b)
                gap = _top2_gap(tiny["fp16"], prompt + ref.token_ids[:i])
                assert gap < 0.05, f"K={k} logprobs={logprobs}: first divergence at {i}, top-2 gap {gap:.4f}"
            assert (out.logprobs == []) is not logprobs


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["no-graph", "cuda-graph"])
def test_speculative_rounds_with_a_separate_graphed_draft(tiny: dict[str, Path], cuda_graph: bool) -> None:
    """Both models graphed (the 1-layer graph-form draft's steps and 2-token catch-ups, the target's K + 1-token
    verifications): greedy at K = 1, 4, 8 with log-probabilities off and on gives the default form's target-only
    tokens (near-ties aside); sampled rounds run and a seed repeats; a second Decoder dropped and garbage-collected
    leaves the process alive (the 2026-12-04 run segfaulted there and in this very configuration)."""
    import gc

    import specrt

    prompt = list(range(1, 9))
    ref = _decoder(tiny["fp16"], None).generate(
        prompt, max_new_tokens=64, temperature=0, num_speculative_tokens=0, ignore_eos=True
    )
    dec = specrt.Decoder(
        tiny["fp16_graph"],
        draft=tiny["fp16_graph_l1"],
        provider="cuda",
        ort_library=LIB,
        max_seq_len=1024,
        cuda_graph=cuda_graph,
    )
    rounds = {"rejected": 0, "full": 0}
    for k in (1, 4, 8):
        for logprobs in (False, True):
            out = dec.generate(
                prompt, max_new_tokens=64, temperature=0, num_speculative_tokens=k, ignore_eos=True, logprobs=logprobs
            )
            rounds["rejected"] += out.stats.n_recovered
            rounds["full"] += out.stats.n_bonus
            if out.token_ids != ref.token_ids:
                i = next(j for j, (a, b) in enumerate(zip(out.token_ids, ref.token_ids, strict=False)) if a != b)
                gap = _top2_gap(tiny["fp16"], prompt + ref.token_ids[:i])
                assert gap < 0.05, f"K={k} logprobs={logprobs}: first divergence at {i}, top-2 gap {gap:.4f}"
    kw = {"max_new_tokens": 48, "temperature": 1.0, "num_speculative_tokens": 4, "seed": 5, "ignore_eos": True}
    a, b = dec.generate(prompt, **kw), dec.generate(prompt, **kw)
    assert a.token_ids == b.token_ids
    assert rounds["rejected"] > 0 and rounds["full"] > 0, rounds
    del dec
    gc.collect()


def test_cuda_graph_needs_the_graph_form(tiny: dict[str, Path]) -> None:
    import specrt
    from specrt.errors import ConfigError

    with pytest.raises(ConfigError, match="attention gqa-graph"):
        specrt.Decoder(tiny["fp16"], provider="cuda", ort_library=LIB, max_seq_len=256, cuda_graph=True)
