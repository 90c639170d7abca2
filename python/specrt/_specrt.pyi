"""Type stubs for the Rust extension ``specrt._specrt`` (hand-written; sections per binding file).

Checked against the built module by ``python -m mypy.stubtest specrt._specrt`` (tests/cli/test_stubs.py). Every pyo3
class is ``@final`` (pyo3 classes cannot be subclassed) and is built by ``__new__`` (pyo3's ``#[new]``), so
constructors are stubbed as ``__new__``; read-only attributes (``#[getter]``, ``get_all``) are properties.
"""

import datetime
import os
import pathlib
from collections.abc import Callable, Sequence
from typing import Any, Literal, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "AUTO_K_MAX",
    "DEFAULT_MAX_PREFILL_TOKENS",
    "DEFAULT_MAX_SEQ_LEN",
    "DEFAULT_PREFIX_CACHE_BYTES",
    "DEFAULT_PREFIX_CACHING",
    "ERROR_VARIANTS",
    "GGUF_MATMUL_TYPES",
    "MAX_BATCH",
    "MAX_DRAFT_TOKENS",
    "MAX_TOP_LOGPROBS",
    "OPERATOR_DOMAIN",
    "PROPOSERS",
    "BackendError",
    "ChatTemplate",
    "ConfigError",
    "ConstraintMasks",
    "DraftComparison",
    "Driver",
    "Encoding",
    "FolderDefaults",
    "GenerationCancelled",
    "GraphSession",
    "InternalError",
    "ModelFileError",
    "ModelFileNotFoundError",
    "NonFiniteLogitsError",
    "OptimalK",
    "OrtModel",
    "PreparedRequest",
    "ProviderError",
    "RequestConfig",
    "Rng",
    "SequenceLengthError",
    "ShapeError",
    "SpecrtError",
    "TextAssembler",
    "TextDelta",
    "Tokenizer",
    "Verification",
    "VocabError",
    "__version__",
    "acceptance_prob",
    "alpha_from_tokens_per_round",
    "check_decoder_options",
    "check_token_ids",
    "compare_drafts",
    "coupled_choice",
    "coupled_uniforms",
    "cycle_cost",
    "error_for",
    "expected_tokens",
    "find_ort_library",
    "gguf_dequantize",
    "gguf_kernel_paths",
    "gguf_matmul",
    "log_softmax_at",
    "optimal_k",
    "process_logits",
    "request_defaults",
    "resolve_request",
    "runtime_info",
    "sample",
    "sample_draft",
    "speedup",
    "verify",
]

__version__: str

# ---------------------------------------------------------------------------------------------------------------
# errors.rs
# ---------------------------------------------------------------------------------------------------------------

class SpecrtError(Exception): ...

class ConfigError(SpecrtError, ValueError):
    field: str | None

class ShapeError(SpecrtError, ValueError): ...
class VocabError(SpecrtError, ValueError): ...

class NonFiniteLogitsError(SpecrtError, ValueError):
    row: int
    token: int
    value: str
    what: str

class SequenceLengthError(SpecrtError, ValueError): ...

class BackendError(SpecrtError, RuntimeError):
    code: str
    message: str

class ProviderError(SpecrtError, RuntimeError): ...
class ModelFileError(SpecrtError, OSError): ...
class ModelFileNotFoundError(ModelFileError, FileNotFoundError): ...
class GenerationCancelled(SpecrtError): ...  # noqa: N818 (name chosen to read as an event)
class InternalError(SpecrtError, RuntimeError): ...

#: The names error_for accepts: each Rust SpecError variant, and "Panic".
ERROR_VARIANTS: list[str]

def error_for(variant: str, message: str) -> SpecrtError:
    """The exception (not raised) the binding makes of Rust error variant ``variant`` with ``message``."""

# ---------------------------------------------------------------------------------------------------------------
# sampling.rs
# ---------------------------------------------------------------------------------------------------------------

_Tokens = npt.NDArray[np.integer] | Sequence[int]

