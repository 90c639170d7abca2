"""Greedy speculative decoding on a ``dtype="gguf"`` target equals the target alone, token for token.

A ``dtype="gguf"`` target runs its matrices on specrt's ``ai.specrt::GgufMatMul``, whose output rows do not depend on
how many rows a pass has (the kernel quantizes each row's activations to int8 by itself and sums in a fixed order).
Target-only decoding runs one-row steps, speculation verifies K + 1 rows a pass, and batched rounds put several
requests' rows in one pass; if nothing in the pass depends on its shape, all of them give the same logits and so the
same greedy tokens. Checked here on a draft/target pair:

1. single stream: the same prompts through K = 1..8 and target-only (the reference);
2. batched rows (the batched layout, ``Decoder(max_batch=4)``): each prompt alone, target-only, against the
   single-stream target-only run (the layouts, as tests/engine/test_batching.py compares batched and solo runs); then
   the prompts decoded together at K = 0, at K = 8, 1, 5, 3 and at K = 2, 7, 4, 6 (a mix of K in every pass) against
   the prompts alone (the rows a pass holds beside a row).

At a divergence the target-only run's own top-2 logit gap at that position is reported (its ``top_logprobs``, the
logits its greedy choice came from; a teacher-forced prefill would be another pass shape), and the divergence is
tolerated only below ``TIE_BOUND`` (float rounding); any other fails with the gap in the message. Every divergence
of a test is listed before it fails, with the speculative run's own gap there and the largest move of the top-1
logit on the positions both runs share (0 where the rows really do not depend on the pass).

Models: tiny random-weight GGUFs (always run; Q4_1, Q6_K and Q8_0 matrices, Q8_0 embeddings, so the head is a
``GgufMatMul`` too; the draft is the same GGUF converted to fp32, the same weights with float activations, which
accepts most drafts but not all; four text prompts) and SmolLM2-135M's own GGUF (marker ``model``: Q4_1 matrices, a
Q8_0 embedding; its int4 conversion as the draft, as in test_batching; three chat prompts).

Measured (2-core x86 with AVX-512 VNNI, onnxruntime 1.32, the extension built from commit a1bc052): the tiny
targets agree in the single stream; the tiny Q6_K target's batched rows diverge (gaps 0.017 and 0.051) and SmolLM2
diverges in both tests (gaps 0.027-0.61; K = 1..8 alike). ``_specrt.gguf_matmul`` gives every row bit for bit at
any M (1, 3, 7, 9; every type and kernel path), but ONNX Runtime's ``GroupQueryAttention`` computes a one-token step
on the cache differently from a pass of several tokens (5e-7 on SmolLM2's shape; passes of 2 or more tokens agree
exactly), the batched layout's rows move with the other rows of their pass, and the next ``GgufMatMul``'s int8
rounding of its input turns such a difference into whole rounding steps wherever an activation sits near a rounding
boundary: SmolLM2's one-token steps differ from the same positions in a multi-token pass by 0.5-1.4 in the logits
(fp32: 5e-5). The same test on int4 conversions: the tiny models agree, SmolLM2 diverges (README, int4 targets).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import specrt
from gguf_checks import needs_gguf_ops
from specrt.scheduler import Scheduler
from test_batching import TIE_BOUND
from test_prefix_caching import _gap

pytestmark = needs_gguf_ops

K_VALUES = range(1, 9)
#: Greedy, a fixed length (no EOS), the top-2 alternatives of every position for the gaps.
SETTINGS: dict[str, Any] = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True, "top_logprobs": 2}
#: K per row of the batched runs (the first as many as there are prompts): every row target-only, then two mixes of
#: K = 1..8 in the same passes.
BATCH_KS = [(0, 0, 0, 0), (8, 1, 5, 3), (2, 7, 4, 6)]

#: Tiny GGUFs (``write_tiny_gguf`` keywords, seed 2, SHAPE): each emits 19-31 distinct tokens in 32 greedy ones with
#: top-2 gaps down to 0.004-0.05 (measured). Not Q4_K: its random well-formed blocks make a tiny model repeat one
#: token at gaps of several nats, which tests nothing.
TINY = {
    "llama-Q4_1": {"arch": "llama", "matrix_type": "Q4_1", "embed_type": "Q8_0", "tied": True},
    "llama-Q6_K-untied": {"arch": "llama", "matrix_type": "Q6_K", "embed_type": "Q8_0", "tied": False},
    "qwen2-Q8_0": {"arch": "qwen2", "matrix_type": "Q8_0", "embed_type": "Q8_0", "tied": True},
}
#: Sizes the K types need (rows of 256), as tests/convert/test_convert_gguf_blocks.py's SHAPE.
SHAPE = {"hidden": 256, "ffn": 512, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2}
TINY_PROMPTS = [{"prompt": p} for p in ["def add(a, b):", "hello world, hello", "the cat", "x = [1, 2, 3]"]]
SMOLLM2_PROMPTS = [
    {"messages": [{"role": "user", "content": q}]}
    for q in [
        "What is the capital of France? Answer in one sentence.",
        "List three uses of a hash map.",
        "Write a Python function that returns the n-th Fibonacci number.",
    ]
]


def divergences(
    what: str, got: Sequence[specrt.GenerationResult], refs: Sequence[specrt.GenerationResult]
) -> list[str]:
    """Compare each of ``got`` with its target-only reference token for token. Returns one message per result whose
    first differing token is not at a near-tie of the reference (top-2 logit gap >= ``TIE_BOUND``); prints every
    divergence, tolerated or not, and the largest move of the top-1 logit on the positions both runs share."""
    failures = []
    shift = 0.0
    for p, (g, ref) in enumerate(zip(got, refs, strict=True)):
        n = next((j for j, (a, b) in enumerate(zip(g.token_ids, ref.token_ids, strict=True)) if a != b), None)
        shared = zip(g.top_logprobs[:n], ref.top_logprobs[:n], strict=True)
        shift = max([shift, *(abs(a[0][1] - b[0][1]) for a, b in shared)])
        if n is None:
            continue
        gap = _gap(ref.top_logprobs[n])
        msg = (
            f"{what}, prompt {p}: first divergence at token {n}: {g.token_ids[n]} (its own gap "
            f"{_gap(g.top_logprobs[n]):.4g}) vs target-only {ref.token_ids[n]}, target-only top-2 logit gap {gap:.4g}"
        )
        if gap < TIE_BOUND:
            print(f"{msg} < {TIE_BOUND}: a near-tie, tolerated")
        else:
            failures.append(f"{msg} >= {TIE_BOUND}")
    print(f"{what}: {len(failures)} divergences beyond a near-tie; top-1 logit moved by at most {shift:.3g}")
    return failures


def check_single_stream(target: Path, draft: Path, prompts: list[dict], max_seq_len: int) -> None:
    """K = 1..8 with ``draft`` against ``target`` alone, greedy, on each of ``prompts``."""
    refs = [specrt.Decoder(target, max_seq_len=max_seq_len).generate(**p, **SETTINGS) for p in prompts]
    dec = specrt.Decoder(target, draft, max_seq_len=max_seq_len)
    failures = []
    for k in K_VALUES:
        got = [dec.generate(**p, num_speculative_tokens=k, **SETTINGS) for p in prompts]
        accepted, drafted = sum(r.stats.n_accepted for r in got), sum(r.stats.n_drafted for r in got)
        print(f"K {k}: {accepted}/{drafted} drafts accepted")
        assert accepted > 0, f"K {k}: no draft accepted: the comparison would not test verification passes"
        failures += divergences(f"K {k}", got, refs)
    assert not failures, "speculative != target-only beyond a near-tie:\n" + "\n".join(failures)


def check_batched(target: Path, target_b: Path, draft_b: Path, prompts: list[dict], max_seq_len: int) -> None:
    """Batched rows (``target_b`` / ``draft_b``, the batched layout): each prompt alone, target-only, against the
    single-stream target-only run of ``target`` (the layouts); then all together at each K mix of ``BATCH_KS``
    against the prompts alone (the rows of a pass: how many, how long, beside which others)."""
    refs = [specrt.Decoder(target, max_seq_len=max_seq_len).generate(**p, **SETTINGS) for p in prompts]
    dec = specrt.Decoder(target_b, draft_b, max_seq_len=max_seq_len, max_batch=4)
    alone = [dec.generate(**p, num_speculative_tokens=0, **SETTINGS) for p in prompts]
    failures = divergences("batched layout, alone, K 0 vs single stream", alone, refs)
    for ks in (mix[: len(prompts)] for mix in BATCH_KS):
        with Scheduler(dec) as sched:
            handles = [
                sched.submit(**p, num_speculative_tokens=k, **SETTINGS) for p, k in zip(prompts, ks, strict=True)
            ]
            got = [h.result(timeout=300) for h in handles]
        if any(ks):
            assert sum(r.stats.n_accepted for r in got) > 0, f"K {ks}: no draft accepted"
        failures += divergences(f"batched layout, together, K {ks} vs alone", got, alone)
    assert not failures, "batched rows != target-only beyond a near-tie:\n" + "\n".join(failures)


# ----- tiny GGUFs (always run) ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=list(TINY))
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One TINY GGUF as the target (``gguf``, ``gguf-B``) and its fp32 conversion as the draft (``fp32``, ``fp32-B``),
    in the single-stream (GQA) and batched layouts."""
    from specrt.convert import convert
    from specrt.convert.tiny import write_tiny_gguf

    root = tmp_path_factory.mktemp(f"gguf-parity-{request.param}")
    g = write_tiny_gguf(root / "m.gguf", seed=2, **TINY[request.param], **SHAPE)
    out = {}
    for dtype in ("gguf", "fp32"):
        out[dtype] = convert(g, root / dtype, dtype=dtype, progress=False)
        out[f"{dtype}-B"] = convert(g, root / f"{dtype}-B", dtype=dtype, attention="batched", progress=False)
    return out


