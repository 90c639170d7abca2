"""Structured output is valid every time, on real models: every output of the JSON-schema set
(``tests/data/json_schemas.json``, 60 schemas: nested objects, bounded arrays, enums, string patterns and formats,
integer and number ranges, nullable and optional fields, anyOf, additionalProperties false) that ends by grammar
completion (or by an EOS the grammar allowed) validates with the ``jsonschema`` package, format checks on; likewise
regexes (``re.fullmatch``) and a Lark grammar. Greedy and T = 0.7, with and without speculation, single-stream and
batched. Outputs cut by ``max_new_tokens`` are counted apart and must stay rare.

SmolLM2-135M with its int4 copy as draft runs in CI (``model``, ``slow``); the Qwen2.5-Coder pair (fp32 1.5B target,
int4 0.5B draft) is ``qwen`` (``SPECRT_TEST_QWEN=1``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]

jsonschema = pytest.importorskip("jsonschema")

SCHEMAS: list[dict[str, Any]] = json.loads((Path(__file__).parent.parent / "data" / "json_schemas.json").read_text())

#: Long enough for the largest schema of the set (a recipe with three 60-character steps is ~130 tokens).
MAX_NEW_TOKENS = 320

#: Most outputs of a sweep that may be cut by ``max_new_tokens`` (a small model can loop inside a free string).
MAX_CUT_SHARE = 0.1

SYSTEM = "You are a helpful assistant. Answer with JSON only."

#: (pattern, prompt): Rust ``regex`` syntax that Python's ``re`` reads the same way.
REGEXES = [
    (r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "What date is New Year's Day 2025? Answer as YYYY-MM-DD."),
    (r"\+?[0-9]{1,3} [0-9]{3} [0-9]{3} [0-9]{4}", "Write a phone number."),
    (r"(yes|no), because [a-z ,]{5,60}\.", "Is the sky blue? Answer yes or no and say why."),
    (r"[A-Z][a-z]+ [A-Z][a-z]+", "Name a famous scientist."),
    (r"(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])){3}", "Give an IP address."),
    (r"def [a-z_]+\([a-z_, ]*\):", "Write the first line of a Python function that adds two numbers."),
]

#: A Lark grammar (llguidance's dialect) and a Python regex describing the same language, to check the outputs.
LARK = r"""
start: "[" item ("," " " item)* "]"
item: WORD ":" " " NUMBER
WORD: /[a-z]{1,12}/
NUMBER: /[1-9][0-9]{0,3}/
"""
LARK_LANGUAGE = r"\[[a-z]{1,12}: [1-9][0-9]{0,3}(, [a-z]{1,12}: [1-9][0-9]{0,3})*\]"
LARK_PROMPTS = [
    "List two fruits with their prices in cents, like [apple: 120, pear: 90].",
    "List the number of legs of three animals, like [cat: 4].",
    "Give the populations in thousands of two towns as a list.",
]


def _validator(schema: dict[str, Any]) -> Any:
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


@dataclass
class Sweep:
    """What a sweep saw: invalid outputs (the test fails on any), outputs cut by length (counted apart)."""

    n: int = 0
    cut: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)

    def check(self, name: str, result: Any, valid: Any) -> None:
        self.n += 1
        if result.finish_reason == "length":
            self.cut.append(name)
            return
        # "grammar": the constraint is complete; "eos": an EOS the constraint allowed (it was accepting).
        if result.finish_reason not in ("grammar", "eos"):
            self.invalid.append(f"{name}: finish reason {result.finish_reason!r}")
            return
        try:
            valid(result.text)
        except Exception as e:  # any failure of the check is an invalid output, reported with its text
            self.invalid.append(f"{name}: {type(e).__name__}: {str(e)[:200]} in {result.text!r}")

    def assert_valid(self) -> None:
        assert not self.invalid, "\n".join(self.invalid)
        assert len(self.cut) <= MAX_CUT_SHARE * self.n, f"{len(self.cut)} of {self.n} cut by length: {self.cut}"


def _json_check(schema: dict[str, Any]) -> Any:
    v = _validator(schema)
    return lambda text: v.validate(json.loads(text))


def _regex_check(pattern: str) -> Any:
    def check(text: str) -> None:
        assert re.fullmatch(pattern, text), f"does not match {pattern!r}"

    return check


def _cases() -> list[tuple[str, dict[str, Any], Any]]:
    """Every request of a sweep: (name, request kwargs, check of the text)."""
    out = [
        (e["name"], {"messages": _chat(e["prompt"]), "json_schema": e["schema"]}, _json_check(e["schema"]))
        for e in SCHEMAS
    ]
    out += [(f"regex {i}", {"messages": _chat(p), "regex": rx}, _regex_check(rx)) for i, (rx, p) in enumerate(REGEXES)]
    out += [
        (f"lark {i}", {"messages": _chat(p), "grammar": LARK}, _regex_check(LARK_LANGUAGE))
        for i, p in enumerate(LARK_PROMPTS)
    ]
    return out


def _folders(model: str) -> tuple[Any, Any, Any, Any]:
    """(target, draft, batched target, batched draft) folders of ``model`` (pulled once, cached)."""
    from specrt import models

    if model == "smollm2":
        target = draft = "smollm2-135m-instruct"
    else:
        target, draft = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
    return (
        models.pull(target, progress=False),
        models.pull(draft, "int4", progress=False),
        models.pull(target, progress=False, attention="batched"),
        models.pull(draft, "int4", progress=False, attention="batched"),
    )


MODELS = [pytest.param("smollm2", id="smollm2"), pytest.param("qwen", id="qwen", marks=pytest.mark.qwen)]


@pytest.fixture(scope="module", params=MODELS)
def folders(request: pytest.FixtureRequest) -> tuple[str, tuple[Any, Any, Any, Any]]:
    return request.param, _folders(request.param)


def _settings(sampling: str, i: int) -> dict[str, Any]:
    return {"temperature": 0.0} if sampling == "greedy" else {"temperature": 0.7, "seed": 1000 + i}


@pytest.mark.parametrize("sampling", ["greedy", "t0.7"])
def test_single_stream_constrained_outputs_validate_with_and_without_speculation(folders, sampling: str) -> None:
    """Every constrained output of the set validates, speculative (K = 4, int4 draft) and target-only; greedy
    speculative output equals greedy target-only output token for token (fp32 target). At T = 0.7 target-only runs
    on every other case (its law is what speculation reproduces, tested by Monte Carlo in the Rust core; here it is
    the validity of the outputs that is checked, and the CI minutes are spent on the speculative path)."""
    import specrt

    _, (target, draft, _, _) = folders
    dec = specrt.Decoder(target, draft, max_seq_len=1024)
    spec, plain = Sweep(), Sweep()
    for i, (name, req, check) in enumerate(_cases()):
        s = _settings(sampling, i)
        a = dec.generate(**req, **s, max_new_tokens=MAX_NEW_TOKENS, num_speculative_tokens=4)
        spec.check(name, a, check)
        if sampling == "greedy" or i % 2 == 0:
            b = dec.generate(**req, **s, max_new_tokens=MAX_NEW_TOKENS, num_speculative_tokens=0)
            plain.check(name, b, check)
            if sampling == "greedy":
                assert a.token_ids == b.token_ids, f"{name}: speculative {a.text!r} != target-only {b.text!r}"
    spec.assert_valid()
    plain.assert_valid()


def test_batched_constrained_outputs_validate(folders) -> None:
    """The same set through batched rounds (``max_batch`` 4, each row its own constraint): greedy and T = 0.7
    requests, speculative (K = 4) and target-only (K = 0), mixed in the same batches."""
    import specrt
    from specrt.scheduler import Scheduler

    _, (_, _, target, draft) = folders
    dec = specrt.Decoder(target, draft, max_batch=4, max_seq_len=1024)
    cases = _cases()
    sweep = Sweep()
    with Scheduler(dec, max_queue=len(cases)) as sched:
        handles = [
            sched.submit(
                **req,
                **_settings("greedy" if i % 2 == 0 else "t0.7", i),
                max_new_tokens=MAX_NEW_TOKENS,
                num_speculative_tokens=4 if i % 4 < 3 else 0,
            )
            for i, (_, req, _) in enumerate(cases)
        ]
        for h, (name, _, check) in zip(handles, cases, strict=True):
            sweep.check(name, h.result(timeout=1800), check)
    sweep.assert_valid()
