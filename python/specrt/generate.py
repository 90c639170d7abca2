"""The generation API: :class:`Decoder` (a target, an optional draft) and its ``generate`` / ``stream`` calls.

Speculative sampling (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023, arXiv:2302.01318): the draft
proposes ``num_speculative_tokens`` (K) tokens, the target scores K + 1 positions in one pass, and modified
rejection sampling keeps the output distribution exactly the target's. The loop runs in Rust (``specrt._specrt``)
with the GIL released; this module adds tokenization, chat templates, stop strings and streaming.

Threads: one :class:`Decoder` may be shared between threads; its generations are serialised (a lock held for the
whole call). Separate decoders run in parallel. Many requests at once share batched rounds through
:class:`specrt.scheduler.Scheduler` on a ``Decoder(max_batch=N)``.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from specrt import _specrt
from specrt._ort import check_cuda, find_ort_library, is_cuda
from specrt.errors import ConfigError, ModelFileNotFoundError, ProviderError, SpecrtError
from specrt.results import EventChunks, GenerationResult, Stats, StreamChunk

__all__ = ["Decoder", "GenerationResult", "Stats", "StreamChunk", "check_request"]


@functools.lru_cache(maxsize=16)
def _compiled_chat_template(template: str, folder: Path | None = None) -> _specrt.ChatTemplate:
    """``template`` compiled once (a server renders the same one for every request), with the special-token strings
    of model ``folder`` (``tokenizer_config.json``, else ``specrt_config.json``'s ids) when given."""
    if folder is None:
        return _specrt.ChatTemplate(template)
    compiled = _specrt.ChatTemplate.from_folder(folder)
    return compiled if compiled.source == template else _specrt.ChatTemplate(template, compiled.special_tokens)


def _check_draft_dtype(draft: str | os.PathLike[str] | None, draft_dtype: str | None) -> None:
    """``draft_dtype`` must name a supported dtype and have a draft model *name* to apply to (ConfigError otherwise:
    a folder is loaded as converted, so a dtype asked for it would be silently ignored)."""
    if draft_dtype is None:
        return
    from specrt.convert import SUPPORTED_DTYPES

    if not isinstance(draft_dtype, str) or draft_dtype not in SUPPORTED_DTYPES:
        raise ConfigError(f"draft_dtype {draft_dtype!r} is invalid (expected one of {', '.join(SUPPORTED_DTYPES)})")
    if draft is None:
        raise ConfigError(f"draft_dtype {draft_dtype!r} was given without a draft model (pass draft=<model name>)")
    if Path(draft).expanduser().exists():
        raise ConfigError(
            f"draft_dtype {draft_dtype!r} applies to model names, but the draft {str(draft)!r} is a folder, loaded as "
            "it was converted (pass a model name, or the folder converted to that dtype without draft_dtype)"
        )


# OpenAI's and llama.cpp's names for stream()'s parameters: a TypeError for one of them says which name to use.
_ALIASES = {"max_tokens": "max_new_tokens", "n_predict": "max_new_tokens", "stop_sequences": "stop"}


@functools.cache
def _stream_signature() -> inspect.Signature:
    """:meth:`Decoder.stream`'s signature (computed once)."""
    return inspect.signature(Decoder.stream)


def _bind_stream_args(caller: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """:meth:`Decoder.stream`'s arguments (name -> value, defaults filled in) from ``kwargs``.

    Raises:
        TypeError: an argument stream() does not take, naming ``caller`` (the function the user called) and, for
            another API's name (``max_tokens``), the name to use.
    """
    try:
        bound = _stream_signature().bind(None, **kwargs)
    except TypeError as e:
        hint = next((f" (did you mean {new!r}?)" for old, new in _ALIASES.items() if repr(old) in str(e)), "")
        raise TypeError(f"{caller}() {e}{hint}") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def check_request(caller: str = "Decoder.generate", *, has_draft: bool, **kwargs: Any) -> None:
    """Check a request's settings (:meth:`Decoder.stream`'s keyword arguments) without loading a model, as the
    CLI does before it loads one. What needs the model (the prompt's token ids against the vocabulary, the sequence
    length, generation_config.json's defaults) is checked when the request runs.

    Raises:
        TypeError: an argument stream() does not take (naming ``caller``).
        ConfigError: a setting out of range (named, with the allowed range).
    """
    _specrt.resolve_request(_settings_of(_bind_stream_args(caller, kwargs)), has_draft=has_draft)


def _settings_of(a: dict[str, Any]) -> dict[str, Any]:
    """The request settings among :meth:`Decoder.stream`'s arguments ``a`` (the prompt and messages left out)."""
    return {k: v for k, v in a.items() if k not in ("self", "prompt", "messages")}


#: Defaults of :meth:`Decoder.stream`'s request settings, from Rust (``GenerationRequest::default()``).
_D = _specrt.request_defaults()


class Decoder:
    """A target model and an optional draft model, ready to generate.

    Thread safety: a Decoder may be shared between threads. Its generations are serialised: ``generate`` holds the
    decoder's lock for the whole call and ``stream`` from its first chunk until it finishes or is closed (another
    thread waits meanwhile; the same thread gets ``ConfigError`` instead of a deadlock). Each generation's output
    depends only on its own arguments and seed, so concurrent calls return what serial calls would. Separate
    Decoders run in parallel: the models run with the GIL released, so other Python threads keep running too.
    Ctrl-C (KeyboardInterrupt) stops a generation between rounds and leaves the decoder usable.

    Args:
        target: a model name from ``specrt models list`` (pulled and converted on first use) or a model folder
            written by ``specrt convert``.
        draft: the same for the draft model, or ``None`` for target-only decoding. Must share the target's
            vocabulary.
        provider: ``"cpu"`` (default) or ``"cuda"``.
        device_id: CUDA device ordinal.
        max_seq_len: longest prompt + new tokens; bounds the KV memory each model preallocates
            (bytes = 2 * layers * kv_heads * head_dim * max_seq_len * 4 for fp32). Default: the model's
            ``max_position_embeddings``, capped at 4096 unless given.
        intra_op_threads: size of the ONNX Runtime thread pool that all models of the process share (default:
            physical cores; the first model loaded in a process decides it).
        allow_fallback: with ``provider="cuda"``, run on CPU instead of raising when CUDA cannot be used
            (:attr:`fallback_reason` then says why; ``specrt generate`` / ``serve`` print it on stderr).
        cuda_graph: with ``provider="cuda"``, capture each decode step shape (1 to 16 new tokens) into a CUDA graph
            and replay it (ONNX Runtime's ``enable_cuda_graph``); model names are pulled in the graph form
            (``attention="gqa-graph"``, cached as ``<dtype>-G``), folders must be in it. Single-stream only
            (``max_batch`` 1). Not yet run on a GPU by specrt's own checks (benches/RESULTS.md says what has been).
        ort_library: absolute path of ``libonnxruntime.so.1.x`` (default: from the installed onnxruntime wheel, or
            ``$SPECRT_ORT_LIBRARY``).
        dtype: precision to pull for model names (``"fp32"``).
        draft_dtype: precision to pull for a draft model name (default: ``dtype``; a folder is used as it is, like
            ``dtype``). An ``"int4"`` draft of an fp32 target is a cheap draft: output stays the fp32 target's
            (verification uses the target alone); only acceptance can drop (benches/RESULTS.md, "Cheap drafts").
            An int4 / int8 draft name is pulled with its int8 prefill graph (``<dtype>-P``, ``<dtype>-P-B``; not for
            CUDA graphs), on which it runs its prompt prefill and catch-up passes on the CPU (``specrt convert
            --prefill-graph``); a draft folder with a prefill graph is used the same way.
        max_batch: rows decoded together in batched rounds (1..64; default 1 = single-stream decoding). Above 1 the
            models are the batched layout (``specrt convert --attention batched``; pulled as ``<dtype>-B`` for model
            names; CPU, float32 activations; a batched-layout folder runs this way at any ``max_batch``) with
            ``max_batch`` KV cache slots each, and :class:`specrt.scheduler.Scheduler`
            runs its requests in shared rounds (``stream`` / ``generate`` still run one request at a time). The
            batched attention reads every slot's cache up to a window that follows the longest cached row (steps
            of 128 positions), so a large ``max_seq_len`` costs time only when a request is that long.
        prefill_chunk: with ``max_batch`` > 1, most prompt tokens a joining request prefills per pass (its
            prompt's chunks).
        max_prefill_tokens: with ``max_batch`` > 1, most prompt tokens prefilled per round over all joining
            requests, in whole chunks taken in slot order (the round's first always; integer >= 1; default
            ``DEFAULT_MAX_PREFILL_TOKENS``, 256): requests arriving together start decoding in fewer rounds, and the
            running rows wait at most this much prefill per round. The outputs do not depend on it.
        prefix_caching: reuse the KV of a prompt's leading tokens that a previous generation left in the caches
            (its prompt and output, matched token id by token id) and prefill only the rest (default on;
            ``Stats.n_cached_tokens`` counts the reused tokens). The output is unchanged up to the pass shape's
            rounding: reused rows were computed by other passes than a fresh prefill's.
        suffix_cache_tokens: tokens of earlier requests' prompts and outputs that suffix decoding
            (``proposer="suffix"`` or ``"suffix+draft"``) drafts from, shared by this decoder's requests (default 0:
            none, each request drafts from its own text; integer ``0 <= n <= 2**26``, about 1 KB a token at most;
            over the budget the oldest half is dropped). A request's text can then shape another's drafts (its
            speed), never its output, which is the target's whatever is drafted (SuffixDecoding, arXiv:2411.04975).

    Raises:
        UnknownModelError, ModelFileError, FileNotFoundError: a model cannot be found or read.
        VocabError: draft and target of one tokenizer whose logits widths differ other than in padding rows beyond
            the tokenizer's ids (both widths and the tokenizer's size named), or of two tokenizers that share no
            token string, or a tokenizer with more ids than its model has logits rows. A draft of another
            tokenizer is accepted and drafts through token-level intersection (:attr:`draft_vocabulary` says which
            method a pair uses).
        ProviderError: CUDA requested and unavailable (without ``allow_fallback``); raised before a model name is
            pulled or converted.
        BackendError: ONNX Runtime failed to load a model.
    """

    def __init__(
        self,
        target: str | os.PathLike[str],
        draft: str | os.PathLike[str] | None = None,
        *,
        provider: str = "cpu",
        device_id: int = 0,
        max_seq_len: int | None = _specrt.DEFAULT_MAX_SEQ_LEN,
        intra_op_threads: int | None = None,
        allow_fallback: bool = False,
        cuda_graph: bool = False,
        ort_library: str | None = None,
        dtype: str = "fp32",
        draft_dtype: str | None = None,
        max_batch: int = 1,
        prefill_chunk: int = 256,
        prefix_caching: bool = _specrt.DEFAULT_PREFIX_CACHING,
        max_prefill_tokens: int = _specrt.DEFAULT_MAX_PREFILL_TOKENS,
        suffix_cache_tokens: int = 0,
    ) -> None:
        from specrt.models import resolve_model

        # The one definition of these options' ranges and combinations is Rust's (``specrt_ort::DecoderOptions``).
        attention = _specrt.check_decoder_options(
            provider=provider,
            device_id=device_id,
            max_seq_len=max_seq_len,
            intra_op_threads=intra_op_threads,
            allow_fallback=allow_fallback,
            cuda_graph=cuda_graph,
            max_batch=max_batch,
            prefill_chunk=prefill_chunk,
            prefix_caching=prefix_caching,
            max_prefill_tokens=max_prefill_tokens,
            suffix_cache_tokens=suffix_cache_tokens,
        )
        _check_draft_dtype(draft, draft_dtype)
        #: Why CUDA was requested but the models run on the CPU (``allow_fallback=True``), else ``None``.
        self.fallback_reason: str | None = None
        if is_cuda(provider):
            # Refuse before any work: a model name would be pulled and converted (minutes, hundreds of MB) only for
            # the session to raise this ProviderError. The check and its message are the late path's (Rust's); with
            # allow_fallback its message is the fallback's reason.
            try:
                ort_library = check_cuda(ort_library, device_id)
            except ProviderError as e:
                if not allow_fallback:
                    raise
                self.fallback_reason = str(e)

        self.max_batch = max_batch
        self.target_path = resolve_model(target, dtype, attention=attention)
        d_dtype = draft_dtype or dtype
        self.draft_path = (
            resolve_model(
                draft,
                d_dtype,
                attention=attention,
                prefill_graph=attention != "gqa-graph" and d_dtype in ("int4", "int8"),
            )
            if draft is not None
            else None
        )
        models = (str(self.target_path), str(self.draft_path) if self.draft_path is not None else None)
        common = {
            "ort_library": ort_library or find_ort_library(provider),
            "provider": provider,
            "max_seq_len": max_seq_len,
            "intra_op_threads": intra_op_threads,
            "allow_fallback": allow_fallback,
        }
        self._scheduler: Any = None  # the Scheduler that owns a batching decoder
        self._solo_id: int | None = None  # the request of a stream() (a stream left unfinished leaves it behind)
        # The one driver of every generation (``specrt_ort::Driver``), in the layout the folders were converted
        # for (Rust reads it: the batched engine for the batched layout, at any max_batch, else the single-stream
        # engine; target and draft layouts must agree, and max_batch > 1 needs the batched one). Rust also compares
        # the draft's vocabulary with the target's: one tokenizer (logits widths equal or differing only in padding
        # rows beyond the tokenizer's ids, as Qwen2.5 7B's 152064 against 0.5B's 151936, else a VocabError before
        # any session loads) or two, drafting through token-level intersection (``draft_vocabulary``).
        self._driver: Any = _specrt.Driver(
            *models,
            max_batch=max_batch,
            prefill_chunk=prefill_chunk,
            max_prefill_tokens=max_prefill_tokens,
            device_id=device_id,
            cuda_graph=cuda_graph,
            prefix_caching=prefix_caching,
            suffix_cache_tokens=suffix_cache_tokens,
            **common,
        )
        batched = self._driver.batched
        tokenizer = self._driver.tokenizer
        if tokenizer is None:
            raise ModelFileNotFoundError(f"{self.target_path / 'tokenizer.json'} not found (the Decoder needs one)")
        self.tokenizer: _specrt.Tokenizer = tokenizer
        #: Whether requests share batched rounds (a batched-layout folder); a Scheduler then owns the decoder.
        self.batched = batched
        if is_cuda(provider) and self.fallback_reason is None and "CUDAExecutionProvider" not in self.providers:
            # CUDA registered, yet the sessions fell back while loading (Rust keeps that reason; the binding does not
            # expose it yet).
            self.fallback_reason = (
                "the batched model layout runs on the CPU provider only"
                if batched
                else "ONNX Runtime could not run these models on the CUDA provider"
            )
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread id holding _lock
        #: The sampling defaults the target folder sets (generation_config.json; absent and ``null`` keys left out).
        self.defaults: dict[str, Any] = self._driver.defaults.sampling()

    @property
    def eos_token_ids(self) -> list[int]:
        """Ids that end generation (default: the target folder's, generation_config.json's ``eos_token_id``, else
        specrt_config.json's). Settable: requests started afterwards end at the ids given.

        Raises:
            VocabError: (on setting) an id outside ``0 <= id < vocab_size``.
        """
        return list(self._driver.eos_token_ids)

    @eos_token_ids.setter
    def eos_token_ids(self, ids: Sequence[int]) -> None:
        self._driver.eos_token_ids = list(ids)

    @property
    def vocab_size(self) -> int:
        """Logits width shared by target and draft."""
        return self._driver.vocab_size

    @property
    def draft_vocabulary(self) -> dict[str, Any] | None:
        """How the draft's vocabulary relates to the target's (``None`` without a draft).

        ``{"method": "same tokenizer", "tokenizer_vocab_size": int | None}``, or for a draft whose tokenizer differs
        ``{"method": "token-level intersection", "target_vocab_size": int, "draft_vocab_size": int,
        "shared_tokens": int, "multi_token_spellings": int, "sample_shared_fraction": float}``: the draft proposes
        only tokens whose strings both vocabularies hold (``shared_tokens``), its distribution restricted to them and
        renormalised, so the output is exactly the target's at any temperature (token-level intersection, Timor et
        al., ICML 2025, arXiv:2502.05202); ``sample_shared_fraction`` is the share of the target's tokens of a short
        English and code sample that the draft can propose at all, an upper bound on the share it can get accepted on
        such text. ``multi_token_spellings`` counts target tokens the draft reads as several of its own.
        """
        text = self._driver.draft_vocabulary_json
        return None if text is None else json.loads(text)

    @property
    def max_seq_len(self) -> int:
        """Longest prompt + new tokens."""
        return self._driver.max_seq_len

    @property
    def providers(self) -> list[str]:
        """ONNX Runtime execution providers in use (preferred first)."""
        return list(self._driver.providers)

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        documents: Sequence[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render chat ``messages`` (``[{"role": ..., "content": ...}]``) with the model folder's template, exactly as
        transformers' ``apply_chat_template(messages, tokenize=False)`` on the folder does (``_specrt.ChatTemplate``:
        the folder's BOS / EOS strings, ``None``-valued message keys dropped).

        ``tools`` (OpenAI's ``[{"type": "function", "function": {...}}]``) and ``documents`` reach the template as
        ``tools`` / ``documents``, None when not given, as in transformers; the template decides how they are shown.
        ``kwargs`` are more template variables (e.g. ``enable_thinking=False``).

        Raises:
            ConfigError: the model has no chat template, or the template rejects the messages (its message), or uses
                a construct the renderer lacks (named, with its line).
        """
        template = self._driver.chat_template_source
        if not template:
            raise ConfigError(f"{self.target_path} has no chat_template.jinja; pass a plain prompt instead")
        return _compiled_chat_template(template, self.target_path).render(
            list(messages),
            add_generation_prompt,
            None if tools is None else list(tools),
            None if documents is None else list(documents),
            **kwargs,
        )

    def encode(self, prompt: str | Sequence[int] | None, messages: Sequence[dict[str, Any]] | None) -> list[int]:
        """Token ids for a prompt (text or ids) or chat messages (exactly one of the two). Ids given are passed on
        as they are: the resolver checks them (``_specrt.resolve_request``).

        Raises:
            ConfigError: both or neither given.
        """
        if (prompt is None) == (messages is None):
            raise ConfigError("give exactly one of prompt and messages")
        if messages is not None:
            return self.tokenizer.encode(self.apply_chat_template(messages), add_special_tokens=False).ids
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt).ids
        return list(prompt)  # type: ignore[arg-type]

    def generate(self, prompt: str | Sequence[int] | None = None, **kwargs: Any) -> GenerationResult:
        """Generate a completion; see :meth:`stream` for the arguments. Returns a :class:`GenerationResult`.

        Raises:
            TypeError: an argument :meth:`stream` does not take (naming ``generate``). (plus what :meth:`stream`
                raises)
        """
        _bind_stream_args("Decoder.generate", {"prompt": prompt, **kwargs})
        result = None
        for chunk in self.stream(prompt, **kwargs):
            result = chunk.result
        assert result is not None
        return result

    def stream(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: Sequence[dict[str, Any]] | None = None,
        max_new_tokens: int = _D["max_new_tokens"],
        num_speculative_tokens: int | str = _D["num_speculative_tokens"],
        proposer: str | None = _D["proposer"],
        prompt_lookup_min: int = _D["prompt_lookup_min"],
        prompt_lookup_max: int = _D["prompt_lookup_max"],
        pinned_costs: dict[str, Any] | None = _D["pinned_costs"],
        temperature: float | None = _D["temperature"],
        top_k: int | None = _D["top_k"],
        top_p: float | None = _D["top_p"],
        min_p: float | None = _D["min_p"],
        repetition_penalty: float | None = _D["repetition_penalty"],
        frequency_penalty: float = _D["frequency_penalty"],
        presence_penalty: float = _D["presence_penalty"],
        seed: int = _D["seed"],
        stop: str | Sequence[str] | None = _D["stop"],
        stop_token_ids: Sequence[int] | None = _D["stop_token_ids"],
        ignore_eos: bool = _D["ignore_eos"],
        coupled: bool = _D["coupled"],
        logprobs: bool = _D["logprobs"],
        top_logprobs: int = _D["top_logprobs"],
        prompt_logprobs: int | None = _D["prompt_logprobs"],
        min_tokens: int = _D["min_tokens"],
        response_format: dict[str, Any] | None = _D["response_format"],
        json_schema: dict[str, Any] | str | None = _D["json_schema"],
        regex: str | None = _D["regex"],
        grammar: str | None = _D["grammar"],
        choice: Sequence[str] | None = _D["choice"],
        skip_special_tokens: bool = _D["skip_special_tokens"],
        include_stop_str_in_output: bool = _D["include_stop_str_in_output"],
        _fault: str | None = None,
    ) -> Iterator[StreamChunk]:
        """Generate, yielding text as it is committed.

        Args:
            prompt: text (encoded with the model's tokenizer) or token ids; or give ``messages``.
            messages: chat messages, rendered with the model folder's chat template.
            max_new_tokens: most tokens to emit (>= 1).
            num_speculative_tokens: K, draft tokens per round (0 to ``MAX_DRAFT_TOKENS``, 64; 0 or no draft =
                target-only), or ``"auto"``:
                each round picks the K in 0..8 that maximises expected tokens per second from running estimates of
                the acceptance rate and the measured costs (the seed's cost model; K = 0 when no K is predicted to
                win, probing again later); with an n-gram proposer it also decides how many tokens of a match to
                verify (up to 8), or to decline the match when the draft model or a plain target step is predicted
                to be faster, from a separate n-gram acceptance estimate. Auto K depends on timings, so the same
                seed can give different text unless ``pinned_costs`` is given; a fixed K always repeats exactly.
            proposer: ``"draft"`` (the draft model; default when one is attached), ``"ngram"`` (prompt lookup: copy
                the continuation of the longest matching n-gram of the prompt and text so far), ``"ngram+draft"``
                (n-gram first, the draft model when nothing matches), ``"suffix"`` (suffix decoding: the most
                frequent continuation of the longest matching suffix in the prompt and text so far and, with the
                Decoder's ``suffix_cache_tokens``, in earlier requests' prompts and outputs), ``"suffix+draft"``,
                ``"none"`` (target-only), or ``"auto"``: each
                round auto K's controller chooses a plain target step, an n-gram match or the draft model (when one
                is attached) and how many tokens, from this request's measured acceptance of each and their costs,
                up to ``num_speculative_tokens`` tokens (the cap; up to ``AUTO_K_MAX`` with ``"auto"``).
            prompt_lookup_min, prompt_lookup_max: n-gram lengths to match (vLLM's names; 1 <= min <= max <= 32);
                suffix decoding matches suffixes of ``prompt_lookup_min`` to 16 tokens (min <= 16).
            pinned_costs: with ``"auto"``: ``{"c_draft": float, "c_verify": [K_max + 1 floats]}`` in any one unit —
                one draft pass, and a target pass over n = 1..K_max + 1 tokens — used instead of timings.
            temperature: 0 = greedy; default from generation_config.json, else 1.
            top_k, top_p, min_p: nucleus settings (0, 1, 0 = off); defaults from generation_config.json.
            repetition_penalty: HF-style (1 = off); frequency_penalty, presence_penalty: OpenAI-style (0 = off).
            seed: random seed; the same seed and settings give the same tokens.
            stop: stop strings; the text ends before the first match.
            skip_special_tokens: vLLM's (default true): leave the text of special added tokens out of the text.
            include_stop_str_in_output: vLLM's (default false): keep the stop string (or the text of the EOS / stop
                id token) that ended the generation at the end of the text.
            stop_token_ids: extra token ids that end generation.
            ignore_eos: keep going past the model's EOS ids.
            coupled: coupled sampling (off by default): the random choice at each output position depends on
                ``(seed, position)`` alone (the Gumbel-max trick as an exponential race, ``specrt-core``'s
                ``coupled.rs``), so the same seed gives the same text with or without speculation, for every K, draft
                model or n-gram proposer. Each position is still an exact sample of the target's processed
                distribution; drafts are accepted only when they equal the target's choice, which accepts fewer
                tokens than ``min(1, p/q)`` acceptance (measured in benches/RESULTS.md).
            logprobs: return the target's log-probability of each token (default true). False returns none
                (``logprobs`` lists stay empty) and lets greedy decoding without penalties or coupled sampling read
                only the models' argmax ids: with a graph-form model (``attention="gqa-graph"``) on CUDA, K + 1 ids
                reach the host per round instead of K + 1 rows of logits, and NaN logits are then not detected
                there (no ``NonFiniteLogitsError``); on the CPU the ids come from the logits, checked as always.
                Batched decoding (``max_batch`` > 1) reads the logits either way.
            top_logprobs: alternatives per emitted token (0..20; default 0 = none): the most likely tokens of the
                target's verification row of the token's position with their log-probabilities (raw logits, as
                ``logprobs``), in :attr:`GenerationResult.top_logprobs` and each chunk's ``top_logprobs``. They are
                the target's own values with or without speculation (equal to a target-only pass up to the pass
                shape's rounding: ~1e-6 in fp32). Above 0, rounds read the models' logits.
            prompt_logprobs: score the prompt (None = off): the target's log-probability of every prompt token and
                this many alternatives per position (0..20), from the prefill pass, in
                :attr:`GenerationResult.prompt_logprobs` (OpenAI's ``echo`` with ``logprobs``, vLLM's
                ``prompt_logprobs``). The prefill then reads every position's logits (in chunks of 256 positions).
            min_tokens: vLLM's: no EOS id (unless ``ignore_eos``) and no ``stop_token_ids`` id before this many tokens
                (0 = off; at most ``max_new_tokens``): their logits are -inf at those positions, in the draft's rows and
                the target's alike (with the penalties), so speculation stays exact. Stop strings still end the text.
            response_format, json_schema, regex, grammar, choice: structured output, at most one of them (default
                none): every emitted token is one the constraint allows, EOS comes only where it accepts, and the
                generation ends with finish reason ``"grammar"`` once nothing but the end can follow. The mask applies
                after the penalties and before temperature / top-k / top-p / min-p (top-k chooses among the allowed
                tokens) to the draft's rows and the target's alike, so speculation stays exact (docs/structured-
                output.md); tokens the constraint forces are proposed without a draft pass (``Stats.n_drafted_forced``).
                ``logprobs`` stay the target's raw values. Single-stream decoding only (a batching decoder,
                ``max_batch`` > 1, refuses them for now). Kinds:

                - ``response_format``: OpenAI's ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}`` (any
                  JSON object) or ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict":
                  bool}}`` (``strict`` true refuses schema keywords llguidance does not implement; false, the
                  default, ignores them, so the output may not check them).
                - ``json_schema``: a JSON Schema (a dict, or its JSON text), not strict; llguidance's subset.
                - ``regex``: a regular expression (Rust ``regex`` syntax) the whole output matches.
                - ``grammar``: a grammar in llguidance's Lark syntax (start rule ``start``).
                - ``choice``: the output is exactly one of these non-empty strings.

                JSON is written compactly (``", "`` between items, ``": "`` after keys, no other whitespace).
            _fault: a deliberate sampler fault, for tests of the tests only (``"residual_from_draft"``).

        Yields:
            :class:`StreamChunk` per round; the last one carries the :class:`GenerationResult`.

        Raises:
            ConfigError: a setting out of range (named, with the allowed range); a bad schema, regex or grammar, a
                ``response_format`` of unknown type, or two constraints at once (the field named), before anything
                runs.
            SequenceLengthError: prompt + max_new_tokens exceeds ``max_seq_len``.
            VocabError: a prompt or stop token id outside ``0 <= id < vocab_size``.
            NonFiniteLogitsError: a model produced NaN/inf logits (position named; not detected in argmax-only
                rounds of a graph-form model on CUDA, see ``logprobs``).
            KeyboardInterrupt: stops promptly (between rounds); the decoder stays usable.
            TypeError: a token id that is not an integer.
        """
        a = dict(locals())
        # Resolved and checked once, now: a bad setting raises before this call waits for the decoder.
        request = self._driver.prepare(self.encode(a["prompt"], a["messages"]), _settings_of(a))
        self._check_not_scheduled()
        me = threading.get_ident()
        if self._owner == me:
            # Waiting for our own lock would hang this thread for good.
            raise ConfigError(
                "this Decoder is already generating in this thread (a stream that is still open); finish or close() "
                "that stream first, or use another Decoder"
            )
        with self._lock:
            self._check_not_scheduled()  # a Scheduler may have taken the decoder over while this call waited
            self._owner = me
            try:
                yield from self._run(request)
            finally:
                self._owner = None

    @property
    def driver(self) -> Any:
        """The Rust driver of every generation of this decoder (``_specrt.Driver``): what :meth:`stream` steps
        for one request and a :class:`specrt.scheduler.Scheduler` steps for its batch."""
        return self._driver

    @property
    def generation_lock(self) -> threading.Lock:
        """The lock every :meth:`generate` / :meth:`stream` holds while it runs (generations are serialised); a
        :class:`specrt.scheduler.Scheduler` over a single-stream decoder holds it while it has requests running, so
        direct calls wait for them."""
        return self._lock

    def attach_scheduler(self, scheduler: Any) -> None:
        """Make ``scheduler`` the only user of this batching decoder (its requests share one batch): direct
        :meth:`generate` / :meth:`stream` calls raise ConfigError until :meth:`detach_scheduler`. The row of a stream
        left unfinished is freed.

        Raises:
            ConfigError: a stream is open on this decoder, or another Scheduler owns it.
        """
        if not self._lock.acquire(blocking=False):
            raise ConfigError(
                "this Decoder is generating (a stream is open); finish or close it before a Scheduler takes it over"
            )
        try:
            if self._scheduler is not None:
                raise ConfigError(
                    "this batching Decoder already has a Scheduler (one Scheduler owns its batch); close that one "
                    "first, or submit to it"
                )
            self._scheduler = scheduler
            if self._solo_id is not None:  # a stream left unfinished frees its row
                self._driver.cancel(self._solo_id)
                self._solo_id = None
        finally:
            self._lock.release()

    def detach_scheduler(self, scheduler: Any) -> None:
        """End ``scheduler``'s ownership of this decoder (nothing when it does not own it)."""
        if self._scheduler is scheduler:
            self._scheduler = None

    def _check_not_scheduled(self) -> None:
        if self._scheduler is not None:
            raise ConfigError(
                "this batching Decoder is owned by a Scheduler (its requests share the batch); submit to the "
                "Scheduler, or close it before calling generate / stream"
            )

    def prepare(self, *, _caller: str = "Decoder.prepare", **kwargs: Any) -> Any:
        """A request from :meth:`stream`'s keyword arguments, resolved and checked once by the one resolver in Rust
        (``specrt_ort::resolve_request``: the folder's defaults, every range, the prompt against the vocabulary and
        ``max_seq_len``), not queued: a ``_specrt.PreparedRequest`` with ``prompt_ids`` (``list[int]``), ``config``
        (the engine's ``RequestConfig``: ``specrt certify`` reads the processing in force from it), ``stop`` and
        ``scored``. :meth:`stream` and :meth:`specrt.scheduler.Scheduler.submit` run requests made here. Never waits
        for a running generation.

        ``_caller`` names the function the user called in a TypeError's message (``"Scheduler.submit"``).

        Raises:
            TypeError: an argument :meth:`stream` does not take. (plus what :meth:`stream` raises for bad settings,
                before anything runs)
        """
        a = _bind_stream_args(_caller, kwargs)
        return self._driver.prepare(self.encode(a["prompt"], a["messages"]), _settings_of(a))

    def _run(self, request: Any) -> Iterator[StreamChunk]:
        """One prepared request on the decoder's driver (``Driver``; no Scheduler owns it): queued, stepped
        round by round, its events turned into chunks; cancelled when the stream ends early (a closed generator,
        Ctrl-C between rounds)."""
        if self._solo_id is not None:
            self._driver.cancel(self._solo_id)  # a stream left unfinished leaves its row behind
        rid = self._solo_id = self._driver.submit(request)
        events = EventChunks(request.prompt_ids, request.scored)
        try:
            while not events.done:
                for e in self._driver.step():
                    if e["id"] == rid:
                        if e["error"] is not None:
                            raise e["error"]
                        yield from events.chunks(e)
                if not events.done and self._driver.is_idle:
                    raise SpecrtError(f"request {rid} left the driver without finishing")  # a bug
        finally:
            self._driver.cancel(rid)  # a stream closed early frees its batch row now (a no-op once finished)
            self._solo_id = None

    def __repr__(self) -> str:
        return f"Decoder(target={str(self.target_path)!r}, draft={str(self.draft_path) if self.draft_path else None!r})"
