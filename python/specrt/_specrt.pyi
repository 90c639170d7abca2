"""Type stubs for the Rust extension ``specrt._specrt`` (hand-written; sections per binding file)."""

import datetime
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__version__: str

# ---------------------------------------------------------------------------------------------------------------
# errors.rs
# ---------------------------------------------------------------------------------------------------------------

class SpecrtError(Exception): ...
class ConfigError(SpecrtError, ValueError): ...
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

# ---------------------------------------------------------------------------------------------------------------
# sampling.rs
# ---------------------------------------------------------------------------------------------------------------

_Tokens = npt.NDArray[np.integer] | Sequence[int]

class Rng:
    """Seeded PCG64 stream, twin of numpy's PCG64. Advanced in place when passed as ``rng=``."""

    def __init__(self, seed: int) -> None: ...
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

class Verification:
    n_draft: int
    n_accepted: int
    tokens: list[int]
    last: Literal["recovered", "bonus"]
    accept_probs: list[float]

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

class OptimalK:
    k: int
    speedup: float

class DraftComparison:
    speedup_a: float
    speedup_b: float
    b_wins: bool

def runtime_info(ort_library: str | os.PathLike[str]) -> dict[str, Any]: ...
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

# ----- models (rust/specrt-py/src/backend.rs) ---------------------------------------------------------------------

class OrtModel:
    """One ONNX decoder in one ONNX Runtime session with its KV cache (shared-buffer or Optimum layout)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ort_library: str | os.PathLike[str] | None = None,
        provider: str = "cpu",
        device_id: int = 0,
        max_seq_len: int | None = None,
        intra_op_threads: int | None = None,
        allow_fallback: bool = False,
        layout: str | None = None,
    ) -> None: ...
    def forward(
        self, tokens: npt.NDArray[np.integer] | Sequence[int], n_past: int, n_logits: int = 1
    ) -> npt.NDArray[np.float32]:
        """Logits ``[n_logits, vocab_size] float32`` of the last positions after running ``tokens`` on ``n_past``."""
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
    def model_path(self) -> str: ...
    def kv_buffer_addresses(self) -> list[int]: ...
    def logits_address(self) -> int: ...
    @property
    def memory_plan(self) -> dict[str, str]: ...
    @staticmethod
    def planned_memory(provider: str) -> dict[str, str]: ...
    @staticmethod
    def check_cuda(ort_library: str | os.PathLike[str], device_id: int = 0) -> None: ...

# ----- the decode loop (rust/specrt-py/src/engine.rs) -------------------------------------------------------------

class RequestConfig:
    """The settings of one generation request (shared by Engine.start and BatchEngine.add)."""

    def __init__(
        self,
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
        eos_token_ids: Sequence[int] = ...,
        stop_token_ids: Sequence[int] = ...,
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
    ) -> None: ...
    @property
    def max_new_tokens(self) -> int: ...

class BatchEngine:
    """Batched rounds over target / draft models in the batched layout; driven round by round by specrt.Scheduler."""

    def __init__(
        self,
        target: str | os.PathLike[str],
        draft: str | os.PathLike[str] | None = None,
        *,
        ort_library: str | os.PathLike[str],
        max_batch: int = 4,
        max_seq_len: int | None = None,
        intra_op_threads: int | None = None,
        prefill_chunk: int = 256,
        provider: str = "cpu",
        allow_fallback: bool = False,
    ) -> None: ...
    def add(self, id: int, prompt: Sequence[int], config: RequestConfig) -> None: ...
    def step(self) -> list[dict[str, Any]]:
        """One round: per row ``{"id", "tokens", "sources", "logprobs", "n_drafted", "finish_reason", "error"}``."""
    def cancel(self, id: int) -> bool: ...
    def stop_at(self, id: int, n_keep: int) -> None: ...
    def stats(self, id: int) -> dict[str, Any] | None: ...
    def prompt_logprobs(self, id: int) -> dict[str, Any] | None: ...
    @property
    def n_running(self) -> int: ...
    @property
    def n_waiting(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def has_draft(self) -> bool: ...
    @property
    def max_seq_len(self) -> int: ...
    @property
    def max_batch(self) -> int: ...

class Engine:
    """The draft/verify loop over a target and an optional draft model; driven round by round by specrt.Decoder."""

    def __init__(
        self,
        target: str | os.PathLike[str],
        draft: str | os.PathLike[str] | None = None,
        *,
        ort_library: str | os.PathLike[str],
        provider: str = "cpu",
        device_id: int = 0,
        max_seq_len: int | None = None,
        intra_op_threads: int | None = None,
        allow_fallback: bool = False,
    ) -> None: ...
    def start(self, prompt: Sequence[int], config: RequestConfig) -> None: ...
    def step(self) -> dict[str, Any]:
        """One round: ``{"tokens", "sources", "logprobs", "n_drafted", "finish_reason"}``."""
    def stop_at(self, n_keep: int) -> None: ...
    def stats(self) -> dict[str, Any] | None: ...
    def prompt_logprobs(self) -> dict[str, Any] | None: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def has_draft(self) -> bool: ...
    @property
    def max_seq_len(self) -> int: ...
    @property
    def providers(self) -> list[str]: ...

# ----- chat templates (rust/specrt-py/src/chat.rs) ----------------------------------------------------------------

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

    def __init__(
        self, source: str, special_tokens: dict[str, str] | None = None, *, now: datetime.datetime | None = None
    ) -> None: ...
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
