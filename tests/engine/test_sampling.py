"""sample / sample_draft / process_logits / log_softmax_at through the Python API."""

from __future__ import annotations

import numpy as np
import pytest

import specrt._specrt as rs
from specrt.errors import NonFiniteLogitsError, ShapeError


def test_plain_softmax_and_log_softmax():
    x = np.array([1.0, 2.0, 3.0, -1.0], np.float32)
    want = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    np.testing.assert_allclose(rs.process_logits(x), want, rtol=1e-6)
    assert rs.log_softmax_at(x, 2) == pytest.approx(np.log(want[2]), abs=1e-6)


def test_top_k_top_p_min_p_keep_expected_tokens():
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05])).astype(np.float32)
    assert (rs.process_logits(x, top_k=2) > 0).sum() == 2
    assert (rs.process_logits(x, top_p=0.7) > 0).sum() == 2
    assert (rs.process_logits(x, min_p=0.2) > 0).sum() == 3
    assert rs.process_logits(x, temperature=0.0).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_penalties_apply_to_seen_tokens():
    x = np.array([2.0, 2.0, 0.0], np.float32)
    p = rs.process_logits(x, repetition_penalty=2.0, prompt_tokens=[0])
    assert p[0] < p[1]
    p = rs.process_logits(x, presence_penalty=1.0, output_tokens=[1])
    assert p[1] < p[0]


def test_sampled_frequencies_match_probabilities():
    x = np.log(np.array([0.5, 0.3, 0.2])).astype(np.float32)
    rng = rs.Rng(1)
    n = 20000
    counts = np.bincount([rs.sample(x, rng=rng) for _ in range(n)], minlength=3)
    # 5-sigma binomial bound per cell
    sigma = np.sqrt(n * np.array([0.5, 0.3, 0.2]) * (1 - np.array([0.5, 0.3, 0.2])))
    assert np.all(np.abs(counts - n * np.array([0.5, 0.3, 0.2])) < 5 * sigma)


def test_sample_draft_returns_the_row_it_sampled_from():
    x = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    t, q = rs.sample_draft(x, seed=3, top_k=5)
    assert q.dtype == np.float32 and q.shape == (100,)
    assert q[t] > 0 and (q > 0).sum() == 5
    assert q.sum() == pytest.approx(1.0, abs=1e-5)


def test_seeded_sampling_is_deterministic():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert [rs.sample(x, seed=s) for s in range(20)] == [rs.sample(x, seed=s) for s in range(20)]


def test_bad_rows_raise():
    with pytest.raises(ShapeError, match="float32"):
        rs.sample(np.zeros(4, np.int32), seed=0)
    with pytest.raises(ShapeError, match=r"\[vocab\]"):
        rs.sample(np.zeros((2, 4), np.float32), seed=0)
    with pytest.raises(ShapeError, match="C-contiguous"):
        rs.sample(np.zeros(8, np.float32)[::2], seed=0)
    x = np.zeros(4, np.float32)
    x[3] = np.inf
    with pytest.raises(NonFiniteLogitsError, match="token 3"):
        rs.sample(x, seed=0)
    with pytest.raises(NonFiniteLogitsError, match="all -inf"):
        rs.sample(np.full(4, -np.inf, np.float32), seed=0)
