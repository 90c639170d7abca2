"""Spec-Bench as a suite of ``specrt bench`` (``specrt bench --suite spec-bench``; ``BenchConfig(suite="spec-bench")``).

**The dataset.** Spec-Bench's 480 questions (Xia et al., "Unlocking Efficiency in Large Language Model Inference: A
Comprehensive Survey of Speculative Decoding", ACL 2024 Findings; https://github.com/hemingkx/Spec-Bench), shipped in
the package as ``specrt/bench/data/spec_bench/question.jsonl`` (a verbatim copy of the repository's
``data/spec_bench/question.jsonl`` at commit fd2c1cd, Apache-2.0: ``LICENSE`` and ``NOTICE`` beside it). One JSON object
per line: ``{"question_id": int, "category": str, "turns": [str, ...]}`` (some also carry a ``reference``, unused).
13 categories (:data:`CATEGORIES`): MT-bench's 8 (writing .. humanities, ids 81-160) with 10 two-turn questions each,
then translation, summarization, qa, math_reasoning and rag with 80 single-turn questions each.

**Selection** (:func:`select_questions`): each selected category's first ``per_category`` questions in file order
(``None``: all of them), categories in :data:`CATEGORIES` order.

**Prompts.** Every turn goes through the target's chat template (``Decoder.generate(messages=...)``), with no system
message of ours (the template adds its own default, as Qwen2.5's does). MT-bench's second turn is the second user turn
of the same chat: ``[user: turn 1, assistant: A1, user: turn 2]``, where A1 is the **target-only** answer to turn 1
(its text, as :attr:`GenerationResult.text`). Every method sees that same history, so the second turns of all methods
share one prompt and their outputs stay comparable token for token (each method's own first answer would differ from
target-only's wherever the first turn's outputs differ, and then so would every later token).

**Methods** (:data:`METHODS`; ``methods`` / ``--methods`` picks some, target-only always runs: it is the baseline and
its answers are the second-turn history), all on one Decoder (target-only is K = 0 on the speculative Decoder's own
target session, as the bench's default baseline ``"k0"``):

- ``target_only``: ``proposer="none"``, K = 0.
- ``draft``: the draft model, K = ``k`` (``-k``).
- ``ngram``: prompt lookup (``proposer="ngram"``), up to K tokens of a match per round.
- ``ngram+draft``: prompt lookup first, the draft model where nothing matches (``proposer="ngram+draft"``), K = ``k``.
- ``auto_k``: the draft model with ``num_speculative_tokens="auto"`` (K in 0..8 chosen each round by the cost model).
- ``auto``: ``proposer="auto"`` with ``num_speculative_tokens="auto"``: each round the controller chooses a plain
  step, an n-gram match or the draft model, and K (up to 8), from the request's own measured acceptance and costs.
- ``suffix``: suffix decoding over the request's own text (``proposer="suffix"``, no cache shared across questions),
  K = ``k``.

Per question, every method runs turn 1, then every method runs turn 2; the methods' order rotates from question to
question so that machine load and session age fall on all alike. One run per question and method (``repeats`` does not
apply: the questions are the sample). Prefix caching is off: every generation prefills its whole prompt afresh, as a
new request would, so no method reuses KV rows another computed. ``warmup_tokens`` > 0 runs one short generation per
method on the first question before any timed one.

**Sampling.** Greedy by default (``temperature`` 0). At ``temperature`` > 0 every method samples with the same
``seed``; with ``coupled`` (the default) the sampling is coupled (``coupled=True``: the choice at each output position
depends on the seed and the position alone, so speculative and target-only outputs are the same tokens for every K,
draft or n-gram proposer, see ``Decoder.stream``), and the outputs are compared as greedy ones are. Coupled
sampling keeps a draft token only when it equals the target's own choice, so it accepts fewer drafts than
``min(1, p/q)`` acceptance (benches/RESULTS.md, coupled sampling): its speedups are coupled speculation's, not
standard speculative sampling's. With ``coupled=False`` the methods sample with ``min(1, p/q)`` acceptance and a
recovered token drawn from the residual: each output is an exact sample of the target's distribution, but the same
seed gives different tokens with and without speculation, so there is nothing to compare token for token and the
equality column reads ``n/a (sampled)``.

**Figures** (per category and over all selected questions, per method; :func:`summarize`). Time is decode time as
the Rust side reports it: a turn's decode ms = ``n_emitted / Stats.decode_tokens_per_s`` (draft + target + core ms
after prefill; prefill is left out, Python's per-round overhead too).

- ``decode_tokens_per_s``: emitted tokens / decode seconds, summed over the group's turns (a ratio of sums).
- ``speedup``: **the median over the group's questions of the paired per-question speedup** (median, min, max, n),
  where a question's speedup = its decode tokens/s under the method / under target-only, each summed over the
  question's turns, both measured in the same run, minutes apart. The median, not a ratio of sums: one question
  slowed by a burst of machine load moves a ratio of sums, hardly the median. (Spec-Bench's own ``speed.py`` divides
  mean per-question tokens/s, wall time with prefill; the two are not the same figure.)
- ``mean_tokens_per_round``: emitted / rounds summed over the group (``Stats.mean_tokens_per_round`` pooled; the
  tokens a verification round commits, accepted drafts plus one; Spec-Bench's "mean accepted tokens").
- ``acceptance_rate``: accepted / drafted summed over the group (``Stats.acceptance_rate`` pooled; None where nothing
  was drafted).
- ``outputs_equal``: ``{"n_equal", "n", "mismatches"}``: questions whose every turn's token ids equal target-only's
  (greedy, or coupled sampling), out of the group's questions, and for each turn that differs ``{"question_id",
  "turn", "position"}`` with the first differing position (0-based; the shorter length where one output is a prefix
  of the other). None where the outputs are not comparable (sampled without coupling).

Target-only's own row has speedup 1 and no equality figure (it is the reference).

**Peers** (``peers``, optional): every turn's rendered prompt goes to the peers of ``specrt bench --peers`` as a
prompt of its own (id ``q<question_id>-t<turn>``; the second turn with target-only's first answer as history), one
repetition: onnxruntime-genai and Hugging Face get specrt's token ids of the rendered chat, llama.cpp gets the
rendered text (``llama-speculative-simple`` takes no chat turns) and times target-only with ``llama-bench`` at the
prompt's depth. Each peer's speculative mode over its own target-only, per question (turns summed) and then the
category's median, as for specrt (:func:`peer_summary`).

**Time of the default run** (measured on a 2-core AMD EPYC Zen 3, benches/RESULTS.md "Spec-Bench"): one question
per category is 21 turns (8 two-turn, 5 single-turn) at 48 new tokens; with the six methods before ``suffix`` the
fp32 1.5B target with the int4 0.5B draft took 26.7 min (target-only 3.4 decode tok/s; Rust builds ran beside it) and
the gguf pair 12.8 min for specrt's part; the seventh method adds about a seventh. All 480 questions
(560 turns, 160 of them about 800 prompt tokens long): about 8 hours.
"""

