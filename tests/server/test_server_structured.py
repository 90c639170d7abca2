"""Structured output and tool calls in ``specrt serve`` (issue 28), with the real openai SDK against a live server on
SmolLM2-135M (fp32 target, its int4 copy as the draft; skipped when the cache has none): ``response_format``
json_schema (strict) / json_object, ``chat.completions.parse`` with a pydantic model, vLLM's ``guided_*`` and
``structured_outputs`` aliases, ``tools`` with ``tool_choice`` required / named / auto (``message.tool_calls``,
streamed deltas, tool results in the history), the refusals (400 in OpenAI's error schema naming the field, before
the request queues), and greedy speculative == greedy target-only. The parser and the grammar of the tool-call format
are checked without a model too (and against Qwen2.5's tokenizer, whose ``<tool_call>`` is one added token)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")

import specrt  # noqa: E402
from specrt import _specrt  # noqa: E402
from specrt.errors import ConfigError  # noqa: E402
from specrt.generate import check_request  # noqa: E402
from specrt.models import cache_dir  # noqa: E402
from specrt.server import create_app  # noqa: E402
from specrt.toolcalls import ToolCallParser, tool_call_grammar  # noqa: E402
from test_server_clients import _live, _sdk  # noqa: E402
from test_structured import SCHEMA  # noqa: E402  (the same person schema as the Python API tests)

SMOL = cache_dir() / "models" / "smollm2-135m-instruct"
QWEN = cache_dir() / "models" / "qwen2.5-coder-0.5b-instruct" / "fp32"

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "description": "Time in a timezone", "parameters": TIME}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
GREEDY = {"model": "smol", "temperature": 0, "max_tokens": 80}
FORMATS = jsonschema.FormatChecker()


@pytest.fixture(scope="module")
def decoders() -> SimpleNamespace:
    if not (SMOL / "fp32" / "model.onnx").is_file() or not (SMOL / "int4" / "model.onnx").is_file():
        pytest.skip("SmolLM2 fp32 and int4 are not in the cache (specrt models pull smollm2-135m-instruct)")
    return SimpleNamespace(
        draft=specrt.Decoder(SMOL / "fp32", SMOL / "int4", max_seq_len=768),
        target_only=specrt.Decoder(SMOL / "fp32", max_seq_len=768),
    )


@pytest.fixture(scope="module")
def served(decoders):
    app = create_app(decoders.draft, model_name="smol", num_speculative_tokens=3)
    with _live(app) as base:
        yield SimpleNamespace(base=base, app=app)


@pytest.fixture(scope="module")
def served_target_only(decoders):
    app = create_app(decoders.target_only, model_name="smol")
    with _live(app) as base:
        yield SimpleNamespace(base=base, app=app)


def _check_calls(message, names: set[str] | None = None) -> list[tuple[str, dict]]:
    """The message's tool calls as (name, arguments), each valid against its function's schema."""
    assert message.content is None and message.tool_calls
    out = []
    for call in message.tool_calls:
        assert call.type == "function" and re.fullmatch(r"call_[0-9a-f]{24}", call.id)
        assert call.function.name in (names or SCHEMAS)
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name], format_checker=FORMATS)
        out.append((call.function.name, args))
    return out


# ----- response_format and chat.completions.parse ---------------------------------------------------------------
def test_response_format_json_schema_strict_and_json_object(served) -> None:
    person = [{"role": "user", "content": "Give a person as JSON with name, age and email."}]
    strict = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    with _sdk(served.base) as client:
        r = client.chat.completions.create(messages=person, response_format=strict, **GREEDY)
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA, format_checker=FORMATS)
        r = client.chat.completions.create(
            messages=person,
            response_format={"type": "json_object"},
            model="smol",
            temperature=0,
            max_tokens=256,
        )
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content  # a complete object, not cut
        assert isinstance(json.loads(r.choices[0].message.content), dict)
        # Completions take response_format too (as vLLM's).
        r = client.completions.create(
            prompt="A person as JSON:",
            extra_body={"response_format": strict},
            model="smol",
            temperature=0,
            max_tokens=80,
        )
        jsonschema.validate(json.loads(r.choices[0].text), SCHEMA, format_checker=FORMATS)


def test_parse_with_a_pydantic_model_returns_the_parsed_object(served) -> None:
    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=12)
        age: int = pydantic.Field(ge=0, le=120)

    person = [{"role": "user", "content": "Give a person as JSON with name and age."}]
    with _sdk(served.base) as client:
        parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
        r = parse(messages=person, response_format=Person, **GREEDY)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Person) and 0 <= parsed.age <= 120
    assert parsed == Person.model_validate_json(r.choices[0].message.content)


# ----- vLLM's aliases --------------------------------------------------------------------------------------------
ALIASES = {
    "guided_json": ({"guided_json": SCHEMA}, "json"),
    "guided_json_text": ({"guided_json": json.dumps(SCHEMA)}, "json"),
    "guided_regex": ({"guided_regex": r"(yes|no), [0-9]{1,3} (apples|pears)"}, "regex"),
    "guided_choice": ({"guided_choice": ["red", "green", "blue"]}, "choice"),
    "guided_grammar": ({"guided_grammar": 'start: "The answer is " NUMBER "."\nNUMBER: /[0-9]{1,4}/\n'}, "grammar"),
    "structured_outputs.json": ({"structured_outputs": {"json": SCHEMA}}, "json"),
    "structured_outputs.regex": ({"structured_outputs": {"regex": r"(yes|no), [0-9]{1,3} (apples|pears)"}}, "regex"),
    "structured_outputs.choice": ({"structured_outputs": {"choice": ["red", "green", "blue"]}}, "choice"),
    "structured_outputs.grammar": (
        {"structured_outputs": {"grammar": 'start: "The answer is " NUMBER "."\nNUMBER: /[0-9]{1,4}/\n'}},
        "grammar",
    ),
    "structured_outputs.json_object": ({"structured_outputs": {"json_object": True}}, "object"),
}


@pytest.mark.parametrize("alias", list(ALIASES))
def test_each_vllm_alias_constrains_the_output(served, alias: str) -> None:
    fields, kind = ALIASES[alias]
    with _sdk(served.base) as client:
        r = client.chat.completions.create(
            messages=[{"role": "user", "content": "Answer briefly: do you like fruit?"}], extra_body=fields, **GREEDY
        )
    text = r.choices[0].message.content
    if kind == "json":
        jsonschema.validate(json.loads(text), SCHEMA, format_checker=FORMATS)
    elif kind == "object":
        assert isinstance(json.loads(text), dict)
    elif kind == "regex":
        assert re.fullmatch(r"(yes|no), [0-9]{1,3} (apples|pears)", text)
    elif kind == "choice":
        assert text in ("red", "green", "blue")
    else:
        assert re.fullmatch(r"The answer is [0-9]{1,4}\.", text)
    assert r.choices[0].finish_reason == "stop"


# ----- tools ------------------------------------------------------------------------------------------------------
def test_tool_choice_required_and_named_give_valid_tool_calls(served) -> None:
    with _sdk(served.base) as client:
        r = client.chat.completions.create(
            messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, **GREEDY
        )
        assert r.choices[0].finish_reason == "tool_calls"
        assert len(_check_calls(r.choices[0].message)) == 1
        named = {"type": "function", "function": {"name": "get_time"}}
        r = client.chat.completions.create(messages=ASK, tools=TOOLS, tool_choice=named, **GREEDY)
        assert r.choices[0].finish_reason == "tool_calls"
        assert [n for n, _ in _check_calls(r.choices[0].message, {"get_time"})] == ["get_time"]


def test_streamed_tool_call_deltas_reassemble_to_the_same_call(served) -> None:
    settings = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, **GREEDY}
    with _sdk(served.base) as client:
        whole = client.chat.completions.create(**settings).choices[0].message.tool_calls
        calls: dict[int, dict] = {}
        finish = None
        n_pieces = 0
        for chunk in client.chat.completions.create(stream=True, **settings):
            for c in chunk.choices:
                finish = c.finish_reason or finish
                for d in c.delta.tool_calls or []:
                    if d.id is not None:  # the first delta of a call: id, type and name
                        assert d.index not in calls and d.type == "function"
                        calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                    calls[d.index]["arguments"] += d.function.arguments or ""
                    n_pieces += bool(d.function.arguments)
    assert finish == "tool_calls" and n_pieces >= 2  # the arguments came in pieces
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (w.function.name, w.function.arguments) for w in whole
    ]


def _streamed_calls(client, settings: dict) -> tuple[list[tuple[str, str]], str | None]:
    """The tool calls a stream's deltas add up to, and its finish reason."""
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **settings):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            for d in c.delta.tool_calls or []:
                if d.id is not None:
                    calls[d.index] = {"name": d.function.name, "arguments": ""}
                calls[d.index]["arguments"] += d.function.arguments or ""
    return [(c["name"], c["arguments"]) for c in calls.values()], finish


