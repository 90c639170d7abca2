"""Build a Hugging Face ``tokenizers`` tokenizer (``tokenizer.json``) from GGUF tokenizer metadata.

Supported: ``tokenizer.ggml.model = gpt2`` (byte-level BPE) with the pre-tokenizers listed in :data:`PRE_TOKENIZERS`,
and ``tokenizer.ggml.model = llama`` (SentencePiece BPE with byte fallback: Llama 1/2, Mistral, Mixtral; see
:func:`sentencepiece_bpe`). Token types follow llama.cpp: 1 normal, 2 unknown and 3 control (-> special added
tokens), 4 user-defined (-> added, not special), 5 unused (vocabulary only), 6 byte (``<0x0A>``: SentencePiece's byte
fallback).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specrt.convert.errors import TokenizerMetadataError
from specrt.convert.gguf_reader import GGUFModel

__all__ = [
    "END_OF_TURN_TOKENS",
    "PRE_TOKENIZERS",
    "SPM_SPACE",
    "TOKENIZER_MODELS",
    "TokenizerInfo",
    "build_tokenizer",
    "hf_tokenizer_config",
    "sentencepiece_bpe",
]

_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
_TAIL = r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2_PATTERN = _CONTRACTIONS + r"\p{N}|" + _TAIL
_LLAMA3_PATTERN = _CONTRACTIONS + r"\p{N}{1,3}|" + _TAIL
#: o200k (GPT-4o, Phi-4-mini): the pattern of their ``tokenizer.json`` (llama.cpp's ``LLAMA_VOCAB_PRE_TYPE_GPT4O``
#: quotes it as "original regex from tokenizer.json" and runs an equivalent without ``\p{M}``: combining marks split
#: otherwise there).
_CASED_UPPER, _CASED_LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_SUFFIX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O_PATTERN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_CASED_UPPER}*{_CASED_LOWER}+{_SUFFIX}|"
    rf"[^\r\n\p{{L}}\p{{N}}]?{_CASED_UPPER}+{_CASED_LOWER}*{_SUFFIX}|"
    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: ``tokenizer.ggml.pre`` -> split regex applied before byte-level mapping (``None``: the GPT-2 regex built into
#: ``ByteLevel(use_regex=True)``).
PRE_TOKENIZERS: dict[str, str | None] = {
    "qwen2": _QWEN2_PATTERN,
    "deepseek-r1-qwen": _QWEN2_PATTERN,
    "llama-bpe": _LLAMA3_PATTERN,
    "llama3": _LLAMA3_PATTERN,
    "gpt-4o": _GPT4O_PATTERN,
    "smollm": None,
    "gpt2": None,
    "gpt-2": None,
    "default": None,
}

#: Token strings that end a turn or a document; a control token with one of these names joins ``eos_token_ids``.
END_OF_TURN_TOKENS = (
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|eom_id|>",
    "<|end|>",
    "</s>",
    "<end_of_turn>",  # Gemma (llama.cpp's vocabulary counts it as an end of generation by this text)
)

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE = 1, 2, 3, 4, 6
#: ``tokenizer.ggml.model`` values :func:`build_tokenizer` reads.
TOKENIZER_MODELS = ("gpt2", "llama")
#: SentencePiece's whitespace mark (U+2581), which its pieces carry instead of spaces.
SPM_SPACE = "\u2581"


@dataclass
class TokenizerInfo:
    """What the runtime needs besides ``tokenizer.json``.

    Attributes:
        bos_token_id: ``tokenizer.ggml.bos_token_id`` (None when absent).
        eos_token_ids: the GGUF EOS id first, then EOT/EOM ids and every control token in
            :data:`END_OF_TURN_TOKENS`.
        pad_token_id: padding id (None when absent).
        add_bos_token: whether encoding should prepend BOS.
        special_tokens: content -> id of every special (control or unknown) token.
        chat_template: Jinja chat template (None when the GGUF has none).
        vocab_size: number of tokens.
    """

    bos_token_id: int | None
    eos_token_ids: list[int]
    pad_token_id: int | None
    add_bos_token: bool
    special_tokens: dict[str, int] = field(default_factory=dict)
    chat_template: str | None = None
    vocab_size: int = 0

    def token_name(self, token_id: int | None) -> str | None:
        """The content of special token ``token_id`` (None if it is not special)."""
        for k, v in self.special_tokens.items():
            if v == token_id:
                return k
        return None


def hf_tokenizer_config(
    tokenizer: Any,
    *,
    bos_token_id: int | None,
    eos_token_ids: list[int],
    pad_token_id: int | None,
    chat_template: str | None,
    model_max_length: int,
) -> dict[str, Any]:
    """The ``tokenizer_config.json`` of a converted folder: with it transformers'
    ``AutoTokenizer.from_pretrained(folder)`` loads the folder as a ``PreTrainedTokenizerFast`` over its
    ``tokenizer.json``, with the special tokens and the chat template; ``specrt serve`` answers ``/tokenizer_info``
    with it (vLLM's endpoint returns the tokenizer's configuration the same way).

    ``add_bos_token`` is left out on purpose: ``tokenizer.json``'s post-processor already prepends BOS where the
    model wants it, and a fast tokenizer that also honoured the flag could prepend it twice.

    Args:
        tokenizer: the ``tokenizers.Tokenizer`` (names the ids below).
        bos_token_id, pad_token_id: ids or None.
        eos_token_ids: the EOS id first (``eos_token`` names it), then other end-of-turn ids.
        chat_template: the Jinja template, or None (no ``chat_template`` key).
        model_max_length: the longest sequence the model accepts (``max_position_embeddings``).

    Returns:
        The JSON-ready dict.
    """

    def name(i: int | None) -> str | None:
        return None if i is None else tokenizer.id_to_token(int(i))

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name(bos_token_id),
        "eos_token": name(eos_token_ids[0]) if eos_token_ids else None,
        "pad_token": name(pad_token_id),
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(model_max_length),
    }
    if chat_template:
        config["chat_template"] = chat_template
    return config


def _byte_level_bpe(model: GGUFModel, tokens: list[str]) -> Any:
    """The ``gpt2`` tokenizer model: byte-level BPE with the GGUF's merges and ``tokenizer.ggml.pre``'s split."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = model.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise TokenizerMetadataError(
            f"pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; "
            f"supported: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    merges_raw: list[str] | None = model.get("tokenizer.ggml.merges")
    if not merges_raw:
        raise TokenizerMetadataError(f"{model.path}: tokenizer metadata 'tokenizer.ggml.merges' is missing")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = []
    for m in merges_raw:
        a, sep, b = m.partition(" ")
        if not sep:
            raise TokenizerMetadataError(f"{model.path}: malformed merge {m!r}")
        merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    pattern = PRE_TOKENIZERS[pre]
    if pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(model: GGUFModel, tokens: list[str], types: list[int]) -> Any:
    """The ``llama`` tokenizer model: :func:`sentencepiece_bpe` over the GGUF's pieces, scores and types."""
    scores = model.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        found = "missing" if scores is None else f"{len(scores)} scores for {len(tokens)} tokens"
        raise TokenizerMetadataError(f"{model.path}: tokenizer metadata 'tokenizer.ggml.scores' is {found}")
    # llama.cpp's SPM tokenizer applies neither (it reads them for other tokenizer models): refuse rather than guess
    if model.get("tokenizer.ggml.remove_extra_whitespaces", False):
        raise TokenizerMetadataError(
            "tokenizer.ggml.remove_extra_whitespaces is not supported for a SentencePiece (llama) tokenizer"
        )
    if model.get("tokenizer.ggml.precompiled_charsmap"):
        raise TokenizerMetadataError(
            "a normalizer (tokenizer.ggml.precompiled_charsmap) is not supported for a SentencePiece (llama) tokenizer"
        )
    add_space_prefix = bool(model.get("tokenizer.ggml.add_space_prefix", True))
    unk = model.get("tokenizer.ggml.unknown_token_id")
    return sentencepiece_bpe(
        tokens,
        [float(x) for x in scores],
        types,
        add_space_prefix=add_space_prefix,
        unk_token_id=None if unk is None else int(unk),
    )