@final
class Rng:
    """Seeded PCG64 stream, twin of numpy's PCG64. Advanced in place when passed as ``rng=``."""

    def __new__(cls, seed: int) -> Rng: ...
    @staticmethod
    def from_state(state: int, inc: int) -> Rng: ...
    @property
    def state(self) -> tuple[int, int]: ...
    def next_u64(self) -> int: ...
    def random(self) -> float: ...
    def copy(self) -> Rng: ...

def sample(
    logits: npt.NDArray[np.float32],
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    prompt_tokens: _Tokens | None = None,
    output_tokens: _Tokens | None = None,
    seed: int | None = None,
    rng: Rng | None = None,
) -> int:
    """One token from ``logits`` ([vocab] float32). Exactly one of seed / rng unless temperature is 0."""

def sample_draft(
    logits: npt.NDArray[np.float32],
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    prompt_tokens: _Tokens | None = None,
    output_tokens: _Tokens | None = None,
    seed: int | None = None,
    rng: Rng | None = None,
) -> tuple[int, npt.NDArray[np.float32]]:
    """The draft's step: (token, [vocab] float32 distribution it was drawn from)."""

def process_logits(
    logits: npt.NDArray[np.float32],
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    prompt_tokens: _Tokens | None = None,
    output_tokens: _Tokens | None = None,
) -> npt.NDArray[np.float32]:
    """The processed [vocab] float32 distribution of a row."""

def log_softmax_at(logits: npt.NDArray[np.float32], token: int) -> float:
    """log softmax(logits)[token] of a raw row."""

# ---------------------------------------------------------------------------------------------------------------
# verify.rs
# ---------------------------------------------------------------------------------------------------------------

MAX_DRAFT_TOKENS: int

@final
class Verification:
    """The result of one verification round. Output tokens = accepted + one recovered or bonus token."""

    @property
    def n_draft(self) -> int:
        """Number of draft tokens proposed (k)."""
    @property
    def n_accepted(self) -> int:
        """Number of draft tokens accepted, 0..=k."""
    @property
    def tokens(self) -> list[int]:
        """Emitted token ids (``n_accepted + 1``): accepted drafts, then the recovered or bonus token."""
    @property
    def last(self) -> Literal["recovered", "bonus"]:
        """What the last token is."""
    @property
    def accept_probs(self) -> list[float]:
        """Acceptance probabilities ``min(1, p/q)`` of the evaluated draft positions."""

def verify(
    target_logits: npt.NDArray[np.float32],
    draft_probs: npt.NDArray[np.float32] | None,
    draft_tokens: _Tokens,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    prompt_tokens: _Tokens | None = None,
    output_tokens: _Tokens | None = None,
    seed: int | None = None,
    rng: Rng | None = None,
    mode: Literal["stochastic", "greedy", "deterministic"] = "stochastic",
) -> Verification:
    """One verification round: target_logits [k + 1, vocab] float32, draft_probs [k, vocab] float32."""

# ---------------------------------------------------------------------------------------------------------------
# cost.rs
# ---------------------------------------------------------------------------------------------------------------

@final
class OptimalK:
    """The best K and its speedup (K = 0 means "don't speculate")."""

    @property
    def k(self) -> int:
        """Best number of draft tokens."""
    @property
    def speedup(self) -> float:
        """Its speedup over target-only decoding."""

@final
class DraftComparison:
    """Speedups of two drafts at the same K."""

    @property
    def speedup_a(self) -> float:
        """Speedup with draft A."""
    @property
    def speedup_b(self) -> float:
        """Speedup with draft B."""
    @property
    def b_wins(self) -> bool:
        """True when B is strictly faster."""

def runtime_info(ort_library: str | os.PathLike[str]) -> dict[str, Any]: ...
def find_ort_library(package: str | os.PathLike[str] | None, install: str) -> pathlib.Path:
    """libonnxruntime.so.1.x by Rust's one search (specrt_ort::discover::find_ort_library_in_package)."""

def acceptance_prob(p: float, q: float) -> float: ...
def expected_tokens(a: float, k: int) -> float: ...
def cycle_cost(k: int, c_q: float, c_p: float, c_verify: float | None = None) -> float: ...
def speedup(a: float, k: int, c_q: float, c_p: float, c_verify: float | None = None) -> float: ...
def optimal_k(
    a: float,
    c_q: float,
    c_p: float,
    *,
    k_max: int = 64,
    c_verify: Callable[[int], float] | Sequence[float] | None = None,
) -> OptimalK: ...
def compare_drafts(
    a_a: float, c_q_a: float, a_b: float, c_q_b: float, *, k: int, c_p: float, c_verify: float | None = None
) -> DraftComparison: ...
def alpha_from_tokens_per_round(tokens_per_round: float, k: int) -> float: ...

