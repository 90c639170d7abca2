"""The batched-attention spike (benches/spike_batched_attention.py) computes what GroupQueryAttention computes: each
row of one masked batched pass over [B, K + 1] new tokens on ragged caches equals that row's own batch-1 GQA pass
(output, new keys after rotary, new values), and GQA itself still refuses the batched multi-token case."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

SPIKE = Path(__file__).resolve().parents[2] / "benches" / "spike_batched_attention.py"


@pytest.fixture(scope="module")
def spike():
    spec = importlib.util.spec_from_file_location("spike_batched_attention", SPIKE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_masked_batched_rows_equal_their_solo_gqa_pass(spike) -> None:
    s = spike.Shapes(64, 4, 2, 16, 128, 48)
    w = spike.weights(s, seed=2)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    gqa = ort.InferenceSession(spike.gqa_graph(s, w), so, providers=["CPUExecutionProvider"])
    masked = ort.InferenceSession(spike.masked_graph(s, w), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    B, S, past = 3, 4, [0, 9, 30]  # an empty cache, a short one, a long one
    x = rng.standard_normal((B, S, s.H)).astype(np.float32)
    pk = rng.standard_normal((B, s.kvh, s.L, s.hd)).astype(np.float32)
    pv = rng.standard_normal((B, s.kvh, s.L, s.hd)).astype(np.float32)
    y, new_k, new_v = masked.run(
        None,
        {
            "x": x,
            "positions": np.array([[p + j for j in range(S)] for p in past], np.int64),
            "past_len": np.array(past, np.int64),
            "past_kt": np.ascontiguousarray(pk.transpose(0, 1, 3, 2)),
            "past_v": pv,
        },
    )
    for b, p in enumerate(past):
        y_r, k_r, v_r = gqa.run(
            None,
            {
                "x": x[b : b + 1],
                "past_key": pk[b : b + 1].copy(),
                "past_value": pv[b : b + 1].copy(),
                "seqlens_k": np.array([p + S - 1], np.int32),
                "total_sequence_length": np.array(p + S, np.int32),
            },
        )
        np.testing.assert_allclose(y[b], y_r[0], atol=2e-5, rtol=1e-5)
        np.testing.assert_allclose(new_k[b], k_r[0, :, p : p + S], atol=2e-6)
        np.testing.assert_array_equal(new_v[b], v_r[0, :, p : p + S])
    # A mask that ignored the lengths would change row 0 (empty cache): garbage keys would enter its softmax.
    y_bad = masked.run(
        None,
        {
            "x": x,
            "positions": np.array([[p + j for j in range(S)] for p in past], np.int64),
            "past_len": np.array([s.L] * B, np.int64),
            "past_kt": np.ascontiguousarray(pk.transpose(0, 1, 3, 2)),
            "past_v": pv,
        },
    )[0]
    assert np.abs(y_bad[0] - y[0]).max() > 1e-2
    with pytest.raises(Exception, match="batch_size must be 1 when sequence_length > 1 and past context is given"):
        gqa.run(
            None,
            {
                "x": x,
                "past_key": pk,
                "past_value": pv,
                "seqlens_k": np.array([p + S - 1 for p in past], np.int32),
                "total_sequence_length": np.array(max(past) + S, np.int32),
            },
        )
