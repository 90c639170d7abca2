"""Settings of one bench run (:class:`BenchConfig`), their validation, and where the bench reads and writes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

#: The source checkout this package is used from (``benches/`` lives there).
REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass
class BenchConfig:
    """Settings of one bench run (``specrt bench --help`` documents each).

    Token counts are new tokens per generation; ``k`` is an int or ``"auto"``; temperatures are floats (0 =
    greedy); ``threads`` = ONNX Runtime intra-op threads per model.
    """

    target: str = "qwen2.5-coder-1.5b-instruct"
    draft: str = "qwen2.5-coder-0.5b-instruct"
    dtype: str = "fp32"
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
    hf_modes: tuple[str, ...] = ("target_only", "assisted")
    peer_interleave: bool = True
    out_dir: str | None = None
    name: str | None = None
    progress: bool = True

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


#: Peers ``specrt bench --peers`` knows, and the modes of the ``hf`` peer.
PEERS = ("genai", "hf")


HF_MODES = ("target_only", "assisted", "assisted_dynamic")


def validate_config(cfg: BenchConfig) -> None:
    """Check the settings that would otherwise fail late (after the specrt phases) or silently.

    Raises:
        ValueError: a bad ``baseline``, ``repeats``, peer name or hf mode, naming the value and what is allowed.
    """
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


def config_dict(cfg: BenchConfig) -> dict[str, Any]:
    d = asdict(cfg)
    for key, value in d.items():
        if isinstance(value, tuple):
            d[key] = list(value)
    return d


def default_out_dir() -> Path:
    bench_dir = REPO_ROOT / "benches"
    return bench_dir / "out" if bench_dir.is_dir() else Path.cwd() / "specrt-bench-out"