@pytest.mark.parametrize("cut", [{"max_tokens": 20}, {"stop": ["</tool_call>"]}], ids=["max_tokens", "stop"])
def test_a_tool_call_cut_short_is_the_same_call_streamed_or_not(served, cut: dict) -> None:
    """Found by client testing: a cut call came back as text whole but as a tool-call delta streamed."""
    settings = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    settings |= {**GREEDY, **cut}
    with _sdk(served.base) as client:
        whole = client.chat.completions.create(**settings).choices[0]
        streamed, finish = _streamed_calls(client, settings)
    assert whole.finish_reason == finish and finish in ("length", "stop"), (whole.finish_reason, finish)
    assert whole.message.content is None and whole.message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == streamed


def test_tool_results_in_the_history_are_answered(served) -> None:
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees, sunny"},
    ]
    with _sdk(served.base) as client:
        r = client.chat.completions.create(messages=history, tools=TOOLS, tool_choice="none", **GREEDY)
        assert isinstance(r.choices[0].message.content, str) and not r.choices[0].message.tool_calls
        r = client.chat.completions.create(messages=history, tools=TOOLS, tool_choice="required", **GREEDY)
        assert r.choices[0].finish_reason in ("tool_calls", "length")


def _calls_text(calls: list[tuple[str, dict]]) -> str:
    return "\n".join(
        f'<tool_call>\n{{"name": {json.dumps(n)}, "arguments": {json.dumps(a)}}}\n</tool_call>' for n, a in calls
    )


