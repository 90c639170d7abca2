"""OpenAI clients against ``specrt serve`` with their default settings (project issue 29): the openai SDK on a real
uvicorn server on the loopback address (``models.retrieve``, prompt lists and token-id lists, ``n`` with its
documented seeds, continuous usage, fields accepted as no-ops, an assistant message with ``content: null``), on a
decoder with a draft, without one, and batched (``Decoder(max_batch=4)``); the headers (``Allow``, ``Retry-After``),
vLLM's tokenizer endpoints and ``tokenizer_config.json``, the field policy of docs/openai-api.md (each refusal names
its field), and schemathesis on ``/openapi.json`` (generated requests get no 5xx and no response outside the
schema)."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from fastapi.testclient import TestClient  # noqa: E402

import specrt  # noqa: E402
from specrt.server import create_app  # noqa: E402

K = 3  # fixed K: auto K depends on timings, and these tests compare seeded outputs exactly

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]

TOOL_TURNS = [
    {"role": "user", "content": "weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]

#: A chat template that shows the tools and the tool calls it is given (the tiny models' ChatML template ignores
#: both), so a test can see them reach the template.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}call {{ c.function.name }} {{ c.function.arguments | tojson }}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# ----- decoders and servers ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def target_only(tiny_decoder) -> specrt.Decoder:
    """The tiny target alone (no draft model)."""
    return specrt.Decoder(tiny_decoder.target_path, max_seq_len=256)


@pytest.fixture(scope="module")
def batched(tmp_path_factory: pytest.TempPathFactory) -> specrt.Decoder:
    """The tiny pair in the batched layout, 4 rows (tests/engine/test_batching.py builds it the same way)."""
    from specrt.convert import convert
    from specrt.convert.tiny import write_tiny_gguf

    root = tmp_path_factory.mktemp("clients-batched")
    out = {}
    for name, layers in [("target", 2), ("draft", 1)]:
        gguf = write_tiny_gguf(root / f"{name}.gguf", arch="qwen2", seed=3, n_layers=layers)
        out[name] = convert(gguf, root / name, progress=False, attention="batched")
    return specrt.Decoder(out["target"], out["draft"], max_seq_len=256, max_batch=4, prefill_chunk=16)


@pytest.fixture(scope="module")
def tools_decoder(tiny_decoder, tmp_path_factory: pytest.TempPathFactory) -> specrt.Decoder:
    """The tiny target with :data:`TOOLS_TEMPLATE` as its chat template (the model files linked, not copied)."""
    src = Path(tiny_decoder.target_path)
    folder = tmp_path_factory.mktemp("clients-tools") / "target"
    folder.mkdir()
    for f in src.iterdir():
        if f.name.startswith("model.onnx"):
            (folder / f.name).symlink_to(f)
        elif f.name not in ("chat_template.jinja", "tokenizer_config.json"):
            shutil.copy(f, folder / f.name)
    (folder / "chat_template.jinja").write_text(TOOLS_TEMPLATE, encoding="utf-8")
    return specrt.Decoder(folder, max_seq_len=256)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _live(app) -> Iterator[str]:
    """``app`` on a uvicorn server on the loopback address (its base URL) until the block ends."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=_free_port(), log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.config.port}"
    try:
        for _ in range(6000):  # a hang guard, not a speed bound
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.01)
        yield base
    finally:
        server.should_exit = True
        thread.join(60)
    assert not thread.is_alive()


@pytest.fixture(scope="module", params=["draft", "target-only", "batched"])
def served(request):
    """A live server on the tiny pair, on the target alone, or on the batched pair (max_batch 4)."""
    dec = request.getfixturevalue(
        {"draft": "tiny_decoder", "target-only": "target_only", "batched": "batched"}[request.param]
    )
    app = create_app(dec, model_name="tiny", num_speculative_tokens=K)
    with _live(app) as base:
        yield SimpleNamespace(base=base, app=app, decoder=dec, kind=request.param)


@contextlib.contextmanager
def _sdk(base: str, **kwargs) -> Iterator[openai.OpenAI]:
    """The openai SDK pointed at ``base``, with its default settings unless ``kwargs`` say otherwise."""
    with openai.OpenAI(base_url=f"{base}/v1", api_key="x", **kwargs) as client:
        yield client


# ----- the openai SDK ---------------------------------------------------------------------------------------------
def test_models_retrieve_and_list_and_another_id_is_a_404(served) -> None:
    with _sdk(served.base) as client:
        assert [m.id for m in client.models.list()] == ["tiny"]
        model = client.models.retrieve("tiny")
        assert model.id == "tiny" and model.object == "model" and model.max_model_len == 256
        with pytest.raises(openai.NotFoundError) as e:
            client.models.retrieve("gpt-4o")
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"


