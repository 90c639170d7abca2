"""Resident memory over many consecutive generations (a leak check for long-running services).

    python benches/bench_memory.py                          # tiny random models, 1,000 generations
    python benches/bench_memory.py --model smollm2-135m-instruct --n 1000 --max-new-tokens 8
    python benches/bench_memory.py --json benches/out/memory_tiny.json

One process, one Decoder (target + draft, the same model as its own draft unless ``--draft`` says otherwise).
Generations cycle through a mix of request kinds, so every path is exercised: sampled and greedy, plain and
streamed, a stream closed after its first chunk, a stop string, a request rejected with ``ConfigError``, and a
``NonFiniteLogitsError``-free penalty run. Every ``--every`` generations: ``gc.collect()`` then ``VmRSS`` from
``/proc/self/status``, split into ``RssAnon`` (heap: where a leak shows) and ``RssFile`` (mapped files such as the
model weights, which the kernel may drop and re-read under memory pressure, so total RSS can also fall). The growth
is the least-squares slope of ``RssAnon`` over the samples after the first (the first window holds one-time
allocations: ONNX Runtime arenas, tokenizer caches).

Prints the series and a Markdown row for ``benches/RESULTS.md``; ``--json`` writes everything.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import specrt
from specrt.errors import ConfigError

PROMPTS = [
    "def fibonacci(n):",
    "The quick brown fox",
    "Write a haiku about the sea.",
    "import numpy as np\nx = np.",
    "Once upon a time, in a land far away,",
]


def status_kib(*fields: str) -> tuple[int, ...]:
    """Fields of /proc/self/status in KiB (e.g. VmRSS, RssAnon, RssFile)."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in fields:
                values[name] = int(rest.split()[0])
    return tuple(values[n] for n in fields)


def rss_kib() -> int:
    """Resident set size of this process in KiB (Linux /proc)."""
    return status_kib("VmRSS")[0]


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0


def tiny_models(root: Path) -> tuple[Path, Path]:
    from specrt.convert import convert
    from specrt.convert.tiny import write_tiny_gguf

    t = convert(write_tiny_gguf(root / "t.gguf", arch="qwen2", seed=1, n_layers=2), root / "target", progress=False)
    d = convert(write_tiny_gguf(root / "d.gguf", arch="qwen2", seed=1, n_layers=1), root / "draft", progress=False)
    return t, d


def one_generation(dec: specrt.Decoder, i: int, max_new: int) -> str:
    """Run request kind ``i % 8``; returns its name."""
    prompt = PROMPTS[i % len(PROMPTS)]
    kw = {"max_new_tokens": max_new, "seed": i, "num_speculative_tokens": 1 + i % 6}
    kind = i % 8
    if kind == 0:
        dec.generate(prompt, temperature=0, **kw)
        return "greedy"
    if kind == 1:
        for _ in dec.stream(prompt, temperature=0.8, **kw):
            pass
        return "stream"
    if kind == 2:
        it = dec.stream(prompt, temperature=0.8, **kw)
        next(it)
        it.close()
        return "stream closed early"
    if kind == 3:
        dec.generate(prompt, temperature=0.8, stop=["e", "\n"], **kw)
        return "stop string"
    if kind == 4:
        try:
            dec.generate(prompt, temperature=-1.0, **kw)
        except ConfigError:
            return "rejected"
        raise AssertionError("expected ConfigError")
    if kind == 5:
        dec.generate(prompt, temperature=0.7, repetition_penalty=1.2, frequency_penalty=0.3, top_p=0.9, **kw)
        return "penalties"
    if kind == 6:
        dec.generate(messages=[{"role": "user", "content": prompt}], temperature=1.0, top_k=20, **kw)
        return "chat"
    dec.generate(prompt, temperature=1.0, num_speculative_tokens=0, max_new_tokens=max_new, seed=i)
    return "target-only"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="'tiny' (random 2-layer qwen2), a registry name or a folder")
    ap.add_argument("--draft", default=None, help="draft model (default: the target itself; 'none' for none)")
    ap.add_argument("--n", type=int, default=1000, help="generations")
    ap.add_argument("--every", type=int, default=100, help="RSS sample interval (generations)")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    a = ap.parse_args(argv)

    tmp = None
    if a.model == "tiny":
        tmp = tempfile.TemporaryDirectory()
        target, draft = tiny_models(Path(tmp.name))
    else:
        target = a.model
        draft = a.draft or a.model
    if a.draft == "none":
        draft = None
    t0 = time.perf_counter()
    rss0 = rss_kib()
    dec = specrt.Decoder(target, draft, max_seq_len=a.max_seq_len)
    rss_loaded = rss_kib()
    series: list[tuple[int, int]] = [(0, rss_loaded)]
    anon: list[tuple[int, int, int]] = [(0, *status_kib("RssAnon", "RssFile"))]
    kinds: dict[str, int] = {}
    print(f"RSS before load {rss0} KiB, after load {rss_loaded} KiB", flush=True)
    for i in range(a.n):
        k = one_generation(dec, i, a.max_new_tokens)
        kinds[k] = kinds.get(k, 0) + 1
        if (i + 1) % a.every == 0:
            gc.collect()
            series.append((i + 1, rss_kib()))
            anon.append((i + 1, *status_kib("RssAnon", "RssFile")))
            elapsed = time.perf_counter() - t0
            print(
                f"{i + 1:6d} generations  RSS {series[-1][1]:8d} KiB  anon {anon[-1][1]:8d} KiB  file {anon[-1][2]:8d} "
                f"KiB  ({elapsed:7.1f} s)",
                flush=True,
            )
    steady = anon[2:] if len(anon) > 3 else anon[1:]
    per_100 = 100 * slope([x for x, _, _ in steady], [y for _, y, _ in steady])
    growth = anon[-1][1] - anon[1][1]
    out = {
        "model": str(a.model),
        "draft": str(draft) if draft else None,
        "n": a.n,
        "every": a.every,
        "max_new_tokens": a.max_new_tokens,
        "kinds": kinds,
        "rss_kib": series,
        "rss_anon_file_kib": anon,
        "rss_before_load_kib": rss0,
        "slope_kib_per_100": per_100,
        "anon_growth_after_first_window_kib": growth,
        "seconds": time.perf_counter() - t0,
        "python": platform.python_version(),
        "specrt": specrt.__version__ if hasattr(specrt, "__version__") else None,
        "pid": os.getpid(),
    }
    print(
        f"\nRssAnon slope after warm-up: {per_100:+.1f} KiB per 100 generations; RssAnon {anon[1][1]} -> "
        f"{anon[-1][1]} KiB ({growth:+d}) from generation {anon[1][0]} to {anon[-1][0]}"
    )
    print(
        f"| {a.model} | {a.n} | {anon[1][1] / 1024:.1f} | {anon[-1][1] / 1024:.1f} | {per_100:+.1f} | "
        f"{', '.join(f'{y / 1024:.1f}' for _, y, _ in anon)} |"
    )
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