# ---------------------------------------------------------------------------------------------------------------
# coupled.rs
# ---------------------------------------------------------------------------------------------------------------

def coupled_uniforms(seed: int, position: int, vocab: int) -> npt.NDArray[np.float64]:
    """``[vocab] float64`` coupled noise ``u_{position, i}`` in (0, 1] of ``seed`` for token ids ``0 .. vocab``."""

def coupled_choice(weights: npt.NDArray[np.float32], seed: int, position: int) -> int:
    """The coupled choice ``argmin_i -ln(u_i) / w_i`` from ``[vocab] float32`` non-negative weights."""

# ----- models (rust/specrt-py/src/ort_model.rs) ---------------------------------------------------------------------

@final
class OrtModel:
    """One ONNX decoder in one ONNX Runtime session with its KV cache (shared-buffer or Optimum layout)."""

    def __new__(
        cls,
        path: str | os.PathLike[str],
        *,
        ort_library: str | os.PathLike[str] | None = None,
        provider: str = "cpu",
        device_id: int = 0,
        max_seq_len: int | None = None,
        intra_op_threads: int | None = None,
        allow_fallback: bool = False,
        layout: str | None = None,
        profile: str | os.PathLike[str] | None = None,
        device_argmax: bool | None = None,
        cuda_graph: bool = False,
        cpu_graph_steps: bool = False,
    ) -> OrtModel: ...
    def forward(
        self, tokens: npt.NDArray[np.integer] | Sequence[int], n_past: int, n_logits: int = 1
    ) -> npt.NDArray[np.float32]:
        """Logits ``[n_logits, vocab_size] float32`` of the last positions after running ``tokens`` on ``n_past``."""
    def forward_argmax(
        self, tokens: npt.NDArray[np.integer] | Sequence[int], n_past: int, n_logits: int = 1
    ) -> list[int]:
        """``[n_logits]`` greedy token ids (first maximum of each row) of the last positions, as :meth:`forward`."""
    def end_profiling(self) -> pathlib.Path:
        """End ONNX Runtime's profiling (the model was created with ``profile``); the trace file's path."""
    @property
    def vocab_size(self) -> int: ...
    @property
    def max_seq_len(self) -> int: ...
    @property
    def layout(self) -> str: ...
    @property
    def providers(self) -> list[str]: ...
    @property
    def fallback_reason(self) -> str | None: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def kv_dtype(self) -> str: ...
    @property
    def n_cached(self) -> int: ...
    @property
    def model_path(self) -> pathlib.Path: ...
    def kv_buffer_addresses(self) -> list[int]: ...
    @property
    def graph_copies(self) -> str | None: ...
    def logits_address(self) -> int: ...
    @property
    def memory_plan(self) -> dict[str, str]: ...
    @staticmethod
    def planned_memory(provider: str) -> dict[str, str]: ...
    @staticmethod
    def check_cuda(ort_library: str | os.PathLike[str], device_id: int = 0) -> None: ...

# ----- the request (rust/specrt-py/src/request_config.rs, prepared.rs) ------------------------------------------------

@final
class RequestConfig:
    """The settings of one generation request (low level; Driver.prepare resolves a dict)."""

    def __new__(
        cls,
        *,
        max_new_tokens: int,
        num_speculative_tokens: int = 4,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        seed: int = 0,
        eos_token_ids: Sequence[int] = (),
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        auto_k: bool = False,
        pinned_c_draft: float | None = None,
        pinned_c_verify: Sequence[float] | None = None,
        prompt_lookup_min: int | None = None,
        prompt_lookup_max: int | None = None,
        use_draft_model: bool = True,
        coupled: bool = False,
        logprobs: bool = True,
        top_logprobs: int = 0,
        prompt_logprobs: int | None = None,
        min_tokens: int = 0,
        _fault: str | None = None,
    ) -> RequestConfig: ...
    @property
    def max_new_tokens(self) -> int: ...
    @property
    def prompt_logprobs(self) -> int | None: ...
    @property
    def constraint_kind(self) -> str | None: ...
    @property
    def sampling(self) -> dict[str, float | int]: ...

