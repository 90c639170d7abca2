"""verify() through the Python API: losslessness (Monte Carlo), broken sampler caught, determinism, bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

import specrt._specrt as rs
from specrt import reference_sampling as ref
from specrt.errors import ConfigError, NonFiniteLogitsError, ShapeError, SpecrtError, VocabError

V = 4
# Bigram target p(next | prev), row 2 gives token 2 probability 0.
TARGET = np.array(
    [[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4], [0.5, 0.3, 0.0, 0.2], [0.25, 0.25, 0.25, 0.25]], dtype=np.float64
)
with np.errstate(divide="ignore"):
    TARGET_LOGITS = np.log(TARGET).astype(np.float32)
DRAFT_LOGITS = TARGET_LOGITS[:, ::-1].copy()  # reversed: lots of rejections, proposes target zeros


def chi2_critical(df: int, z: float = 4.753) -> float:
    """Chi-square quantile at significance 1e-6 (Wilson-Hilferty)."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * np.sqrt(c)) ** 3


def first_two_tokens(n: int, k: int, seed: int, broken: bool = False) -> np.ndarray:
    """[V, V] counts of the first two emitted tokens after context token 0, running whole rounds."""
    rng = rs.Rng(seed)
    counts = np.zeros((V, V), np.int64)
    for _ in range(n):
        emitted: list[int] = []
        last = 0
        while len(emitted) < 2:
            # [k, V] draft rows, [k + 1, V] target logits
            q = np.zeros((k, V), np.float32)
            d: list[int] = []
            prev = last
            for i in range(k):
                t, q[i] = rs.sample_draft(DRAFT_LOGITS[prev], rng=rng)
                d.append(t)
                prev = t
            target = TARGET_LOGITS[[last, *d]]
            if broken:
                # BROKEN: on rejection resample from p (no residual).
                toks = []
                for i, di in enumerate(d):
                    if rng.random() * q[i, di] >= TARGET[[last, *d][i], di]:
                        toks.append(rs.sample(target[i], rng=rng))
                        break
                    toks.append(di)
                else:
                    toks.append(rs.sample(target[k], rng=rng))
            else:
                toks = rs.verify(target, q, d, rng=rng).tokens
            emitted += toks
            last = toks[-1]
        counts[emitted[0], emitted[1]] += 1
    return counts


def chi2(counts: np.ndarray) -> tuple[float, float]:
    expected = TARGET[0][:, None] * TARGET * counts.sum()
    assert counts[expected == 0].sum() == 0, "a token with target probability 0 was emitted"
    mask = expected > 0
    stat = float((((counts - expected) ** 2)[mask] / expected[mask]).sum())
    return stat, chi2_critical(int(mask.sum()) - 1)


def test_reversed_draft_preserves_first_two_token_distribution():
    stat, crit = chi2(first_two_tokens(4000, k=2, seed=1))
    assert stat < crit


def test_broken_sampler_without_residual_is_caught():
    stat, crit = chi2(first_two_tokens(4000, k=2, seed=2, broken=True))
    assert stat > crit


@pytest.mark.slow
def test_reversed_draft_preserves_distribution_many_draws():
    for k in (1, 3):
        stat, crit = chi2(first_two_tokens(30000, k=k, seed=10 + k))
        assert stat < crit, (k, stat, crit)


def test_seeded_verification_is_bit_identical():
    g = np.random.default_rng(0)
    target = g.standard_normal((5, 1000)).astype(np.float32)
    q = np.full((4, 1000), 1e-3, np.float32)
    runs = [rs.verify(target, q, [1, 2, 3, 4], seed=99, top_p=0.9) for _ in range(3)]
    assert all((r.tokens, r.n_accepted) == (runs[0].tokens, runs[0].n_accepted) for r in runs)


def test_rng_argument_is_advanced_in_place():
    target = np.zeros((2, 8), np.float32)
    q = np.full((1, 8), 0.125, np.float32)
    rng = rs.Rng(5)
    before = rng.state
    rs.verify(target, q, [3], rng=rng)
    assert rng.state != before


def test_greedy_verification_matches_argmax_and_needs_no_seed():
    target = TARGET_LOGITS[[0, 0, 0]]
    v = rs.verify(target, None, [0, 1], temperature=0.0)
    assert (v.tokens, v.last) == ([0, 0], "recovered")


