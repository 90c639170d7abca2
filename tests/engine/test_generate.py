"""The generation API end to end on tiny random-weight models converted from GGUF (and SmolLM2-135M when pulled).

Greedy parity (speculative == target-only, token for token), the distribution of the first token at temperature 1,
stops (EOS, stop token, stop string, max_new_tokens), streaming, statistics and bad input.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

import specrt
from specrt import _specrt
from specrt._ort import find_ort_library
from specrt.convert import convert
from specrt.convert.tiny import write_tiny_gguf
from specrt.errors import ConfigError, SequenceLengthError, VocabError


def _convert_tiny(root: Path, name: str, attention: str = "gqa", **kw) -> Path:
    gguf = write_tiny_gguf(root / f"{name}.gguf", **kw)
    return convert(gguf, root / name, progress=False, attention=attention)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A qwen2 target, drafts of the same family (a 1-layer one and one with other weights), and a llama model."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        "target": _convert_tiny(root, "target", arch="qwen2", seed=1, n_layers=2),
        "draft_close": _convert_tiny(root, "draft_close", arch="qwen2", seed=1, n_layers=1),
        "draft_other": _convert_tiny(root, "draft_other", arch="qwen2", seed=7, n_layers=1),
        "llama": _convert_tiny(root, "llama", arch="llama", seed=3, n_layers=2, n_heads=4, n_kv_heads=1),
        # The graph form (sequence lengths and logit positions as inputs; ARCHITECTURE.md "Graph form").
        "target_graph": _convert_tiny(root, "target_graph", "gqa-graph", arch="qwen2", seed=1, n_layers=2),
        "draft_other_graph": _convert_tiny(root, "draft_other_graph", "gqa-graph", arch="qwen2", seed=7, n_layers=1),
    }


@pytest.fixture(scope="module")
def target_only(tiny: dict[str, Path]) -> specrt.Decoder:
    return specrt.Decoder(tiny["target"], max_seq_len=256)


PROMPTS = ["def add(a, b):", "hello world, hello", "x = [1, 2, 3]\nfor"]


@pytest.mark.parametrize("draft", ["target", "draft_close", "draft_other"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_speculative_output_equals_target_only(tiny, target_only, draft: str, k: int) -> None:
    dec = specrt.Decoder(tiny["target"], tiny[draft], max_seq_len=256)
    for prompt in PROMPTS:
        ref = target_only.generate(prompt, max_new_tokens=40, temperature=0, ignore_eos=True)
        out = dec.generate(prompt, max_new_tokens=40, temperature=0, num_speculative_tokens=k, ignore_eos=True)
        assert out.token_ids == ref.token_ids, (prompt, draft, k)
        assert out.text == ref.text
        # fp32 kernels over k + 1 rows and over one row round differently (~1e-5).
        np.testing.assert_allclose(out.logprobs, ref.logprobs, rtol=0, atol=1e-4)
        s = out.stats
        assert s.n_accepted + s.n_recovered + s.n_bonus == len(out.token_ids) == 40
        if draft == "target":
            assert s.n_accepted == s.n_drafted, "a draft identical to the target is always accepted"


def test_greedy_parity_on_llama_layout_with_self_draft(tiny) -> None:
    ref = specrt.Decoder(tiny["llama"]).generate("abc", max_new_tokens=30, temperature=0, ignore_eos=True)
    out = specrt.Decoder(tiny["llama"], tiny["llama"]).generate(
        "abc", max_new_tokens=30, temperature=0, num_speculative_tokens=5, ignore_eos=True
    )
    assert out.token_ids == ref.token_ids
    assert out.stats.mean_tokens_per_round == pytest.approx(30 / out.stats.n_rounds)


@pytest.mark.parametrize("form", ["", "_graph"], ids=["gqa", "gqa-graph"])
def test_first_token_at_temperature_one_follows_the_target_distribution(tiny, form: str) -> None:
    # Exact target distribution of the first generated token, from the target's logits (of the default form: the
    # graph form must sample it too).
    dec = specrt.Decoder(tiny["target" + form], tiny["draft_other" + form], max_seq_len=64)
    ids = dec.encode("hello", None)
    model = _specrt.OrtModel(str(tiny["target"]), ort_library=find_ort_library(), max_seq_len=64)
    logits = model.forward(np.array(ids, dtype=np.int64), 0, 1)[0].astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    n = 4000
    counts = np.zeros_like(p)
    for seed in range(n):
        out = dec.generate(ids, max_new_tokens=2, temperature=1.0, num_speculative_tokens=3, seed=seed)
        counts[out.token_ids[0]] += 1
    # Pearson chi-square over cells with expected count >= 5 (the rest pooled); critical value at z = 4.3
    # (Wilson-Hilferty, one-sided p ~ 1e-5): a correct sampler fails with negligible probability, and a sampler off
    # by a few percent of mass on a frequent token fails reliably at this n.
    expected = p * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    stat = float(((obs - exp) ** 2 / np.maximum(exp, 1e-12)).sum())
    df = len(obs) - 1
    a = 2 / (9 * df)
    crit = df * (1 - a + 4.3 * math.sqrt(a)) ** 3
    assert stat < crit, f"chi-square {stat:.1f} >= {crit:.1f} (df {df})"


def test_same_seed_same_output_and_seed_matters(tiny) -> None:
    dec = specrt.Decoder(tiny["target"], tiny["draft_close"])
    a = dec.generate("hello", max_new_tokens=30, temperature=1.0, seed=5, ignore_eos=True)
    b = dec.generate("hello", max_new_tokens=30, temperature=1.0, seed=5, ignore_eos=True)
    c = dec.generate("hello", max_new_tokens=30, temperature=1.0, seed=6, ignore_eos=True)
    assert a.token_ids == b.token_ids and a.sources == b.sources
    assert a.token_ids != c.token_ids


def test_eos_planted_inside_a_block_ends_generation(tiny, target_only) -> None:
    ref = target_only.generate("hello", max_new_tokens=40, temperature=0, ignore_eos=True)
    # Plant EOS: declare a token the greedy output emits mid-way an end-of-sequence id.
    pos = 9
    eos = ref.token_ids[pos]
    first = ref.token_ids.index(eos)
    dec = specrt.Decoder(tiny["target"], tiny["target"])
    dec.eos_token_ids = [eos]
    out = dec.generate("hello", max_new_tokens=40, temperature=0, num_speculative_tokens=6)
    assert out.finish_reason == "eos"
    assert out.token_ids == ref.token_ids[: first + 1], "nothing after EOS"
    assert out.stats.n_emitted == first + 1


def test_stop_token_and_max_new_tokens_inside_a_block(tiny, target_only) -> None:
    ref = target_only.generate("hello", max_new_tokens=40, temperature=0, ignore_eos=True)
    dec = specrt.Decoder(tiny["target"], tiny["target"])
    stop = ref.token_ids[7]
    out = dec.generate("hello", max_new_tokens=40, temperature=0, num_speculative_tokens=8, stop_token_ids=[stop])
    assert out.finish_reason == "stop"
    assert out.token_ids == ref.token_ids[: ref.token_ids.index(stop) + 1]
    out = dec.generate("hello", max_new_tokens=5, temperature=0, num_speculative_tokens=8, ignore_eos=True)
    assert out.finish_reason == "length"
    assert out.token_ids == ref.token_ids[:5]
    assert out.stats.n_emitted == 5


def test_stop_string_cuts_text_and_tokens(tiny, target_only) -> None:
    ref = target_only.generate("hello", max_new_tokens=40, temperature=0, ignore_eos=True)
    stop = ref.text[12:15]
    assert len(stop) == 3
    cut = ref.text.find(stop)
    dec = specrt.Decoder(tiny["target"], tiny["draft_close"])
    out = dec.generate("hello", max_new_tokens=40, temperature=0, stop=[stop], ignore_eos=True)
    assert out.finish_reason == "stop"
    assert out.text == ref.text[:cut]
    assert stop not in out.text
    # The kept tokens are a prefix of the reference that reaches the end of the stop string, and no more.
    n = len(out.token_ids)
    assert out.token_ids == ref.token_ids[:n]
    decode = dec.tokenizer.decode
    assert len(decode(ref.token_ids[:n], skip_special_tokens=True)) >= cut + len(stop)
    assert len(decode(ref.token_ids[: n - 1], skip_special_tokens=True)) < cut + len(stop)
    assert out.stats.n_emitted == n


def test_include_stop_str_in_output_keeps_the_stop_string_in_the_text_and_the_stream(tiny, target_only) -> None:
    # vLLM's include_stop_str_in_output, per request on the driver: the same tokens, the text through the stop.
    ref = target_only.generate("hello", max_new_tokens=40, temperature=0, ignore_eos=True)
    stop = ref.text[12:15]
    cut = ref.text.find(stop)
    kw = {"max_new_tokens": 40, "temperature": 0, "stop": [stop], "ignore_eos": True}
    left_out = target_only.generate("hello", **kw)
    kept = target_only.generate("hello", include_stop_str_in_output=True, **kw)
    assert (left_out.text, kept.text) == (ref.text[:cut], ref.text[: cut + len(stop)])
    assert kept.token_ids == left_out.token_ids and kept.finish_reason == "stop"
    streamed = "".join(c.text for c in target_only.stream("hello", include_stop_str_in_output=True, **kw))
    assert streamed == kept.text
    with pytest.raises(specrt.errors.ConfigError, match="include_stop_str_in_output"):
        target_only.generate("hello", include_stop_str_in_output="yes", **kw)


def test_streaming_yields_the_final_text_and_holds_back_partial_stops(tiny, target_only) -> None:
    ref = target_only.generate("hello", max_new_tokens=40, temperature=0, ignore_eos=True)
    stop = ref.text[20:24]
    dec = specrt.Decoder(tiny["target"], tiny["draft_close"])
    chunks = list(dec.stream("hello", max_new_tokens=40, temperature=0, stop=[stop], ignore_eos=True))
    result = chunks[-1].result
    assert result is not None
    streamed = "".join(c.text for c in chunks)
    assert streamed == result.text == ref.text[: ref.text.find(stop)]
    for i in range(1, len(chunks)):
        assert stop not in "".join(c.text for c in chunks[:i])
    assert sum(len(c.token_ids) for c in chunks) == len(result.token_ids)


def test_chat_messages_use_the_model_template(tiny) -> None:
    dec = specrt.Decoder(tiny["target"])
    text = dec.apply_chat_template([{"role": "user", "content": "hi"}])
    assert "<|im_start|>" in text and text.rstrip().endswith("assistant")
    out = dec.generate(messages=[{"role": "user", "content": "hi"}], max_new_tokens=4, temperature=0)
    assert out.prompt_token_ids == dec.tokenizer.encode(text, add_special_tokens=False).ids


def test_bad_input_gives_specific_errors(tiny, tmp_path) -> None:
    dec = specrt.Decoder(tiny["target"], tiny["draft_close"], max_seq_len=64)
    with pytest.raises(ConfigError, match="empty"):
        dec.generate("", max_new_tokens=4)
    with pytest.raises(ConfigError, match=r"temperature -0\.5"):
        dec.generate("hi", temperature=-0.5)
    with pytest.raises(ConfigError, match=r"top_p 1\.5"):
        dec.generate("hi", top_p=1.5)
    with pytest.raises(ConfigError, match="top_k -1"):
        dec.generate("hi", top_k=-1)
    with pytest.raises(ConfigError, match="min_p 2"):
        dec.generate("hi", min_p=2.0)
    with pytest.raises(ConfigError, match="num_speculative_tokens 65"):
        dec.generate("hi", num_speculative_tokens=65)
    with pytest.raises(SequenceLengthError, match="64"):
        dec.generate("hi", max_new_tokens=100)
    with pytest.raises(ConfigError, match="exactly one"):
        dec.generate("hi", messages=[{"role": "user", "content": "x"}])
    # The decoder stays usable after errors.
    assert dec.generate("hi", max_new_tokens=3, temperature=0).stats.n_emitted == 3


def test_draft_dtype_that_cannot_apply_is_an_error_not_ignored(tiny) -> None:
    """draft_dtype picks the weights pulled for a draft model *name*: a bad value, no draft, or a folder draft (loaded
    as converted) are errors naming draft_dtype, before anything is loaded."""
    for bad in ("int3", "", 4):
        expected = r"draft_dtype .* is invalid \(expected one of fp32, fp16, int4, int8, gguf\)"
        with pytest.raises(ConfigError, match=expected):
            specrt.Decoder(tiny["target"], "smollm2-135m-instruct", draft_dtype=bad)
    with pytest.raises(ConfigError, match="draft_dtype 'int4' was given without a draft model"):
        specrt.Decoder(tiny["target"], draft_dtype="int4")
    with pytest.raises(ConfigError, match=r"draft_dtype 'int4' applies to model names.*is a folder"):
        specrt.Decoder(tiny["target"], tiny["draft_close"], draft_dtype="int4")


def test_vocab_mismatch_names_both_sizes(tiny, tmp_path) -> None:
    small = _convert_tiny(tmp_path, "small", arch="qwen2", seed=2, n_layers=1, with_tokenizer=True)
    # The same tokenizer and logits width (265) passes (widths differing in padding rows: the test below)...
    specrt.Decoder(tiny["target"], small)
    # ...and a draft whose tokenizer differs, with more ids than its model has logits rows, is refused naming both
    # (a draft of another tokenizer drafts across vocabularies: tests/engine/test_cross_vocab.py).
    import json

    tok = json.loads((small / "tokenizer.json").read_text())
    tok["added_tokens"].append(
        {
            "id": 265,
            "content": "<extra>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    (small / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(VocabError, match=r"draft's tokenizer has 266 ids, more than its model's 265 logits rows"):
        specrt.Decoder(tiny["target"], small)


PAD_ROWS = 64  # the tiny tokenizer has 265 ids; a padded model's logits are 329 wide


@pytest.fixture(scope="module")
def padded_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Models of one tokenizer (265 ids) with logits 265 or 265 + PAD_ROWS wide (the extra rows random: a target
    puts real mass on them), as Qwen2.5 7B (152064 rows) and 0.5B (151936 rows) over one 151665-id tokenizer; in the
    default and the batched layout."""
    root = tmp_path_factory.mktemp("padded")
    out = {}
    for attention in ("gqa", "batched"):
        for name, layers, pad in (
            ("target", 2, 0),
            ("draft", 1, 0),
            ("wide_target", 2, PAD_ROWS),
            ("wide_draft", 1, PAD_ROWS),
        ):
            out[f"{name}_{attention}"] = _convert_tiny(
                root, f"{name}_{attention}", attention, arch="qwen2", seed=1, n_layers=layers, pad_rows=pad
            )
    return out