from __future__ import annotations

import gc
import importlib.resources
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specrt.bench.config import BenchConfig, config_dict, config_warnings, resolve_config, validate_config
from specrt.bench.stats import _first_divergence, med, spread

#: The suites of ``specrt bench --suite``.
SUITES = ("spec-bench",)

#: Spec-Bench's categories, in file order: MT-bench's eight (two turns each), then the five single-turn subtasks.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
CATEGORIES = (*MT_BENCH_CATEGORIES, "translation", "summarization", "qa", "math_reasoning", "rag")

#: Methods of the suite, in table order (the first is the baseline every other is paired with).
METHODS = ("target_only", "draft", "ngram", "ngram+draft", "auto_k", "auto", "suffix")

#: Questions per category of the default run (``--per-category``; see the module docstring for its time).
DEFAULT_PER_CATEGORY = 1

#: New tokens per turn of the default run (``--max-new-tokens`` with ``--suite``).
DEFAULT_MAX_NEW_TOKENS = 48

#: Where the shipped questions come from (recorded in the report).
SOURCE = {
    "name": "Spec-Bench",
    "repository": "https://github.com/hemingkx/Spec-Bench",
    "commit": "fd2c1cd7d2201ef71db4c5f4e455008f017967bf",
    "path": "data/spec_bench/question.jsonl",
    "sha256": "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04",
    "license": "Apache-2.0",
    "paper": "Xia et al., Unlocking Efficiency in Large Language Model Inference: A Comprehensive Survey of "
    "Speculative Decoding, Findings of ACL 2024 (https://aclanthology.org/2024.findings-acl.456)",
}