@final
class PreparedRequest:
    """A request resolved and checked once (Driver.prepare), queued as it is (Driver.submit)."""

    @property
    def prompt_ids(self) -> list[int]: ...
    @property
    def config(self) -> RequestConfig: ...
    @property
    def stop(self) -> list[str]: ...
    @property
    def scored(self) -> bool: ...

# ----- the one request resolver (rust/specrt-py/src/request_config.rs -> specrt_ort::resolve_request) -----------------

DEFAULT_MAX_SEQ_LEN: int
DEFAULT_MAX_PREFILL_TOKENS: int
DEFAULT_PREFIX_CACHING: bool
DEFAULT_PREFIX_CACHE_BYTES: int
#: Most top_logprobs (and prompt_logprobs) alternatives per position (specrt_core::MAX_TOP_LOGPROBS).
MAX_TOP_LOGPROBS: int
#: Largest K that num_speculative_tokens "auto" picks (specrt_ort::AUTO_K_MAX).
AUTO_K_MAX: int
#: Largest max_batch of a batched decoder (specrt_ort::MAX_BATCH).
MAX_BATCH: int
#: The proposer names a request accepts (specrt_ort::Proposer::ALL).
PROPOSERS: list[str]

@final
class FolderDefaults:
    """A model folder's generation defaults (generation_config.json; specrt_config.json for the EOS ids)."""

    def __new__(cls, path: str | os.PathLike[str]) -> FolderDefaults: ...
    def sampling(self) -> dict[str, float | int]: ...
    @property
    def eos_token_ids(self) -> list[int]: ...

def request_defaults() -> dict[str, Any]:
    """Decoder.stream()'s request-setting defaults (Rust's GenerationRequest::default())."""

def resolve_request(
    settings: dict[str, Any],
    *,
    has_draft: bool,
    defaults: FolderDefaults | None = None,
    vocab_size: int | None = None,
    prompt_ids: Sequence[int] | None = None,
    max_seq_len: int | None = None,
    eos_token_ids: Sequence[int] | None = None,
) -> tuple[RequestConfig, list[str], list[int] | None]:
    """Decoder.stream()'s settings -> (RequestConfig, stop strings, checked prompt ids or None)."""

def check_decoder_options(
    *,
    provider: Any,
    device_id: Any,
    max_seq_len: Any,
    intra_op_threads: Any,
    allow_fallback: Any,
    cuda_graph: Any,
    max_batch: Any,
    prefill_chunk: Any,
    prefix_caching: Any = None,
    max_prefill_tokens: Any = None,
    suffix_cache_tokens: Any = None,
) -> str:
    """Check a Decoder's own options (``specrt_ort::DecoderOptions``); returns ``"gqa"``, ``"gqa-graph"`` or
    ``"batched"``. Raises ConfigError naming a bad option."""

def check_token_ids(name: str, ids: Sequence[int], vocab_size: int) -> list[int]:
    """Token ids as ints, each 0 <= id < vocab_size (VocabError / TypeError otherwise)."""

