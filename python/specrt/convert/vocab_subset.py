"""Choosing the token ids a pruned-vocabulary draft scores: the most frequent ones in a text corpus.

A pruned draft (``specrt convert --vocab-subset N``) keeps only ``N`` rows of its output layer. Verification stays
exactly lossless whatever the subset (rust/specrt-core/src/subset.rs); the subset only decides how much acceptance
is lost: the target's probability mass outside it can never be proposed. The ids are chosen by counting tokens in a
corpus (by default the Python standard library's sources and its English documentation topics, which are installed
everywhere: code and prose, as in the benchmark prompts), plus every special token (EOS, chat markers), which must
stay proposable.
"""

from __future__ import annotations

import os
import sysconfig
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_CORPUS_BYTES", "default_corpus", "frequent_token_ids"]

#: How much text the default corpus reads (bytes).
DEFAULT_CORPUS_BYTES = 8 << 20


def default_corpus(max_bytes: int = DEFAULT_CORPUS_BYTES) -> list[Path]:
    """Files of the default corpus: ``pydoc_data/topics.py`` (English documentation) first, then the standard
    library's ``.py`` files in sorted order, up to ``max_bytes`` in all (deterministic for one Python version)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    topics = stdlib / "pydoc_data" / "topics.py"
    if topics.is_file():
        files.append(topics)
    total = sum(f.stat().st_size for f in files)
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "test", "tests", "__pycache__", "idlelib"))
        for name in sorted(names):
            path = Path(root) / name
            if name.endswith(".py") and path != topics:
                size = path.stat().st_size
                if total + size > max_bytes:
                    return files
                files.append(path)
                total += size
    return files


def frequent_token_ids(
    tokenizer: Any,
    n: int,
    corpus: Iterable[str | os.PathLike[str]] | None = None,
    *,
    always: Sequence[int] = (),
    vocab_size: int | None = None,
) -> tuple[list[int], dict[str, Any]]:
    """The ``n`` most frequent token ids of ``corpus`` under ``tokenizer``, plus ``always``.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        n: how many ids to keep (``len(always) <= n <= vocab_size``).
        corpus: text files (UTF-8; undecodable bytes replaced); default :func:`default_corpus`.
        always: ids kept whatever their count (special tokens).
        vocab_size: the model's vocabulary size (embedding rows); ids at or above it are ignored.

    Returns:
        ``(ids, info)``: ``n`` ascending ids, and ``{"corpus_tokens", "corpus_files", "coverage"}`` where coverage
        is the fraction of corpus tokens that fall in the subset. Ties in count go to the smaller id.

    Raises:
        ValueError: ``n`` out of range (named, with the range).
    """
    vocab = vocab_size or tokenizer.get_vocab_size()
    keep = sorted({int(t) for t in always if 0 <= int(t) < vocab})
    if not len(keep) <= n <= vocab:
        raise ValueError(f"vocab subset size {n} is invalid (expected {len(keep)} <= N <= {vocab})")
    files = [Path(f) for f in (corpus if corpus is not None else default_corpus())]
    counts: Counter[int] = Counter()
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        # Chunks of lines keep each encode call small (tokenizers is fast on many short inputs).
        lines = text.splitlines(keepends=True)
        chunks = ["".join(lines[i : i + 64]) for i in range(0, len(lines), 64)]
        for enc in tokenizer.encode_batch(chunks, add_special_tokens=False):
            counts.update(enc.ids)
    total = sum(counts.values())
    chosen = set(keep)
    for tok, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(chosen) >= n:
            break
        if tok < vocab:
            chosen.add(tok)
    # A small corpus may not name n distinct ids: fill with the smallest unused ids (byte-level tokens come first in
    # BPE vocabularies).
    fill = 0
    while len(chosen) < n:
        if fill not in chosen:
            chosen.add(fill)
        fill += 1
    ids = sorted(chosen)
    covered = sum(c for t, c in counts.items() if t in chosen)
    info = {
        "corpus_tokens": total,
        "corpus_files": len(files),
        "coverage": covered / total if total else None,
    }
    return ids, info
