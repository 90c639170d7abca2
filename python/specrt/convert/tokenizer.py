"""Build a Hugging Face ``tokenizers`` tokenizer (``tokenizer.json``) from GGUF tokenizer metadata.

Supported: ``tokenizer.ggml.model = gpt2`` (byte-level BPE) with the pre-tokenizers listed in :data:`PRE_TOKENIZERS`.
Token types follow llama.cpp: 1 normal, 2 unknown, 3 control (-> special added token), 4 user-defined (-> added,
not special), 5 unused (vocabulary only), 6 byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specrt.convert.errors import TokenizerMetadataError
from specrt.convert.gguf_reader import GGUFModel

__all__ = ["END_OF_TURN_TOKENS", "PRE_TOKENIZERS", "TokenizerInfo", "build_tokenizer", "hf_tokenizer_config"]

_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
_TAIL = r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2_PATTERN = _CONTRACTIONS + r"\p{N}|" + _TAIL
_LLAMA3_PATTERN = _CONTRACTIONS + r"\p{N}{1,3}|" + _TAIL

#: ``tokenizer.ggml.pre`` -> split regex applied before byte-level mapping (``None``: the GPT-2 regex built into
#: ``ByteLevel(use_regex=True)``).
PRE_TOKENIZERS: dict[str, str | None] = {
    "qwen2": _QWEN2_PATTERN,
    "deepseek-r1-qwen": _QWEN2_PATTERN,
    "llama-bpe": _LLAMA3_PATTERN,
    "llama3": _LLAMA3_PATTERN,
    "smollm": None,
    "gpt2": None,
    "gpt-2": None,
    "default": None,
}

#: Token strings that end a turn or a document; a control token with one of these names joins ``eos_token_ids``.
END_OF_TURN_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>", "<|end|>", "</s>")

_CONTROL, _USER_DEFINED = 3, 4


@dataclass
class TokenizerInfo:
    """What the runtime needs besides ``tokenizer.json``.

    Attributes:
        bos_token_id: ``tokenizer.ggml.bos_token_id`` (None when absent).
        eos_token_ids: the GGUF EOS id first, then EOT/EOM ids and every control token in
            :data:`END_OF_TURN_TOKENS`.
        pad_token_id: padding id (None when absent).
        add_bos_token: whether encoding should prepend BOS.
        special_tokens: content -> id of every special (control) token.
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


def build_tokenizer(model: GGUFModel) -> tuple[Any, TokenizerInfo]:
    """Build the tokenizer described by ``model``'s metadata.

    Returns:
        ``(tokenizer, info)``: a ``tokenizers.Tokenizer`` (save with ``.save(path)``) and :class:`TokenizerInfo`.

    Raises:
        TokenizerMetadataError: tokenizer keys are missing, or the tokenizer model / pre-tokenizer is unsupported.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens"):
        if not model.has(key):
            raise TokenizerMetadataError(
                f"{model.path}: tokenizer metadata {key!r} is missing; cannot build a tokenizer"
            )
    kind = model.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise TokenizerMetadataError(
            f"tokenizer model {kind!r} is not supported (only byte-level BPE, tokenizer.ggml.model = 'gpt2')"
        )
    pre = model.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise TokenizerMetadataError(
            f"pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; "
            f"supported: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    tokens: list[str] = model.get("tokenizer.ggml.tokens")
    types: list[int] = model.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges_raw: list[str] | None = model.get("tokenizer.ggml.merges")
    if not merges_raw:
        raise TokenizerMetadataError(f"{model.path}: tokenizer metadata 'tokenizer.ggml.merges' is missing")
    if len(types) != len(tokens):
        raise TokenizerMetadataError(f"{model.path}: {len(tokens)} tokens but {len(types)} token types")

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

    special: dict[str, int] = {}
    added = []
    for i, (t, ty) in enumerate(zip(tokens, types, strict=True)):
        if ty == _CONTROL:
            special[t] = i
            added.append(AddedToken(t, special=True, normalized=False))
        elif ty == _USER_DEFINED:
            added.append(AddedToken(t, special=False, normalized=False))
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
