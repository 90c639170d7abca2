"""Settings of one bench run (:class:`BenchConfig`), their validation, and where the bench reads and writes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any


def checkout_root() -> Path | None:
    """The source checkout this package is used from, or None when specrt is installed (a wheel in site-packages).

    The one place that tells the two apart: a checkout holds this file at ``<root>/python/specrt/bench/config.py``
    with ``<root>/benches/`` and ``<root>/pyproject.toml`` beside ``python/`` (an editable install runs from there
    too). What the bench writes by default follows it (:func:`default_out_dir`, :func:`default_peer_venv`), and so
    does the record's git commit; the prompt file ships in the package either way.
    """
    bench_pkg = Path(__file__).resolve().parent
    root = bench_pkg.parents[2]
    is_checkout = (
        bench_pkg.parent.parent.name == "python" and (root / "benches").is_dir() and (root / "pyproject.toml").is_file()
    )
    return root if is_checkout else None


@dataclass
class BenchConfig:
    """Settings of one bench run (``specrt bench --help`` documents each).

    Token counts are new tokens per generation; ``k`` is an int or ``"auto"``; temperatures are floats (0 =
    greedy); ``threads`` = ONNX Runtime intra-op threads per model. ``None`` in ``dtype``, ``acceptance`` and an
    empty ``verify_ns`` mean "the default for this provider / mode" (:func:`resolve_config`).

    ``suite`` (``"spec-bench"``, or None for the bench itself) runs a suite instead of the verify costs, main table
    and sweeps (:mod:`specrt.bench.spec_bench`; :meth:`spec_bench` gives its defaults): ``per_category`` questions
    of each category (None = all), ``categories`` (empty = all), ``methods`` (target-only always runs), at
    ``temperature`` with ``seed``, sampled runs coupled unless ``coupled`` is False; ``k``, ``max_new_tokens``,
    ``warmup_tokens``, ``threads``, ``max_seq_len``, ``ignore_eos`` and the peers apply as in the bench.
    """

    target: str = "qwen2.5-coder-1.5b-instruct"
    draft: str = "qwen2.5-coder-0.5b-instruct"
    dtype: str | None = None
    provider: str = "cpu"
    random_shapes: str | None = None
    cuda_graph: bool = False
    random_tokenizer: str | None = None
    acceptance: float | None = None
    verify_ns: tuple[int, ...] = ()
    prompts_file: str | None = None
    prompt_set: str = "main"
    prompt_ids: tuple[str, ...] = ()
    sweep_set: str = "sweep"
    sweep_ids: tuple[str, ...] = ()
    max_new_tokens: int = 128
    sweep_max_new_tokens: int = 64
    k: int | str = 4
    k_sweep: tuple[int, ...] = (0, 1, 2, 4, 8)
    temperatures: tuple[float, ...] = (0.0, 0.5, 1.0)
    temperature: float = 0.0
    repeats: int = 3
    verify_repeats: int = 5
    warmup_tokens: int = 8
    threads: int | None = 2
    max_seq_len: int = 1024
    seed: int = 0
    ignore_eos: bool = False
    baseline: str = "k0"
    sweeps: bool = True
    plots: bool = True
    peers: tuple[str, ...] = ()
    genai_python: str | None = None
    hf_python: str | None = None
    llama_cpp_bin: str | None = None
    hf_modes: tuple[str, ...] = ("target_only", "assisted")
    peer_interleave: bool = True
    out_dir: str | None = None
    name: str | None = None
    progress: bool = True
    suite: str | None = None
    per_category: int | None = 1
    categories: tuple[str, ...] = ()
    methods: tuple[str, ...] = ("target_only", "draft", "ngram", "ngram+draft", "auto_k", "auto", "suffix")
    coupled: bool = True

    @classmethod
    def quick(cls, **overrides: Any) -> BenchConfig:
        """A few-minute configuration: two prompts, 32 tokens, a short K sweep."""
        base = cls(
            prompt_set="quick",
            sweep_set="quick",
            max_new_tokens=32,
            sweep_max_new_tokens=32,
            k_sweep=(0, 2, 4),
            temperatures=(0.0, 1.0),
            verify_repeats=3,
            warmup_tokens=4,
        )
        return replace(base, **overrides)

    @classmethod
    def spec_bench(cls, **overrides: Any) -> BenchConfig:
        """The Spec-Bench suite's defaults (``specrt bench --suite spec-bench``): one question per category, 48 new
        tokens per turn, all methods, greedy (about half an hour for the fp32 pair on 2 CPU cores, measured in
        :mod:`specrt.bench.spec_bench`)."""
        from specrt.bench.spec_bench import DEFAULT_MAX_NEW_TOKENS, DEFAULT_PER_CATEGORY

        base = cls(
            suite="spec-bench",
            per_category=DEFAULT_PER_CATEGORY,
            max_new_tokens=DEFAULT_MAX_NEW_TOKENS,
            sweeps=False,
        )
        return replace(base, **overrides)


#: Peers ``specrt bench --peers`` knows, and the modes of the ``hf`` peer.
PEERS = ("genai", "hf", "llama.cpp")


HF_MODES = ("target_only", "assisted", "assisted_dynamic")

#: Execution providers of ``--provider``, and the weights each uses for registry names unless ``--dtype`` says.
PROVIDERS = ("cpu", "cuda")
DEFAULT_DTYPE = {"cpu": "fp32", "cuda": "fp16"}

#: The n of t(n) (target forward over n tokens) measured on CUDA unless ``--verify-ns`` says: 1..16.
CUDA_VERIFY_NS = tuple(range(1, 17))

#: Largest n of ``--verify-ns``.
MAX_VERIFY_N = 64

#: Per-token acceptance a of the real Qwen2.5-Coder 1.5B / 0.5B pair, the default of ``--acceptance``: the a whose
#: geometric model (1 - a^5) / (1 - a) gives E = 4.154, the mean tokens per round at K = 4 (fp32, greedy, the 'main'
#: set, CPU) of the default run in benches/results/default-fp32-with-peers-2026-11-29.json
#: (``main.totals.all.mean_tokens_per_round``; benches/RESULTS.md, "The default run"). Its per-prompt a: 0.83-0.99.
QWEN_CODER_ACCEPTANCE = 0.907

#: Where :data:`QWEN_CODER_ACCEPTANCE` comes from (recorded in the report).
QWEN_CODER_ACCEPTANCE_SOURCE = (
    "benches/results/default-fp32-with-peers-2026-11-29.json: a fitted to the mean E = 4.154 at K = 4 "
    "(Qwen2.5-Coder 1.5B / 0.5B, fp32, greedy, 'main' set, CPU)"
)


def model_dtype(cfg: BenchConfig) -> str:
    """The weights of registry-named models: ``cfg.dtype``, else fp16 on CUDA and fp32 on CPU."""
    return cfg.dtype or DEFAULT_DTYPE.get(cfg.provider, "fp32")


def resolve_config(cfg: BenchConfig) -> BenchConfig:
    """``cfg`` with the provider's and the mode's defaults filled in (what the report records).

    ``dtype``: :func:`model_dtype`; ``verify_ns``: :data:`CUDA_VERIFY_NS` on CUDA; with ``random_shapes``:
    ``acceptance`` defaults to :data:`QWEN_CODER_ACCEPTANCE` and ``ignore_eos`` is on (random weights stop at a
    random EOS otherwise).
    """
    out = replace(cfg, dtype=model_dtype(cfg))
    if not out.verify_ns and out.provider == "cuda":
        out = replace(out, verify_ns=CUDA_VERIFY_NS)
    if out.random_shapes is not None:
        out = replace(out, ignore_eos=True)
        if out.acceptance is None:
            out = replace(out, acceptance=QWEN_CODER_ACCEPTANCE)
    return out


def validate_config(cfg: BenchConfig) -> None:
    """Check the settings that would otherwise fail late (after the specrt phases) or silently.

    Raises:
        ValueError: a bad ``baseline``, ``repeats``, peer name, hf mode, provider, dtype for the provider, random
            shape name, acceptance or verify n, naming the value and what is allowed.
    """
    from specrt import _specrt
    from specrt.bench.random_models import SHAPE_PAIRS

    # The provider and cuda_graph rules are the Decoder's (Rust's DecoderOptions; ConfigError is a ValueError).
    _specrt.check_decoder_options(
        provider=cfg.provider,
        device_id=0,
        max_seq_len=None,
        intra_op_threads=None,
        allow_fallback=False,
        cuda_graph=cfg.cuda_graph,
        max_batch=1,
        prefill_chunk=1,
    )
    if cfg.provider not in PROVIDERS:  # an alias the Decoder takes ("gpu"): the report keys by the plain names
        raise ValueError(f"provider {cfg.provider!r} is invalid here (expected one of: 'cpu', 'cuda')")
    if cfg.provider == "cuda" and model_dtype(cfg) != "fp16":
        raise ValueError(
            f"dtype {cfg.dtype!r} is invalid with provider 'cuda' (expected 'fp16': the CUDA path runs float16 "
            "models; leave --dtype out to get it)"
        )
    if cfg.random_shapes is not None and model_dtype(cfg) == "gguf":
        raise ValueError(
            "dtype 'gguf' is invalid with random shapes (their random weights are written as Hugging Face folders: "
            "no GGUF blocks to keep; expected one of: fp32, fp16, int4, int8)"
        )
    if cfg.random_shapes is not None and cfg.random_shapes not in SHAPE_PAIRS:
        raise ValueError(f"random shapes {cfg.random_shapes!r} are unknown (expected one of: {', '.join(SHAPE_PAIRS)})")
    if cfg.acceptance is not None and not 0.0 <= cfg.acceptance <= 1.0:
        raise ValueError(f"acceptance {cfg.acceptance} is invalid (expected a per-token acceptance in [0, 1])")
    bad_ns = [n for n in cfg.verify_ns if not 1 <= n <= MAX_VERIFY_N]
    if bad_ns:
        raise ValueError(f"verify ns {bad_ns} are invalid (expected token counts 1..{MAX_VERIFY_N})")
    if cfg.peers and (cfg.provider != "cpu" or cfg.random_shapes is not None):
        raise ValueError(
            f"peers {list(cfg.peers)} run on CPU with the real models only (provider {cfg.provider!r}, random shapes "
            f"{cfg.random_shapes!r})"
        )
    if cfg.baseline not in ("separate", "k0"):
        raise ValueError(f"baseline {cfg.baseline!r} is invalid (expected one of: 'separate', 'k0')")
    if cfg.repeats < 1:
        raise ValueError(f"repeats {cfg.repeats} is invalid (expected >= 1; 3 or more for a spread)")
    unknown = [p for p in cfg.peers if p not in PEERS]
    if unknown:
        raise ValueError(f"peers {unknown} are unknown (expected some of: {', '.join(PEERS)})")
    bad = [m for m in cfg.hf_modes if m not in HF_MODES]
    if bad or not cfg.hf_modes:
        raise ValueError(f"hf modes {bad or list(cfg.hf_modes)} are invalid (expected some of: {', '.join(HF_MODES)})")
    if cfg.suite is not None:
        _validate_suite(cfg)


def _validate_suite(cfg: BenchConfig) -> None:
    """The suite's own settings (:mod:`specrt.bench.spec_bench`): its name, selection, methods and temperature."""
    from specrt.bench.spec_bench import SUITES, check_methods, check_selection

    if cfg.suite not in SUITES:
        raise ValueError(f"suite {cfg.suite!r} is unknown (expected one of: {', '.join(SUITES)})")
    check_selection(cfg.per_category, cfg.categories)
    check_methods(cfg.methods)
    if cfg.random_shapes is not None:
        raise ValueError(
            f"suite {cfg.suite!r} runs real models only (random shapes {cfg.random_shapes!r}: random weights accept "
            "nothing and stop nowhere)"
        )
    if not cfg.temperature >= 0:
        raise ValueError(f"temperature {cfg.temperature} is invalid (expected >= 0; 0 = greedy)")