#: A few-shot history that teaches SmolLM2 (whose template ignores ``tools``) to start a tool call.
FEW_SHOT = [
    {"role": "system", "content": 'To call a tool answer <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>'},
    {"role": "user", "content": "What is the weather in Rome, in celsius?"},
    {
        "role": "assistant",
        "content": _calls_text([("get_weather", {"city": "Rome", "unit": "celsius"})]),
    },
    {"role": "user", "content": "What is the weather in Oslo, in celsius?"},
    {
        "role": "assistant",
        "content": _calls_text([("get_weather", {"city": "Oslo", "unit": "celsius"})]),
    },
    *ASK,
]


def test_tool_choice_auto_gives_text_or_a_parsed_tool_call(served) -> None:
    plain = [{"role": "user", "content": "Say hello."}]
    with _sdk(served.base) as client:
        # Text: what tool_choice "none" gives, token for token (the text branch only bars starting with the tag).
        auto = client.chat.completions.create(messages=plain, tools=TOOLS, tool_choice="auto", **GREEDY)
        none = client.chat.completions.create(messages=plain, tools=TOOLS, tool_choice="none", **GREEDY)
        assert not none.choices[0].message.content.startswith("<tool_call>")
        assert auto.choices[0].message.content == none.choices[0].message.content
        assert auto.choices[0].message.tool_calls is None and auto.choices[0].finish_reason != "tool_calls"
        # A call the model starts is constrained from its start and parsed.
        r = client.chat.completions.create(messages=FEW_SHOT, tools=TOOLS, tool_choice="auto", **GREEDY)
        assert r.choices[0].finish_reason == "tool_calls"
        _check_calls(r.choices[0].message)


