"""What a generation returns: :class:`Stats`, :class:`GenerationResult` and :class:`StreamChunk`, built from the
events of the Rust driver (``specrt._specrt.Driver``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["GenerationResult", "Stats", "StreamChunk"]

_SOURCES = ("accepted", "recovered", "bonus")


@dataclass(frozen=True)
class Stats:
    """Statistics of one generation (vLLM's definitions: emitted = accepted + recovered + bonus).

    Attributes:
        n_prompt_tokens: prompt length in tokens.
        n_rounds: verification rounds (target passes after prefill).
        n_drafted: draft tokens proposed and verified.
        n_accepted: emitted draft tokens the target accepted.
        n_recovered: emitted tokens sampled from the residual norm(max(0, p - q)) after a rejection.
        n_bonus: emitted tokens from the target's last row after all drafts were accepted (K = 0 steps included).
        acceptance_rate: accepted / drafted in [0, 1] (None if nothing was drafted).
        mean_tokens_per_round: emitted / rounds (the seed's E).
        prefill_ms, draft_ms, target_ms, core_ms: wall time in ms (core = verification and bookkeeping).
        draft_ms_per_round, target_ms_per_round: per-round means in ms.
        decode_tokens_per_s: emitted tokens per second after prefill; tokens_per_s: including prefill.
        accepted_at: rounds in which draft position i was accepted.
        n_drafted_ngram, n_accepted_ngram: of n_drafted / n_accepted, the prompt-lookup (n-gram) proposals.
        rounds_by_k: rounds_by_k[k] = rounds that verified k draft tokens (how often each K was chosen).
        n_cached_tokens: of n_prompt_tokens, those whose target KV was reused from an earlier generation instead of
            prefilled (prefix caching; OpenAI's ``usage.prompt_tokens_details.cached_tokens``); 0 = a miss.
        n_cached_tokens_dft: the same for the draft model (0 when the request does not run it).
        n_drafted_forced, n_accepted_forced: of n_drafted / n_accepted, the tokens an output constraint forced
            (structured output: proposed without a draft pass, verified as any proposal).
        mask_ms: wall time in ms spent in the output constraint (masks, forced tokens, advancing); 0 without one.
    """

    n_prompt_tokens: int
    n_rounds: int
    n_drafted: int
    n_accepted: int
    n_recovered: int
    n_bonus: int
    acceptance_rate: float | None
    mean_tokens_per_round: float | None
    prefill_ms: float
    draft_ms: float
    target_ms: float
    core_ms: float
    draft_ms_per_round: float
    target_ms_per_round: float
    decode_tokens_per_s: float | None
    tokens_per_s: float | None
    accepted_at: tuple[int, ...] = ()
    n_drafted_ngram: int = 0
    n_accepted_ngram: int = 0
    rounds_by_k: tuple[int, ...] = ()
    n_cached_tokens: int = 0
    n_cached_tokens_dft: int = 0
    n_drafted_forced: int = 0
    n_accepted_forced: int = 0
    mask_ms: float = 0.0

    @property
    def prefix_cache_hit(self) -> bool:
        """Whether the target reused a cached prefix of the prompt."""
        return self.n_cached_tokens > 0

    @property
    def n_emitted(self) -> int:
        """accepted + recovered + bonus."""
        return self.n_accepted + self.n_recovered + self.n_bonus

    @classmethod
    def _from_engine(cls, d: dict[str, Any]) -> Stats:
        rounds = max(int(d["n_rounds"]), 1)
        return cls(
            n_prompt_tokens=d["n_prompt_tokens"],
            n_rounds=d["n_rounds"],
            n_drafted=d["n_drafted"],
            n_accepted=d["n_accepted"],
            n_recovered=d["n_recovered"],
            n_bonus=d["n_bonus"],
            acceptance_rate=d["acceptance_rate"],
            mean_tokens_per_round=d["mean_tokens_per_round"],
            prefill_ms=d["prefill_ms"],
            draft_ms=d["draft_ms"],
            target_ms=d["target_ms"],
            core_ms=d["core_ms"],
            draft_ms_per_round=d["draft_ms"] / rounds,
            target_ms_per_round=d["target_ms"] / rounds,
            decode_tokens_per_s=d["decode_tokens_per_s"],
            tokens_per_s=d["tokens_per_s"],
            accepted_at=tuple(d["accepted_at"]),
            n_drafted_ngram=d["n_drafted_ngram"],
            n_accepted_ngram=d["n_accepted_ngram"],
            rounds_by_k=tuple(d["rounds_by_k"]),
            n_cached_tokens=d["n_cached_tokens"],
            n_cached_tokens_dft=d["n_cached_tokens_dft"],
            n_drafted_forced=d["n_drafted_forced"],
            n_accepted_forced=d["n_accepted_forced"],
            mask_ms=d["mask_ms"],
        )

    def as_dict(self) -> dict[str, Any]:
        """All fields plus ``n_emitted``, JSON-ready."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["accepted_at"] = list(self.accepted_at)
        out["rounds_by_k"] = list(self.rounds_by_k)
        out["n_emitted"] = self.n_emitted
        return out


@dataclass(frozen=True)
class GenerationResult:
    """What :meth:`Decoder.generate` returns.

    Attributes:
        text: the generated text as vLLM's defaults define it (Rust ``TextOptions``): special tokens skipped; ends
            before a matched stop string; the text of the EOS or stop token id that ended generation left out.
        token_ids: the emitted token ids (an EOS or stop token id that ended generation included).
        finish_reason: ``"eos"``, ``"stop"`` (stop string or stop token id), ``"length"`` or ``"grammar"`` (the
            output constraint is complete).
        logprobs: the target's log-probability (natural log, raw logits) of each emitted token; empty when the
            request passed ``logprobs=False``.
        top_logprobs: per emitted token, the request's ``top_logprobs`` most likely tokens of the target's
            verification row of its position as ``(token id, log-probability)``, most likely first (the first is the
            greedy choice); empty when the request asked for none.
        prompt_logprobs: with ``prompt_logprobs=k``, one entry per prompt token: ``None`` for the first (no
            position before it), then the target's log-probability of each from the prefill pass (the row of the
            position before it); empty otherwise. ``prompt_top_logprobs``: each position's ``k`` alternatives
            (``[]`` for the first).
        sources: ``"accepted"``, ``"recovered"`` or ``"bonus"`` for each emitted token.
        stats: counters and timings.
        prompt_token_ids: the prompt as the models saw it.
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    logprobs: list[float]
    sources: list[str]
    stats: Stats
    prompt_token_ids: list[int] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    prompt_logprobs: list[float | None] = field(default_factory=list)
    prompt_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)


@dataclass(frozen=True)
class StreamChunk:
    """One piece of a streamed generation: the text and tokens committed by one round.

    ``text`` holds back incomplete UTF-8 and a possible partial stop string until they resolve. ``logprobs`` are the
    target's log-probabilities of ``token_ids`` (as :attr:`GenerationResult.logprobs`). The chunk of the last round
    already carries ``finish_reason``; the last chunk (no tokens) has ``finish_reason`` and ``result`` set. With
    ``prompt_logprobs``, the first chunk carries the prompt's scores too (``prompt_token_ids``, ``prompt_logprobs``,
    ``prompt_top_logprobs``, as :class:`GenerationResult` has them; None on the other chunks).
    """

    text: str
    token_ids: list[int]
    sources: list[str]
    finish_reason: str | None = None
    result: GenerationResult | None = None
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]]] | None = None
    prompt_token_ids: list[int] | None = None


def _prompt_lists(prompt: dict[str, Any] | None) -> tuple[list[float | None], list[list[tuple[int, float]]]]:
    """The engine's prompt scores as :class:`GenerationResult` holds them (first position: None / no alternatives)."""
    if prompt is None:
        return [], []
    return [None, *prompt["logprobs"]], [[], *prompt["top_logprobs"]]


def _prompt_fields(ids: list[int], prompt: dict[str, Any] | None) -> dict[str, Any]:
    """The prompt's scores as the first :class:`StreamChunk` carries them."""
    lps, tops = _prompt_lists(prompt)
    return {"prompt_logprobs": lps, "prompt_top_logprobs": tops, "prompt_token_ids": list(ids)}


def _result_chunk(out: dict[str, Any], ids: list[int], scored: bool) -> StreamChunk:
    """The last chunk of a generation, carrying its :class:`GenerationResult`, from its whole output ``out`` (the keys
    of ``Driver``'s ``done``: text, tokens, finish_reason, logprobs, sources, top_logprobs, stats, prompt)."""
    prompt_logprobs, prompt_top = _prompt_lists(out["prompt"]) if scored else ([], [])
    result = GenerationResult(
        text=out["text"],
        token_ids=out["tokens"],
        finish_reason=out["finish_reason"],
        logprobs=out["logprobs"],
        sources=out["sources"],
        stats=Stats._from_engine(out["stats"]),
        prompt_token_ids=ids,
        top_logprobs=out["top_logprobs"],
        prompt_logprobs=prompt_logprobs,
        prompt_top_logprobs=prompt_top,
    )
    return StreamChunk(text="", token_ids=[], sources=[], finish_reason=out["finish_reason"], result=result)


class EventChunks:
    """One request's events (``Driver.step``'s dicts) -> :class:`StreamChunk` s. Its text, stop-string
    cut and finish are Rust's (``specrt_ort::Driver``); this only builds the Python objects."""

    def __init__(self, ids: list[int], scored: bool) -> None:
        self.ids = ids
        self.scored = scored  # the request asked for prompt_logprobs
        self.done = False

    def chunks(self, e: dict[str, Any]) -> list[StreamChunk]:
        """The chunks of one event: the round's, then (on the last event) the one carrying the result."""
        scores = _prompt_fields(self.ids, e["prompt"]) if e["prompt"] is not None else {}
        out = [
            StreamChunk(
                text=e["text"],
                token_ids=e["tokens"],
                sources=e["sources"],
                finish_reason=e["finish_reason"],
                logprobs=e["logprobs"],
                top_logprobs=e["top_logprobs"],
                **scores,
            )
        ]
        if e["done"] is not None:
            self.done = True
            out.append(_result_chunk(e["done"], self.ids, self.scored))
        return out
