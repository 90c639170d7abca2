"""Rust vs the NumPy reference (specrt.reference_sampling), draw for draw, on random inputs."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import specrt._specrt as rs
from specrt import reference_sampling as ref

params_st = st.builds(
    ref.Params,
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    top_k=st.sampled_from([0, 1, 3, 10]),
    top_p=st.sampled_from([1.0, 0.9, 0.5]),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
    repetition_penalty=st.sampled_from([1.0, 1.3]),
    frequency_penalty=st.sampled_from([0.0, 0.4]),
    presence_penalty=st.sampled_from([0.0, -0.5, 0.6]),
)


def kwargs(p: ref.Params) -> dict:
    return dict(
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        min_p=p.min_p,
        repetition_penalty=p.repetition_penalty,
        frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty,
    )


def test_rng_matches_numpy_pcg64_draw_for_draw():
    r = rs.Rng(12345)
    assert r.state == ref.pcg_state_from_seed(12345)
    gen = ref.numpy_generator(*r.state)
    bg = ref.numpy_generator(*r.state).bit_generator
    for _ in range(1000):
        assert r.copy().next_u64() == bg.random_raw()
        assert r.random() == gen.random()


def test_rng_from_state_resumes_stream():
    a = rs.Rng(3)
    a.random()
    b = rs.Rng.from_state(*a.state)
    assert [a.random() for _ in range(10)] == [b.random() for _ in range(10)]


@given(params=params_st, seed=st.integers(0, 2**64 - 1), vocab=st.integers(2, 300), data=st.data())
def test_process_and_sample_match_reference(params, seed, vocab, data):
    g = np.random.default_rng(seed % 2**32)
    logits = (g.standard_normal(vocab) * 3).astype(np.float32)
    output = data.draw(st.lists(st.integers(0, vocab - 1), max_size=5))
    prompt = data.draw(st.lists(st.integers(0, vocab - 1), max_size=5))
    got = rs.process_logits(logits, prompt_tokens=prompt, output_tokens=output, **kwargs(params))
    want = ref.process(logits, params, prompt, output).probs()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-12)
    rng = rs.Rng(seed)
    gen = ref.numpy_generator(*rng.state)
    for _ in range(5):
        t = rs.sample(logits, rng=rng, prompt_tokens=prompt, output_tokens=output, **kwargs(params))
        assert t == ref.sample(logits, params, gen, prompt, output)


@given(
    params=params_st,
    seed=st.integers(0, 2**64 - 1),
    vocab=st.integers(2, 200),
    k=st.integers(0, 6),
    mode=st.sampled_from(["stochastic", "deterministic"]),
    noise=st.sampled_from([0.0, 0.5, 3.0]),
)
def test_verify_matches_reference(params, seed, vocab, k, mode, noise):
    g = np.random.default_rng(seed % 2**32)
    # [k + 1, vocab] target logits; the draft is the target plus noise (noise 0: identical rows).
    target = (g.standard_normal((k + 1, vocab)) * 2).astype(np.float32)
    rng = rs.Rng(seed)
    gen = ref.numpy_generator(*rng.state)
    draft_probs = np.zeros((k, vocab), np.float32)
    tokens = []
    for i in range(k):
        dl = (target[i] + noise * g.standard_normal(vocab)).astype(np.float32)
        t, q = rs.sample_draft(dl, rng=rng, output_tokens=tokens, **kwargs(params))
        t_ref, q_ref = ref.sample_draft(dl, params, gen, (), tokens)
        assert t == t_ref
        np.testing.assert_allclose(q, q_ref, rtol=2e-5, atol=1e-12)
        draft_probs[i] = q
        tokens.append(t)
    v = rs.verify(target, draft_probs, tokens, rng=rng, mode=mode, **kwargs(params))
    w = ref.verify(target, draft_probs, tokens, params, gen, mode=mode)
    assert (v.n_accepted, v.tokens, v.last) == (w.n_accepted, w.tokens, w.last)
    assert rng.random() == gen.random()  # same number of draws
