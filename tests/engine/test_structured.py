"""Structured output from Python (``Decoder.stream(response_format= / json_schema= / regex= / grammar= / choice=)``),
the CLI flags and the refusals, on SmolLM2-135M (fp32 target, its int4 copy as the draft; skipped when the cache has
none). The exactness argument and the Monte Carlo tests of constrained speculation are Rust's
(``rust/specrt-core/tests/constrained.rs``); the certificate's constrained case is in tests/engine/test_certify.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import specrt
from specrt import _specrt
from specrt.errors import ConfigError
from specrt.generate import check_request
from specrt.models import cache_dir

SMOL = cache_dir() / "models" / "smollm2-135m-instruct"

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email"},
    },
    "required": ["name", "age", "email"],
    "additionalProperties": False,
}
REGEX = r"(yes|no), [0-9]{1,3} (apples|pears)"
CHOICES = ["red", "green", "blue"]
GRAMMAR = """
start: "The answer is " NUMBER "."
NUMBER: /[0-9]{1,4}/
"""

# (request fields, prompt)
CASES = {
    "json_schema": ({"json_schema": SCHEMA}, "Give a person as JSON with name, age and email."),
    "json_schema_strict": (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA, "strict": True}}},
        "Give a person as JSON with name, age and email.",
    ),
    "json_object": ({"response_format": {"type": "json_object"}}, "Describe a cat as a JSON object."),
    "regex": ({"regex": REGEX}, "Do you like fruit? How many, and which?"),
    "choice": ({"choice": CHOICES}, "What colour is the sky?"),
    "grammar": ({"grammar": GRAMMAR}, "What is 12 times 12?"),
}


@pytest.fixture(scope="module")
def smol() -> specrt.Decoder:
    if not (SMOL / "fp32" / "model.onnx").is_file() or not (SMOL / "int4" / "model.onnx").is_file():
        pytest.skip("SmolLM2 fp32 and int4 are not in the cache (specrt models pull smollm2-135m-instruct)")
    return specrt.Decoder(SMOL / "fp32", SMOL / "int4", max_seq_len=384)


def _messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def _check_valid(kind: str, fields: dict, text: str) -> None:
    """The finished output satisfies its constraint (checked by independent Python code)."""
    if kind.startswith("json_schema"):
        jsonschema.validate(json.loads(text), SCHEMA, format_checker=jsonschema.FormatChecker())
    elif kind == "json_object":
        assert isinstance(json.loads(text), dict)
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    elif kind == "choice":
        assert text in CHOICES
    elif kind == "grammar":
        assert re.fullmatch(r"The answer is [0-9]{1,4}\.", text), text


@pytest.mark.parametrize("kind", list(CASES))
def test_greedy_speculative_equals_greedy_target_only_and_the_output_is_valid(smol, kind: str) -> None:
    fields, prompt = CASES[kind]
    kw = {"messages": _messages(prompt), "max_new_tokens": 40, "temperature": 0.0, **fields}
    ref = smol.generate(proposer="none", num_speculative_tokens=0, **kw)
    spec = smol.generate(num_speculative_tokens=4, **kw)
    assert spec.token_ids == ref.token_ids
    assert spec.finish_reason == ref.finish_reason
    if ref.finish_reason in ("grammar", "eos"):
        _check_valid(kind, fields, ref.text)
    # (A one-token answer, "blue" of the choices, comes from the prefill's last row: no round drafts for it.)
    assert spec.stats.n_drafted > 0 or len(spec.token_ids) == 1
    assert spec.stats.mask_ms > 0 and ref.stats.mask_ms > 0


def test_every_case_finishes_by_its_grammar_at_least_once(smol) -> None:
    # The parity test above is vacuous about validity when nothing finishes: the short constraints must finish.
    for kind in ("regex", "choice", "grammar", "json_schema"):
        fields, prompt = CASES[kind]
        res = smol.generate(messages=_messages(prompt), max_new_tokens=40, temperature=0.0, **fields)
        assert res.finish_reason in ("grammar", "eos"), (kind, res.text)
        _check_valid(kind, fields, res.text)


def test_forced_tokens_are_drafted_and_counted(smol) -> None:
    fields, prompt = CASES["json_schema"]
    res = smol.generate(messages=_messages(prompt), max_new_tokens=40, temperature=0.0, **fields)
    s = res.stats
    # Keys and punctuation are forced: proposed without a draft pass, part of n_drafted / n_accepted.
    assert 0 < s.n_drafted_forced <= s.n_drafted
    assert 0 < s.n_accepted_forced <= s.n_accepted
    assert s.as_dict()["n_drafted_forced"] == s.n_drafted_forced


def test_sampled_constrained_output_is_valid_and_repeats_with_its_seed(smol) -> None:
    fields, prompt = CASES["json_schema"]
    kw = {"messages": _messages(prompt), "max_new_tokens": 60, "temperature": 0.7, "num_speculative_tokens": 3}
    outs = [smol.generate(seed=seed, **kw, **fields) for seed in (1, 2, 1)]
    assert outs[0].token_ids == outs[2].token_ids
    for res in outs:
        if res.finish_reason == "grammar":
            _check_valid("json_schema", fields, res.text)
    assert any(res.finish_reason == "grammar" for res in outs)


def test_stream_chunks_add_up_to_the_constrained_result(smol) -> None:
    chunks = list(smol.stream(messages=_messages("Pick a colour."), max_new_tokens=10, temperature=0.0, choice=CHOICES))
    assert chunks[-1].result is not None
    assert "".join(c.text for c in chunks) == chunks[-1].result.text
    assert chunks[-1].finish_reason == "grammar"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"json_schema": {"type": "object", "properties": 5}}, r"^json_schema .* is invalid"),
        ({"json_schema": "{not json"}, r"^json_schema \"\{not json\" is invalid"),
        ({"regex": "(unclosed"}, r"^regex \"\(unclosed\" is invalid"),
        ({"grammar": "start: undefined_rule"}, r"^grammar .* is invalid"),
        ({"regex": "a", "choice": ["a"]}, r"at most one of .* \(got regex and choice\)"),
        ({"response_format": {"type": "xml"}}, r"^response_format type \"xml\" is invalid \(expected one of: 'text'"),
        ({"choice": []}, r"^choice \[\] is invalid"),
        ({"regex": 5}, r"^regex 5 is invalid \(expected a string"),
    ],
)
def test_bad_constraints_are_refused_naming_the_field(fields: dict, message: str) -> None:
    # Refused by the one resolver, without a model (what Decoder.stream and the CLI run first).
    with pytest.raises(ConfigError, match=message):
        check_request("Decoder.generate", has_draft=False, **fields)
    with pytest.raises(ConfigError, match=message):
        _specrt.resolve_request(fields, has_draft=False)


def test_a_bad_constraint_is_refused_before_the_decoder_runs(smol) -> None:
    with pytest.raises(ConfigError, match=r"^regex"):
        smol.generate("Hi", regex="[", max_new_tokens=4)
    # The decoder stays usable.
    assert smol.generate("Hi", max_new_tokens=2, temperature=0.0).token_ids


def test_constraint_masks_are_the_engines_masks(smol) -> None:
    # What `specrt certify` scores with: row t allows what may follow the first t tokens, EOS only where accepting.
    eos = smol.eos_token_ids
    config, _, _ = _specrt.resolve_request({"choice": ["red", "blue"]}, has_draft=False, eos_token_ids=eos)
    masks = _specrt.ConstraintMasks(smol.target_path, config, smol.vocab_size)
    assert masks.kind == "choice"
    red = smol.tokenizer.encode("red", add_special_tokens=False).ids
    m = masks.masks(red)
    assert m.shape == (len(red), smol.vocab_size) and m.dtype == bool
    assert m[0, red[0]] and not m[0, eos].any()
    assert 1 < m[0].sum() < smol.vocab_size / 10
    # "red" is complete: the request ends there (finish reason "grammar"), nothing may follow, not even EOS.
    with pytest.raises(ConfigError, match=f"position {len(red)} follows the end of the constraint"):
        masks.masks([*red, eos[0]])
    # The engine agrees: greedy decoding under the same choice emits only allowed tokens.
    res = smol.generate("Colour:", choice=["red", "blue"], max_new_tokens=8, temperature=0.0)
    assert res.text in ("red", "blue") and res.finish_reason == "grammar"
    assert masks.masks(res.token_ids)[np.arange(len(res.token_ids)), res.token_ids].all()
    green = smol.tokenizer.encode("green", add_special_tokens=False).ids
    with pytest.raises(ConfigError, match=r"output token .* at position 0"):
        masks.masks(green)
    with pytest.raises(ConfigError, match="has none"):
        _specrt.ConstraintMasks(smol.target_path, _specrt.RequestConfig(max_new_tokens=4), smol.vocab_size)


def test_text_response_format_is_no_constraint() -> None:
    config, _, _ = _specrt.resolve_request({"response_format": {"type": "text"}}, has_draft=False)
    assert config.constraint_kind is None
    config, _, _ = _specrt.resolve_request({"json_schema": json.dumps(SCHEMA)}, has_draft=False)
    assert config.constraint_kind == "json_schema"


def test_batched_constrained_output_equals_single_stream_constrained_output(smol) -> None:
    """Batched rounds (the ``-B`` folders, ``max_batch`` 4): each row its own constraint, one row unconstrained, all
    in the same rounds; greedy, each output equals the single-stream decoder's token for token."""
    from specrt.scheduler import Scheduler

    tb, db = SMOL / "fp32-B", SMOL / "int4-B"
    if not (tb / "model.onnx").is_file() or not (db / "model.onnx").is_file():
        pytest.skip("SmolLM2 fp32-B / int4-B (batched layout) are not in the cache")
    dec = specrt.Decoder(tb, db, max_batch=4, max_seq_len=384)
    reqs = [
        {"messages": _messages(prompt), "max_new_tokens": 40, "temperature": 0.0, **fields}
        for fields, prompt in (CASES["json_schema"], CASES["regex"], CASES["choice"], CASES["grammar"])
    ]
    reqs.append({"messages": _messages("Name three colours."), "max_new_tokens": 16, "temperature": 0.0})
    with Scheduler(dec, max_queue=len(reqs)) as sched:
        handles = [sched.submit(**r, num_speculative_tokens=4) for r in reqs]
        outs = [h.result(timeout=600) for h in handles]
    for r, out in zip(reqs, outs, strict=True):
        ref = smol.generate(**r, num_speculative_tokens=4)
        assert out.token_ids == ref.token_ids, (out.text, ref.text)
        assert out.finish_reason == ref.finish_reason
    assert sum(o.stats.n_drafted_forced for o in outs) > 0
    with pytest.raises(ConfigError, match="json_schema"):
        dec.generate("Hi", json_schema={"type": "nope"}, max_new_tokens=4)