def test_prompt_lists_and_token_id_lists_give_one_choice_per_prompt_in_order(served) -> None:
    texts = ["def add(a, b):", "hello world, hello", "x"]
    ids = [served.decoder.tokenizer.encode(t).ids for t in texts]
    settings = {"model": "tiny", "max_tokens": 10, "temperature": 0, "extra_body": {"ignore_eos": True}}
    with _sdk(served.base) as client:
        alone = [client.completions.create(prompt=t, **settings) for t in texts]
        for prompt in (texts, ids):
            r = client.completions.create(prompt=prompt, **settings)
            assert [c.index for c in r.choices] == [0, 1, 2]
            assert [c.text for c in r.choices] == [a.choices[0].text for a in alone]
            assert r.usage.prompt_tokens == sum(len(i) for i in ids)
            assert r.usage.completion_tokens == 30
        # One list of token ids is one prompt.
        r = client.completions.create(prompt=ids[0], **settings)
        assert len(r.choices) == 1 and r.choices[0].text == alone[0].choices[0].text
        # Streamed, each chunk carries its choice's index; each index's text is that prompt's completion.
        streamed = {0: "", 1: "", 2: ""}
        finish = {}
        for chunk in client.completions.create(prompt=texts, stream=True, **settings):
            for c in chunk.choices:
                streamed[c.index] += c.text
                if c.finish_reason is not None:
                    finish[c.index] = c.finish_reason
    assert [streamed[i] for i in range(3)] == [a.choices[0].text for a in alone]
    assert finish == {0: "length", 1: "length", 2: "length"}


@pytest.mark.parametrize("coupled", [False, True])
def test_n_choices_differ_and_each_equals_one_request_with_seed_plus_its_index(served, coupled) -> None:
    settings = {
        "model": "tiny",
        "max_tokens": 12,
        "temperature": 1.0,
        "extra_body": {"coupled": coupled, "ignore_eos": True},
    }
    with _sdk(served.base) as client:
        r = client.completions.create(prompt="hello world, hello", n=3, seed=11, **settings)
        texts = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
        assert [c.index for c in r.choices] == [0, 1, 2]
        assert len(set(texts)) == 3, texts  # seeds 11, 12, 13: three samples, also under coupled sampling
        for i, text in enumerate(texts):
            one = client.completions.create(prompt="hello world, hello", seed=11 + i, **settings)
            assert one.choices[0].text == text, i
        # Two prompts x n = 2: prompt-major indices, choice k * n + i = prompt k with seed 5 + i.
        prompts = ["def f(x):", "abc abc"]
        r = client.completions.create(prompt=prompts, n=2, seed=5, **settings)
        got = {c.index: c.text for c in r.choices}
        for k, p in enumerate(prompts):
            for i in range(2):
                one = client.completions.create(prompt=p, seed=5 + i, **settings)
                assert got[k * 2 + i] == one.choices[0].text, (k, i)
        # Chat too.
        chat = client.chat.completions.create(messages=MESSAGES, n=2, seed=3, **settings)
        assert [c.index for c in chat.choices] == [0, 1]
        for i, c in enumerate(chat.choices):
            one = client.chat.completions.create(messages=MESSAGES, seed=3 + i, **settings)
            assert c.message.content == one.choices[0].message.content
        assert chat.usage.completion_tokens == 24


