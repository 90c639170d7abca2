"""Pruned-vocabulary drafts (``specrt convert --vocab-subset N``): the folder, the logits, greedy parity and the
target distribution at temperature 1 (q is zero outside the subset; verification stays exact)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import specrt
from specrt import _specrt
from specrt._ort import find_ort_library
from specrt.convert import UnsupportedModelError, convert
from specrt.convert.tiny import write_tiny_gguf
from specrt.convert.vocab_subset import frequent_token_ids


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vocab-subset")
    target_gguf = write_tiny_gguf(root / "t.gguf", arch="qwen2", seed=1, n_layers=2)
    draft_gguf = write_tiny_gguf(root / "d.gguf", arch="qwen2", seed=1, n_layers=1)
    corpus = root / "corpus.txt"
    corpus.write_text("def add(a, b):\n    return a + b\n" * 50 + "hello world, hello there\n" * 30, encoding="utf-8")
    return {
        "target": convert(target_gguf, root / "target", progress=False),
        "draft_full": convert(draft_gguf, root / "draft_full", progress=False),
        "draft_pruned": convert(
            draft_gguf, root / "draft_pruned", progress=False, vocab_subset=40, vocab_corpus=[corpus]
        ),
        "draft_given": convert(draft_gguf, root / "draft_given", progress=False, vocab_subset=list(range(0, 200, 3))),
    }


def test_pruned_folder_records_the_subset_and_scores_only_it(models: dict[str, Path]) -> None:
    folder = models["draft_pruned"]
    cfg = json.loads((folder / "specrt_config.json").read_text())
    ids = json.loads((folder / "vocab_subset.json").read_text())["token_ids"]
    assert cfg["vocab_size"] == len(ids) == 40 and cfg["full_vocab_size"] > 40
    assert ids == sorted(set(ids))
    special = set(cfg["special_tokens"].values()) | set(cfg["eos_token_ids"])
    assert special <= set(ids)
    lib = find_ort_library()
    pruned = _specrt.OrtModel(folder, ort_library=lib, max_seq_len=64)
    full = _specrt.OrtModel(models["draft_full"], ort_library=lib, max_seq_len=64)
    assert pruned.vocab_size == full.vocab_size == cfg["full_vocab_size"]
    tokens = np.array([3, 17, 5, 200, 9], dtype=np.int64)
    got = np.asarray(pruned.forward(tokens, 0, 5))
    ref = np.asarray(full.forward(tokens, 0, 5))
    np.testing.assert_allclose(got[:, ids], ref[:, ids], atol=1e-5, rtol=0)
    outside = np.setdiff1d(np.arange(ref.shape[1]), ids)
    assert np.all(np.isneginf(got[:, outside]))


def test_frequent_ids_follow_the_corpus(tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("aaa bbb aaa aaa ccc\n" * 10, encoding="utf-8")

    class Enc:
        def __init__(self, ids: list[int]) -> None:
            self.ids = ids

    class Tok:
        def get_vocab_size(self) -> int:
            return 10

        def encode_batch(self, chunks: list[str], add_special_tokens: bool = False) -> list[Enc]:
            m = {"aaa": 7, "bbb": 3, "ccc": 5}
            return [Enc([m[w] for w in c.split()]) for c in chunks]

    ids, info = frequent_token_ids(Tok(), 3, [corpus], always=[9])
    assert ids == [3, 7, 9]  # aaa (30), bbb (10) beat ccc (10) on the smaller id; 9 always kept
    assert info["coverage"] == pytest.approx(40 / 50)
    with pytest.raises(ValueError, match="vocab subset size 11 is invalid"):
        frequent_token_ids(Tok(), 11, [corpus])


def test_bad_subsets_are_clear_errors(models: dict[str, Path], tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "d.gguf", arch="qwen2", seed=1, n_layers=1)
    with pytest.raises(UnsupportedModelError, match="vocab_subset ids must be non-empty"):
        convert(gguf, tmp_path / "bad", progress=False, vocab_subset=[10**9])
    with pytest.raises(UnsupportedModelError, match=r"vocab_corpus file not found: /nonexistent\.txt"):
        convert(gguf, tmp_path / "bad2", progress=False, vocab_subset=8, vocab_corpus=["/nonexistent.txt"])


@pytest.mark.parametrize("draft", ["draft_pruned", "draft_given"])
def test_greedy_speculative_output_with_a_pruned_draft_equals_target_only(models, draft: str) -> None:
    ref_dec = specrt.Decoder(models["target"], max_seq_len=256)
    dec = specrt.Decoder(models["target"], models[draft], max_seq_len=256)
    for prompt in ["def add(a, b):", "hello world, hello", "x = [1, 2, 3]\nfor"]:
        ref = ref_dec.generate(prompt, max_new_tokens=40, temperature=0, ignore_eos=True)
        for k in (1, 4, 8):
            out = dec.generate(prompt, max_new_tokens=40, temperature=0, num_speculative_tokens=k, ignore_eos=True)
            assert out.token_ids == ref.token_ids, (draft, prompt, k)


def test_first_token_with_a_pruned_draft_follows_the_target_distribution(models) -> None:
    # Exact target distribution of the first token vs 12,000 seeded generations; chi-square over cells with
    # expected count >= 5 at p ~ 1e-5 (Wilson-Hilferty z = 4.3), as in tests/engine/test_generate.py.
    dec = specrt.Decoder(models["target"], models["draft_pruned"], max_seq_len=64)
    ids = dec.encode("hello world, hello", None)
    model = _specrt.OrtModel(models["target"], ort_library=find_ort_library(), max_seq_len=64)
    row = np.asarray(model.forward(np.asarray(ids), 0, 1))[0].astype(np.float64)
    p = np.exp(row - row.max())
    p /= p.sum()
    n = 12_000
    counts = np.zeros(len(p))
    for seed in range(n):
        # max_new_tokens 4: the first round drafts K = 3 tokens, so the first token is an accepted or recovered one.
        out = dec.generate(ids, max_new_tokens=4, temperature=1.0, num_speculative_tokens=3, seed=seed, ignore_eos=True)
        counts[out.token_ids[0]] += 1
    ex = p * n
    cells = ex >= 5
    tail_obs, tail_ex = counts[~cells].sum(), max(ex[~cells].sum(), 1e-9)
    stat = float(((counts[cells] - ex[cells]) ** 2 / ex[cells]).sum() + (tail_obs - tail_ex) ** 2 / tail_ex)
    df = int(cells.sum())
    a = 2 / (9 * df)
    crit = df * (1 - a + 4.3 * np.sqrt(a)) ** 3
    assert stat < crit, (stat, crit, df)
