"""The Python API under hypothesis: arbitrary argument combinations, valid and invalid.

Rule checked everywhere: a call either works (and its result is well-formed: token ids in range, finite
log-probabilities, a finish reason, determinism for a seed) or raises the documented specrt exception for the first
bad argument (``ConfigError`` / ``ShapeError`` / ``VocabError`` / ``SequenceLengthError``, all ``ValueError``s;
``NonFiniteLogitsError`` for NaN / inf logits). Never anything else: no ``OverflowError``, ``KeyError``,
``TypeError`` for values of the right type, ``PanicException``, crash or hang.

Each test runs 400 examples by default (about 13 s here); ``SPECRT_FUZZ_EXAMPLES=N`` sets another count.
Each property states its oracle: the documented valid ranges, evaluated as the engine sees the values (floats are
float32 in the engine, so e.g. ``top_p=1e-50`` is 0 there and invalid).
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import specrt
from specrt import _specrt, cost
from specrt.convert import convert
from specrt.convert.tiny import write_tiny_gguf
from specrt.errors import (
    ConfigError,
    NonFiniteLogitsError,
    SequenceLengthError,
    ShapeError,
    SpecrtError,
    VocabError,
)

VOCAB = 265
MAX_SEQ = 64
# SPECRT_FUZZ_EXAMPLES raises the count for a long run (benches/RESULTS.md, "Robustness").
FAST = settings(
    max_examples=int(os.environ.get("SPECRT_FUZZ_EXAMPLES", "400")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)


def _f32(x: float) -> float:
    with warnings.catch_warnings(), np.errstate(over="ignore"):
        warnings.simplefilter("ignore")
        return float(np.float32(x))


def _convert_tiny(root: Path, name: str, **kw) -> Path:
    gguf = write_tiny_gguf(root / f"{name}.gguf", **kw)
    return convert(gguf, root / name, progress=False)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> specrt.Decoder:
    root = tmp_path_factory.mktemp("fuzz_api")
    target = _convert_tiny(root, "target", arch="qwen2", seed=1, n_layers=1)
    draft = _convert_tiny(root, "draft", arch="qwen2", seed=5, n_layers=1)
    return specrt.Decoder(target, draft, max_seq_len=MAX_SEQ)


# ---------------------------------------------------------------------------------------------------------------
# Decoder.generate


def wild_floats(lo: float, hi: float) -> st.SearchStrategy[float]:
    """Mostly in [lo, hi], sometimes just outside, sometimes anything (NaN, inf, huge, tiny, denormal)."""
    return st.one_of(
        st.floats(lo, hi),
        st.sampled_from([lo, hi, 0.0, -0.0, 1.0, 1e-50, 1e-40, 1e39, -1e-45, 3.4e38]),
        st.floats(allow_nan=True, allow_infinity=True),
    )


def wild_ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(lo, hi),
        st.sampled_from([-1, 0, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**70, -(2**63) - 1]),
    )


PROPOSERS = [None, "draft", "ngram", "ngram+draft", "none", "auto"]


def mostly(valid: st.SearchStrategy, wild: st.SearchStrategy) -> st.SearchStrategy:
    """``valid`` nine times in ten, else ``wild``: most requests then have at most one bad argument, so every
    check is reached (a request with several bad ones stops at the first)."""
    return st.integers(0, 9).flatmap(lambda i: wild if i == 0 else valid)


requests = st.fixed_dictionaries(
    {
        "prompt": mostly(
            st.one_of(st.text(min_size=1, max_size=40), st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24)),
            st.one_of(st.just(""), st.lists(wild_ints(-2, VOCAB + 2), max_size=24)),
        ),
        "max_new_tokens": mostly(st.integers(1, 30), wild_ints(-3, 80)),
        "num_speculative_tokens": mostly(
            st.one_of(st.integers(0, 8), st.just("auto")),
            st.one_of(wild_ints(-2, 70), st.sampled_from(["x", "", 2.0, 1.5, True, None])),
        ),
        "proposer": mostly(st.sampled_from(PROPOSERS), st.just("bogus")),
        "prompt_lookup_min": mostly(st.integers(1, 3), wild_ints(-1, 40)),
        "prompt_lookup_max": mostly(st.integers(3, 6), wild_ints(-1, 40)),
        "temperature": mostly(st.one_of(st.none(), st.sampled_from([0.0, 1.0]), st.floats(0, 2)), wild_floats(0, 2)),
        "top_k": mostly(st.one_of(st.none(), st.integers(0, 300)), wild_ints(-2, 2**33)),
        "top_p": mostly(st.one_of(st.none(), st.floats(0.05, 1.0)), wild_floats(0.0, 1.0)),
        "min_p": mostly(st.one_of(st.none(), st.floats(0, 1)), wild_floats(0.0, 1.0)),
        "repetition_penalty": mostly(st.one_of(st.none(), st.floats(0.5, 2)), wild_floats(0.5, 2.0)),
        "frequency_penalty": mostly(st.floats(-2, 2), wild_floats(-2.0, 2.0)),
        "presence_penalty": mostly(st.floats(-2, 2), wild_floats(-2.0, 2.0)),
        "seed": mostly(st.integers(0, 2**64 - 1), wild_ints(0, 2**64 - 1)),
        "stop": mostly(
            st.one_of(
                st.none(), st.text(min_size=1, max_size=3), st.lists(st.text(min_size=1, max_size=3), max_size=3)
            ),
            st.one_of(st.just(""), st.lists(st.text(max_size=3), max_size=3)),
        ),
        "stop_token_ids": mostly(
            st.one_of(st.none(), st.lists(st.integers(0, VOCAB - 1), max_size=3)),
            st.lists(wild_ints(0, VOCAB - 1), max_size=3),
        ),
        "ignore_eos": st.booleans(),
        "pinned_costs": mostly(
            st.one_of(
                st.none(),
                st.fixed_dictionaries(
                    {"c_draft": st.floats(0, 2), "c_verify": st.lists(st.floats(0.5, 3), min_size=9, max_size=12)}
                ),
            ),
            st.one_of(
                st.fixed_dictionaries(
                    {
                        "c_draft": wild_floats(0.0, 2.0),
                        "c_verify": st.lists(wild_floats(0.5, 3.0), min_size=0, max_size=12),
                    }
                ),
                st.sampled_from([{}, {"c_draft": 1.0}, {"c_verify": [1.0] * 9}, {"c_draft": "x", "c_verify": 1}]),
            ),
        ),
    }
)


def _pinned_ok(pinned: dict, proposer: str, k_max: int = 8) -> bool:
    """Pinned costs as documented: both keys, c_draft >= 0, K_max + 1 (9 with K "auto") values of c_verify > 0, all
    finite."""
    if set(pinned) != {"c_draft", "c_verify"}:
        return False
    c_draft, c_verify = pinned["c_draft"], pinned["c_verify"]
    if not isinstance(c_draft, float) or not isinstance(c_verify, list):
        return False
    return proposer == "none" or (
        len(c_verify) >= k_max + 1
        and math.isfinite(c_draft)
        and c_draft >= 0
        and all(math.isfinite(c) and c > 0 for c in c_verify)
    )


def _expected_errors(dec: specrt.Decoder, kw: dict) -> tuple[set[type], set[type]]:
    """(errors the request must raise one of -- empty if it is valid, errors it may raise on top)."""
    bad: set[type] = set()
    may: set[type] = set()
    prompt = kw["prompt"]
    ids = dec.tokenizer.encode(prompt).ids if isinstance(prompt, str) else prompt
    if not ids:
        bad.add(ConfigError)
    if any(not 0 <= t < VOCAB for t in ids):
        bad.add(VocabError)
    n = kw["max_new_tokens"]
    if n < 1:
        bad.add(ConfigError)
    elif len(ids) + n > MAX_SEQ:
        bad.add(SequenceLengthError)
    k = kw["num_speculative_tokens"]
    auto = k == "auto"
    if not auto and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= 64):
        bad.add(ConfigError)
    proposer = kw["proposer"] or "draft"
    if proposer not in ("draft", "ngram", "ngram+draft", "none", "auto"):
        bad.add(ConfigError)
    # "auto": the n-gram proposer and the draft model under auto K, a fixed K its cap (K = 0: no auto K)
    if ("ngram" in proposer or proposer == "auto") and not 1 <= kw["prompt_lookup_min"] <= kw[
        "prompt_lookup_max"
    ] <= 32:
        bad.add(ConfigError)
    k_max = 8 if auto or not isinstance(k, int) else k
    auto_k = auto or (proposer == "auto" and isinstance(k, int) and not isinstance(k, bool) and k > 0)
    pinned = kw["pinned_costs"]
    if pinned is not None and (not auto_k or not _pinned_ok(pinned, proposer, k_max)):
        bad.add(ConfigError)
    d = dec.defaults
    t = _f32(d.get("temperature", 1.0) if kw["temperature"] is None else kw["temperature"])
    if not (math.isfinite(t) and t >= 0):
        bad.add(ConfigError)
    top_k = kw["top_k"]
    if top_k is not None and not 0 <= top_k < 2**32:
        bad.add(ConfigError)
    top_p = _f32(1.0 if kw["top_p"] is None else kw["top_p"])
    if not 0 < top_p <= 1:
        bad.add(ConfigError)
    min_p = _f32(0.0 if kw["min_p"] is None else kw["min_p"])
    if not 0 <= min_p <= 1:
        bad.add(ConfigError)
    r = _f32(1.0 if kw["repetition_penalty"] is None else kw["repetition_penalty"])
    if not (math.isfinite(r) and r > 0):
        bad.add(ConfigError)
    for name in ("frequency_penalty", "presence_penalty"):
        if not math.isfinite(_f32(kw[name])):
            bad.add(ConfigError)
    # Penalties large enough to push a float32 logit to +-inf are reported as non-finite logits.
    if abs(_f32(kw["frequency_penalty"])) > 1e30 or abs(_f32(kw["presence_penalty"])) > 1e30:
        may.add(NonFiniteLogitsError)
    if math.isfinite(r) and (r < 1e-30 or r > 1e30):
        may.add(NonFiniteLogitsError)
    if not 0 <= kw["seed"] < 2**64:
        bad.add(ConfigError)
    stop = kw["stop"]
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(s == "" for s in stops):
        bad.add(ConfigError)
    if any(not 0 <= i < VOCAB for i in kw["stop_token_ids"] or []):
        bad.add(VocabError)
    return bad, may


def _call(dec: specrt.Decoder, kw: dict) -> specrt.GenerationResult:
    kw = dict(kw)
    return dec.generate(kw.pop("prompt"), **kw)


BASE_REQUEST = {
    "prompt": "hello",
    "max_new_tokens": 4,
    "num_speculative_tokens": 2,
    "proposer": None,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 3,
    "temperature": 0.0,
    "top_k": None,
    "top_p": None,
    "min_p": None,
    "repetition_penalty": None,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "seed": 0,
    "stop": None,
    "stop_token_ids": None,
    "ignore_eos": False,
    "pinned_costs": None,
}


@FAST
@given(kw=requests)
# Found by this test (OverflowError / KeyError / silently accepted before the fixes):
@example(kw={**BASE_REQUEST, "proposer": "ngram", "prompt_lookup_min": -1})
@example(kw={**BASE_REQUEST, "proposer": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 3})
@example(kw={**BASE_REQUEST, "num_speculative_tokens": "auto", "pinned_costs": {}})
@example(kw={**BASE_REQUEST, "seed": -1})
@example(kw={**BASE_REQUEST, "max_new_tokens": 2**64})
@example(kw={**BASE_REQUEST, "stop_token_ids": [VOCAB]})
def test_generate_with_arbitrary_arguments_works_or_raises_the_documented_error(decoder, kw) -> None:
    bad, may = _expected_errors(decoder, kw)
    try:
        out = _call(decoder, kw)
    except SpecrtError as e:
        event(f"raised {type(e).__name__}")
        assert type(e) in bad | may or any(isinstance(e, c) for c in bad), (
            f"{type(e).__name__}: {e}; expected {sorted(c.__name__ for c in bad)} for {kw}"
        )
        assert isinstance(e, ValueError)
        assert str(e)
        return
    event("generated")
    assert not bad, f"accepted an invalid request (expected {sorted(c.__name__ for c in bad)}): {kw}"
    n = len(out.token_ids)
    assert 1 <= n <= kw["max_new_tokens"] or (n == 0 and out.finish_reason == "stop")
    assert out.finish_reason in ("eos", "stop", "length")
    assert all(0 <= t < VOCAB for t in out.token_ids)
    assert len(out.logprobs) == len(out.sources) == n
    assert all(math.isfinite(lp) and lp <= 1e-4 for lp in out.logprobs), out.logprobs
    assert set(out.sources) <= {"accepted", "recovered", "bonus"}
    assert out.stats.n_emitted == n
    if out.finish_reason == "length":
        assert n == kw["max_new_tokens"]
    if kw["num_speculative_tokens"] != "auto" or kw["pinned_costs"] is not None:
        assert _call(decoder, kw).token_ids == out.token_ids, "same seed and settings, different tokens"


# ---------------------------------------------------------------------------------------------------------------
# Low-level kernels: arbitrary arrays (dtype, shape, layout, NaN / inf / denormal values) and parameters.

ROW_VALUES = st.one_of(
    st.floats(-30, 30, width=32),
    st.sampled_from([0.0, -0.0, 1.0, float("nan"), float("inf"), float("-inf"), 1e-45, -1e-45, 3.4e38, -3.4e38]),
)


@st.composite
def arrays(draw, ndim: int) -> np.ndarray:
    """float32 C-contiguous most of the time; sometimes another dtype, rank or layout."""
    kind = draw(st.sampled_from(["ok"] * 6 + ["float64", "int32", "rank", "strided", "fortran"]))
    shape = tuple(draw(st.integers(1 if i == 0 else 0, 12)) for i in range(ndim)) if ndim else ()
    a = draw(hnp.arrays(np.float32, shape, elements=ROW_VALUES))
    if kind == "float64":
        return a.astype(np.float64)
    if kind == "int32":
        return np.nan_to_num(a).clip(-100, 100).astype(np.int32)
    if kind == "rank":
        return a[None]
    if kind == "strided":
        return np.repeat(a, 2, axis=-1)[..., ::2] if a.shape[-1] > 1 else a[..., ::1][None]
    if kind == "fortran" and ndim == 2 and min(a.shape) > 1:
        return np.asfortranarray(a)
    return a


def _array_ok(a: np.ndarray, ndim: int) -> bool:
    return a.dtype == np.float32 and a.ndim == ndim and a.flags.c_contiguous


def _row_state(row: np.ndarray) -> str:
    if np.isnan(row).any() or np.isposinf(row).any():
        return "bad"
    if row.size == 0 or np.isneginf(row).all():
        return "bad"
    return "ok"


params = st.fixed_dictionaries(
    {
        "temperature": st.one_of(st.sampled_from([0.0, 1.0, 0.7]), wild_floats(0.0, 3.0)),
        "top_k": st.one_of(st.integers(0, 20), st.integers(-3, 2**31)),
        "top_p": st.one_of(st.just(1.0), wild_floats(0.0, 1.0)),
        "min_p": st.one_of(st.just(0.0), wild_floats(0.0, 1.0)),
        "repetition_penalty": st.one_of(st.just(1.0), wild_floats(0.5, 2.0)),
        "frequency_penalty": st.one_of(st.just(0.0), st.floats(-2, 2)),
        "presence_penalty": st.one_of(st.just(0.0), st.floats(-2, 2)),
    }
)


def _params_ok(p: dict) -> bool:
    t, tp, mp, r = (_f32(p[k]) for k in ("temperature", "top_p", "min_p", "repetition_penalty"))
    return (
        math.isfinite(t)
        and t >= 0
        and 0 < tp <= 1
        and 0 <= mp <= 1
        and math.isfinite(r)
        and r > 0
        and 0 <= p["top_k"] < 2**32
        and math.isfinite(_f32(p["frequency_penalty"]))
        and math.isfinite(_f32(p["presence_penalty"]))
    )


@FAST
@given(
    row=arrays(1),
    p=params,
    seed=st.integers(0, 2**64 - 1),
    out_tokens=st.lists(st.integers(-2, 14), max_size=4),
    fn=st.sampled_from(["sample", "sample_draft", "process_logits"]),
)
def test_row_kernels_with_arbitrary_input_return_in_range_tokens_or_the_documented_error(
    row, p, seed, out_tokens, fn
) -> None:
    allowed: set[type] = set()
    if not _params_ok(p):
        allowed.add(ConfigError)
    if not _array_ok(row, 1):
        allowed.add(ShapeError)
    elif any(not 0 <= t < row.size for t in out_tokens):
        allowed.add(VocabError)
    elif _row_state(row) == "bad" or p["repetition_penalty"] != 1.0 or p["frequency_penalty"] or p["presence_penalty"]:
        allowed.add(NonFiniteLogitsError)  # raw NaN / inf, or penalties pushing a logit out of float32
    kw = {**p, "output_tokens": out_tokens}
    if fn != "process_logits":
        kw["seed"] = seed
    try:
        out = getattr(_specrt, fn)(row, **kw)
    except SpecrtError as e:
        assert any(isinstance(e, c) for c in allowed), f"{type(e).__name__}: {e} (allowed {allowed})"
        if isinstance(e, NonFiniteLogitsError):
            assert e.row == 0 and 0 <= e.token < max(row.size, 1)
        return
    assert ConfigError not in allowed and ShapeError not in allowed and VocabError not in allowed
    assert _row_state(row) == "ok"
    probs = _specrt.process_logits(row, **{k: v for k, v in kw.items() if k != "seed"})
    assert np.isfinite(probs).all() and (probs >= 0).all() and abs(float(probs.sum(dtype=np.float64)) - 1) < 1e-3
    if fn == "process_logits":
        return
    tok = out if fn == "sample" else out[0]
    assert 0 <= tok < row.size
    assert probs[tok] > 0, f"sampled token {tok} has probability 0"
    if fn == "sample_draft":
        np.testing.assert_allclose(out[1], probs, rtol=0, atol=1e-6)


@FAST
@given(
    data=st.data(),
    p=params,
    seed=st.integers(0, 2**64 - 1),
    mode=st.sampled_from(["stochastic", "deterministic", "greedy", "bogus"]),
)
def test_verify_with_arbitrary_input_is_well_formed_or_the_documented_error(data, p, seed, mode) -> None:
    k = data.draw(st.one_of(st.integers(0, 5), st.just(65)))
    vocab = data.draw(st.integers(1, 10))
    tgt = data.draw(
        st.one_of(
            hnp.arrays(np.float32, (k + 1, vocab), elements=ROW_VALUES),
            hnp.arrays(np.float32, (k + 1, vocab), elements=st.floats(-5, 5, width=32)),
            arrays(2),
        )
    )
    q_kind = data.draw(st.sampled_from(["valid", "valid", "garbage", "none", "wrong"]))
    if q_kind == "valid":
        q = np.random.default_rng(seed % 2**32).dirichlet(np.ones(vocab), size=k).astype(np.float32)
    elif q_kind == "garbage":
        q = data.draw(hnp.arrays(np.float32, (k, vocab), elements=ROW_VALUES))
    elif q_kind == "wrong":
        q = data.draw(arrays(2))
    else:
        q = None
    tokens = data.draw(
        st.one_of(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k), st.lists(wild_ints(-1, 12), max_size=7))
    )
    try:
        v = _specrt.verify(tgt, q, tokens, seed=seed, mode=mode, **p)
    except (ConfigError, ShapeError, VocabError, NonFiniteLogitsError) as e:
        assert str(e)
        return
    # Success: the inputs were valid enough to run, and the output is well-formed.
    assert _params_ok(p) and mode != "bogus" and _array_ok(tgt, 2)
    n_vocab = tgt.shape[1]
    assert len(tokens) <= 64 and tgt.shape[0] == len(tokens) + 1
    assert 0 <= v.n_accepted <= v.n_draft == len(tokens)
    assert len(v.tokens) == v.n_accepted + 1
    assert list(v.tokens[: v.n_accepted]) == list(tokens[: v.n_accepted])
    assert all(0 <= t < n_vocab for t in v.tokens)
    assert all(0 <= a <= 1 for a in v.accept_probs)
    assert v.last in ("recovered", "bonus")
    # Every emitted token has positive probability under its processed target row.
    for i, t in enumerate(v.tokens):
        kw = {k_: val for k_, val in p.items()}
        probs = _specrt.process_logits(np.ascontiguousarray(tgt[i]), output_tokens=list(tokens[:i]), **kw)
        assert probs[t] > 0, f"row {i} emitted token {t} of probability 0"


@FAST
@given(state=st.integers(0, 2**128 - 1), inc=st.integers(0, 2**128 - 1))
def test_rng_from_arbitrary_state_is_valid_or_a_config_error(state, inc) -> None:
    try:
        r = _specrt.Rng.from_state(state, inc)
    except ConfigError:
        assert inc % 2 == 0
        return
    assert inc % 2 == 1
    assert 0.0 <= r.random() < 1.0


# ---------------------------------------------------------------------------------------------------------------
# Cost model: arbitrary floats and (also huge) K.

costs = st.one_of(st.floats(0, 100), st.floats(allow_nan=True, allow_infinity=True))
units = st.one_of(st.floats(0, 1), st.floats(allow_nan=True, allow_infinity=True))
ks = st.one_of(st.integers(0, 64), st.integers(0, 2**64 - 1))


@FAST
@given(a=units, k=ks, c_q=costs, c_p=costs, c_verify=st.one_of(st.none(), costs), which=st.integers(0, 5))
# Found by this test: a loop over K hung (GIL held) for huge K; k + 1 overflowed for K = 2**64 - 1.
@example(a=0.999, k=2**64 - 1, c_q=1.0, c_p=10.0, c_verify=None, which=0)
@example(a=0.7, k=2**40, c_q=1.0, c_p=10.0, c_verify=None, which=3)
@example(a=0.5, k=2**64 - 1, c_q=1.0, c_p=10.0, c_verify=None, which=4)
def test_cost_model_with_arbitrary_numbers_returns_finite_values_or_a_config_error(a, k, c_q, c_p, c_verify, which):
    try:
        if which == 0:
            v = cost.expected_tokens(a, k)
            assert 1 <= v <= k + 1 + 1e-9 * k
        elif which == 1:
            v = cost.cycle_cost(k, c_q, c_p, c_verify)
            assert v >= 0
        elif which == 2:
            v = cost.speedup(a, k, c_q, c_p, c_verify)
            assert v >= 0
        elif which == 3:
            r = cost.optimal_k(a, c_q, c_p, k_max=k)
            assert 0 <= r.k <= k
            v = r.speedup
        elif which == 4:
            e = 1 + a * k if math.isfinite(a) else a
            v = cost.alpha_from_tokens_per_round(e, k)
            assert 0 <= v <= 1
        else:
            r = cost.compare_drafts(a, c_q, 1 - a if math.isfinite(a) else a, c_p, k=k, c_p=c_p, c_verify=c_verify)
            v = r.speedup_a
    except ConfigError as e:
        assert str(e)
        return
    assert not math.isnan(v)
    assume(True)