#: A few-shot history whose answers say a sentence before the call.
FEW_SHOT_TEXT = [
    {"role": "system", "content": 'To call a tool answer <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>'},
    {"role": "user", "content": "What is the weather in Rome, in celsius?"},
    {
        "role": "assistant",
        "content": "I will check Rome.\n" + _calls_text([("get_weather", {"city": "Rome", "unit": "celsius"})]),
    },
    {"role": "user", "content": "What is the weather in Oslo, in celsius?"},
    {
        "role": "assistant",
        "content": "I will check Oslo.\n" + _calls_text([("get_weather", {"city": "Oslo", "unit": "celsius"})]),
    },
    *ASK,
]


def test_tool_choice_auto_parses_a_call_after_text_streamed_or_not(served) -> None:
    """A call the model starts after a sentence: the sentence is the content, the call is parsed and valid, and a
    stream's content and tool-call deltas add up to the same message."""
    settings = {"messages": FEW_SHOT_TEXT, "tools": TOOLS, "tool_choice": "auto", **GREEDY}
    with _sdk(served.base) as client:
        c = client.chat.completions.create(**settings).choices[0]
        assert c.finish_reason == "tool_calls", c.message
        assert c.message.content and c.message.content == c.message.content.rstrip(), c.message
        _check_calls(SimpleNamespace(content=None, tool_calls=c.message.tool_calls))
        content = ""
        for chunk in client.chat.completions.create(stream=True, **settings):
            content += "".join(ch.delta.content or "" for ch in chunk.choices)
        calls, finish = _streamed_calls(client, settings)
    assert content == c.message.content and finish == "tool_calls"
    assert calls == [(t.function.name, t.function.arguments) for t in c.message.tool_calls]


def test_greedy_speculative_equals_greedy_target_only(served, served_target_only) -> None:
    strict = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER, "strict": True}}
    requests = [
        {"messages": ASK, "response_format": strict},
        {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
        {"messages": FEW_SHOT, "tools": TOOLS, "tool_choice": "auto"},
        {"messages": FEW_SHOT_TEXT, "tools": TOOLS, "tool_choice": "auto"},
    ]
    outs = []
    for s in (served, served_target_only):
        with _sdk(s.base) as client:
            got = []
            for body in requests:
                m = client.chat.completions.create(**body, **GREEDY).choices[0].message
                got.append((m.content, [(c.function.name, c.function.arguments) for c in m.tool_calls or []]))
            outs.append(got)
    assert outs[0] == outs[1]


# ----- refusals ---------------------------------------------------------------------------------------------------
BAD = [
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
        "response_format",
        "bogus",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}},
        "response_format.json_schema.name",
        "1 to 64 letters",
    ),
    ({"guided_regex": "(unclosed"}, "guided_regex", "unclosed"),
    ({"guided_json": "{not json"}, "guided_json", "json_schema"),
    ({"guided_choice": []}, "guided_choice", "non-empty"),
    (
        {"guided_regex": "a+", "response_format": {"type": "json_object"}},
        "guided_regex",
        "response_format and guided_regex",
    ),
    ({"structured_outputs": {"json": SCHEMA, "regex": "a"}}, "structured_outputs.regex", "structured_outputs.json and"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag", "structural tags"),
    ({"structured_outputs": {"bogus": 1}}, "structured_outputs.bogus", "accepted keys"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "'nope'"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    (
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}],
            "tool_choice": "required",
        },
        "tools.0.function.parameters",
        "bogus",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "get weather"}}]},
        "tools.0.function.name",
        "'get weather' is invalid",
    ),
    (
        {"tools": [*TOOLS, {"type": "function", "function": {"name": "get_time"}}], "tool_choice": "auto"},
        f"tools.{len(TOOLS)}.function.name",
        "must be unique",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
        "tools.0.function.parameters",
        "type 'string' is invalid",
    ),
    (
        {"tools": TOOLS, "tool_choice": "required", "guided_choice": ["a"]},
        "tool_choice",
        "guided_choice and tool_choice",
    ),
]