def test_cli_flags_constrain_generate(smol, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specrt.cli import main

    base = ["generate", "--target", str(SMOL / "fp32"), "--max-seq-len", "256", "--temperature", "0", "--json"]
    assert main([*base, "--prompt", "Colour?", "--max-new-tokens", "8", "--choice", "red", "--choice", "blue"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] in ("red", "blue") and out["finish_reason"] == "grammar"

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    assert main([*base, "--prompt", "A person:", "--max-new-tokens", "48", "--json-schema", str(schema)]) == 0
    out = json.loads(capsys.readouterr().out)
    if out["finish_reason"] == "grammar":
        _check_valid("json_schema", {}, out["text"])
    assert out["text"].startswith('{"name": "')

    lark = tmp_path / "g.lark"
    lark.write_text(GRAMMAR)
    assert main([*base, "--prompt", "12*12?", "--max-new-tokens", "12", "--grammar", str(lark)]) == 0
    assert json.loads(capsys.readouterr().out)["text"].startswith("The answer is ")


def test_cli_refusals_name_the_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specrt.cli import main

    # Checked before any model loads: the target need not exist.
    base = ["generate", "--target", str(tmp_path / "no-model"), "--prompt", "x"]
    assert main([*base, "--regex", "("]) == 2
    assert re.search(r"error: --regex \"\(\" is invalid", capsys.readouterr().err)
    assert main([*base, "--regex", "a", "--choice", "a", "--choice", "b"]) == 2
    err = capsys.readouterr().err
    assert "at most one of --json-object, --json-schema, --regex, --grammar, --choice (got --regex and --choice)" in err
    assert main([*base, "--json-schema", str(tmp_path / "missing.json")]) == 2
    assert "cannot read --json-schema" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    assert main([*base, "--json-schema", str(bad)]) == 2
    assert "error: --json-schema" in capsys.readouterr().err
