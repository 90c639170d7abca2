"""Coupled sampling: the noise twin, exactness of one position, and same-seed-same-text across K and proposers.

Coupled sampling fixes the random choice at each output position by (seed, position) alone (an exponential race,
i.e. the Gumbel-max trick; rust/specrt-core/src/coupled.rs), so speculative decoding with any K, draft model or
n-gram proposer emits exactly what target-only coupled decoding emits.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import specrt
from specrt import _specrt
from specrt import reference_sampling as reference
from specrt._ort import find_ort_library
from specrt.convert import convert
from specrt.convert.tiny import write_tiny_gguf
from specrt.errors import ConfigError


@pytest.mark.parametrize(("seed", "position", "vocab"), [(0, 0, 1000), (123456789, 77, 4096), (2**64 - 1, 2**31, 300)])
def test_rust_noise_equals_the_numpy_twin(seed: int, position: int, vocab: int) -> None:
    got = _specrt.coupled_uniforms(seed, position, vocab)
    np.testing.assert_array_equal(got, reference.coupled_uniforms(seed, position, vocab))
    assert got.min() > 0 and got.max() <= 1


def test_rust_choice_equals_the_numpy_twin(np_rng: np.random.Generator) -> None:
    for trial in range(30):
        w = np_rng.random(700).astype(np.float32) ** 8
        w[np_rng.random(700) < 0.3] = 0
        for position in range(5):
            assert _specrt.coupled_choice(w, trial, position) == reference.coupled_choice(w, trial, position)


def test_bad_weights_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match="no positive entry"):
        _specrt.coupled_choice(np.zeros(4, np.float32), 0, 0)
    with pytest.raises(ConfigError, match=r"weights\[1\] = -1 is invalid"):
        _specrt.coupled_choice(np.array([1, -1], np.float32), 0, 0)


def test_one_position_is_an_exact_sample_of_the_weights() -> None:
    # Chi-square over 6 tokens with 60,000 positions; critical value at p = 1e-4 for 5 df is 25.7.
    p = np.array([0.4, 0.25, 0.2, 0.1, 0.04, 0.01])
    w = (p * 3).astype(np.float32)
    n = 60_000
    counts = np.bincount([_specrt.coupled_choice(w, 42, t) for t in range(n)], minlength=6)
    stat = float(((counts - n * p) ** 2 / (n * p)).sum())
    assert stat < 25.7, (stat, counts)


# ----- end to end on tiny converted models -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-coupled")
    out = {}
    for name, seed, layers in [("target", 1, 2), ("draft", 1, 1)]:
        gguf = write_tiny_gguf(root / f"{name}.gguf", arch="qwen2", seed=seed, n_layers=layers)
        out[name] = convert(gguf, root / name, progress=False)
    return out


PROMPTS = ["def add(a, b):", "hello world, hello world, hello", "x = [1, 2, 3]\nfor"]
SETTINGS = [{"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.9}]


def _race_margin(logits: np.ndarray, settings: dict, prompt: list[int], out: list[int], seed: int, pos: int) -> float:
    """Gap between the winner and the runner-up of the race at ``pos``, in perturbed-logit units
    (``log w - log E``): how far the row's logits must move to change the coupled choice."""
    probs = _specrt.process_logits(logits, **settings, prompt_tokens=prompt, output_tokens=out)
    u = reference.coupled_uniforms(seed, pos, len(probs))
    with np.errstate(divide="ignore"):
        score = np.where(probs > 0, np.log(probs.astype(np.float64)) - np.log(-np.log(u)), -np.inf)
    top = np.sort(score)[-2:]
    return float(top[1] - top[0])


def test_coupled_speculative_text_equals_target_only_coupled_decoding(tiny: dict[str, Path]) -> None:
    # 20 seeds x 3 prompts x 2 settings; K = 1, 4, 8 and auto; draft model, n-gram and both. fp32 kernels over
    # K + 1 rows and over one row round differently (~1e-5 in logits): a divergence is allowed only where the race
    # at that position is that close (margin < 1e-4), and is reported.
    target_only = specrt.Decoder(tiny["target"], max_seq_len=256)
    spec = specrt.Decoder(tiny["target"], tiny["draft"], max_seq_len=256)
    model = _specrt.OrtModel(tiny["target"], ort_library=find_ort_library(), max_seq_len=256)
    variants = [(k, p) for k in (1, 4, 8, "auto") for p in ("draft", "ngram", "ngram+draft")]
    n_checked, n_accepted, divergences = 0, 0, []
    for settings in SETTINGS:
        for prompt in PROMPTS:
            ids = target_only.encode(prompt, None)
            for seed in range(20):
                kw = {"max_new_tokens": 16, "seed": seed, "coupled": True, "ignore_eos": True, **settings}
                ref = target_only.generate(ids, **kw).token_ids
                for k, proposer in variants:
                    pinned = {"c_draft": 0.2, "c_verify": [1.0 + 0.05 * i for i in range(9)]} if k == "auto" else None
                    out = spec.generate(ids, num_speculative_tokens=k, proposer=proposer, pinned_costs=pinned, **kw)
                    n_checked += 1
                    n_accepted += out.stats.n_accepted
                    if out.token_ids == ref:
                        continue
                    i = next(j for j, (a, b) in enumerate(zip(out.token_ids, ref, strict=True)) if a != b)
                    row = np.asarray(model.forward(np.asarray(ids + ref[:i]), 0, 1))[0]
                    margin = _race_margin(row, settings, ids, ref[:i], seed, len(ids) + i)
                    divergences.append((prompt, seed, k, proposer, i, margin))
                    assert margin < 1e-4, divergences
    print(f"{n_checked} speculative generations, {len(divergences)} divergences (near-ties): {divergences}")
    assert n_accepted > 0


def test_coupled_seeds_repeat_and_differ(tiny: dict[str, Path]) -> None:
    dec = specrt.Decoder(tiny["target"], tiny["draft"], max_seq_len=256)
    kw = {"max_new_tokens": 24, "coupled": True, "temperature": 1.0, "ignore_eos": True, "num_speculative_tokens": 4}
    a = dec.generate("hello", seed=3, **kw).token_ids
    assert dec.generate("hello", seed=3, **kw).token_ids == a
    assert any(dec.generate("hello", seed=s, **kw).token_ids != a for s in (4, 5, 6))


def test_coupled_acceptance_is_at_most_rejection_sampling_acceptance(tiny: dict[str, Path]) -> None:
    # Per position, P(coupled accept) <= sum_x min(p, q) (the maximal coupling); over many tokens the measured
    # acceptance of coupled decoding stays below that of min(1, p/q) acceptance (with sampling noise: 4 sd).
    dec = specrt.Decoder(tiny["target"], tiny["draft"], max_seq_len=512)
    rates = {}
    for coupled in (False, True):
        drafted = accepted = 0
        for seed in range(30):
            s = dec.generate(
                "x = [1, 2, 3]\nfor",
                max_new_tokens=48,
                seed=seed,
                temperature=1.0,
                num_speculative_tokens=4,
                coupled=coupled,
                ignore_eos=True,
            ).stats
            drafted, accepted = drafted + s.n_drafted, accepted + s.n_accepted
        rates[coupled] = (accepted / drafted, drafted)
    (a_mrs, n1), (a_cpl, n2) = rates[False], rates[True]
    sd = math.sqrt(a_mrs * (1 - a_mrs) / n1 + a_cpl * (1 - a_cpl) / n2)
    assert a_cpl <= a_mrs + 4 * sd, rates