@pytest.mark.parametrize(("fields", "param", "message"), BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_constraints_are_a_400_naming_the_field_before_queueing(
    served, monkeypatch: pytest.MonkeyPatch, fields: dict, param: str, message: str
) -> None:
    # Refused by the server's own checks or by the submission's resolution (Scheduler.submit raises): either way
    # no submission succeeds, so nothing of the request is queued.
    scheduler = served.app.state.scheduler
    queued, submit = [], scheduler.submit

    def recorded(*a, **k):
        queued.append(submit(*a, **k))
        return queued[-1]

    monkeypatch.setattr(scheduler, "submit", recorded)
    with _sdk(served.base, max_retries=0) as client, pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(messages=ASK, extra_body=fields, **GREEDY)
    err = e.value.body
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert message in err["message"], err["message"]
    assert queued == []


# ----- the tool-call format, without the server -------------------------------------------------------------------
@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_parser_deltas_in_any_pieces_add_up_to_the_calls(step: int) -> None:
    calls = [("get_weather", {"city": "Pa}ris", "unit": "celsius"}), ("get_time", {"timezone": "Europe/Paris"})]
    text = _calls_text(calls)
    p = ToolCallParser()
    got: dict[int, dict] = {}
    for i in range(0, len(text), step):
        deltas, content = p.feed(text[i : i + step])
        assert content == ""
        for d in deltas:
            if "id" in d:
                got[d["index"]] = {"name": d["function"]["name"], "arguments": d["function"]["arguments"]}
            else:
                got[d["index"]]["arguments"] += d["function"]["arguments"]
    assert p.complete
    assert [(g["name"], json.loads(g["arguments"])) for g in got.values()] == calls
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in p.tool_calls()] == calls


@pytest.mark.parametrize("text", ["Hello!", "<tool", "<tool_cal", "<b>bold</b>", ""])
def test_parser_in_auto_mode_passes_text_through(text: str) -> None:
    p = ToolCallParser(text_allowed=True)
    out = "".join(p.feed(ch)[1] for ch in text) + p.finish()[1]
    assert out == text and not p.complete and p.tool_calls() == []


def test_parser_in_auto_mode_parses_a_call_it_starts() -> None:
    text = _calls_text([("get_time", {"timezone": "Europe/Oslo"})])
    p = ToolCallParser(text_allowed=True)
    content = "".join(p.feed(text[i : i + 4])[1] for i in range(0, len(text), 4)) + p.finish()[1]
    assert content == "" and p.complete and p.tool_calls()[0]["function"]["name"] == "get_time"