#: What the equality column says where sampled outputs are not comparable.
NOT_COMPARED = "n/a (sampled)"


@dataclass(frozen=True)
class Question:
    """One Spec-Bench question: its id, category and user turns (1 or 2)."""

    question_id: int
    category: str
    turns: tuple[str, ...]


def questions_path() -> Path:
    """The question file shipped in the package (``specrt/bench/data/spec_bench/question.jsonl``)."""
    return Path(str(importlib.resources.files("specrt.bench") / "data" / "spec_bench" / "question.jsonl"))


def load_questions(path: str | os.PathLike[str] | None = None) -> list[Question]:
    """Read a Spec-Bench question file (default :func:`questions_path`), in file order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not a question (its line number and what is missing), or an unknown category.
    """
    p = Path(path) if path is not None else questions_path()
    out = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        raw = json.loads(line)
        turns = raw.get("turns")
        if not isinstance(raw.get("question_id"), int) or not isinstance(turns, list) or not turns:
            raise ValueError(f"{p}:{n}: expected a question_id (int) and a non-empty list of turns")
        if raw.get("category") not in CATEGORIES:
            raise ValueError(
                f"{p}:{n}: category {raw.get('category')!r} is unknown (expected one of: {', '.join(CATEGORIES)})"
            )
        out.append(Question(question_id=raw["question_id"], category=raw["category"], turns=tuple(turns)))
    return out


def select_questions(
    questions: Sequence[Question], per_category: int | None, categories: Sequence[str] = ()
) -> list[Question]:
    """Each category's first ``per_category`` questions (None: all), categories in :data:`CATEGORIES` order.

    Args:
        questions: the file's questions, in file order.
        per_category: questions per category (>= 1), or None for all.
        categories: the categories to keep (empty: all 13).

    Raises:
        ValueError: an unknown category or a per_category below 1 (the field and what is allowed named).
    """
    check_selection(per_category, categories)
    keep = [c for c in CATEGORIES if not categories or c in categories]
    out = []
    for cat in keep:
        in_cat = [q for q in questions if q.category == cat]
        out += in_cat if per_category is None else in_cat[:per_category]
    return out


def check_selection(per_category: int | None, categories: Sequence[str]) -> None:
    """Raises ValueError for a ``per_category`` below 1 or an unknown category (naming the field and the valid set)."""
    if per_category is not None and (not isinstance(per_category, int) or per_category < 1):
        raise ValueError(f"per_category {per_category!r} is invalid (expected an integer >= 1, or None / 'all')")
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise ValueError(f"categories {unknown} are unknown (expected some of: {', '.join(CATEGORIES)})")


