"""``specrt bench`` on the command line: its options, the report files, the exit code."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from specrt.bench.config import (
    DEFAULT_DTYPE,
    MAX_VERIFY_N,
    PEERS,
    PROVIDERS,
    QWEN_CODER_ACCEPTANCE,
    BenchConfig,
    checkout_root,
    default_out_dir,
    default_peer_venv,
    validate_config,
)
from specrt.bench.peers import llama_cpp_bin, setup_command
from specrt.bench.plots import write_plots
from specrt.bench.random_models import SHAPE_PAIRS
from specrt.bench.report import render_table
from specrt.bench.runner import check_provider, run_bench
from specrt.cli_args import k_arg as _k_value  # one parser of K values for every subcommand
from specrt.cli_args import positive_int

#: Help line of ``specrt bench``.
HELP = "benchmark speculative vs target-only decoding against the cost model (tokens/s, E, a, c_q, c_p, c_verify)"


def _int_list(value: str) -> tuple[int, ...]:
    return tuple(int(v) for v in value.split(",") if v.strip())


def _float_list(value: str) -> tuple[float, ...]:
    return tuple(float(v) for v in value.split(",") if v.strip())


def _str_list(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _n_list(value: str) -> tuple[int, ...]:
    """``"1-16"``, ``"1,2,4,8"`` or ``"1-4,8,16"`` -> sorted distinct ints."""
    out: set[int] = set()
    try:
        for part in _str_list(value):
            lo, _, hi = part.partition("-")
            out |= set(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a list of token counts like 1-16 or 1,2,4,8") from None
    return tuple(sorted(out))


def _per_category(value: str) -> int | str:
    """``--per-category``: a positive integer or ``all``."""
    if value == "all":
        return value
    try:
        return positive_int(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive integer or 'all'") from None


def _here(path: Path) -> str:
    """``path`` for a help text ("here: ..." after the checkout and installed defaults), ``%`` escaped for argparse."""
    where = "this checkout" if checkout_root() is not None else "this installed specrt"
    return f"{where}: {path}".replace("%", "%%")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``specrt bench`` options to ``p``."""
    d = BenchConfig()
    p.add_argument("--target", default=d.target, help=f"target model name or folder (default {d.target})")
    p.add_argument("--draft", default=d.draft, help=f"draft model name or folder (default {d.draft})")
    p.add_argument(
        "--dtype",
        choices=["fp32", "fp16", "int4", "int8", "gguf"],
        default=None,
        help="weights of registry-named models and of --random-shapes (default fp32 with --provider cpu, fp16 with "
        "--provider cuda; folders are used as they are)",
    )
    p.add_argument(
        "--provider",
        choices=PROVIDERS,
        default=d.provider,
        help="execution provider of every model the bench loads (default cpu). cuda needs the CUDA build of ONNX "
        "Runtime (pip install 'specrt[cuda]') and a GPU, checked before anything runs; it runs fp16 models "
        "(registry names are pulled and converted with --dtype fp16 unless --dtype is given) and measures t(n) "
        "for n = 1..16",
    )
    p.add_argument(
        "--verify-ns",
        type=_n_list,
        default=(),
        metavar="NS",
        help=f"token counts n (1..{MAX_VERIFY_N}) whose target forward time t(n) is measured besides each K + 1, "
        "as 1-16 or 1,2,4,8 (default: 1-16 with --provider cuda, only the Ks used on cpu)",
    )
    p.add_argument(
        "--cuda-graph",
        action="store_true",
        help="with --provider cuda: models in the graph form (gqa-graph), each decode step replayed from a CUDA "
        "graph (Decoder(cuda_graph=True)); greedy rounds read only argmax ids either way",
    )
    p.add_argument(
        "--random-shapes",
        choices=list(SHAPE_PAIRS),
        default=None,
        help="bench random-weight models in these shapes instead of --target/--draft (qwen2.5-coder: the "
        "Qwen2.5-Coder 1.5B target and 0.5B draft, vocab 151936; qwen2.5-coder-7b: the 7B target, vocab 152064, "
        "and the 0.5B draft; qwen2.5-coder-7b-1.5b: the 7B target and the 1.5B draft; tiny: for tests), written "
        "and converted once "
        "under <specrt cache>/random/<shapes>-<dtype>/. GPU time does not depend on the weights: the report "
        "predicts the real pair's speedup from the costs measured on the real shapes and --acceptance, and checks "
        "the cost model on a pair of known acceptance (the target with its layers scaled down, its first layers as "
        "draft: acceptance ~1)",
    )
    p.add_argument(
        "--random-tokenizer",
        default=None,
        metavar="DIR",
        help="tokenizer folder for --random-shapes (tokenizer.json, optionally tokenizer_config.json, "
        "chat_template.jinja; default: the real pair's from specrt's model cache, else a byte-level stand-in)",
    )
    p.add_argument(
        "--acceptance",
        type=float,
        default=None,
        metavar="A",
        help="per-token acceptance a of the real pair for the --random-shapes prediction (default "
        f"{QWEN_CODER_ACCEPTANCE}: the a of the mean E of the default CPU run of the Qwen2.5-Coder pair, "
        "benches/results/default-fp32-with-peers-2026-11-29.json)",
    )
    p.add_argument(
        "--prompts-file",
        default=None,
        help="prompt file (default: the one shipped in the package, specrt/bench/prompts.json; a checkout's "
        "benches/prompts.json links to it)",
    )
    p.add_argument("--prompt-set", default=None, help="named set for the main table (default 'main'; 'all')")
    p.add_argument("--prompts", type=_str_list, default=(), help="comma-separated prompt ids (overrides --prompt-set)")
    p.add_argument("--sweep-set", default=None, help="named set for the sweeps (default 'sweep')")
    p.add_argument("--sweep-prompts", type=_str_list, default=(), help="comma-separated prompt ids for the sweeps")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"main table (default {d.max_new_tokens}); with --suite, per turn "
        f"(default {BenchConfig.spec_bench().max_new_tokens})",
    )
    p.add_argument("--sweep-max-new-tokens", type=int, default=None, help=f"sweeps (default {d.sweep_max_new_tokens})")
    p.add_argument("-k", "--num-speculative-tokens", dest="k", type=_k_value, default=d.k, help="main K (or 'auto')")
    p.add_argument("--k-sweep", type=_int_list, default=None, help="Ks of the K sweep (default 0,1,2,4,8)")
    p.add_argument("--temperatures", type=_float_list, default=None, help="temperature sweep (default 0,0.5,1)")
    p.add_argument(
        "--temperature", type=float, default=d.temperature, help="main table (or --suite) temperature (default 0)"
    )
    p.add_argument("--repeats", type=int, default=d.repeats, help="interleaved repetitions per figure (default 3)")
    p.add_argument("--verify-repeats", type=int, default=None, help="forwards per n for c_verify (default 5)")
    p.add_argument("--warmup-tokens", type=int, default=None, help="tokens per warm-up generation (0 = none)")
    p.add_argument("--threads", type=int, default=d.threads, help="ONNX Runtime threads per model (default 2)")
    p.add_argument("--max-seq-len", type=int, default=d.max_seq_len, help="KV cache length (default 1024)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed (repetition r uses seed + r)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate max_new_tokens")
    p.add_argument(
        "--baseline",
        choices=["separate", "k0"],
        default=d.baseline,
        help="target-only = the speculative Decoder at K=0 on the same target session (default: sessions created "
        "later in a process decode faster, so a separate Decoder is biased) or a separate Decoder without draft",
    )
    p.add_argument("--no-sweeps", action="store_true", help="main table only")
    p.add_argument("--no-plots", action="store_true", help="no PNGs")
    p.add_argument(
        "--peers", type=_str_list, default=(), help="comma-separated peers to run after specrt: genai, hf, llama.cpp"
    )
    for peer, what in (("genai", "onnxruntime-genai"), ("hf", "torch + transformers")):
        p.add_argument(
            f"--{peer}-python",
            default=None,
            help=f"python of the {what} venv (default <venv>/bin/python, <venv> = benches/out/venv-{peer} in a "
            f"checkout, <specrt cache>/bench/venv-{peer} installed; {_here(default_peer_venv(peer))}; "
            f"--setup-peer {peer} makes it)",
        )
    p.add_argument(
        "--llama-cpp-bin",
        default=None,
        help="folder with llama-bench and llama-speculative-simple (default: what --setup-peer llama.cpp builds, "
        f"<specrt cache>/llama.cpp/<version>/build/bin, checkout or not; {_here(llama_cpp_bin(d))})",
    )
    p.add_argument(
        "--setup-peer",
        choices=PEERS,
        default=None,
        help="set up one peer where the bench looks for it, then exit (nothing is benchmarked): genai and hf make a "
        "venv from PyPI (the one of --genai-python / --hf-python, else the default; never over a folder that is "
        "neither new, empty nor a venv), llama.cpp builds llama.cpp "
        "from llama-cpp-python's sdist (about 8 minutes). Runs the setup script shipped in specrt/bench/peer_setup",
    )
    p.add_argument(
        "--hf-modes",
        type=_str_list,
        default=None,
        help="hf peer modes: target_only, assisted (K drafts per round), assisted_dynamic (default: the first two)",
    )
    p.add_argument(
        "--peers-sequential",
        action="store_true",
        help="peers load one model set at a time (less memory, no interleaving of their target-only and speculative)",
    )
    p.add_argument(
        "--out-dir",
        default=None,
        help="where JSON and PNGs go, and the peers' work files (default benches/out in a checkout, "
        f"./specrt-bench-out installed; {_here(default_out_dir())})",
    )
    p.add_argument("--name", default=None, help="file name prefix (default bench-<date>-<time>)")
    p.add_argument("--quick", action="store_true", help="a few minutes: 2 prompts, 32 tokens, K sweep 0,2,4")
    sb = BenchConfig.spec_bench()
    g = p.add_argument_group(
        "suites",
        "--suite spec-bench runs Spec-Bench's questions (480 in 13 categories: MT-bench's 8 x 10 two-turn questions, "
        "then translation, summarization, qa, math_reasoning and rag x 80; shipped in the package, Apache-2.0, from "
        "github.com/hemingkx/Spec-Bench at fd2c1cd) through the target's chat template, every method on every turn, "
        "interleaved with target-only on the same target session, in place of the verify costs, main table and "
        "sweeps. MT-bench's second turn carries target-only's own first answer as history, the same for every "
        "method. Reports per category and overall: decode tokens/s, speedup over target-only (median over the "
        "questions of the paired per-question ratio), tokens per round, acceptance rate and outputs equal to "
        "target-only token for token (greedy, or coupled sampling at --temperature > 0); a PNG of the speedups. "
        f"Defaults: {sb.per_category} question per category, {sb.max_new_tokens} new tokens per turn "
        "(--max-new-tokens), K as -k, greedy. Time of the default run on 2 CPU cores (benches/RESULTS.md, "
        "measured with six methods): the Qwen2.5-Coder 1.5B fp32 target and 0.5B int4 draft 27 min, the gguf pair "
        "13 min, the seventh method about a seventh more; --per-category all (480 "
        "questions, 560 turns): about 8 hours. --repeats and "
        "--baseline do not apply; "
        "--quick cannot be combined with it",
    )
    g.add_argument(
        "--suite",
        choices=["spec-bench"],
        default=None,
        help="run a benchmark suite instead of the bench (see above; default none)",
    )
    g.add_argument(
        "--per-category",
        type=_per_category,
        default=None,
        metavar="N",
        help=f"questions per category, each category's first N in file order, or 'all' (default {sb.per_category})",
    )
    g.add_argument(
        "--categories",
        type=_str_list,
        default=None,
        help="comma-separated categories (default all): writing, roleplay, reasoning, math, coding, extraction, "
        "stem, humanities, translation, summarization, qa, math_reasoning, rag",
    )
    g.add_argument(
        "--methods",
        type=_str_list,
        default=None,
        help="comma-separated methods (default all; target_only always runs, the baseline): "
        "target_only, draft (the draft model, K = -k), ngram (prompt lookup, up to K tokens), ngram+draft (prompt "
        "lookup, else the draft model), auto_k (the draft model, K chosen per round), auto (proposer and K chosen "
        "per round), suffix (suffix decoding over the request's own text)",
    )
    g.add_argument(
        "--no-coupled",
        action="store_true",
        help="with --temperature > 0: min(1, p/q) speculative sampling instead of coupled sampling (the default "
        "there); the outputs then differ from target-only's for the same seed and are not compared (n/a (sampled))",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(a: argparse.Namespace) -> BenchConfig:
    """A :class:`BenchConfig` from parsed ``specrt bench`` arguments (``--quick`` and ``--suite`` change the defaults
    only: :meth:`BenchConfig.quick`, :meth:`BenchConfig.spec_bench`)."""
    suite = getattr(a, "suite", None)
    cfg = BenchConfig.spec_bench(suite=suite) if suite else BenchConfig.quick() if a.quick else BenchConfig()
    if getattr(a, "per_category", None) is not None:
        cfg = replace(cfg, per_category=None if a.per_category == "all" else a.per_category)
    given = {
        "target": a.target,
        "draft": a.draft,
        "dtype": a.dtype or DEFAULT_DTYPE[a.provider],
        "provider": a.provider,
        "verify_ns": a.verify_ns,
        "random_shapes": a.random_shapes,
        "cuda_graph": a.cuda_graph,
        "random_tokenizer": a.random_tokenizer,
        "acceptance": a.acceptance,
        "prompts_file": a.prompts_file,
        "prompt_set": a.prompt_set,
        "prompt_ids": a.prompts,
        "sweep_set": a.sweep_set,
        "sweep_ids": a.sweep_prompts,
        "max_new_tokens": a.max_new_tokens,
        "sweep_max_new_tokens": a.sweep_max_new_tokens,
        "k": a.k,
        "k_sweep": a.k_sweep,
        "temperatures": a.temperatures,
        "temperature": a.temperature,
        "repeats": a.repeats,
        "verify_repeats": a.verify_repeats,
        "warmup_tokens": a.warmup_tokens,
        "threads": a.threads,
        "max_seq_len": a.max_seq_len,
        "seed": a.seed,
        "ignore_eos": a.ignore_eos,
        "baseline": a.baseline,
        "sweeps": not a.no_sweeps,
        "plots": not a.no_plots,
        "peers": a.peers,
        "genai_python": a.genai_python,
        "hf_python": a.hf_python,
        "llama_cpp_bin": a.llama_cpp_bin,
        "hf_modes": a.hf_modes or None,
        "peer_interleave": False if a.peers_sequential else None,
        "out_dir": a.out_dir,
        "name": a.name,
        "progress": not a.no_progress,
        "categories": getattr(a, "categories", None),
        "methods": getattr(a, "methods", None),
        "coupled": False if getattr(a, "no_coupled", False) else None,
    }
    return replace(cfg, **{k: v for k, v in given.items() if v is not None})


def save(report: dict[str, Any], cfg: BenchConfig) -> dict[str, Path]:
    """Write ``<out_dir>/<name>.json`` and the PNGs (the sweeps', or a suite's); return their paths. ``name`` defaults
    to ``bench-<date>-<time>`` (``spec-bench-<date>-<time>`` for the suite)."""
    out_dir = Path(cfg.out_dir) if cfg.out_dir else default_out_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    name = cfg.name or time.strftime(f"{cfg.suite or 'bench'}-%Y%m%d-%H%M%S")
    paths: dict[str, Path] = {}
    if cfg.plots:
        for p in write_plots(report, out_dir / name):
            paths[p.stem.removeprefix(name + "-")] = p
    report.setdefault("files", {}).update({k: str(v) for k, v in paths.items()})
    json_path = out_dir / f"{name}.json"
    report["files"]["json"] = str(json_path)
    json_path.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    paths["json"] = json_path
    return paths


def run_cli(a: argparse.Namespace) -> int:
    """``specrt bench``: run, print the table, write JSON (+ PNGs). Returns the exit code."""
    from specrt.errors import ProviderError

    cfg = config_from_args(a)
    if a.setup_peer:
        return setup_peer(cfg, a.setup_peer)
    if a.quick and a.suite:
        print(
            f"specrt bench: error: --quick does not apply to --suite {a.suite} (its own defaults: "
            f"--per-category {cfg.per_category}, --max-new-tokens {cfg.max_new_tokens}; lower those instead)",
            file=sys.stderr,
        )
        return 2
    try:
        validate_config(cfg)
        check_provider(cfg.provider)
    except (ValueError, ProviderError, FileNotFoundError) as e:
        print(f"specrt bench: error: {e}", file=sys.stderr)
        return 2
    report = run_bench(cfg)
    paths = save(report, cfg)
    render_table(report)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    failed = [name for name, peer in (report.get("peers") or {}).items() if peer.get("status") == "error"]
    if failed:
        print(f"specrt bench: peer {', '.join(failed)} failed (see the notes above and the JSON)", file=sys.stderr)
        return 1
    return 0


def setup_peer(cfg: BenchConfig, peer: str) -> int:
    """``specrt bench --setup-peer <peer>``: run the peer's shipped setup script (:func:`setup_command`) where ``cfg``
    looks for the peer; its exit code (2 where it cannot be set up there, the reason on stderr)."""
    try:
        command = setup_command(cfg, peer)
    except (ValueError, FileNotFoundError) as e:
        print(f"specrt bench: error: {e}", file=sys.stderr)
        return 2
    print(f"specrt bench: setting up peer {peer}: {shlex.join(command)}", file=sys.stderr, flush=True)
    return subprocess.run(command, check=False).returncode