def config_warnings(cfg: BenchConfig) -> list[str]:
    """Settings that will have no effect, said before the run starts (the run goes on)."""
    d = BenchConfig()
    out = []
    if cfg.random_shapes is not None and (cfg.target, cfg.draft) != (d.target, d.draft):
        out.append(f"--target / --draft are not used with --random-shapes {cfg.random_shapes}")
    if cfg.random_shapes is None:
        if cfg.acceptance is not None:
            out.append("--acceptance has no effect without --random-shapes (the real pair's acceptance is measured)")
        if cfg.random_tokenizer is not None:
            out.append("--random-tokenizer has no effect without --random-shapes")
    if cfg.suite is not None:
        d = BenchConfig.spec_bench()
        if cfg.repeats != d.repeats:
            out.append(f"--repeats has no effect with --suite {cfg.suite} (one run per question and method)")
        if cfg.baseline != d.baseline:
            out.append(f"--baseline has no effect with --suite {cfg.suite} (target-only is K = 0 on the one Decoder)")
        if cfg.temperature == 0 and not cfg.coupled:
            out.append("--no-coupled has no effect at temperature 0 (greedy)")
    else:
        d = BenchConfig()
        given = [
            flag
            for name, flag in (
                ("per_category", "--per-category"),
                ("categories", "--categories"),
                ("methods", "--methods"),
                ("coupled", "--no-coupled"),
            )
            if getattr(cfg, name) != getattr(d, name)
        ]
        if given:
            out.append(f"{', '.join(given)} have no effect without --suite")
    return out


