"""A refused setting carries its field (issue 40): the Rust validators' ``SpecError::Setting`` is a ``ConfigError``
whose ``field`` is specrt's name of the setting, and ``specrt serve`` puts that field, in the request's words, into
an OpenAI 400's ``param`` (no message text is parsed). Each refusal of
tests/engine/test_request.py is sent over HTTP here."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import specrt
from specrt import _specrt
from specrt.errors import ConfigError, SequenceLengthError, SpecrtError, VocabError
from specrt.generate import check_request

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient

from specrt.server import create_app
from specrt.server.policy import param_of

#: tests/engine/test_request.py's refusals: (Decoder settings, the error, its field (None: not a ConfigError), an HTTP
#: request body with the same refusal, the 400's param). The HTTP fields are OpenAI's / vLLM's: some of the values
#: are refused by the request schema already (pydantic, naming the field), some by the server's own checks, the rest
#: by the Rust resolver (the field from ConfigError.field).
CASES = [
    ({"max_new_tokens": 0}, ConfigError, "max_new_tokens", {"max_tokens": 0}, "max_tokens"),
    ({"max_new_tokens": "8"}, ConfigError, "max_new_tokens", {"max_tokens": "8"}, "max_tokens"),
    (
        {"num_speculative_tokens": "many"},
        ConfigError,
        "num_speculative_tokens",
        {"num_speculative_tokens": "many"},
        "num_speculative_tokens",
    ),
    (
        {"num_speculative_tokens": 65},
        ConfigError,
        "num_speculative_tokens",
        {"num_speculative_tokens": 65},
        "num_speculative_tokens",
    ),
    (
        {"num_speculative_tokens": True},
        ConfigError,
        "num_speculative_tokens",
        {"num_speculative_tokens": True},
        "num_speculative_tokens",
    ),
    ({"proposer": "magic"}, ConfigError, "proposer", {"proposer": "magic"}, "proposer"),
    ({"proposer": "draft"}, ConfigError, "proposer", {"proposer": "draft"}, "proposer"),
    ({"temperature": -1.0}, ConfigError, "temperature", {"temperature": -1.0}, "temperature"),
    ({"temperature": "hot"}, ConfigError, "temperature", {"temperature": "hot"}, "temperature"),
    ({"top_k": -1}, ConfigError, "top_k", {"top_k": -1}, "top_k"),
    ({"top_k": 1.5}, ConfigError, "top_k", {"top_k": 1.5}, "top_k"),
    ({"seed": -1}, ConfigError, "seed", {"seed": -1}, "seed"),
    ({"seed": 2**64}, ConfigError, "seed", {"seed": 2**64}, "seed"),
    ({"stop": ["ok", ""]}, ConfigError, "stop", {"stop": ["ok", ""]}, "stop"),
    ({"stop": [1]}, ConfigError, "stop", {"stop": [1]}, "stop"),
    ({"stop_token_ids": [10**9]}, VocabError, None, {"stop_token_ids": [10**9]}, "stop_token_ids"),
    ({"stop_token_ids": [-1]}, VocabError, None, {"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"ignore_eos": "false"}, ConfigError, "ignore_eos", {"ignore_eos": "false"}, "ignore_eos"),
    ({"top_logprobs": 21}, ConfigError, "top_logprobs", {"logprobs": 21}, "logprobs"),
    ({"min_tokens": -2}, ConfigError, "min_tokens", {"min_tokens": -2}, "min_tokens"),
    (
        {"pinned_costs": {"c_draft": 1.0}},
        ConfigError,
        "pinned_costs",
        {"pinned_costs": {"c_draft": 1.0}},
        "pinned_costs",
    ),
    (
        {"num_speculative_tokens": "auto", "pinned_costs": {"c_draft": 1.0, "c_verify": "x"}},
        ConfigError,
        "pinned_costs",
        {"num_speculative_tokens": "auto", "pinned_costs": {"c_draft": 1.0, "c_verify": "x"}},
        "pinned_costs",
    ),
    (
        {"pinned_costs": {"c_draft": 1.0, "c_verify": [1.0] * 9}},
        ConfigError,
        "pinned_costs",
        {"pinned_costs": {"c_draft": 1.0, "c_verify": [1.0] * 9}},
        "pinned_costs",
    ),
    (
        {"proposer": "ngram", "prompt_lookup_min": -1},
        ConfigError,
        "prompt_lookup_min",
        {"proposer": "ngram", "prompt_lookup_min": -1},
        "prompt_lookup_min",  # not a request field (the n-gram lengths are the server's): the schema names it
    ),
    (
        {"proposer": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 3},
        ConfigError,
        "prompt_lookup_min",
        {"proposer": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 3},
        "prompt_lookup_min",
    ),
    ({"max_new_tokens": 2**70}, SequenceLengthError, None, {"max_tokens": 2**70}, "max_tokens"),
]

#: Refusals that only the Rust validators make (the request schema lets the values through): the field comes from
#: ConfigError.field. (path, body, param)
RUST_REFUSALS = [
    ("/v1/completions", {"prompt": "x", "min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "x", "min_tokens": 5, "max_tokens": 2, "stream": True}, "min_tokens"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "min_tokens": 9, "max_completion_tokens": 3},
        "min_tokens",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"x": [1, 2**70]}},
        "chat_template_kwargs",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "documents": [{"n": -(2**70)}]},
        "documents",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "guided_regex": "(unclosed"},
        "guided_regex",
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}},
        },
        "response_format.json_schema.name",
    ),
]


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specrt.convert import convert
    from specrt.convert.tiny import write_tiny_gguf

    root = tmp_path_factory.mktemp("fields")
    return convert(write_tiny_gguf(root / "t.gguf", arch="qwen2", seed=2, n_layers=1), root / "t", progress=False)


@pytest.fixture(scope="module")
def decoder(tiny_target: Path) -> specrt.Decoder:
    return specrt.Decoder(tiny_target)


@pytest.fixture(scope="module")
def client(decoder):
    # the target-only decoder the Decoder-level refusals use: "proposer": "draft" is refused the same way
    with TestClient(create_app(decoder, model_name="tiny")) as c:
        yield c


@pytest.mark.parametrize(("settings", "error", "field", "body", "param"), CASES, ids=[str(c[0]) for c in CASES])
def test_each_refusal_carries_its_field(decoder, settings, error, field, body, param) -> None:
    with pytest.raises(error) as e:
        decoder.prepare(prompt=[1, 2, 3], **settings)
    assert getattr(e.value, "field", None) == field, e.value
    if field is not None:
        assert str(e.value).startswith(field) or str(e.value).startswith("n-gram lengths"), e.value


@pytest.mark.parametrize(("settings", "error", "field", "body", "param"), CASES, ids=[str(c[0]) for c in CASES])
def test_each_refusal_over_http_names_the_openai_field(client, settings, error, field, body, param) -> None:
    r = client.post("/v1/completions", json={"prompt": "hello", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err


@pytest.mark.parametrize(("path", "body", "param"), RUST_REFUSALS, ids=[p for _, _, p in RUST_REFUSALS])
def test_refusals_of_the_rust_validators_name_the_request_field(client, path, body, param) -> None:
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_the_settings_names_become_the_requests_names() -> None:
    with pytest.raises(ConfigError) as e:
        check_request(has_draft=False, max_new_tokens=0)
    assert e.value.field == "max_new_tokens"
    completion = SimpleNamespace(prompt="x", max_tokens=0)
    chat = SimpleNamespace(messages=[], max_tokens=None, max_completion_tokens=5)
    assert param_of(e.value, completion) == "max_tokens"
    assert param_of(e.value, chat) == "max_completion_tokens"
    with pytest.raises(ConfigError) as e:
        _specrt.resolve_request({}, has_draft=False, prompt_ids=[])
    assert e.value.field == "prompt"
    assert param_of(e.value, completion) == "prompt" and param_of(e.value, chat) == "messages"
    template = _specrt.ChatTemplate("{{ messages }}")
    with pytest.raises(ConfigError) as e:
        template.render([{"role": "user", "content": "x"}], flag=float("nan"))
    assert e.value.field == "kwargs" and param_of(e.value, chat) == "chat_template_kwargs"
    # Not about one setting: no field, no param.
    with pytest.raises(ConfigError) as e:
        _specrt.ChatTemplate("{{ raise_exception('no') }}").render([])
    assert e.value.field is None and param_of(e.value, chat) is None


def test_config_error_keeps_its_class_and_a_python_raised_one_has_no_field() -> None:
    assert ConfigError.__mro__[1:3] == (SpecrtError, ValueError)
    assert ConfigError("x").field is None
    with pytest.raises(ValueError) as e:
        check_request(has_draft=False, temperature=-1.0)
    assert isinstance(e.value, ConfigError) and type(e.value) is ConfigError and e.value.field == "temperature"


def test_a_server_with_a_draft_model_chooses_the_proposer_per_round_by_default(tiny_decoder, decoder) -> None:
    """``specrt serve`` with a draft model defaults to ``proposer="auto"`` (n-gram and draft model under auto K):
    a greedy request's text is target-only's, and a request may still pick a proposer or set one that is refused."""
    from specrt.server import defaults

    assert defaults.PROPOSER_WITH_DRAFT == "auto"
    want = tiny_decoder.generate(
        "count: one two three one two three", max_new_tokens=24, temperature=0, proposer="none"
    )
    with TestClient(create_app(tiny_decoder, model_name="tiny")) as c:
        body = {"prompt": "count: one two three one two three", "max_tokens": 24, "temperature": 0}
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want.text
        r = c.post("/v1/completions", json={**body, "proposer": "ngram"})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want.text, r.text
        r = c.post("/v1/completions", json={**body, "proposer": "every"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "proposer", r.text
    # an explicit server default is checked by the Rust resolver when the app is made
    with pytest.raises(ConfigError) as e:
        create_app(decoder, model_name="tiny", proposer="draft")
    assert e.value.field == "proposer"