@pytest.mark.parametrize("step", [1, 2, 3, 5, 1000])
@pytest.mark.parametrize("before", ["Let me check that.\n\n", "  ", "Tags like <tool or <b> are text. "])
def test_parser_in_auto_mode_parses_a_call_after_text(step: int, before: str) -> None:
    """Text, then a call: the text before the tag is the content (trailing whitespace dropped), streamed in any
    pieces or whole, and the call is parsed as when it starts the answer."""
    calls = [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"timezone": "Europe/Oslo"})]
    text = before + _calls_text(calls)
    p = ToolCallParser(text_allowed=True)
    streamed, got = "", {}
    for i in range(0, len(text), step):
        deltas, content = p.feed(text[i : i + step])
        streamed += content
        for d in deltas:
            got.setdefault(d["index"], "")
            got[d["index"]] += d["function"]["arguments"]
    streamed += p.finish()[1]
    assert streamed == p.content == (before.rstrip() or "")
    assert p.complete and [json.loads(a) for a in got.values()] == [a for _, a in calls]
    assert [c["function"]["name"] for c in p.tool_calls()] == ["get_weather", "get_time"]


def test_parser_in_auto_mode_holds_back_only_what_may_be_the_tag() -> None:
    p = ToolCallParser(text_allowed=True)
    assert p.feed("Hi <tool")[1] == "Hi"  # " <tool" may still become the tag
    assert p.feed("box> and")[1] == " <toolbox> and"
    assert p.feed(" \n")[1] == ""
    assert p.finish()[1] == " \n" and p.content == "Hi <toolbox> and \n"


def test_the_grammar_takes_qwens_single_tool_call_token_and_only_the_format() -> None:
    if not (QWEN / "tokenizer.json").is_file():
        pytest.skip("Qwen2.5-Coder 0.5B is not in the cache")
    tok = _specrt.Tokenizer.from_file(QWEN / "tokenizer.json")
    spec = json.loads((QWEN / "specrt_config.json").read_text())
    fns = [t["function"] for t in TOOLS]
    text = _calls_text([("get_weather", {"city": "Paris", "unit": "celsius"})])
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids[0] == 151657 and ids[-1] == 151658  # <tool_call> and </tool_call>: one added token each
    for auto in (False, True):
        grammar = tool_call_grammar(fns, multiple=True, text_allowed=auto)
        config, _, _ = _specrt.resolve_request(
            {"grammar": grammar, "max_new_tokens": 64}, has_draft=False, eos_token_ids=spec["eos_token_ids"]
        )
        constraint = _specrt.ConstraintMasks(QWEN, config, spec["vocab_size"])
        masks = constraint.masks(ids)
        assert masks[np.arange(len(ids)), ids].all()
        # Forced: the tag is the only first token; auto: text may start there too.
        assert (masks[0].sum() == 1) is not auto
        # A value outside the function's schema is refused at its first token.
        bad = tok.encode(_calls_text([("get_weather", {"city": "Paris", "unit": "kelvin"})]), False).ids
        n = next(i for i, (a, b) in enumerate(zip(ids, bad, strict=False)) if a != b)
        with pytest.raises(ConfigError, match=f"position {n}"):
            constraint.masks(bad[: n + 1])


def test_auto_grammar_takes_text_then_calls_and_nothing_after_them() -> None:
    """tool_choice auto on Qwen's tokenizer: text then a call is allowed (the tag token after text), text after the
    last call is refused, and text that never writes the tag may end anywhere."""
    if not (QWEN / "tokenizer.json").is_file():
        pytest.skip("Qwen2.5-Coder 0.5B is not in the cache")
    tok = _specrt.Tokenizer.from_file(QWEN / "tokenizer.json")
    spec = json.loads((QWEN / "specrt_config.json").read_text())
    grammar = tool_call_grammar([t["function"] for t in TOOLS], multiple=True, text_allowed=True)
    config, _, _ = _specrt.resolve_request(
        {"grammar": grammar, "max_new_tokens": 64}, has_draft=False, eos_token_ids=spec["eos_token_ids"]
    )
    constraint = _specrt.ConstraintMasks(QWEN, config, spec["vocab_size"])
    eos = spec["eos_token_ids"][0]
    call = _calls_text([("get_time", {"timezone": "Europe/Oslo"})])
    ids = tok.encode("I will look it up.\n" + call, add_special_tokens=False).ids
    assert 151657 in ids[1:]  # the tag token after text
    masks = constraint.masks([*ids, eos])
    assert masks[np.arange(len(ids) + 1), [*ids, eos]].all()
    text_ids = tok.encode("Plain text, no call.", add_special_tokens=False).ids
    masks = constraint.masks([*text_ids, eos])
    assert masks[np.arange(len(text_ids) + 1), [*text_ids, eos]].all()
    after = tok.encode(" Done.", add_special_tokens=False).ids
    with pytest.raises(ConfigError, match=f"position {len(ids)}"):
        constraint.masks([*ids, *after])


