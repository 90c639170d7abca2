"""specrt's Rust text pieces (``specrt._specrt.Tokenizer``, ``TextAssembler``; crate ``specrt-text``) against the
Python ``tokenizers`` package and the Python detokenizer they replaced.

- ``Tokenizer``: the same ids and text as ``tokenizers.Tokenizer`` on the tiny test models' tokenizer and on the
  SmolLM2 / Qwen tokenizer.json in specrt's cache (whichever are there), for accents, CJK, emoji, code, runs of
  whitespace and special tokens, and on random id sequences (incomplete UTF-8 included).
- ``TextAssembler``: chunk for chunk the output of the old Python ``_Assembler.feed`` (kept below as the oracle,
  decoding with the Python package) on random token streams with stop strings that end mid-token and span tokens,
  for byte-level tokenizers (incremental) and Metaspace / WordPiece ones (decoded whole).
- The server's text views (``TextAssembler`` with vLLM's ``skip_special_tokens`` / ``include_stop_str_in_output``)
  chunk for chunk the output of the old Python ``_TextView`` (kept below as the oracle) over the old Decoder, on
  random streams ended by length, an EOS or a stop token id, with stop strings that end mid-token or hold a special
  token's text, for the tiny and SmolLM2 tokenizers (and Metaspace / WordPiece: the whole text).
- ``Decoder``: greedy generation with a stop string streams what the oracle makes of the same rounds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

import specrt
from specrt import _specrt
from specrt.bench.random_models import write_stand_in_tokenizer
from specrt.convert import convert
from specrt.convert.tiny import write_tiny_gguf
from specrt.errors import ConfigError, ModelFileError
from specrt.models import cache_dir

TEXTS = [
    "hello world",
    "héllo wörld, ça va? naïve façade",
    "日本語のテキストと中文混合",
    "emoji 🙂👍🏽 and flags 🇫🇷, ZWJ 👨‍👩‍👧",
    "def f(x):\n    return {'a': [x, x ** 2]}  # comment\n",
    "   leading, \t\ttabs,   runs   of  spaces\n\n\n  ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>after",
    "",
    "\u00a0\u2003\u200b odd spaces",
]


# ----- the oracle: python/specrt/generate.py's detokenizer before the port, on the Python package ---------------
def _longest_partial_stop(text: str, stops: list[str]) -> int:
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


class _OldAssembler:
    """``_Assembler.feed``, ``Decoder._find_stop`` and ``_tokens_covering`` as they were (text in code points)."""

    def __init__(self, tok: tokenizers.Tokenizer, stops: list[str]) -> None:
        self.tok, self.stops = tok, stops
        self.tokens: list[int] = []
        self.sent = 0
        self.text = ""
        self.finish: str | None = None
        self.n_keep: int | None = None

    def _tokens_covering(self, n_chars: int) -> int:
        lo, hi = 1, len(self.tokens)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self.tok.decode(self.tokens[:mid], skip_special_tokens=True).rstrip("\ufffd")) >= n_chars:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _find_stop(self, text: str) -> tuple[int, int] | None:
        start = max(0, self.sent - max(len(s) for s in self.stops))
        best = None
        for s in self.stops:
            i = text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        cut, s = best
        return cut, self._tokens_covering(cut + len(s))

    def feed(self, tokens: list[int], finish_reason: str | None) -> str:
        self.tokens += tokens
        self.finish = finish_reason
        text = self.tok.decode(self.tokens, skip_special_tokens=True)
        if self.stops:
            hit = self._find_stop(text)
            if hit is not None:
                cut, self.n_keep = hit
                del self.tokens[self.n_keep :]
                text = text[:cut]
                self.finish = "stop"
        if self.finish is None:
            end = len(text.rstrip("\ufffd"))
            end -= _longest_partial_stop(text[:end], self.stops)
        else:
            end = len(text)
        self.text = text
        chunk = text[self.sent : end]
        self.sent = max(self.sent, end)
        return chunk


# ----- tokenizers -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny test models' 265-token byte-level BPE tokenizer (ChatML specials)."""
    return write_stand_in_tokenizer(tmp_path_factory.mktemp("tiny-tok")) / "tokenizer.json"


def _cached_tokenizers() -> list[Path]:
    """One tokenizer.json per model in specrt's cache (SmolLM2, Qwen, ... whichever were pulled)."""
    out = []
    root = cache_dir() / "models"
    for model in sorted(root.iterdir()) if root.is_dir() else []:
        found = sorted(model.glob("*/tokenizer.json"))
        if found:
            out.append(found[0])
    return out


