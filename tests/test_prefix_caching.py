"""Prefix caching on SmolLM2-135M fp32 (single stream and the batched layout): a 4-turn chat, each turn's prompt
the rendered history, gives the same token ids with prefix caching as without it, greedy (with and without an int4
draft) and with coupled sampling; turns 2-4 reuse the history's KV (``Stats.n_cached_tokens``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import specrt
from specrt.errors import ConfigError
from specrt.models import cache_dir

QUESTIONS = [
    "Name three colours.",
    "Which of them is the colour of the sky?",
    "And the colour of grass?",
    "Thank you. Say goodbye.",
]


def _folder(layout: str) -> Path:
    folder = cache_dir() / "models" / "smollm2-135m-instruct" / layout
    if not (folder / "model.onnx").is_file():
        pytest.skip(f"SmolLM2 {layout} is not in the cache (specrt models pull smollm2-135m-instruct)")
    return folder


def _chat(dec: specrt.Decoder, **kwargs: Any) -> list[specrt.GenerationResult]:
    """Four turns: each prompt is the whole history rendered with the chat template."""
    messages: list[dict[str, str]] = []
    results = []
    for q in QUESTIONS:
        messages.append({"role": "user", "content": q})
        r = dec.generate(dec.apply_chat_template(messages), max_new_tokens=12, **kwargs)
        messages.append({"role": "assistant", "content": r.text})
        results.append(r)
    return results


def _check(cached: specrt.Decoder, fresh: specrt.Decoder, **kwargs: Any) -> None:
    a, b = _chat(cached, **kwargs), _chat(fresh, **kwargs)
    for turn, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.token_ids == y.token_ids, f"turn {turn + 1}"
        assert y.stats.n_cached_tokens == 0
        if turn > 0:
            # The re-rendered history repeats the previous prompt and (most of) the answer.
            assert x.stats.prefix_cache_hit
            assert x.stats.n_cached_tokens >= a[turn - 1].stats.n_prompt_tokens - 1, f"turn {turn + 1}"


def test_single_stream_chat_turns_reuse_the_history_and_give_the_same_tokens() -> None:
    fp32, int4 = _folder("fp32"), _folder("int4")
    cached = specrt.Decoder(fp32, max_seq_len=512)
    fresh = specrt.Decoder(fp32, max_seq_len=512, prefix_caching=False)
    _check(cached, fresh, temperature=0.0)
    cached = specrt.Decoder(fp32, int4, max_seq_len=512)
    fresh = specrt.Decoder(fp32, int4, max_seq_len=512, prefix_caching=False)
    _check(cached, fresh, temperature=0.0, num_speculative_tokens=3)
    _check(cached, fresh, temperature=0.8, seed=4, coupled=True, num_speculative_tokens=3)


def test_batched_layout_chat_turns_reuse_the_history_and_give_the_same_tokens() -> None:
    folder = _folder("fp32-B")
    cached = specrt.Decoder(folder, max_seq_len=512, max_batch=2)
    fresh = specrt.Decoder(folder, max_seq_len=512, max_batch=2, prefix_caching=False)
    _check(cached, fresh, temperature=0.0)
    _check(cached, fresh, temperature=0.8, seed=3, coupled=True)


def test_prefix_caching_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="prefix_caching 'no' is invalid"):
        specrt.Decoder(_folder("fp32"), prefix_caching="no")  # type: ignore[arg-type]