def test_tool_grammar_errors_name_the_function_schema() -> None:
    bad = [{"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "bogus"}}}, "strict": True}]
    with pytest.raises(ConfigError, match="bogus"):
        check_request(has_draft=False, max_new_tokens=4, grammar=tool_call_grammar(bad, multiple=False))


def test_batched_server_gives_the_single_stream_answers_in_shared_rounds(served) -> None:
    """``--max-batch 4``: constrained rows (a schema, tool calls, auto text) and a free one, sent together so they
    share batched rounds, answer greedily as the single-stream server does."""
    from concurrent.futures import ThreadPoolExecutor

    if not (SMOL / "fp32-B" / "model.onnx").is_file() or not (SMOL / "int4-B" / "model.onnx").is_file():
        pytest.skip("SmolLM2 fp32-B / int4-B (batched layout) are not in the cache")
    dec = specrt.Decoder(SMOL / "fp32-B", SMOL / "int4-B", max_seq_len=768, max_batch=4)
    strict = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER, "strict": True}}
    requests = [
        {"messages": ASK, "response_format": strict},
        {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
        {"messages": FEW_SHOT, "tools": TOOLS, "tool_choice": "auto"},
        {"messages": ASK},
    ]

    def answers(base: str) -> list:
        with _sdk(base) as client, ThreadPoolExecutor(len(requests)) as pool:
            done = pool.map(lambda body: client.chat.completions.create(**body, **GREEDY).choices[0], requests)
            return [
                (
                    c.finish_reason,
                    c.message.content,
                    [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []],
                )
                for c in done
            ]

    with _live(create_app(dec, model_name="smol", num_speculative_tokens=3)) as base:
        batched = answers(base)
    assert batched == answers(served.base)
    assert [b[0] for b in batched[:3]] == ["stop", "tool_calls", "tool_calls"]


def test_metrics_count_constraint_time_and_forced_tokens(served) -> None:
    """/metrics: the constraint's time and the tokens of constrained requests (their ratio is the mask time per
    token), and the grammar-forced draft tokens; a free request adds to neither."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    def read() -> dict[str, float]:
        text = httpx.get(f"{served.base}/metrics").text
        return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}

    names = (
        "specrt_constraint_seconds_total",
        "specrt_constrained_generation_tokens_total",
        "specrt_forced_draft_tokens_total",
    )
    with _sdk(served.base) as client:
        before = read()
        free = client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "Say hi."}], max_tokens=6, temperature=0
        )
        assert free.usage.completion_tokens > 0
        after_free = read()
        assert all(after_free[n] == before[n] for n in names), (before, after_free)
        r = client.chat.completions.create(
            model="smol",
            messages=[{"role": "user", "content": "Give a person as JSON."}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
            },
            max_tokens=64,
            temperature=0,
        )
        after = read()
        assert after["specrt_constraint_seconds_total"] > after_free["specrt_constraint_seconds_total"]
        got = (
            after["specrt_constrained_generation_tokens_total"]
            - after_free["specrt_constrained_generation_tokens_total"]
        )
        assert got == r.usage.completion_tokens
        # The person schema forces its keys and punctuation: some of the tokens were forced drafts.
        assert after["specrt_forced_draft_tokens_total"] > after_free["specrt_forced_draft_tokens_total"]