def sentencepiece_bpe(
    tokens: list[str],
    scores: list[float],
    types: list[int],
    *,
    add_space_prefix: bool = True,
    unk_token_id: int | None = None,
) -> Any:
    """A ``tokenizers.Tokenizer`` that encodes as SentencePiece's BPE model (``SentencePieceProcessor.encode``) and
    as llama.cpp's ``llama`` (SPM) tokenizer: what transformers' ``LlamaConverter`` writes for Llama 2 and Mistral
    (their ``tokenizer.json``), built from the GGUF's pieces instead of a ``tokenizer.model``.

    SentencePiece's BPE repeatedly joins the adjacent pair whose joined piece has the highest score (leftmost
    first); a BPE model whose merges are ranked by that score (then by piece id) makes the same choices. Only normal
    pieces (type 1) merge; characters missing from the vocabulary become their UTF-8 bytes (``<0xE4>``: byte
    fallback) when the vocabulary has byte pieces, else the unknown piece. Spaces become ``▁`` and, with
    ``add_space_prefix`` (SentencePiece's ``add_dummy_prefix``; GGUF ``tokenizer.ggml.add_space_prefix``, default
    true), one ``▁`` is prepended to each stretch of text between added tokens (llama.cpp adds the space after every
    special token likewise; transformers calls this the "legacy" form, which Mistral's ``tokenizer.json`` uses).
    Decoding maps ``▁`` back to spaces, fuses byte pieces into UTF-8 and drops the prefix's space.

    Args:
        tokens: the pieces by id (``tokenizer.ggml.tokens``).
        scores: their scores (``tokenizer.ggml.scores``): higher merges first.
        types: their llama.cpp token types (``tokenizer.ggml.token_type``).
        add_space_prefix: prepend ``▁`` (see above).
        unk_token_id: the unknown piece when no piece has type 2 (``tokenizer.ggml.unknown_token_id``: Gemma's
            ``<unk>`` is a control token in llama.cpp's GGUFs).

    Returns:
        The tokenizer, without added tokens or post-processor (:func:`build_tokenizer` adds them).

    Raises:
        TokenizerMetadataError: no unknown piece (type 2 or ``unk_token_id``), which SentencePiece always has.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers

    unknown = [t for t, ty in zip(tokens, types, strict=True) if ty == _UNKNOWN]
    if not unknown and unk_token_id is not None and 0 <= unk_token_id < len(tokens):
        unknown = [tokens[unk_token_id]]
    if not unknown:
        raise TokenizerMetadataError("a SentencePiece vocabulary needs an unknown piece (token type 2); none found")
    vocab = {t: i for i, t in enumerate(tokens)}
    normal = {t: (float(scores[i]), i) for i, t in enumerate(tokens) if types[i] == _NORMAL}
    # Each way of splitting a normal piece into two normal pieces is a merge; its rank: the joined piece's score
    # (highest first), then its id (transformers' SpmConverter ranks them the same way).
    ranked = []
    for piece, (score, i) in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                ranked.append((-score, i, left, right))
    merges = [(left, right) for _, _, left, right in sorted(ranked)]
    byte_fallback = _BYTE in types
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=unknown[0], fuse_unk=True, byte_fallback=byte_fallback)
    )
    steps = [normalizers.Prepend(SPM_SPACE)] if add_space_prefix else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPM_SPACE)])
    decode = [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:  # Strip applies to each token: after Fuse it strips the start of the text only
        decode.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(decode)
    return tok


#: Special tokens of a Phi-3 vocabulary that keep the whitespace after them (llama.cpp's ``llama_vocab::load``).
_PHI3_KEEP_SPACE = ("<unk>", "<s>", "<|endoftext|>")


def _rstripped_tokens(model: GGUFModel) -> Any:
    """Which added tokens drop the whitespace after them in the text (``AddedToken(rstrip=True)``), as llama.cpp's
    vocabulary loader decides it (``llama_vocab::load``: "Per token attributes are missing from the GGUF file", set by
    the lowercased ``general.name``): every special (control, unknown, user-defined) token but ``<unk>``, ``<s>`` and
    ``<|endoftext|>`` of a model named ``phi3`` / ``phi-3`` (Phi-3 / Phi-3.5 chat prompts: ``<|user|>\n`` then the
    text); none of other models."""
    name = str(model.get("general.name", "")).lower()
    if "phi3" not in name and "phi-3" not in name:
        return lambda _token: False
    return lambda token: token not in _PHI3_KEEP_SPACE


def build_tokenizer(model: GGUFModel) -> tuple[Any, TokenizerInfo]:
    """Build the tokenizer described by ``model``'s metadata.

    Returns:
        ``(tokenizer, info)``: a ``tokenizers.Tokenizer`` (save with ``.save(path)``) and :class:`TokenizerInfo`.

    Raises:
        TokenizerMetadataError: tokenizer keys are missing or inconsistent, or the tokenizer model (one of
            :data:`TOKENIZER_MODELS`) / pre-tokenizer is unsupported, or a SentencePiece vocabulary asks for
            ``tokenizer.ggml.remove_extra_whitespaces`` or a ``precompiled_charsmap`` normalizer.
    """
    from tokenizers import AddedToken, processors

    for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens"):
        if not model.has(key):
            raise TokenizerMetadataError(
                f"{model.path}: tokenizer metadata {key!r} is missing; cannot build a tokenizer"
            )
    kind = model.get("tokenizer.ggml.model")
    if kind not in TOKENIZER_MODELS:
        raise TokenizerMetadataError(
            f"tokenizer model {kind!r} (tokenizer.ggml.model) is not supported; supported: "
            f"{', '.join(TOKENIZER_MODELS)} (byte-level BPE, SentencePiece BPE)"
        )
    tokens: list[str] = model.get("tokenizer.ggml.tokens")
    types: list[int] = model.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise TokenizerMetadataError(f"{model.path}: {len(tokens)} tokens but {len(types)} token types")
    tok = _sentencepiece(model, tokens, types) if kind == "llama" else _byte_level_bpe(model, tokens)

    special: dict[str, int] = {}
    added = []
    rstrip = _rstripped_tokens(model)
    for i, (t, ty) in enumerate(zip(tokens, types, strict=True)):
        if ty in (_CONTROL, _UNKNOWN):  # llama.cpp matches both in text as special tokens, transformers too
            special[t] = i
            added.append(AddedToken(t, special=True, normalized=False, rstrip=rstrip(t)))
        elif ty == _USER_DEFINED:
            added.append(AddedToken(t, special=False, normalized=False, rstrip=rstrip(t)))
    # Registration keeps the ids: every added token already exists in the vocabulary.
    tok.add_tokens([a for a in added if not a.special])
    tok.add_special_tokens([a for a in added if a.special])

    def opt_id(key: str) -> int | None:
        v = model.get(key)
        return None if v is None else int(v)

    bos = opt_id("tokenizer.ggml.bos_token_id")
    add_bos = bool(model.get("tokenizer.ggml.add_bos_token", False))
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A {tokens[bos]} $B", special_tokens=[(tokens[bos], bos)]
        )
    eos_ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        v = opt_id(key)
        if v is not None and v not in eos_ids:
            eos_ids.append(v)
    for name in END_OF_TURN_TOKENS:
        if name in special and special[name] not in eos_ids:
            eos_ids.append(special[name])
    info = TokenizerInfo(
        bos_token_id=bos,
        eos_token_ids=eos_ids,
        pad_token_id=opt_id("tokenizer.ggml.padding_token_id"),
        add_bos_token=add_bos,
        special_tokens=special,
        chat_template=model.get("tokenizer.chat_template"),
        vocab_size=len(tokens),
    )
    return tok, info