@pytest.mark.parametrize("attention", ["gqa", "batched"])
@pytest.mark.parametrize("wide", ["target", "draft"])
def test_logits_widths_that_differ_in_padding_rows_decode_as_the_target_alone(
    padded_pairs: dict[str, Path], wide: str, attention: str
) -> None:
    target = padded_pairs[f"{'wide_' if wide == 'target' else ''}target_{attention}"]
    draft = padded_pairs[f"{'wide_' if wide == 'draft' else ''}draft_{attention}"]
    kw = {"max_batch": 2} if attention == "batched" else {}
    plain = specrt.Decoder(target, max_seq_len=128, **kw)
    spec = specrt.Decoder(target, draft, max_seq_len=128, **kw)
    width = 265 + (PAD_ROWS if wide == "target" else 0)
    assert plain.vocab_size == spec.vocab_size == width
    emitted_padding = accepted = 0
    for prompt in PROMPTS:
        ref = plain.generate(prompt, max_new_tokens=30, temperature=0, ignore_eos=True)
        emitted_padding += sum(t >= 265 for t in ref.token_ids)
        for k in (1, 4):
            out = spec.generate(prompt, max_new_tokens=30, temperature=0, num_speculative_tokens=k, ignore_eos=True)
            assert out.token_ids == ref.token_ids, (prompt, k)
            np.testing.assert_allclose(out.logprobs, ref.logprobs, rtol=0, atol=1e-4)
            accepted += out.stats.n_accepted
        # Sampled: a wide target emits its padding ids, which the narrow draft is then fed (as its last row).
        for seed in range(3):
            out = spec.generate(prompt, max_new_tokens=30, temperature=1.0, seed=seed, num_speculative_tokens=3)
            assert all(0 <= t < width for t in out.token_ids)
            emitted_padding += sum(t >= 265 for t in out.token_ids)
    assert accepted > 0
    if wide == "target":
        assert emitted_padding > 0, "the test would not feed the narrow draft a padding id"