@final
class Driver:
    """The driver every generation runs through (``specrt_ort::Driver``): the batched engine (folders in the
    batched layout) or the single-stream one (one request at a time); ``batched`` None (default) takes the layout the
    folders were converted for (``Driver::open``; ConfigError when target and draft differ, or max_batch > 1
    without the batched layout). Requests are resolved at ``submit``; streamed text and stop strings are Rust's;
    ``specrt.Decoder`` / ``specrt.Scheduler`` drive it."""

    def __new__(
        cls,
        target: str | os.PathLike[str],
        draft: str | os.PathLike[str] | None = None,
        *,
        ort_library: str | os.PathLike[str],
        batched: bool | None = None,
        max_batch: int = 4,
        max_seq_len: int | None = None,
        intra_op_threads: int | None = None,
        prefill_chunk: int = 256,
        provider: str = "cpu",
        device_id: int = 0,
        allow_fallback: bool = False,
        cuda_graph: bool = False,
        prefix_caching: bool | None = None,
        prefix_cache_bytes: int | None = None,
        max_prefill_tokens: int | None = None,
        profile: str | os.PathLike[str] | None = None,
        suffix_cache_tokens: int = 0,
    ) -> Driver: ...
    def prepare(self, prompt: Sequence[int], settings: dict[str, Any]) -> PreparedRequest: ...
    def submit(self, request: PreparedRequest) -> int: ...
    def step(self) -> list[dict[str, Any]]:
        """One round: per request ``{"id", "text", "tokens", "sources", "logprobs", "top_logprobs", "n_drafted",
        "finish_reason", "prompt", "done", "error"}``."""
    def cancel(self, id: int) -> bool: ...
    def stats(self, id: int) -> dict[str, Any] | None: ...
    def last_stats(self) -> dict[str, Any] | None: ...
    @property
    def is_idle(self) -> bool: ...
    @property
    def n_running(self) -> int: ...
    @property
    def n_waiting(self) -> int: ...
    @property
    def prefix_cache_usage(self) -> tuple[int, int]: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def has_draft(self) -> bool: ...
    @property
    def draft_vocabulary_json(self) -> str | None: ...
    @property
    def batched(self) -> bool: ...
    @property
    def tokenizer(self) -> Tokenizer | None: ...
    @property
    def chat_template_source(self) -> str | None: ...
    @property
    def defaults(self) -> FolderDefaults: ...
    @property
    def max_seq_len(self) -> int: ...
    @property
    def max_batch(self) -> int: ...
    @property
    def providers(self) -> list[str]: ...
    @property
    def eos_token_ids(self) -> list[int]: ...
    @eos_token_ids.setter
    def eos_token_ids(self, value: list[int]) -> None: ...

@final
class ConstraintMasks:
    """A constrained request's masks, position by position (the engine's mask and EOS rule)."""

    def __new__(cls, target: str | os.PathLike[str], config: RequestConfig, vocab_size: int) -> ConstraintMasks: ...
    def masks(self, output_ids: Sequence[int]) -> npt.NDArray[np.bool_]:
        """``[n, vocab] bool``: row t = the tokens allowed after ``output_ids[:t]``."""
    @property
    def kind(self) -> str: ...

# ----- text in, text out (rust/specrt-py/src/text.rs) -------------------------------------------------------------

@final
class Encoding:
    """The ids of one encoded text."""

    @property
    def ids(self) -> list[int]:
        """Token ids, each ``0 <= id < vocab size``."""
    def __len__(self) -> int: ...