def test_continuous_usage_stats_put_usage_in_every_chunk(served) -> None:
    """guidellm's stream_options: ``include_usage`` and vLLM's ``continuous_usage_stats``."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    with _sdk(served.base) as client:
        chunks = list(
            client.completions.create(
                model="tiny",
                prompt=["def f(x):", "hello"],
                max_tokens=9,
                temperature=0,
                stream=True,
                stream_options=options,
                extra_body={"ignore_eos": True},
            )
        )
        chat = list(
            client.chat.completions.create(
                model="tiny", messages=MESSAGES, max_tokens=7, temperature=0, stream=True, stream_options=options
            )
        )
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 18
    n_prompt = {k: len(served.decoder.tokenizer.encode(p).ids) for k, p in enumerate(["def f(x):", "hello"])}
    seen = {0: 0, 1: 0}
    for chunk in body:
        (c,) = chunk.choices
        u = chunk.usage
        assert u.prompt_tokens == n_prompt[c.index] and u.total_tokens == u.prompt_tokens + u.completion_tokens
        assert u.completion_tokens >= seen[c.index]
        seen[c.index] = u.completion_tokens
    assert seen == {0: 9, 1: 9}
    assert last.usage.prompt_tokens == sum(n_prompt.values())
    assert all(c.usage is not None for c in chat) and chat[-1].choices == []
    assert chat[-2].usage.completion_tokens == chat[-1].usage.completion_tokens <= 7


def test_fields_accepted_as_no_ops_leave_the_output_as_it_is(served) -> None:
    plain = {"model": "tiny", "max_tokens": 10, "temperature": 0}
    no_ops = {
        "user": "u-1",
        "metadata": {"team": "eval"},
        "store": False,
        "service_tier": "auto",
        "parallel_tool_calls": False,
        "response_format": {"type": "text"},
        "tool_choice": "none",
        "prediction": {"type": "content", "content": "hello"},
        "safety_identifier": "s-1",
        "prompt_cache_key": "k",
        "extra_body": {"cache_salt": "salt", "min_tokens": 0, "priority": 0, "length_penalty": 1.0},
    }
    with _sdk(served.base) as client:
        want = client.chat.completions.create(messages=MESSAGES, **plain).choices[0].message.content
        got = client.chat.completions.create(messages=MESSAGES, tools=TOOLS, **plain, **no_ops)
        # The tiny template does not show tools, so even the tools leave the prompt as it is here.
        assert got.choices[0].message.content == want
        want = client.completions.create(prompt="def f(x):", **plain).choices[0].text
        got = client.completions.create(
            prompt="def f(x):",
            user="u-1",
            best_of=1,
            suffix="",
            **plain,
            extra_body={"response_format": {"type": "text"}, "cache_salt": "salt", "store": False},
        )
        assert got.choices[0].text == want
        # lm-eval's stop list: its `until` strings and EOS, more than OpenAI's 4.
        stops = ["\n\n", "Question:", "</s>", "<|im_end|>", "<|endoftext|>", "###"]
        r = client.completions.create(prompt="def f(x):", stop=stops, **plain)
        for stop in stops:
            want = want.split(stop)[0]  # the text before the first stop string, if one occurs
        assert r.choices[0].text == want


def test_assistant_message_with_null_content_tool_calls_and_tool_results(served) -> None:
    """The conversation of a tool call (an assistant message with ``content: null`` and ``tool_calls``, the tool's
    answer) is a prompt like any other: the chat template's rendering, the null content as ""."""
    rendered = [{"role": m["role"], "content": m["content"] or ""} for m in TOOL_TURNS]
    ids = served.decoder.encode(None, rendered)  # the tiny ChatML template shows neither tools nor calls
    with _sdk(served.base) as client:
        chat = client.chat.completions.create(
            model="tiny", messages=TOOL_TURNS, tools=TOOLS, tool_choice="auto", max_tokens=6, temperature=0
        )
        completion = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.usage.prompt_tokens == len(ids)
    assert chat.choices[0].message.content == completion.choices[0].text