def config_dict(cfg: BenchConfig) -> dict[str, Any]:
    d = asdict(cfg)
    for key, value in d.items():
        if isinstance(value, tuple):
            d[key] = list(value)
    return d


def bench_cache_dir() -> Path:
    """``<specrt cache>/bench`` (``$SPECRT_CACHE_DIR/bench``, else ``~/.cache/specrt/bench``): an installed specrt's
    peer venvs."""
    from specrt.models import cache_dir

    return cache_dir() / "bench"


def default_out_dir() -> Path:
    """Where reports go without ``--out-dir``: ``benches/out`` of a checkout, else ``./specrt-bench-out`` (the
    current folder: a report belongs with the run that made it, not in a cache)."""
    root = checkout_root()
    return root / "benches" / "out" if root is not None else Path.cwd() / "specrt-bench-out"


def default_peer_venv(peer: str) -> Path:
    """The virtual environment of peer ``"genai"`` or ``"hf"`` without ``--genai-python`` / ``--hf-python``:
    ``benches/out/venv-<peer>`` of a checkout, else ``<specrt cache>/bench/venv-<peer>`` (:func:`bench_cache_dir`)."""
    root = checkout_root()
    return (root / "benches" / "out" if root is not None else bench_cache_dir()) / f"venv-{peer}"