def test_deterministic_mode_needs_no_draft_probs():
    v = rs.verify(TARGET_LOGITS[[0, 1]], None, [0], mode="deterministic", seed=1)
    assert 1 <= len(v.tokens) <= 2


def test_matches_reference_on_large_vocab():
    g = np.random.default_rng(1)
    target = (g.standard_normal((5, 32000)) * 3).astype(np.float32)
    p = ref.Params(top_p=0.9)
    rng = rs.Rng(7)
    gen = ref.numpy_generator(*rng.state)
    q = np.zeros((4, 32000), np.float32)
    d = []
    for i in range(4):
        t, q[i] = rs.sample_draft(target[i] + g.standard_normal(32000).astype(np.float32), rng=rng, top_p=0.9)
        ref.sample_draft(target[i], p, gen)  # advance the twin by the same draw
        d.append(t)
    v = rs.verify(target, q, d, rng=rng, top_p=0.9)
    assert v.tokens == ref.verify(target, q, d, p, gen).tokens


@pytest.mark.parametrize(
    ("target", "probs", "tokens", "exc", "match"),
    [
        (np.zeros((3, 4), np.float64), np.zeros((2, 4), np.float32), [0, 1], ShapeError, "float32.*float64"),
        (np.zeros((3, 4), np.float32), np.zeros((2, 5), np.float32), [0, 1], ShapeError, r"\[k, vocab\]"),
        (np.zeros((4, 4), np.float32), np.zeros((2, 4), np.float32), [0, 1], ShapeError, r"\[3, 4\]"),
        (np.zeros((4, 3), np.float32).T, np.zeros((2, 4), np.float32), [0, 1], ShapeError, "C-contiguous"),
        (np.zeros(12, np.float32), np.zeros((2, 4), np.float32), [0, 1], ShapeError, r"\[k \+ 1, vocab\]"),
        (np.zeros((3, 4), np.float32), np.full((2, 4), 0.25, np.float32), [0, 9], VocabError, "draft_tokens"),
        (np.zeros((3, 4), np.float32), np.full((2, 4), 0.25, np.float32), [0, -1], VocabError, "-1"),
        (np.zeros((3, 4), np.float32), np.zeros((2, 4), np.float32), [0, 1], ConfigError, "positive draft prob"),
    ],
)
def test_bad_inputs_raise_clear_errors(target, probs, tokens, exc, match):
    with pytest.raises(exc, match=match):
        rs.verify(target, probs, tokens, seed=0)


def test_nan_logits_report_row_and_token():
    target = np.zeros((3, 6), np.float32)
    target[1, 4] = np.nan
    q = np.full((2, 6), 1 / 6, np.float32)
    with pytest.raises(NonFiniteLogitsError) as e:
        # Uniform target and q: the first draft is always accepted, so row 1 is evaluated.
        rs.verify(target, q, [0, 0], seed=0)
    assert (e.value.row, e.value.token, e.value.what) == (1, 4, "NaN")
    assert isinstance(e.value, ValueError)
    assert isinstance(e.value, SpecrtError)


def test_too_many_draft_tokens_is_a_config_error():
    k = rs.MAX_DRAFT_TOKENS + 1
    with pytest.raises(ConfigError, match="65 draft tokens"):
        rs.verify(np.zeros((k + 1, 4), np.float32), np.full((k, 4), 0.25, np.float32), [0] * k, seed=0)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"temperature": -1.0}, "temperature -1"),
        ({"top_p": 0.0}, "top_p 0"),
        ({"top_p": 1.5}, "top_p 1.5"),
        ({"top_k": -1}, "top_k -1"),
        ({"min_p": 2.0}, "min_p 2"),
        ({"repetition_penalty": 0.0}, "repetition_penalty 0"),
        ({"mode": "fast"}, 'mode "fast"'),
        ({"mode": "greedy"}, "needs temperature 0"),
    ],
)
def test_bad_parameters_raise_config_error(kw, match):
    with pytest.raises(ConfigError, match=match):
        rs.verify(np.zeros((2, 4), np.float32), np.full((1, 4), 0.25, np.float32), [0], seed=0, **kw)


def test_seed_or_rng_is_required_unless_greedy():
    with pytest.raises(ConfigError, match="seed="):
        rs.verify(np.zeros((1, 4), np.float32), None, [])
    with pytest.raises(ConfigError, match="not both"):
        rs.verify(np.zeros((1, 4), np.float32), None, [], seed=1, rng=rs.Rng(1))