def test_an_unknown_argument_is_a_type_error_naming_the_called_function(target_only: specrt.Decoder) -> None:
    with pytest.raises(TypeError, match=r"^Decoder\.generate\(\) got an unexpected keyword argument 'max_tokens'") as e:
        target_only.generate("hi", max_tokens=4)
    assert "did you mean 'max_new_tokens'" in str(e.value)
    with pytest.raises(TypeError, match=r"Decoder\.generate\(\) got an unexpected keyword argument 'colour'") as e:
        target_only.generate("hi", colour=True)
    assert "did you mean" not in str(e.value)
    # stream() is a Python function: its own TypeError names stream (raised at the call, before any round).
    with pytest.raises(TypeError, match="stream"):
        target_only.stream("hi", max_tokens=4)


def test_request_settings_are_checked_without_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    from specrt import _specrt
    from specrt.cli import main
    from specrt.generate import check_request

    check_request(has_draft=False, max_new_tokens=4, temperature=0.5, top_p=0.9)  # fine: returns None
    for kw, msg in [
        ({"temperature": -1.0}, "temperature -1 is invalid"),
        ({"top_p": 0.0}, "top_p 0 is invalid"),
        ({"min_p": 2.0}, "min_p 2 is invalid"),
        ({"max_new_tokens": 0}, "max_new_tokens 0 is invalid"),
        ({"num_speculative_tokens": 65}, "num_speculative_tokens 65 is invalid"),
        ({"proposer": "draft"}, "needs a draft model"),
        ({"stop": [""]}, "stop strings must be non-empty"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(msg)):
            check_request(has_draft=False, **kw)
    # The engine's request type checks in full when it is made (one definition: GenerationConfig::validate).
    with pytest.raises(ConfigError, match="repetition_penalty 0 is invalid"):
        _specrt.RequestConfig(max_new_tokens=4, repetition_penalty=0.0)
    # The CLI refuses a bad setting before it resolves (pulls, converts, loads) the model.
    assert main(["generate", "--target", "no-such-model-anywhere", "--prompt", "x", "--temperature", "-1"]) == 2
    err = capsys.readouterr().err
    assert "temperature -1 is invalid" in err and "no-such-model-anywhere" not in err


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_top_logprobs_are_the_targets_teacher_forced_log_softmax_with_or_without_a_draft(
    tiny: dict[str, Path], temperature: float
) -> None:
    from specrt import _specrt
    from specrt._ort import find_ort_library

    model = _specrt.OrtModel(str(tiny["target"]), ort_library=find_ort_library(), max_seq_len=256)
    for draft, k in [(None, 0), (tiny["draft_close"], 3), (tiny["draft_other"], 4)]:
        dec = specrt.Decoder(tiny["target"], draft, max_seq_len=256)
        kw = {"max_new_tokens": 12, "temperature": temperature, "seed": 3, "num_speculative_tokens": k}
        res = dec.generate("def add(a, b):", top_logprobs=5, ignore_eos=True, **kw)
        assert len(res.top_logprobs) == len(res.token_ids) == 12
        # Teacher-forced: one target pass over prompt + output, the rows that predicted each output token.
        seq = res.prompt_token_ids + res.token_ids
        rows = model.forward(np.array(seq[:-1]), 0, len(res.token_ids)).astype(np.float64)
        logsm = rows - rows.max(axis=1, keepdims=True)
        logsm -= np.log(np.exp(logsm).sum(axis=1, keepdims=True))
        for i, alts in enumerate(res.top_logprobs):
            ids = [t for t, _ in alts]
            order = sorted(range(logsm.shape[1]), key=lambda j: (-rows[i, j], j))[:5]
            assert ids == order, (draft, i)
            np.testing.assert_allclose([lp for _, lp in alts], logsm[i, ids], atol=1e-4)
            assert res.logprobs[i] == pytest.approx(logsm[i, res.token_ids[i]], abs=1e-4)
            if temperature == 0:
                assert ids[0] == res.token_ids[i], "greedy picks the first alternative"
        # Streamed chunks carry the same alternatives, in order (the values to float32 rounding: this run's first
        # row comes from a prefill of the prompt's uncached rest, the first run's from the whole prompt).
        chunks = list(dec.stream("def add(a, b):", top_logprobs=5, ignore_eos=True, **kw))
        streamed = [a for c in chunks for a in c.top_logprobs]
        assert [[t for t, _ in alts] for alts in streamed] == [[t for t, _ in alts] for alts in res.top_logprobs]
        streamed_lp = [[lp for _, lp in alts] for alts in streamed]
        np.testing.assert_allclose(streamed_lp, [[lp for _, lp in alts] for alts in res.top_logprobs], atol=1e-4)
    for bad, match in [(21, "top_logprobs 21 is invalid"), (-1, "top_logprobs -1 is invalid"), (2.5, "top_logprobs")]:
        with pytest.raises(ConfigError, match=match):
            dec.generate("x", max_new_tokens=2, top_logprobs=bad)
    assert dec.generate("x", max_new_tokens=2).top_logprobs == []


@pytest.mark.parametrize("max_batch", [1, 4])
def test_prompt_logprobs_equal_a_teacher_forced_target_pass(
    tiny: dict[str, Path], tmp_path: Path, max_batch: int
) -> None:
    from specrt import _specrt
    from specrt._ort import find_ort_library

    model = _specrt.OrtModel(str(tiny["target"]), ort_library=find_ort_library(), max_seq_len=256)
    if max_batch == 1:
        dec = specrt.Decoder(tiny["target"], tiny["draft_close"], max_seq_len=256)
    else:  # the batched layout, its prompt prefilled (and scored) in chunks of 64
        t, d = (
            _convert_tiny(tmp_path, name, "batched", arch="qwen2", seed=1, n_layers=n)
            for name, n in (("t", 2), ("d", 1))
        )
        dec = specrt.Decoder(t, d, max_seq_len=256, max_batch=max_batch, prefill_chunk=64)
    prompt = [1 + (7 * i) % 250 for i in range(200)]
    rows = model.forward(np.array(prompt[:-1]), 0, len(prompt) - 1).astype(np.float64)
    logsm = rows - rows.max(axis=1, keepdims=True)
    logsm -= np.log(np.exp(logsm).sum(axis=1, keepdims=True))
    plain = dec.generate(prompt, max_new_tokens=6, temperature=0, num_speculative_tokens=3)
    res = dec.generate(prompt, max_new_tokens=6, temperature=0, num_speculative_tokens=3, prompt_logprobs=3)
    assert res.token_ids == plain.token_ids and plain.prompt_logprobs == []
    assert len(res.prompt_logprobs) == len(res.prompt_top_logprobs) == len(prompt)
    assert res.prompt_logprobs[0] is None and res.prompt_top_logprobs[0] == []
    want = [logsm[j - 1, prompt[j]] for j in range(1, len(prompt))]
    np.testing.assert_allclose(res.prompt_logprobs[1:], want, atol=1e-4)
    for j in range(1, len(prompt)):
        alts = res.prompt_top_logprobs[j]
        assert [t for t, _ in alts] == sorted(range(logsm.shape[1]), key=lambda v: (-rows[j - 1, v], v))[:3]
        np.testing.assert_allclose([lp for _, lp in alts], logsm[j - 1, [t for t, _ in alts]], atol=1e-4)
    # Through the Scheduler (batched rounds on a batching decoder) too.
    if max_batch > 1:
        from specrt.scheduler import Scheduler

        with Scheduler(dec) as sched:
            handles = [sched.submit(prompt, max_new_tokens=4, temperature=0, prompt_logprobs=0) for _ in range(2)]
            for h in handles:
                r = h.result(timeout=120)
                np.testing.assert_allclose(r.prompt_logprobs[1:], want, atol=1e-4)
                assert all(a == [] for a in r.prompt_top_logprobs)
    else:
        with pytest.raises(ConfigError, match="prompt_logprobs 21 is invalid"):
            dec.generate("x", max_new_tokens=2, prompt_logprobs=21)


def test_min_tokens_keeps_stop_ids_out_of_the_first_tokens_with_or_without_a_draft(tiny: dict[str, Path]) -> None:
    target_only = specrt.Decoder(tiny["target"], max_seq_len=256)
    free = target_only.generate("def add(a, b):", max_new_tokens=20, temperature=0, ignore_eos=True).token_ids
    stop = free[2]  # a token greedy decoding emits third: as a stop id it ends the generation there
    kw = {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True, "stop_token_ids": [stop]}
    cut = target_only.generate("def add(a, b):", **kw)
    assert cut.token_ids[-1] == stop and len(cut.token_ids) <= 3 and cut.finish_reason == "stop"
    held = target_only.generate("def add(a, b):", min_tokens=8, **kw)
    assert stop not in held.token_ids[:8] and len(held.token_ids) >= 8
    for draft, k in [(tiny["draft_close"], 3), (tiny["draft_other"], 4)]:
        dec = specrt.Decoder(tiny["target"], draft, max_seq_len=256)
        assert dec.generate("def add(a, b):", min_tokens=8, num_speculative_tokens=k, **kw).token_ids == held.token_ids
    with pytest.raises(ConfigError, match="min_tokens 30 is invalid"):
        target_only.generate("x", max_new_tokens=20, min_tokens=30)
    with pytest.raises(ConfigError, match="min_tokens"):
        target_only.generate("x", max_new_tokens=20, min_tokens=-1)