def test_tiny_gguf_greedy_speculation_equals_target_only_for_every_k(tiny: dict[str, Path]) -> None:
    check_single_stream(tiny["gguf"], tiny["fp32"], TINY_PROMPTS, 256)


#: Why a test fails today (strict xfail: it must go on failing until the cause is fixed, and then the mark goes).
SHAPE_DEPENDENT_ATTENTION = (
    "ONNX Runtime's attention computes a one-token step differently from a multi-token pass (~5e-7) and the batched "
    "layout's rows move with their pass's other rows; GgufMatMul's int8 rounding of the next input turns that into "
    "whole rounding steps (module docstring)"
)


def test_tiny_gguf_batched_rows_equal_target_only(tiny: dict[str, Path], request: pytest.FixtureRequest) -> None:
    if "Q6_K" in request.node.callspec.id:
        request.applymarker(pytest.mark.xfail(reason=SHAPE_DEPENDENT_ATTENTION))
    check_batched(tiny["gguf"], tiny["gguf-B"], tiny["fp32-B"], TINY_PROMPTS, 256)


# ----- SmolLM2-135M's own GGUF (Q4_1) --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2(smollm2_gguf_folder: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """SmolLM2's GGUF as the target (``gguf``; ``gguf-B`` converted here) and its int4 conversion as the draft
    (``int4``, ``int4-B``: from the cache, pulled and converted when absent)."""
    from specrt import models
    from specrt.convert import convert

    g, folder = smollm2_gguf_folder
    name = "smollm2-135m-instruct"
    return {
        "gguf": folder,
        "gguf-B": convert(
            g, tmp_path_factory.mktemp("smollm2-B") / "gguf", dtype="gguf", attention="batched", progress=False
        ),
        "int4": models.pull(name, "int4", progress=False),
        "int4-B": models.pull(name, "int4", progress=False, attention="batched"),
    }


@pytest.mark.model
@pytest.mark.xfail(reason=SHAPE_DEPENDENT_ATTENTION)
def test_smollm2_gguf_greedy_speculation_equals_target_only_for_every_k(smollm2: dict[str, Path]) -> None:
    check_single_stream(smollm2["gguf"], smollm2["int4"], SMOLLM2_PROMPTS, 512)


@pytest.mark.model
@pytest.mark.xfail(reason=SHAPE_DEPENDENT_ATTENTION)
def test_smollm2_gguf_batched_rows_equal_target_only(smollm2: dict[str, Path]) -> None:
    check_batched(smollm2["gguf"], smollm2["gguf-B"], smollm2["int4-B"], SMOLLM2_PROMPTS, 512)