def check_methods(methods: Sequence[str]) -> None:
    """Raises ValueError for an unknown or repeated method, or none (naming the field and what is allowed)."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods or len(set(methods)) != len(methods):
        raise ValueError(
            f"methods {list(methods)} are invalid (expected distinct names among: {', '.join(METHODS)}; "
            "target_only always runs)"
        )


def run_methods(methods: Sequence[str]) -> list[str]:
    """The methods a run times: target-only first (the baseline), then ``methods`` in :data:`METHODS` order."""
    return [m for m in METHODS if m == "target_only" or m in methods]


def method_settings(method: str, k: int | str) -> dict[str, Any]:
    """The ``Decoder.generate`` settings that make ``method`` (:data:`METHODS`) at K = ``k``."""
    return {
        "target_only": {"proposer": "none", "num_speculative_tokens": 0},
        "draft": {"proposer": "draft", "num_speculative_tokens": k},
        "ngram": {"proposer": "ngram", "num_speculative_tokens": k},
        "ngram+draft": {"proposer": "ngram+draft", "num_speculative_tokens": k},
        "auto_k": {"proposer": "draft", "num_speculative_tokens": "auto"},
        "auto": {"proposer": "auto", "num_speculative_tokens": "auto"},
        "suffix": {"proposer": "suffix", "num_speculative_tokens": k},
    }[method]


def outputs_compared(cfg: BenchConfig) -> bool:
    """Whether the outputs are compared token for token with target-only: greedy, or sampled with coupling."""
    return cfg.temperature == 0 or cfg.coupled


def messages_for(question: Question, turn: int, answers: Sequence[str]) -> list[dict[str, str]]:
    """The chat of ``question``'s turn ``turn`` (0-based): its user turns so far, each earlier one followed by the
    target-only answer to it (``answers[i]``)."""
    out: list[dict[str, str]] = []
    for i in range(turn):
        out += [{"role": "user", "content": question.turns[i]}, {"role": "assistant", "content": answers[i]}]
    return [*out, {"role": "user", "content": question.turns[turn]}]


def _decode_ms(stats: dict[str, Any]) -> float:
    """A turn's decode ms as the Rust side reports it: ``n_emitted / decode_tokens_per_s`` (0 without decode time)."""
    tps = stats.get("decode_tokens_per_s")
    return stats["n_emitted"] * 1e3 / tps if tps else 0.0