@final
class Tokenizer:
    """A ``tokenizer.json`` through the Rust ``tokenizers`` crate (the Python package's version: identical ids and
    text). Safe to share between threads; encode / decode release the GIL."""

    @staticmethod
    def from_file(path: str | os.PathLike[str]) -> Tokenizer:
        """Load a ``tokenizer.json``.

        Raises:
            ModelFileNotFoundError: the file does not exist (also a ``FileNotFoundError``).
            ModelFileError: it cannot be read or parsed (the path named).
        """
    @staticmethod
    def from_str(json: str) -> Tokenizer:
        """Parse the text of a ``tokenizer.json``. Raises ModelFileError when it cannot be parsed."""
    def encode(self, text: str, add_special_tokens: bool = True) -> Encoding:
        """Token ids of ``text`` (``add_special_tokens``: the post-processor's BOS / EOS; special tokens written in
        the text are recognised either way)."""
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (ids outside the vocabulary are left out; an incomplete UTF-8 sequence decodes to
        U+FFFD). Raises OverflowError for an id < 0 or >= 2**32."""
    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        """Number of ids (with the added tokens: the logits width)."""
    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        """Token string -> id."""
    def id_to_token(self, id: int) -> str | None:
        """The token string of ``id`` (e.g. ``"Ġhello"``), or None outside the vocabulary."""
    def token_to_id(self, token: str) -> int | None:
        """The id of ``token``, or None."""
    @property
    def special_ids(self) -> list[int]:
        """Ids of the added tokens marked special, ascending (what ``skip_special_tokens`` leaves out)."""
    @property
    def decoder_type(self) -> str | None:
        """The ``decoder.type`` of the ``tokenizer.json`` (``"ByteLevel"``, ``"Metaspace"``, ...), or None."""

@final
class TextDelta:
    """What one round adds to the text."""

    @property
    def text(self) -> str:
        """Text to emit now."""
    @property
    def n_keep(self) -> int | None:
        """With a stop string found this round: the tokens to keep (pass to the engine's ``stop_at``); else None."""
    @property
    def stop_index(self) -> int | None:
        """With a stop string found this round: its index in the stops given; else None."""
    @property
    def finished(self) -> bool:
        """Whether the text is complete (feed no more)."""

@final
class TextAssembler:
    """One request's streaming text: each round's committed ids in, the text to emit out. The text is the whole
    generated sequence decoded (incrementally for byte-level tokenizers, whole otherwise); a stop string cuts it
    (it may end mid-token and span tokens); an incomplete UTF-8 sequence and a partial stop string are held back
    until the next round, and flushed when generation finishes. Which text: vLLM's ``skip_special_tokens`` and
    ``include_stop_str_in_output`` (the one definition, Rust ``specrt_text::detok::TextOptions``)."""

    def __new__(
        cls,
        tokenizer: Tokenizer,
        stops: Sequence[str],
        *,
        skip_special_tokens: bool = True,
        include_stop_str_in_output: bool = False,
    ) -> TextAssembler:
        """Raises ConfigError for an empty stop string. Stops are matched in the text without special tokens
        whatever ``skip_special_tokens`` says (where the engine stops). ``skip_special_tokens`` False: the text
        keeps special tokens' text and is cut before the first stop string occurring in it.
        ``include_stop_str_in_output``: keep the stop string that ended generation, or the text of the EOS /
        stop-token-id token that ended it (both left out otherwise)."""
    def feed(
        self, tokens: Sequence[int], finish_reason: Literal["eos", "stop", "length", "grammar"] | None
    ) -> TextDelta:
        """Add one round's committed ids (``finish_reason``: the engine's for the round). After a stop string the
        assembler's tokens are cut to ``n_keep``; the caller cuts the engine's with ``stop_at(n_keep)``.

        Raises:
            ConfigError: called after the text finished, or an unknown ``finish_reason``.
            OverflowError: an id < 0 or >= 2**32.
        """
    @property
    def text(self) -> str:
        """The text so far (once finished: the whole text, cut at the stop string)."""
    @property
    def tokens(self) -> list[int]:
        """The ids fed so far, cut to ``n_keep`` after a stop string."""
    @property
    def finished(self) -> bool: ...
    @property
    def incremental(self) -> bool:
        """True for byte-level tokenizers (text appended round by round), False when decoded whole each round."""

# ----- chat templates (rust/specrt-py/src/chat.rs) ----------------------------------------------------------------

@final
class ChatTemplate:
    """A chat template rendered exactly as Hugging Face transformers' ``apply_chat_template(..., tokenize=False)``
    renders it (minijinja in Rust, ``rust/specrt-text/src/chat.rs``): trim/lstrip blocks, loop controls,
    ``raise_exception``, ``strftime_now``, transformers' ``tojson``, Python's str/dict/list methods and
    ``{% generation %}``.

    Args:
        source: the Jinja template.
        special_tokens: name -> string passed to every rendering as transformers passes ``special_tokens_map``
            (e.g. ``{"bos_token": "<s>", "eos_token": "</s>"}``); None: none.
        now: the datetime ``strftime_now`` formats; None: the current time (UTC) at each rendering.

    Raises:
        ConfigError: minijinja cannot compile the template (the message names the construct and the line), a
            special token is not a string, or ``now`` is not a datetime.
    """

    def __new__(
        cls, source: str, special_tokens: dict[str, str] | None = None, *, now: datetime.datetime | None = None
    ) -> ChatTemplate: ...
    @staticmethod
    def from_folder(path: str | os.PathLike[str], *, now: datetime.datetime | None = None) -> ChatTemplate:
        """The template of a folder written by ``specrt convert``: ``chat_template.jinja`` with the special tokens of
        ``tokenizer_config.json`` (else ``specrt_config.json``'s ids named through ``tokenizer.json``).

        Raises:
            ModelFileNotFoundError: the folder has no chat template.
            ModelFileError: a file is unreadable or malformed.
            ConfigError: as the constructor.
        """
    @property
    def source(self) -> str:
        """The template's source text."""
    @property
    def special_tokens(self) -> dict[str, str]:
        """The special-token strings passed to every rendering (name -> string)."""
    def render(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = False,
        tools: Sequence[dict[str, Any]] | None = None,
        documents: Sequence[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render as transformers' ``apply_chat_template(messages, tools=tools, documents=documents,
        add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs)``: ``None``-valued message keys are
        dropped, reasoning is aliased (``thinking`` / ``reasoning_content``), ``kwargs`` override special tokens.

        Raises:
            ConfigError: a value that is not JSON-like, the template's ``raise_exception(message)``
                (``chat template failed: <message>``), or a construct the renderer lacks (named, with its line).
        """

# ----- the GGUF-block kernel and one-file sessions (rust/specrt-py/src/quant.rs) ----------------------------------

GGUF_MATMUL_TYPES: dict[str, int]
"""The ggml types the ``ai.specrt::GgufMatMul`` kernel runs, name -> ggml's type id (``{"Q4_0": 2, ...}``)."""

OPERATOR_DOMAIN: str
"""The ONNX operator domain of specrt's own operators (``"ai.specrt"``)."""

def gguf_matmul(
    x: npt.NDArray[np.float32],
    blocks: npt.NDArray[np.uint8],
    ggml_type: int,
    *,
    path: str | None = None,
    threads: int = 1,
) -> npt.NDArray[np.float32]:
    """``x @ dequantize(blocks).T`` with the ``GgufMatMul`` kernel: ``x`` ``[M, K]`` float32 (quantized to int8 per
    block of 32, or per super-block of 256 for Q4_K / Q5_K / Q6_K), ``blocks`` ``[N, row_bytes]`` uint8 (the GGUF
    tensor's bytes), ``path`` ``"portable"`` / ``"avx2"`` / ``"avx512vnni"`` or None (the fastest); returns
    ``[M, N]`` float32, the same whatever ``threads``.

    Raises:
        ConfigError: an unsupported ``ggml_type`` or ``path``, or a path this CPU cannot run.
        ShapeError: ``blocks``' row width does not match ``K``, or ``K`` is not a multiple of the block length.
    """

def gguf_dequantize(blocks: npt.NDArray[np.uint8], ggml_type: int, k: int) -> npt.NDArray[np.float32]:
    """Dequantize ``[N, row_bytes]`` uint8 GGUF blocks to ``[N, k]`` float32 (``GgufGather``'s rows).

    Raises:
        ConfigError: an unsupported ``ggml_type``, or ``k`` not a multiple of its block length.
        ShapeError: ``blocks``' row width does not match ``k``.
    """

def gguf_kernel_paths() -> list[str]:
    """The kernel paths this CPU runs, fastest last (``["portable", "avx2", "avx512vnni"]`` on AVX-512 VNNI)."""

@final
class GraphSession:
    """A CPU session of one ONNX file on specrt's ONNX Runtime with the ``ai.specrt`` operators registered (float32
    inputs and outputs only; for benches and tests)."""

    def __new__(
        cls,
        model: str | os.PathLike[str],
        ort_library: str | os.PathLike[str],
        intra_op_threads: int | None = None,
    ) -> GraphSession:
        """Open ``model`` with the ONNX Runtime library ``ort_library`` on ``intra_op_threads`` threads (None: the
        physical cores).

        Raises:
            ModelFileNotFoundError / SpecrtError: the file or library cannot be loaded.
        """
    def run(self, inputs: dict[str, npt.NDArray[np.float32]]) -> dict[str, npt.NDArray[np.float32]]:
        """Run with float32 inputs ``{name: array}``; returns every output ``{name: float32 array}``.

        Raises:
            ShapeError: an input that is not a float32 array.
            BackendError: ONNX Runtime's error (an unknown input, a failing kernel).
        """