def _metaspace_json() -> str:
    """A SentencePiece-style (Unigram + Metaspace) tokenizer: its decoder strips the first token's space."""
    pieces = ["<unk>", "▁", "▁Hi", "▁there", "!", "▁日本", "語", "a", "b", "ab", "▁a", "\n", "é", "🙂"]
    tok = tokenizers.Tokenizer(models.Unigram([(p, -float(i + 1)) for i, p in enumerate(pieces)], unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens(["</s>"])
    return tok.to_str()


def _wordpiece_json() -> str:
    """A WordPiece tokenizer: its decoder joins with spaces and cleans up (" ." -> "."), rewriting earlier text."""
    vocab = {w: i for i, w in enumerate(["[UNK]", "[SEP]", "hi", "there", ".", ",", "##s", "##é", "do", "n't", "!"])}
    tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(["[SEP]"])
    return tok.to_str()


def _pair_from_file(path: Path) -> tuple[_specrt.Tokenizer, tokenizers.Tokenizer]:
    return _specrt.Tokenizer.from_file(path), tokenizers.Tokenizer.from_file(str(path))


def _pair_from_json(text: str) -> tuple[_specrt.Tokenizer, tokenizers.Tokenizer]:
    return _specrt.Tokenizer.from_str(text), tokenizers.Tokenizer.from_str(text)


def _all_pairs(tiny_json: Path) -> list[tuple[str, _specrt.Tokenizer, tokenizers.Tokenizer]]:
    pairs = [("tiny", *_pair_from_file(tiny_json))]
    pairs += [(p.parent.parent.name, *_pair_from_file(p)) for p in _cached_tokenizers()]
    pairs += [("metaspace", *_pair_from_json(_metaspace_json())), ("wordpiece", *_pair_from_json(_wordpiece_json()))]
    return pairs


def test_rust_tokenizer_gives_the_python_packages_ids_and_text(tiny_tokenizer_json: Path) -> None:
    for name, rs, py in _all_pairs(tiny_tokenizer_json):
        assert rs.get_vocab_size() == py.get_vocab_size(), name
        assert rs.get_vocab_size(with_added_tokens=False) == py.get_vocab_size(with_added_tokens=False), name
        assert rs.get_vocab() == py.get_vocab(), name
        special = sorted(i for i, t in py.get_added_tokens_decoder().items() if t.special)
        assert rs.special_ids == special, name
        assert rs.decoder_type == (type(py.decoder).__name__ if py.decoder is not None else None), name
        n = py.get_vocab_size()
        for i in [*range(min(n, 600)), *range(max(0, n - 300), n + 2)]:
            assert rs.id_to_token(i) == py.id_to_token(i), (name, i)
        for text in TEXTS:
            for add in (True, False):
                ids = rs.encode(text, add_special_tokens=add).ids
                assert ids == py.encode(text, add_special_tokens=add).ids, (name, text, add)
                for skip in (True, False):
                    assert rs.decode(ids, skip_special_tokens=skip) == py.decode(ids, skip_special_tokens=skip)
            assert rs.token_to_id(text) == py.token_to_id(text)


def test_random_id_sequences_decode_identically(tiny_tokenizer_json: Path) -> None:
    rng = random.Random(20261202)
    for name, rs, py in _all_pairs(tiny_tokenizer_json):
        n = py.get_vocab_size()
        for _ in range(200):
            ids = [rng.randrange(n + 3) for _ in range(rng.randrange(12))]  # a few ids outside the vocabulary
            for skip in (True, False):
                assert rs.decode(ids, skip_special_tokens=skip) == py.decode(ids, skip_special_tokens=skip), (
                    name,
                    ids,
                )


def test_tokenizer_file_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"tokenizer file not found: .*missing\.json"):
        _specrt.Tokenizer.from_file(tmp_path / "missing.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ModelFileError, match=r"tokenizer\.json: cannot be loaded by tokenizers"):
        _specrt.Tokenizer.from_file(bad)
    with pytest.raises(OverflowError):
        _specrt.Tokenizer.from_str(_metaspace_json()).decode([-1])


# ----- the assembler against the oracle ----------------------------------------------------------------------------
def _random_case(rng: random.Random, py: tokenizers.Tokenizer) -> tuple[list[list[int]], list[str]]:
    """Rounds of ids (a text's encoding, byte-split pieces and random ids) and stops cut from the decoded text at
    random places, so they end mid-token and span tokens; sometimes one that never occurs."""
    n = py.get_vocab_size()
    ids: list[int] = []
    for _ in range(rng.randrange(1, 4)):
        kind = rng.random()
        if kind < 0.6:
            ids += py.encode(rng.choice(TEXTS), add_special_tokens=False).ids
        else:
            ids += [rng.randrange(n) for _ in range(rng.randrange(1, 6))]
    rounds: list[list[int]] = []
    i = 0
    while i < len(ids):
        k = rng.randrange(0, 5)
        rounds.append(ids[i : i + k])
        i += k
    rounds.append([])
    text = py.decode(ids, skip_special_tokens=True)
    stops: list[str] = []
    for _ in range(rng.randrange(0, 3)):
        if text and rng.random() < 0.8:
            a = rng.randrange(len(text))
            s = text[a : a + rng.randrange(1, 6)]
            if s:
                stops.append(s)
        else:
            stops.append(rng.choice(["zzz", "\n\n", "🙂🙂", "é?"]))
    return rounds, stops


def _assemble(rs: _specrt.Tokenizer, rounds: list[list[int]], stops: list[str]) -> tuple[list[str], int | None, str]:
    asm = _specrt.TextAssembler(rs, stops)
    chunks, n_keep = [], None
    for j, r in enumerate(rounds):
        d = asm.feed(r, "length" if j + 1 == len(rounds) else None)
        chunks.append(d.text)
        if d.n_keep is not None:
            n_keep = d.n_keep
            assert len(asm.tokens) == n_keep
        if d.finished:
            break
    assert asm.finished
    return chunks, n_keep, asm.text


def _oracle(py: tokenizers.Tokenizer, rounds: list[list[int]], stops: list[str]) -> tuple[list[str], int | None, str]:
    old = _OldAssembler(py, stops)
    chunks = []
    for j, r in enumerate(rounds):
        chunks.append(old.feed(r, "length" if j + 1 == len(rounds) else None))
        if old.finish is not None:
            break
    return chunks, old.n_keep, old.text


def test_assembler_chunks_equal_the_old_python_algorithm(tiny_tokenizer_json: Path) -> None:
    rng = random.Random(7)
    for name, rs, py in _all_pairs(tiny_tokenizer_json):
        assert _specrt.TextAssembler(rs, []).incremental == (py.decoder is not None and rs.decoder_type == "ByteLevel")
        n_cases = 300 if name in ("tiny", "metaspace", "wordpiece") else 120
        for case in range(n_cases):
            rounds, stops = _random_case(rng, py)
            got = _assemble(rs, rounds, stops)
            want = _oracle(py, rounds, stops)
            assert got == want, (name, case, rounds, stops)
            assert "".join(got[0]).encode() == "".join(want[0]).encode()


def test_multibyte_characters_split_across_tokens_are_held_back(tiny_tokenizer_json: Path) -> None:
    rs, py = _pair_from_file(tiny_tokenizer_json)
    text = "a日🙂é"
    ids = py.encode(text, add_special_tokens=False).ids
    assert len(ids) > len(text)  # the tiny vocabulary spells multi-byte characters byte by byte
    asm = _specrt.TextAssembler(rs, [])
    got = [asm.feed([i], None).text for i in ids]
    assert "".join(got) == text and all("\ufffd" not in g for g in got)
    assert got == _oracle(py, [[i] for i in ids] + [[]], [])[0][: len(ids)]


def test_views_show_special_tokens_keep_the_stop_string_and_hide_the_finishing_token(
    tiny_tokenizer_json: Path,
) -> None:
    rs, py = _pair_from_file(tiny_tokenizer_json)
    ids = py.encode("hi<|im_end|>there, more", add_special_tokens=False).ids
    im_end = py.token_to_id("<|im_end|>")
    asm = _specrt.TextAssembler(rs, ["re,"], skip_special_tokens=False, include_stop_str_in_output=True)
    text = ""
    for i in ids:
        d = asm.feed([i], None)
        text += d.text
        if d.finished:
            break
    assert text == asm.text == "hi<|im_end|>there,"
    assert asm.tokens == ids[: len(asm.tokens)] and py.decode(asm.tokens, skip_special_tokens=False).startswith(text)
    asm = _specrt.TextAssembler(rs, [], skip_special_tokens=False)  # the EOS that ended it: left out
    out = asm.feed(ids[:3], None).text + asm.feed([im_end], "eos").text
    assert out == py.decode(ids[:3], skip_special_tokens=False) and asm.tokens == [*ids[:3], im_end]
    with pytest.raises(ConfigError, match="already finished"):
        asm.feed([1], None)
    with pytest.raises(ConfigError, match='finish_reason "done" is invalid'):
        _specrt.TextAssembler(rs, []).feed([1], "done")
    with pytest.raises(ConfigError, match="empty"):
        _specrt.TextAssembler(rs, ["a", ""])


# ----- the server's text views against its old Python _TextView --------------------------------------------------
@dataclass
class _Chunk:
    """The fields of a ``StreamChunk`` the old view read."""

    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class _Result:
    """The fields of a ``GenerationResult`` the old view read."""

    text: str
    token_ids: list[int]
    finish_reason: str


class _OldTextView:
    """python/specrt/server.py's ``_TextView`` as it was (over the Decoder's chunks and result)."""

    def __init__(self, tokenizer: Any, stops: list[str], skip_special: bool, include_stop: bool, custom: bool) -> None:
        self.tokenizer, self.stops = tokenizer, stops
        self.skip_special, self.include_stop = skip_special, include_stop
        self.custom = custom or not skip_special
        self.ids: list[int] = []
        self.sent = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def _first_stop(self, text: str) -> tuple[int, str] | None:
        found = [(text.find(s), k, s) for k, s in enumerate(self.stops) if s in text]
        if not found:
            return None
        i, _, s = min(found)
        return i, s

    def feed(self, chunk: _Chunk) -> str:
        self.ids += chunk.token_ids
        if not self.custom:
            delta = chunk.text
        elif chunk.finish_reason is not None:
            delta = ""
        else:
            text = self._decode(self.ids)
            end = len(text.rstrip("\ufffd"))
            end -= _longest_partial_stop(text[:end], self.stops)
            hit = self._first_stop(text[:end])
            if hit is not None:
                end = hit[0]
            delta = text[len(self.sent) : end] if text.startswith(self.sent) else ""
        self.sent += delta
        return delta

    def final(self, result: _Result) -> str:
        ids = result.token_ids
        hit = None
        if result.finish_reason == "stop" and self.stops:
            plain = self.tokenizer.decode(ids, skip_special_tokens=True)
            cut = len(result.text)
            hit = next((s for s in self.stops if plain.startswith(s, cut)), None)
        if hit is not None:
            if self.skip_special:
                return result.text + (hit if self.include_stop else "")
            text = self._decode(ids)
            first = self._first_stop(text)
            if first is not None:
                text = text[: first[0] + (len(first[1]) if self.include_stop else 0)]
            return text
        if not self.custom:
            return result.text
        ended_by_token = result.finish_reason in ("eos", "stop") and bool(ids)
        return self._decode(ids[:-1] if ended_by_token and not self.include_stop else ids)

    def rest(self, result: _Result) -> str:
        text = self.final(result)
        delta = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent += delta
        return delta


def _old_decoder(py: tokenizers.Tokenizer, rounds: list[list[int]], stops: list[str], finish: str):
    """What the Decoder streamed before the port (the old ``_Assembler``): its chunks and its result; the last
    round ends with ``finish``."""
    old = _OldAssembler(py, stops)
    chunks = []
    for j, r in enumerate(rounds):
        n_before = len(old.tokens)
        text = old.feed(r, finish if j + 1 == len(rounds) else None)
        chunks.append(_Chunk(text, old.tokens[n_before:], old.finish))
        if old.finish is not None:
            break
    assert old.finish is not None
    return chunks, _Result(old.text, list(old.tokens), old.finish)


def _view_case(rng: random.Random, rs: _specrt.Tokenizer, py: tokenizers.Tokenizer):
    """A random stream (as :func:`_random_case`) ended by length, by an EOS (a special token, as models' are) or by
    a stop token id (any token: the request then has stop_token_ids), and the request's view options."""
    rounds, stops = _random_case(rng, py)
    finish = rng.choice(["length", "eos", "stop"])
    custom = finish == "stop" or rng.random() < 0.3  # stop_token_ids given (and not hit unless finish is "stop")
    if finish != "length":
        rounds = [r for r in rounds if r] or [[]]
        last = rng.choice(rs.special_ids) if finish == "eos" else rng.randrange(py.get_vocab_size())
        rounds[-1] = [*rounds[-1], last]
    if rng.random() < 0.3:  # a stop string holding a special token's text
        stops.append(py.id_to_token(rng.choice(rs.special_ids)))
    return rounds, stops, finish, custom, rng.random() < 0.5, rng.random() < 0.5


def _smollm2_tokenizer() -> Path | None:
    """SmolLM2's tokenizer.json: the model cache's, else ../shared/reference's (None without either)."""
    for p in _cached_tokenizers():
        if "smollm2" in str(p).lower():
            return p
    ref = Path(__file__).resolve().parents[3] / "shared" / "reference" / "tokenizers" / "smollm2" / "tokenizer.json"
    return ref if ref.is_file() else None


def test_text_views_equal_the_old_python_text_view(tiny_tokenizer_json: Path) -> None:
    """The server's views (``TextAssembler`` with vLLM's skip_special_tokens / include_stop_str_in_output, fed the
    Decoder's chunks, or the whole result at once) against the old ``_TextView`` over the old Decoder: the same text
    for every chunk before the last, the same whole text streamed and not."""
    pairs = [("tiny", *_pair_from_file(tiny_tokenizer_json))]
    smol = _smollm2_tokenizer()
    if smol is not None:
        pairs.append(("smollm2", *_pair_from_file(smol)))
    pairs += [("metaspace", *_pair_from_json(_metaspace_json())), ("wordpiece", *_pair_from_json(_wordpiece_json()))]
    rng = random.Random(27)
    n_checked = 0
    for name, rs, py in pairs:
        byte_level = rs.decoder_type == "ByteLevel"
        for case in range(400 if name in ("tiny", "smollm2") else 150):
            rounds, stops, finish, custom, skip, include = _view_case(rng, rs, py)
            chunks, result = _old_decoder(py, rounds, stops, finish)
            old = _OldTextView(py, stops, skip, include, custom)
            want = [old.feed(c) for c in chunks]
            want.append(old.rest(result))
            whole = _OldTextView(py, stops, skip, include, custom).final(result)
            assert "".join(want) == whole
            opts = {"skip_special_tokens": skip, "include_stop_str_in_output": include}
            asm = _specrt.TextAssembler(rs, stops, **opts)
            got = [asm.feed(c.token_ids, c.finish_reason).text for c in chunks]
            where = (name, case, rounds, stops, finish, custom, skip, include)
            assert asm.finished and asm.text == whole and "".join(got) == whole, where
            if byte_level:  # (other decoders rewrite earlier text: the old view and the new slice it differently)
                assert got[:-1] == want[: len(got) - 1], where
            once = _specrt.TextAssembler(rs, stops, **opts).feed(result.token_ids, result.finish_reason)
            assert once.finished and once.text == whole, where
            n_checked += 1
    assert n_checked >= 1100


# ----- end to end through Decoder ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("text-tiny")
    return convert(write_tiny_gguf(root / "t.gguf", arch="qwen2", seed=1, n_layers=2), root / "target", progress=False)


def _check_decoder_against_oracle(dec: specrt.Decoder, prompt: str, n: int, k: int, cuts: list[tuple[int, int]]):
    py = tokenizers.Tokenizer.from_file(str(Path(dec.target_path) / "tokenizer.json"))
    kw = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, "num_speculative_tokens": k}
    rounds = [c.token_ids for c in dec.stream(prompt, **kw) if c.result is None]
    full = py.decode([t for r in rounds for t in r])
    for a, b in cuts:
        stop = full[a:b]
        if not stop:
            continue
        chunks = list(dec.stream(prompt, stop=[stop], **kw))
        result = chunks[-1].result
        want_chunks, want_keep, want_text = _oracle(py, [*rounds, []], [stop])
        assert [c.text for c in chunks[:-1]] == want_chunks, (stop, rounds)
        assert result.text == want_text == full[: full.find(stop)]
        assert len(result.token_ids) == want_keep and result.finish_reason == "stop"


def test_greedy_generation_with_a_stop_string_streams_what_the_old_assembler_did(tiny_target: Path) -> None:
    dec = specrt.Decoder(tiny_target, tiny_target, max_seq_len=256)
    _check_decoder_against_oracle(dec, "hello", 40, 3, [(12, 15), (20, 24), (1, 2), (30, 31)])


def test_smollm2_greedy_stop_string_streams_what_the_old_assembler_did(tiny_smollm2_or_skip) -> None:
    _check_decoder_against_oracle(tiny_smollm2_or_skip, "The capital of France is", 32, 0, [(5, 9), (10, 20), (40, 43)])