def _pooled(turns: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counters and decode time of a group of turns (each ``{"stats": Stats.as_dict(), ...}``), summed."""
    st = [t["stats"] for t in turns]
    n_emitted = sum(s["n_emitted"] for s in st)
    decode_ms = sum(_decode_ms(s) for s in st)
    n_rounds = sum(s["n_rounds"] for s in st)
    n_drafted = sum(s["n_drafted"] for s in st)
    n_accepted = sum(s["n_accepted"] for s in st)
    return {
        "n_turns": len(st),
        "n_emitted": n_emitted,
        "decode_s": decode_ms / 1e3,
        "decode_tokens_per_s": n_emitted * 1e3 / decode_ms if decode_ms > 0 else None,
        "n_rounds": n_rounds,
        "n_drafted": n_drafted,
        "n_accepted": n_accepted,
        "mean_tokens_per_round": n_emitted / n_rounds if n_rounds else None,
        "acceptance_rate": n_accepted / n_drafted if n_drafted else None,
    }


def _question_figures(record: dict[str, Any], methods: Sequence[str], compare: bool) -> dict[str, Any]:
    """One question's figures per method: pooled turns, paired speedup over target-only, first differences."""
    runs = record["runs"]
    base = _pooled(runs["target_only"])
    out: dict[str, Any] = {}
    for m in methods:
        fig = _pooled(runs[m])
        tps, base_tps = fig["decode_tokens_per_s"], base["decode_tokens_per_s"]
        fig["speedup"] = tps / base_tps if tps and base_tps else None
        if compare and m != "target_only":
            fig["differences"] = [
                {"turn": i + 1, "position": pos}
                for i, (b, s) in enumerate(zip(runs["target_only"], runs[m], strict=True))
                if (pos := _first_divergence(b["token_ids"], s["token_ids"])) is not None
            ]
        out[m] = fig
    return out


def _group(records: Sequence[dict[str, Any]], methods: Sequence[str], compare: bool) -> dict[str, Any]:
    """One group's (a category's, or all questions') figures per method (definitions in the module docstring)."""
    out: dict[str, Any] = {}
    for m in methods:
        fig = _pooled([t for r in records for t in r["runs"][m]])
        fig["n_questions"] = len(records)
        fig["speedup"] = spread(r["figures"][m]["speedup"] for r in records)
        if m == "target_only" or not compare:
            fig["outputs_equal"] = None
        else:
            mismatches = [
                {"question_id": r["question_id"], **d} for r in records for d in r["figures"][m]["differences"]
            ]
            n_equal = sum(not r["figures"][m]["differences"] for r in records)
            fig["outputs_equal"] = {"n_equal": n_equal, "n": len(records), "mismatches": mismatches}
        out[m] = fig
    return out


def summarize(records: list[dict[str, Any]], methods: Sequence[str], *, compare: bool) -> dict[str, Any]:
    """The suite's figures from its per-question records (pure arithmetic on the recorded ``Stats``; no models).

    Args:
        records: per question ``{"question_id", "category", "runs": {method: [turn, ...]}}``, each turn
            ``{"token_ids": [...], "stats": Stats.as_dict(), ...}``; every method has the question's every turn.
            Each record gains ``"figures"`` (per method: pooled turns, ``speedup``, ``differences``).
        methods: the methods run, ``"target_only"`` among them.
        compare: compare outputs with target-only token for token (greedy, or coupled sampling).

    Returns:
        ``{"categories": {category: {method: figures}}, "overall": {method: figures}}`` (definitions in the module
        docstring).
    """
    for r in records:
        r["figures"] = _question_figures(r, methods, compare)
    cats = [c for c in CATEGORIES if any(r["category"] == c for r in records)]
    return {
        "categories": {c: _group([r for r in records if r["category"] == c], methods, compare) for c in cats},
        "overall": _group(records, methods, compare),
    }


def _timed_turn(dec: Any, messages: list[dict[str, str]], settings: dict[str, Any], keep_text: bool) -> dict[str, Any]:
    """One generation: its token ids, finish reason, ``Stats`` (as a dict) and wall ms (the text for target-only)."""
    t0 = time.perf_counter()
    res = dec.generate(messages=messages, **settings)
    wall_ms = (time.perf_counter() - t0) * 1e3
    turn = {
        "n_prompt_tokens": res.stats.n_prompt_tokens,
        "token_ids": list(res.token_ids),
        "finish_reason": res.finish_reason,
        "wall_ms": wall_ms,
        "stats": res.stats.as_dict(),
    }
    if keep_text:
        turn["text"] = res.text
    return turn


def run_questions(
    dec: Any, questions: Sequence[Question], methods: Sequence[str], cfg: BenchConfig, progress: Any = None
) -> list[dict[str, Any]]:
    """Run every turn of ``questions`` with every method on ``dec`` (order in the module docstring).

    Returns:
        Per question ``{"question_id", "category", "runs": {method: [turn, ...]}}``; each turn holds its
        ``n_prompt_tokens``, ``token_ids``, ``finish_reason``, ``wall_ms`` and ``stats`` (``Stats.as_dict()``), and
        target-only's turns their ``text`` (the next turn's history).
    """
    common: dict[str, Any] = {
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "seed": cfg.seed,
        "ignore_eos": cfg.ignore_eos,
        "logprobs": False,  # greedy rounds then read only argmax ids, as a service runs them
    }
    if cfg.temperature > 0 and cfg.coupled:
        common["coupled"] = True
    settings = {m: {**common, **method_settings(m, cfg.k)} for m in methods}
    if cfg.warmup_tokens > 0 and questions:
        warm = messages_for(questions[0], 0, [])
        for m in methods:
            if progress is not None:
                progress.describe(f"warm-up {m}")
            dec.generate(messages=warm, **{**settings[m], "max_new_tokens": cfg.warmup_tokens, "ignore_eos": True})
            if progress is not None:
                progress.step()
    records = []
    for qi, q in enumerate(questions):
        shift = qi % len(methods)
        order = list(methods[shift:]) + list(methods[:shift])
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
        answers: list[str] = []
        for t in range(len(q.turns)):
            messages = messages_for(q, t, answers)
            for m in order:
                if progress is not None:
                    progress.describe(f"q{q.question_id} {q.category} turn {t + 1} {m}")
                runs[m].append(_timed_turn(dec, messages, settings[m], keep_text=m == "target_only"))
                if progress is not None:
                    progress.step()
            answers.append(runs["target_only"][-1]["text"])
        records.append({"question_id": q.question_id, "category": q.category, "runs": runs})
    return records


def _peer_prompts(records: Sequence[dict[str, Any]], questions: Sequence[Question], dec: Any) -> dict[str, Any]:
    """Every turn as a peer prompt: id ``q<id>-t<turn>`` -> the rendered chat (text), its token ids and category."""
    by_id = {q.question_id: q for q in questions}
    texts: dict[str, str] = {}
    tokens: dict[str, list[int]] = {}
    kinds: dict[str, str] = {}
    for r in records:
        q = by_id[r["question_id"]]
        answers = [t["text"] for t in r["runs"]["target_only"]]
        for t in range(len(q.turns)):
            pid = f"q{q.question_id}-t{t + 1}"
            messages = messages_for(q, t, answers)
            texts[pid] = dec.apply_chat_template(messages)
            tokens[pid] = dec.encode(None, messages)
            kinds[pid] = q.category
    return {"texts": texts, "tokens": tokens, "kinds": kinds}


def peer_summary(report: dict[str, Any]) -> dict[str, Any]:
    """Per peer mode (``peer_modes`` labels): per category and overall, the median over questions of the peer's
    speculative decode speed over its own target-only's, and how many of the peer's greedy target-only turns equal
    specrt's token for token (where the peer reports token ids), and ``decode_tokens_per_s``: per category and
    ``overall``, ``{"target_only", "speculative"}`` decode tokens/s (the speculative mode's emitted tokens over each
    mode's decode seconds, summed over the group's questions; None where no question has both rates).

    A question's speed ratio = target-only decode seconds / speculative decode seconds for the tokens the
    speculative mode emitted on each turn (turns summed; each mode's seconds = those tokens / its decode tokens/s:
    llama-bench, llama.cpp's target-only, generates a fixed count and reports only its rate).
    """
    from specrt.bench.peers import peer_modes

    records = report["spec_bench"]["questions"]
    greedy = report["config"]["temperature"] == 0
    out: dict[str, Any] = {}
    for name, peer in (report.get("peers") or {}).items():
        if peer.get("status") != "ok":
            continue
        by_label: dict[str, dict[str, Any]] = {}
        for pid, label, figs in peer_modes(name, peer):
            by_label.setdefault(label, {})[pid] = figs
        for label, figs in by_label.items():
            per_q: dict[int, float | None] = {}
            # per question: (tokens, target-only seconds, speculative seconds) for the category's decode tok/s
            sums: dict[int, tuple[float, float, float]] = {}
            same = [0, 0]
            for r in records:
                turns = [f"q{r['question_id']}-t{i + 1}" for i in range(len(r["runs"]["target_only"]))]
                if not all(pid in figs for pid in turns):
                    continue
                # Decode seconds of each mode for the tokens the speculative mode emitted (llama-bench, llama.cpp's
                # target-only, generates a fixed count and reports only its rate).
                secs = {"target_only": 0.0, "speculative": 0.0}
                for pid in turns:
                    n = med(figs[pid]["speculative"].get("n_emitted")) or 0.0
                    for mode in secs:
                        tps = med(figs[pid][mode]["decode_tokens_per_s"])
                        secs[mode] += n / tps if tps else float("nan")
                ok = secs["speculative"] > 0 and secs["target_only"] == secs["target_only"]  # no NaN: every rate known
                per_q[r["question_id"]] = secs["target_only"] / secs["speculative"] if ok else None
                if ok:
                    n_tok = sum(med(figs[pid]["speculative"].get("n_emitted")) or 0.0 for pid in turns)
                    sums[r["question_id"]] = (n_tok, secs["target_only"], secs["speculative"])
                for i, pid in enumerate(turns):
                    theirs = (peer["prompts"][pid].get("token_ids") or {}).get("target_only")
                    if greedy and theirs is not None:
                        same[0] += theirs == r["runs"]["target_only"][i]["token_ids"]
                        same[1] += 1
            cats = {
                c: spread(per_q.get(r["question_id"]) for r in records if r["category"] == c)
                for c in CATEGORIES
                if any(r["category"] == c for r in records)
            }

            out[label] = {
                "peer": name,
                "categories": cats,
                "overall": spread(per_q.values()),
                # decode tokens/s of each mode, tokens over seconds summed over the group's questions
                "decode_tokens_per_s": {
                    **{c: _rates(sums, [r["question_id"] for r in records if r["category"] == c]) for c in cats},
                    "overall": _rates(sums, [r["question_id"] for r in records]),
                },
                "target_only_same_tokens_as_specrt": {"n_equal": same[0], "n": same[1]} if same[1] else None,
            }
    return out


def _rates(sums: dict[int, tuple[float, float, float]], qids: list[int]) -> dict[str, float] | None:
    """Decode tokens/s of both peer modes over the questions ``qids``: ``sums[q]`` = (tokens, target-only seconds,
    speculative seconds); None where none of them has both."""
    got = [sums[q] for q in qids if q in sums]
    if not got:
        return None
    n_tok = sum(g[0] for g in got)
    return {"target_only": n_tok / sum(g[1] for g in got), "speculative": n_tok / sum(g[2] for g in got)}


def _max_seq_len(cfg: BenchConfig, target: Path, questions: Sequence[Question]) -> int:
    """A KV length that holds every turn: ``cfg.max_seq_len``, or more where a question needs it (its chat with empty
    answers in the target's template, plus each earlier answer and the new tokens, max_new_tokens + 16 each).

    Raises:
        ValueError: the target has no chat template (the suite sends chats).
    """
    from specrt.folder_text import folder_text

    tokenizer, template = folder_text(target)
    if template is None:
        raise ValueError(f"target {target} has no chat template (the spec-bench suite sends every turn as a chat)")
    longest = 0
    for q in questions:
        last = len(q.turns) - 1
        text = template.render(messages_for(q, last, [""] * last), True)
        longest = max(
            longest, len(tokenizer.encode(text, add_special_tokens=False).ids) + last * (cfg.max_new_tokens + 16)
        )
    return max(cfg.max_seq_len, longest + cfg.max_new_tokens + 16)


def run_spec_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the Spec-Bench suite (the module docstring says what, how and what each figure means) and return the
    JSON-ready report: ``{"schema", "suite", "config", "models", "machine", "dataset", "decoding", "spec_bench":
    {"questions": [...], "categories": {...}, "overall": {...}}, "peers"?, "peer_summary"?, "wall_s", "phase_s"}``.

    Raises:
        ValueError: invalid settings (:func:`specrt.bench.config.validate_config`).
        ProviderError: CUDA asked for and unusable here.
    """
    import specrt
    from specrt.bench.peers import peer_warnings, run_peers
    from specrt.bench.runner import SCHEMA, _machine, _Progress, check_provider
    from specrt.models import resolve_model

    t_start = time.perf_counter()
    cfg = resolve_config(cfg)
    validate_config(cfg)
    check_provider(cfg.provider)
    for line in [*config_warnings(cfg), *peer_warnings(cfg)]:
        print(f"specrt bench: warning: {line}", file=sys.stderr)
    questions = select_questions(load_questions(), cfg.per_category, cfg.categories)
    methods = run_methods(cfg.methods)
    compare = outputs_compared(cfg)
    machine = _machine(cfg.provider)
    assert cfg.dtype is not None  # resolve_config
    attention = "gqa-graph" if cfg.cuda_graph else "gqa"
    target_path = resolve_model(cfg.target, cfg.dtype, attention=attention)
    draft_path = resolve_model(cfg.draft, cfg.dtype, attention=attention)
    max_seq = _max_seq_len(cfg, target_path, questions)
    phase_s: dict[str, float] = {}
    n_turns = sum(len(q.turns) for q in questions)
    n_runs = len(methods) * (n_turns + (1 if cfg.warmup_tokens > 0 else 0))
    progress = _Progress(n_runs, cfg.progress)
    progress.write(
        f"specrt bench: spec-bench: {len(questions)} questions ({n_turns} turns) x {len(methods)} methods "
        f"({', '.join(methods)}), {cfg.max_new_tokens} new tokens per turn"
    )
    t_phase = time.perf_counter()
    dec = None
    try:
        progress.describe("loading models")
        dec = specrt.Decoder(
            target_path,
            draft_path,
            provider=cfg.provider,
            max_seq_len=max_seq,
            intra_op_threads=cfg.threads,
            cuda_graph=cfg.cuda_graph,
            prefix_caching=False,
        )
        phase_s["load"] = time.perf_counter() - t_phase
        t_phase = time.perf_counter()
        records = run_questions(dec, questions, methods, cfg, progress)
        phase_s["questions"] = time.perf_counter() - t_phase
        defaults = dict(dec.defaults)
        peer_prompts = _peer_prompts(records, questions, dec) if cfg.peers else None
    finally:
        progress.close()
        del dec
        gc.collect()
    summary = summarize(records, methods, compare=compare)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "suite": "spec-bench",
        "config": config_dict(cfg),
        "models": {"target": str(target_path), "draft": str(draft_path)},
        "machine": machine,
        "dataset": {
            **SOURCE,
            "n_questions": len(questions),
            "n_turns": n_turns,
            "question_ids": {c: [q.question_id for q in questions if q.category == c] for c in summary["categories"]},
        },
        "decoding": {
            "methods": {m: method_settings(m, cfg.k) for m in methods},
            "temperature": cfg.temperature,
            "seed": cfg.seed,
            "coupled": cfg.temperature > 0 and cfg.coupled,
            "outputs_compared": compare,
            "why_not_compared": None
            if compare
            else "sampled with min(1, p/q) acceptance (coupled=False): the same seed gives different tokens with "
            "and without speculation",
            "max_new_tokens": cfg.max_new_tokens,
            "prefix_caching": False,
            "folder_defaults": defaults,
        },
        "spec_bench": {"questions": records, **summary},
    }
    phase_s["specrt"] = time.perf_counter() - t_start
    if cfg.peers and peer_prompts is not None:
        from specrt.bench.prompts import Prompt

        prompts = [
            Prompt(id=pid, kind=peer_prompts["kinds"][pid], prompt=text, note="spec-bench turn (rendered chat)")
            for pid, text in peer_prompts["texts"].items()
        ]
        t_phase = time.perf_counter()
        report["peers"] = run_peers(
            replace(cfg, repeats=1), target_path, draft_path, prompts, peer_prompts["tokens"], peer_prompts["texts"]
        )
        for name, peer in report["peers"].items():
            phase_s[f"peer_{name}"] = peer.pop("elapsed_s", time.perf_counter() - t_phase)
        report["peer_summary"] = peer_summary(report)
    machine["load_avg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    report["wall_s"] = time.perf_counter() - t_start
    report["phase_s"] = phase_s
    return report