def test_tools_and_tool_calls_reach_the_chat_template(tools_decoder) -> None:
    """A template that shows them: /tokenize and a chat request render the tools, the call (arguments parsed from
    their JSON, as transformers' templates expect) and the tool's answer; the chat request equals a completion of
    that prompt."""
    expected = (
        "<|im_start|>system\ntools: get_weather<|im_end|>\n"
        "<|im_start|>user\nweather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\ncall get_weather {"city": "Paris"}<|im_end|>\n'
        "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n"
    )
    want_ids = tools_decoder.tokenizer.encode(expected, add_special_tokens=False).ids
    app = create_app(tools_decoder, model_name="tiny", num_speculative_tokens=0)
    with _live(app) as base:
        r = httpx.post(f"{base}/tokenize", json={"messages": TOOL_TURNS, "tools": TOOLS}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == want_ids
        without = httpx.post(f"{base}/tokenize", json={"messages": TOOL_TURNS}, timeout=60).json()["tokens"]
        assert without != want_ids
        with _sdk(base) as client:
            chat = client.chat.completions.create(
                model="tiny", messages=TOOL_TURNS, tools=TOOLS, max_tokens=8, temperature=0
            )
            completion = client.completions.create(model="tiny", prompt=want_ids, max_tokens=8, temperature=0)
    assert chat.usage.prompt_tokens == len(want_ids)
    assert chat.choices[0].message.content == completion.choices[0].text


# ----- headers, tokenizer endpoints, policy --------------------------------------------------------------------
@pytest.mark.timing
def test_405_says_allow_and_429_and_503_say_retry_after(target_only) -> None:
    app = create_app(target_only, model_name="tiny", max_queue=3)
    sched = app.state.scheduler
    with _live(app) as base:
        r = httpx.get(f"{base}/v1/completions")
        assert r.status_code == 405 and r.headers["allow"] == "POST", r.headers
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        with target_only.generation_lock:  # the worker's generation waits for this lock: one running, two queued
            running = sched.submit("a", max_new_tokens=2)
            for _ in range(6000):  # a hang guard, not a speed bound
                if sched.running:
                    break
                time.sleep(0.005)
            queued = [sched.submit(p, max_new_tokens=2) for p in ("b", "c")]
            assert sched.queue_length == 2  # one place left
            # Two prompts do not fit: the request is refused whole (none of its choices is queued).
            with _sdk(base, max_retries=0) as client, pytest.raises(openai.RateLimitError) as e:
                client.completions.create(model="tiny", prompt=["d", "e"], max_tokens=2)
            assert e.value.response.headers["retry-after"] == "1"
            assert e.value.body["code"] == "queue_full" and sched.queue_length == 2
            r = httpx.post(f"{base}/v1/chat/completions", json={"messages": MESSAGES, "n": 2})
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
        for h in (running, *queued):
            h.result(timeout=60)
        sched.close()  # as at shutdown: no new requests
        r = httpx.post(f"{base}/v1/completions", json={"prompt": "c"})
        assert r.status_code == 503 and r.headers["retry-after"] == "10", r.text
        assert r.json()["error"]["code"] == "shutting_down"


@pytest.mark.timing
def test_all_choices_are_queued_at_once(target_only) -> None:
    """n x prompts choices are submitted together, before the first starts (a batching decoder then runs them in
    shared rounds)."""
    app = create_app(target_only, model_name="tiny")
    sched = app.state.scheduler
    with TestClient(app) as c:
        out = {}
        with target_only.generation_lock:  # the worker waits: nothing finishes meanwhile
            t = threading.Thread(
                target=lambda: out.update(
                    r=c.post("/v1/completions", json={"prompt": ["a", "b"], "n": 3, "max_tokens": 2})
                )
            )
            t.start()
            for _ in range(6000):  # a hang guard, not a speed bound
                if sched.queue_length + sched.running == 6:
                    break
                time.sleep(0.005)
            assert sched.queue_length + sched.running == 6
        t.join(60)
    assert out["r"].status_code == 200 and [ch["index"] for ch in out["r"].json()["choices"]] == list(range(6))


def test_tokenize_detokenize_round_trip_and_tokenizer_info(tiny_decoder, tmp_path: Path) -> None:
    tok = tiny_decoder.tokenizer
    app = create_app(tiny_decoder, model_name="tiny")
    with _live(app) as base:
        r = httpx.post(f"{base}/tokenize", json={"model": "tiny", "prompt": "hello world", "return_token_strs": True})
        body = r.json()
        assert body["tokens"] == tok.encode("hello world").ids and body["count"] == len(body["tokens"])
        assert body["max_model_len"] == 256 and body["token_strs"] == [tok.id_to_token(i) for i in body["tokens"]]
        back = httpx.post(f"{base}/detokenize", json={"tokens": body["tokens"]}).json()
        assert back == {"prompt": "hello world"}
        chat = httpx.post(f"{base}/tokenize", json={"messages": MESSAGES}).json()
        assert chat["tokens"] == tiny_decoder.encode(None, MESSAGES) and chat["token_strs"] is None
        r = httpx.post(f"{base}/detokenize", json={"tokens": [1, 99999]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
        r = httpx.post(f"{base}/tokenize", json={"model": "other", "prompt": "x"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        info = httpx.get(f"{base}/tokenizer_info").json()
    folder = Path(tiny_decoder.target_path)
    assert info["tokenizer_class"] == "PreTrainedTokenizerFast" and info["eos_token"] == "<|im_end|>"
    assert info["chat_template"] == (folder / "chat_template.jinja").read_text(encoding="utf-8")
    assert info == json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    # A folder converted before tokenizer_config.json existed: the server builds the same from specrt_config.json.
    old = tmp_path / "old"
    old.mkdir()
    for f in folder.iterdir():
        if f.name != "tokenizer_config.json":
            (old / f.name).symlink_to(f)
    dec = specrt.Decoder(old, max_seq_len=256)
    with TestClient(create_app(dec, model_name="tiny")) as c:
        assert c.get("/tokenizer_info").json() == info


def test_converted_folders_load_in_transformers(tiny_decoder) -> None:
    transformers = pytest.importorskip("transformers")
    folder = Path(tiny_decoder.target_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    text = "hello world, hello <|im_end|>"
    assert hf(text)["input_ids"] == tiny_decoder.tokenizer.encode(text).ids
    assert hf.eos_token == "<|im_end|>"
    assert hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == (
        tiny_decoder.apply_chat_template(MESSAGES)
    )


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema"}},
            "response_format.json_schema",
            "null is invalid",
        ),
        (
            "/v1/chat/completions",
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
            "tool_choice",
            "not among the tools",
        ),
        ("/v1/chat/completions", {"structural_tag": "{}"}, "structural_tag", "structural tags"),
        ("/v1/chat/completions", {"guided_whitespace_pattern": " *"}, "guided_whitespace_pattern", "compact"),
        ("/v1/chat/completions", {"logit_bias": {"5": 3.0}}, "logit_bias", "not implemented"),
        ("/v1/chat/completions", {"min_tokens": 40, "max_tokens": 8}, "min_tokens", "min_tokens 40 is invalid"),
        ("/v1/chat/completions", {"echo": True}, "echo", "false"),
        ("/v1/chat/completions", {"continue_final_message": True}, "continue_final_message", "add_generation_prompt"),
        ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions", "unknown field"),
        ("/v1/completions", {"best_of": 3}, "best_of", "ranking"),
        ("/v1/completions", {"best_of": 1, "n": 2}, "best_of", ">= n"),
        ("/v1/completions", {"suffix": "}"}, "suffix", "insertion"),
        ("/v1/completions", {"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice", "one constraint"),
        ("/v1/completions", {"use_beam_search": True}, "use_beam_search", "beam search"),
        ("/v1/completions", {"n": 65}, "n", "max_queue"),
        ("/v1/completions", {"frobnicate": 1}, "frobnicate", "unknown field"),
    ],
)
def test_fields_that_would_change_the_output_are_refused_by_name(client_for_policy, path, body, param, words) -> None:
    base = {"messages": MESSAGES} if "chat" in path else {"prompt": "x"}
    r = client_for_policy.post(path, json={**base, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    assert err["message"].startswith(param), err


@pytest.fixture(scope="module")
def client_for_policy(tiny_decoder):
    with TestClient(create_app(tiny_decoder, model_name="tiny", num_speculative_tokens=K)) as c:
        yield c


def test_include_stop_str_in_output_and_stop_token_ids_as_vllm_defines_them(client_for_policy, tiny_decoder) -> None:
    c = client_for_policy
    base = {"prompt": "hello world, hello", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    full = c.post("/v1/completions", json=base).json()["choices"][0]["text"]
    # A two-character stop string that first occurs at its own place, past the start (no partial UTF-8 in it).
    at = next(
        i for i in range(3, len(full) - 2) if "\ufffd" not in full[i : i + 2] and full.index(full[i : i + 2]) == i
    )
    stop = full[at : at + 2]
    for include in (False, True):
        body = {**base, "stop": [stop], "include_stop_str_in_output": include}
        whole = c.post("/v1/completions", json=body).json()["choices"][0]
        assert whole["finish_reason"] == "stop"
        assert whole["text"] == full[: at + 2 if include else at]
        with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
            events = [json.loads(x[6:]) for x in resp.iter_lines() if x.startswith("data: {")]
        assert "".join(e["choices"][0]["text"] for e in events) == whole["text"]
    # A stop token id ends the generation; its text is left out unless include_stop_str_in_output.
    ids = tiny_decoder.generate(
        base["prompt"], max_new_tokens=40, temperature=0, num_speculative_tokens=K, ignore_eos=True
    ).token_ids
    stop_id = ids[6]
    first = ids.index(stop_id)
    for include in (False, True):
        body = {**base, "stop_token_ids": [stop_id], "include_stop_str_in_output": include}
        whole = c.post("/v1/completions", json=body).json()
        kept = ids[: first + (1 if include else 0)]
        assert whole["choices"][0]["text"] == tiny_decoder.tokenizer.decode(kept, skip_special_tokens=True)
        assert whole["usage"]["completion_tokens"] == first + 1
        with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
            events = [json.loads(x[6:]) for x in resp.iter_lines() if x.startswith("data: {")]
        assert "".join(e["choices"][0]["text"] for e in events) == whole["choices"][0]["text"]
    # An id outside the vocabulary: a 400 naming the field.
    bad = c.post("/v1/completions", json={**base, "stop_token_ids": [tiny_decoder.vocab_size]})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "stop_token_ids"
    assert str(tiny_decoder.vocab_size) in bad.json()["error"]["message"]


def test_skip_special_tokens_false_keeps_special_tokens_but_not_the_eos_that_ended(
    client_for_policy, tiny_decoder
) -> None:
    c = client_for_policy
    config = json.loads((tiny_decoder.target_path / "specrt_config.json").read_text())
    special = set(config["special_tokens"].values())
    # A seed whose sample holds a special token before its end (ignore_eos: an EOS does not end it).
    for seed in range(200):
        r = tiny_decoder.generate(
            "x", max_new_tokens=30, temperature=1.0, seed=seed, num_speculative_tokens=K, ignore_eos=True
        )
        if special & set(r.token_ids[:-1]):
            break
    else:
        pytest.fail("no sample with a special token in 200 seeds")
    body = {"prompt": "x", "max_tokens": 30, "temperature": 1.0, "seed": seed, "ignore_eos": True}
    kept = c.post("/v1/completions", json={**body, "skip_special_tokens": False}).json()["choices"][0]["text"]
    assert kept == tiny_decoder.tokenizer.decode(r.token_ids, skip_special_tokens=False) != r.text
    with c.stream("POST", "/v1/completions", json={**body, "skip_special_tokens": False, "stream": True}) as resp:
        events = [json.loads(x[6:]) for x in resp.iter_lines() if x.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events) == kept
    # A generation that ended on EOS: the EOS text is left out (vLLM), kept with include_stop_str_in_output.
    for seed in range(200):
        r = tiny_decoder.generate("x", max_new_tokens=60, temperature=1.0, seed=seed, num_speculative_tokens=K)
        if r.finish_reason == "eos":
            break
    else:
        pytest.fail("no sample ending on EOS in 200 seeds")
    body = {"prompt": "x", "max_tokens": 60, "temperature": 1.0, "seed": seed, "skip_special_tokens": False}
    for include in (False, True):
        got = c.post("/v1/completions", json={**body, "include_stop_str_in_output": include}).json()
        ids = r.token_ids if include else r.token_ids[:-1]
        assert got["choices"][0]["text"] == tiny_decoder.tokenizer.decode(ids, skip_special_tokens=False)


def test_echo_puts_the_prompt_before_the_completion(client_for_policy) -> None:
    c = client_for_policy
    body = {"prompt": ["def f(x):", "abc"], "max_tokens": 6, "temperature": 0}
    plain = [ch["text"] for ch in c.post("/v1/completions", json=body).json()["choices"]]
    echoed = [ch["text"] for ch in c.post("/v1/completions", json={**body, "echo": True}).json()["choices"]]
    assert echoed == ["def f(x):" + plain[0], "abc" + plain[1]]
    with c.stream("POST", "/v1/completions", json={**body, "echo": True, "stream": True}) as resp:
        events = [json.loads(x[6:]) for x in resp.iter_lines() if x.startswith("data: {")]
    texts = {0: "", 1: ""}
    for e in events:
        for ch in e["choices"]:
            texts[ch["index"]] += ch["text"]
    assert [texts[0], texts[1]] == echoed


def test_openapi_documents_the_request_bodies_statuses_and_content_types(client_for_policy) -> None:
    doc = client_for_policy.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for path, name in [
        ("/v1/completions", "CompletionRequest"),
        ("/v1/chat/completions", "ChatCompletionRequest"),
        ("/detokenize", "DetokenizeRequest"),
    ]:
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{name}"}
        assert name in schemas
    op = doc["paths"]["/v1/chat/completions"]["post"]
    assert set(op["responses"]) == {"200", "400", "404", "429", "499", "500", "503", "504"}
    assert set(op["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert "Retry-After" in op["responses"]["429"]["headers"] and "Retry-After" in op["responses"]["503"]["headers"]
    assert {"messages", "tools", "tool_choice", "n", "stream_options"} <= set(
        schemas["ChatCompletionRequest"]["properties"]
    )
    assert set(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert "/v1/models/{model}" in doc["paths"] and "/tokenize" in doc["paths"] and "/tokenizer_info" in doc["paths"]


def test_smollm2_chat_with_the_sdk_and_its_tokenizer(tiny_smollm2_or_skip) -> None:
    dec = tiny_smollm2_or_skip
    app = create_app(dec, model_name="smollm2", num_speculative_tokens=0)
    with _live(app) as base, _sdk(base) as client:
        r = client.chat.completions.create(
            model="smollm2", messages=[*MESSAGES, *TOOL_TURNS], tools=TOOLS, n=2, seed=1, max_tokens=8
        )
        assert [c.index for c in r.choices] == [0, 1]
        ids = httpx.post(f"{base}/tokenize", json={"messages": MESSAGES}).json()["tokens"]
        assert ids == dec.encode(None, MESSAGES)
        info = httpx.get(f"{base}/tokenizer_info").json()
    assert info["eos_token"] and info["chat_template"]


# ----- schemathesis -------------------------------------------------------------------------------------------------
def test_generated_requests_get_no_server_error_and_no_response_outside_the_schema(tiny_decoder) -> None:
    """schemathesis on the live server's /openapi.json: per operation 30 derandomized requests valid by the schema
    and 30 invalid ones, each checked by every check but positive_data_acceptance (a schema-valid request may still
    be refused by the field policy of docs/openai-api.md, or by a rule across fields such as best_of == n, with a
    documented 400). schemathesis' pytest decorators are not used: ``from_fixture`` fails on pytest 9
    (``Function._nodeid``)."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from schemathesis.generation import GenerationMode
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    # A short queue and default length keep the generated requests cheap.
    app = create_app(tiny_decoder, model_name="tiny", max_queue=8, default_max_tokens=8, num_speculative_tokens=2)
    with _live(app) as base:
        schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) == 9
        for operation, mode in itertools.product(operations, GenerationMode):
            if mode is GenerationMode.NEGATIVE and not len(operation.body):
                continue  # a GET has nothing to make invalid (a path's model is any string)

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=30,
                derandomize=True,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            )
            def check(case) -> None:
                case.call_and_validate(excluded_checks=[positive_data_acceptance])

            check()


# ----- log-probabilities and their alternatives -------------------------------------------------------------------
def _teacher_forced_log_softmax(target_path, ids: list[int]):
    """``[len(ids) - 1, vocab]`` float64 log-softmax of one target pass over ``ids`` (row j predicts ids[j + 1])."""
    import numpy as np

    from specrt import _specrt
    from specrt._ort import find_ort_library

    model = _specrt.OrtModel(str(target_path), ort_library=find_ort_library(), max_seq_len=256)
    rows = model.forward(np.array(ids[:-1]), 0, len(ids) - 1).astype(np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    return rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))


def test_echo_logprobs_and_alternatives_equal_a_teacher_forced_target_pass(served, tiny_decoder) -> None:
    import numpy as np

    tok = served.decoder.tokenizer
    prompt = tok.encode("def add(a, b):\n    return").ids
    with _sdk(served.base) as client:
        # lm-eval's loglikelihood request (echo, logprobs, a few tokens), token ids returned exactly.
        r = client.completions.create(
            model="tiny",
            prompt=[prompt],
            max_tokens=4,
            temperature=0,
            echo=True,
            logprobs=3,
            extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
        )
    lp = r.choices[0].logprobs
    ids = [int(t.removeprefix("token_id:")) for t in lp.tokens]
    assert ids[: len(prompt)] == prompt and len(ids) == len(prompt) + 4
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    # The reference: the target (same weights, GQA layout) over prompt + output in one pass.
    ref = _teacher_forced_log_softmax(tiny_decoder.target_path, ids)
    np.testing.assert_allclose(lp.token_logprobs[1:], [ref[j - 1, ids[j]] for j in range(1, len(ids))], atol=1e-4)
    for j in range(1, len(ids)):
        by_text: dict[str, float] = {}
        for i in np.argsort(-ref[j - 1], kind="stable")[:3]:
            by_text.setdefault(tok.decode([int(i)]), ref[j - 1, i])  # equal texts: the more likely one's value
        assert set(lp.top_logprobs[j]) == set(by_text), j
        for text, value in lp.top_logprobs[j].items():
            assert value == pytest.approx(by_text[text], abs=1e-4)
        if j >= len(prompt):  # a generated token at temperature 0 is the maximum of its alternatives
            assert lp.token_logprobs[j] == pytest.approx(max(lp.top_logprobs[j].values()), abs=1e-6)


def test_streamed_echo_with_logprobs_gives_the_same_entries_as_the_whole_response(served) -> None:
    settings = {
        "model": "tiny",
        "prompt": ["def add(a, b):\n    return", "x = 1"],
        "max_tokens": 6,
        "temperature": 0,
        "echo": True,
        "logprobs": 2,
        "extra_body": {"ignore_eos": True},
    }
    with _sdk(served.base) as client:
        whole = client.completions.create(**settings)
        events = list(client.completions.create(**settings, stream=True))
    for choice in whole.choices:
        mine = [e.choices[0] for e in events if e.choices and e.choices[0].index == choice.index]
        assert "".join(c.text for c in mine) == choice.text
        got: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for c in mine:
            if c.logprobs is not None:
                for k in got:
                    got[k] += getattr(c.logprobs, k) or []
        want = choice.logprobs
        assert got["tokens"] == want.tokens and got["text_offset"] == want.text_offset
        assert got["token_logprobs"][0] is None and got["top_logprobs"][0] is None  # the prompt's first token
        assert got["token_logprobs"][1:] == pytest.approx(want.token_logprobs[1:], abs=1e-6)
        assert [sorted(t) for t in got["top_logprobs"][1:]] == [sorted(t) for t in want.top_logprobs[1:]]
        assert mine[0].text.startswith(settings["prompt"][choice.index])  # the prompt comes in the first event


def test_chat_top_logprobs_are_the_targets_log_softmax_and_the_choice_is_their_maximum(served, tiny_decoder) -> None:
    import numpy as np

    with _sdk(served.base) as client:
        r = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=5,
            temperature=0,
            logprobs=True,
            top_logprobs=4,
            extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
        )
        prompt = httpx.post(f"{served.base}/tokenize", json={"model": "tiny", "messages": MESSAGES}).json()["tokens"]
    content = r.choices[0].logprobs.content
    out = [int(e.token.removeprefix("token_id:")) for e in content]
    ids = prompt + out
    ref = _teacher_forced_log_softmax(tiny_decoder.target_path, ids)
    for k, e in enumerate(content):
        row = ref[len(prompt) + k - 1]
        want = np.argsort(-row, kind="stable")[:4]
        assert [int(a.token.removeprefix("token_id:")) for a in e.top_logprobs] == list(want)
        np.testing.assert_allclose([a.logprob for a in e.top_logprobs], row[want], atol=1e-4)
        assert out[k] == want[0] and e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-6)


def test_min_tokens_as_vllm_defines_it(served) -> None:
    settings = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 20, "temperature": 0}
    with _sdk(served.base) as client:
        free = client.completions.create(
            **settings, extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True}, logprobs=0
        )
        stop = int(free.choices[0].logprobs.tokens[2].removeprefix("token_id:"))
        extra = {"ignore_eos": True, "stop_token_ids": [stop]}
        cut = client.completions.create(**settings, extra_body=extra)
        held = client.completions.create(**settings, extra_body={**extra, "min_tokens": 8})
    assert cut.usage.completion_tokens <= 3 and held.usage.completion_tokens >= 8


def test_max_tokens_zero_with_echo_scores_the_prompt_only(served) -> None:
    tok = served.decoder.tokenizer
    prompt = tok.encode("def add(a, b):\n    return").ids
    settings = {"model": "tiny", "prompt": [prompt], "temperature": 0, "echo": True, "logprobs": 2}
    with _sdk(served.base) as client:
        scored = client.completions.create(max_tokens=0, **settings)
        one = client.completions.create(max_tokens=1, **settings)
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="tiny", prompt="x", max_tokens=0)
    assert e.value.body["param"] == "max_tokens" and "echo" in e.value.body["message"]
    c, o = scored.choices[0], one.choices[0]
    assert c.text == tok.decode(prompt) and scored.usage.completion_tokens == 0
    assert scored.usage.prompt_tokens == len(prompt)
    n = len(prompt)
    assert len(c.logprobs.tokens) == n and c.logprobs.token_logprobs[0] is None
    # The same scores as the prompt part of a one-token request.
    assert c.logprobs.token_logprobs == o.logprobs.token_logprobs[:n]
    assert c.logprobs.top_logprobs == o.logprobs.top_logprobs[:n]


def test_chat_template_kwargs_and_documents_reach_the_template(tmp_path) -> None:
    import shutil

    import specrt
    from specrt.convert import convert
    from specrt.convert.tiny import write_tiny_gguf

    folder = convert(write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2", seed=4, n_layers=1), tmp_path / "t")
    custom = tmp_path / "custom"
    shutil.copytree(folder, custom)
    (custom / "chat_template.jinja").write_text(
        "{% if enable_thinking is defined and not enable_thinking %}[no-think]{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% for d in documents or [] %}[doc {{ d.title }}: {{ d.text }}]{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    dec = specrt.Decoder(custom, max_seq_len=256)
    messages = [{"role": "user", "content": "hi"}]
    with TestClient(create_app(dec, model_name="t")) as c:
        plain = c.post("/tokenize", json={"messages": messages}).json()["tokens"]
        body = {
            "messages": messages,
            "chat_template_kwargs": {"enable_thinking": False},
            "documents": [{"title": "a", "text": "b"}],
        }
        got = c.post("/tokenize", json=body).json()["tokens"]
        assert dec.tokenizer.decode(plain, skip_special_tokens=False) == "<user>hi<assistant>"
        assert dec.tokenizer.decode(got, skip_special_tokens=False) == "[no-think]<user>hi[doc a: b]<assistant>"
        r = c.post("/v1/chat/completions", json={**body, "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(got)
        bad = c.post("/v1/chat/completions", json={"messages": messages, "chat_template_kwargs": {"messages": []}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs", bad.text
        assert bad.json()["error"]["message"].startswith("chat_template_kwargs: 'messages' cannot be set here")
        # A value the renderer cannot take names its own field (raw JSON: NaN is not JSON, Python's json sends it).
        for field, value in [
            ("chat_template_kwargs", {"x": float("nan")}),
            ("documents", [{"title": "a", "score": float("inf")}]),
            ("tools", [{"type": "function", "function": {"name": "f", "parameters": {"default": float("nan")}}}]),
        ]:
            raw = json.dumps({"messages": messages, field: value})
            r = c.post("/tokenize", content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)


def test_metrics_report_the_prefix_store_a_batched_server_fills(served) -> None:
    """``specrt_prefix_cache_entries`` / ``_bytes``: the batched layout's prefix store holds the finished request's
    prompt (KV copies of both models: bytes > 0), within its budget; the single-stream layout keeps no copies (0)."""

    def gauge(name: str) -> float:
        text = httpx.get(f"{served.base}/metrics").text
        m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
        assert m, name
        return float(m.group(1))

    r = httpx.post(
        f"{served.base}/v1/completions",
        json={"prompt": f"a prompt for the store of the {served.kind} server", "max_tokens": 4, "temperature": 0},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    entries, used = gauge("specrt_prefix_cache_entries"), gauge("specrt_prefix_cache_bytes")
    assert (entries, used) == tuple(float(x) for x in served.decoder.driver.prefix_cache_usage)
    if served.kind == "batched":
        assert entries >= 1 and 0 < used <= specrt._specrt.DEFAULT_PREFIX_CACHE_BYTES
    else:
        assert (entries, used) == (0, 0)
