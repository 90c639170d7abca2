"""Chat templates rendered in Rust (``_specrt.ChatTemplate``: minijinja, ``rust/specrt-text/src/chat.rs``) equal Hugging
Face transformers' ``apply_chat_template(conversation, tools=..., documents=..., add_generation_prompt=...,
tokenize=False)`` (jinja2), character for character, for the model registry's templates and llama.cpp's collection
(``models/templates/*.jinja``, vendored in llama-cpp-python's sdist, fetched once into the specrt cache).

Each template is rendered for the cases of :data:`CASES` (with and without a system message, with and without the
generation prompt, several turns, tools, a tool call and its answer, content parts, reasoning, documents, extra
template arguments). A case transformers itself cannot render (the template's own ``raise_exception``, or an error of
jinja2) is skipped for that template; where the template raised, ours must raise ``ConfigError`` with its message.
``strftime_now`` formats :data:`FIXED_NOW` in both (transformers' ``datetime`` is patched)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from specrt import _specrt
from specrt.errors import ConfigError, ModelFileNotFoundError

#: transformers 5 drops None-valued message keys and aliases reasoning fields, as the Rust renderer does.
transformers = pytest.importorskip("transformers", minversion="5.0")

#: The moment ``strftime_now`` formats in both renderers.
FIXED_NOW = dt.datetime(2024, 7, 26, 9, 5, 3)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]
#: Command-R's own tool format.
COHERE_TOOLS = [
    {
        "name": "internet_search",
        "description": "Returns a list of relevant document snippets for a textual query retrieved from the internet",
        "parameter_definitions": {
            "query": {"description": "Query to search the internet with", "type": "str", "required": True}
        },
    }
]
DOCUMENTS = [{"title": "Paris weather", "text": "Paris is sunny today."}, {"title": "Lyon", "text": "Lyon: 27 °C."}]
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
USER = {"role": "user", "content": "What's the weather like in Paris & Lyon? <b>Be brief</b>."}
ASSISTANT = {"role": "assistant", "content": "Sunny in both, about 25 °C."}
USER2 = {"role": "user", "content": "And tomorrow?"}
PARTS = {"role": "user", "content": [{"type": "text", "text": "Describe Paris"}, {"type": "text", "text": " briefly."}]}
THOUGHT = {"role": "assistant", "content": "Sunny, 25 °C.", "reasoning_content": "The user wants the weather."}
#: Tool call ids of 9 alphanumerics: Mistral's templates refuse others.
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "abc123xyz", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    ],
}
CALL_JSON_ARGS = {
    "role": "assistant",
    "content": None,  # dropped, as transformers drops None-valued keys
    "tool_calls": [
        {"id": "abc123xyz", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ],
}
TOOL = {"role": "tool", "tool_call_id": "abc123xyz", "name": "get_weather", "content": '{"temperature": 25}'}


@dataclasses.dataclass(frozen=True)
class Case:
    """One rendering: ``messages`` with these arguments; ``needs``: a word the template must contain for the case to
    apply (its documents or tool format), or None."""

    messages: list[dict[str, Any]]
    add_generation_prompt: bool
    tools: list[dict[str, Any]] | None = None
    documents: list[dict[str, Any]] | None = None
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    needs: str | None = None


CASES: dict[str, Case] = {
    "user+gen": Case([USER], True),
    "user": Case([USER], False),
    "system+gen": Case([SYSTEM, USER], True),
    "multi_turn+gen": Case([USER, ASSISTANT, USER2], True),
    "system+multi_turn": Case([SYSTEM, USER, ASSISTANT], False),
    "tools+gen": Case([USER], True, tools=TOOLS),
    "tools+system+gen": Case([SYSTEM, USER], True, tools=TOOLS),
    "tool_call+tool_result+gen": Case([USER, CALL, TOOL], True, tools=TOOLS),
    "tool_call_json_args+gen": Case([SYSTEM, USER, CALL_JSON_ARGS, TOOL], True, tools=TOOLS),
    "content_parts+gen": Case([PARTS], True),
    "reasoning+multi_turn+gen": Case([USER, THOUGHT, USER2], True),
    "enable_thinking_false+gen": Case([USER], True, kwargs={"enable_thinking": False}, needs="enable_thinking"),
    "cohere_tools+gen": Case([USER], True, tools=COHERE_TOOLS, needs="parameter_definitions"),
    "documents+gen": Case([USER], True, documents=DOCUMENTS, needs="documents"),
}

#: llama.cpp templates for the families named in the brief (file stems of ``models/templates``).
FAMILIES = {
    "llama-3.1-tools": "meta-llama-Llama-3.1-8B-Instruct",
    "llama-3.2": "meta-llama-Llama-3.2-3B-Instruct",
    "llama-3.3": "meta-llama-Llama-3.3-70B-Instruct",
    "mistral-nemo": "mistralai-Mistral-Nemo-Instruct-2407",
    "mistral-small-3.2": "Mistral-Small-3.2-24B-Instruct-2506",
    "ministral-3": "mistralai-Ministral-3-14B-Reasoning-2512",
    "gemma-2": "google-gemma-2-2b-it",
    "phi-3.5": "microsoft-Phi-3.5-mini-instruct",
    "deepseek-r1-distill-qwen": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "deepseek-r1-distill-llama": "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "deepseek-v3.1": "deepseek-ai-DeepSeek-V3.1",
    "qwen2.5-tools": "Qwen-Qwen2.5-7B-Instruct",
    "qwen3": "Qwen-Qwen3-0.6B",
    "qwq": "Qwen-QwQ-32B",
    "command-r-plus-tools": "CohereForAI-c4ai-command-r-plus-tool_use",
    "command-r7b-tools": "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
    "granite-3.3": "ibm-granite-granite-3.3-2B-Instruct",
    "granite-4.0": "ibm-granite-granite-4.0",
    "hermes-3-tools": "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    "smollm3": "HuggingFaceTB-SmolLM3-3B",
    "gpt-oss": "openai-gpt-oss-120b",
}

#: (template stem, case) pairs where the two renderings differ, with why. Nothing else may differ.
KNOWN_DIFFERENCES = {
    (stem, case): (
        "jinja2 Markup semantics: `'...'|safe + x` HTML-escapes x (the template's tojson output becomes &#34;...); "
        "minijinja's + does not escape"
    )
    for stem in ("meetkai-functionary-medium-v3.1",)
    for case in ("tools+gen", "tools+system+gen", "tool_call+tool_result+gen", "tool_call_json_args+gen")
}


@pytest.fixture(autouse=True)
def _fixed_transformers_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' ``strftime_now`` calls ``datetime.now()`` of its module: make it :data:`FIXED_NOW`."""
    from transformers.utils import chat_template_utils

    class _Fixed(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> dt.datetime:  # type: ignore[override]
            return FIXED_NOW

    monkeypatch.setattr(chat_template_utils, "datetime", _Fixed)


def _hf_tokenizer(source: str, special_tokens: dict[str, str]) -> Any:
    """A transformers fast tokenizer holding ``source`` as its chat template (the vocabulary does not matter)."""
    from tokenizers import Tokenizer, models

    backend = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=source, **special_tokens)


def _special_tokens(stem: str) -> dict[str, str]:
    """Plausible BOS / EOS strings for a llama.cpp template (either renderer gets the same ones)."""
    s = stem.lower()
    if "llama-3" in s or "hermes-3" in s or "firefunction" in s or "functionary" in s or "llama-8b" in s:
        return {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    if "gemma" in s:
        return {"bos_token": "<bos>", "eos_token": "<eos>"}
    return {"bos_token": "<s>", "eos_token": "</s>"}


@dataclasses.dataclass
class Outcome:
    """One (template, case): ``status`` is match, differ, ours_failed, refused_alike (transformers and ours both
    raise), or skipped (transformers cannot render it; ``detail`` says why)."""

    template: str
    case: str
    status: str
    detail: str = ""


def _compare(name: str, source: str, special_tokens: dict[str, str], ours: Any = None, hf: Any = None) -> list[Outcome]:
    """Every applicable case of :data:`CASES` rendered by transformers and by ``_specrt.ChatTemplate``."""
    import jinja2

    hf = hf if hf is not None else _hf_tokenizer(source, special_tokens)
    compile_error = None
    if ours is None:
        try:
            ours = _specrt.ChatTemplate(source, special_tokens, now=FIXED_NOW)
        except ConfigError as e:
            compile_error = e
    out = []
    for case_name, case in CASES.items():
        if case.needs is not None and case.needs not in source:
            continue
        try:
            want = hf.apply_chat_template(
                case.messages,
                tools=case.tools,
                documents=case.documents,
                add_generation_prompt=case.add_generation_prompt,
                tokenize=False,
                **case.kwargs,
            )
        except jinja2.TemplateError as e:
            raised = type(e) is jinja2.TemplateError  # the template's raise_exception, not a jinja2 error
            try:
                if compile_error is not None:
                    raise compile_error
                ours.render(case.messages, case.add_generation_prompt, case.tools, case.documents, **case.kwargs)
            except ConfigError as ours_error:
                if raised and str(e) not in str(ours_error):
                    out.append(Outcome(name, case_name, "differ", f"raise_exception {e!s:.80} -> ours {ours_error}"))
                else:
                    out.append(Outcome(name, case_name, "refused_alike", f"{type(e).__name__}: {e!s:.100}"))
                continue
            if raised:
                out.append(Outcome(name, case_name, "differ", f"the template raised {e!s:.100}; ours rendered"))
            else:
                out.append(Outcome(name, case_name, "skipped", f"transformers: {type(e).__name__}: {e!s:.100}"))
            continue
        except Exception as e:  # jinja2 runtime errors surface as Python's (TypeError, ...)
            out.append(Outcome(name, case_name, "skipped", f"transformers: {type(e).__name__}: {e!s:.100}"))
            continue
        try:
            if compile_error is not None:
                raise compile_error
            got = ours.render(case.messages, case.add_generation_prompt, case.tools, case.documents, **case.kwargs)
        except ConfigError as e:
            out.append(Outcome(name, case_name, "ours_failed", str(e)))
            continue
        if got == want:
            out.append(Outcome(name, case_name, "match"))
        else:
            i = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
            out.append(
                Outcome(
                    name, case_name, "differ", f"at {i}: ours {got[i : i + 60]!r}, transformers {want[i : i + 60]!r}"
                )
            )
    return out


def _unexpected(outcomes: list[Outcome]) -> list[Outcome]:
    return [
        o for o in outcomes if o.status in ("differ", "ours_failed") and (o.template, o.case) not in KNOWN_DIFFERENCES
    ]


def _report(outcomes: list[Outcome]) -> str:
    counts = Counter(o.status for o in outcomes)
    lines = [f"{len({o.template for o in outcomes})} templates, (template, case) pairs: {dict(sorted(counts.items()))}"]
    lines += [
        f"  {o.status}: {o.template} / {o.case}: {o.detail}" for o in outcomes if o.status in ("differ", "ours_failed")
    ]
    return "\n".join(lines)


# ----- the registry's templates ----------------------------------------------------------------------------------
def _registry_folder(name: str) -> Path | None:
    """A converted folder of registry model ``name`` in the cache (any dtype) with its chat template, or None."""
    from specrt.models import cache_dir

    root = cache_dir() / "models" / name
    if not root.is_dir():
        return None
    for folder in sorted(root.iterdir()):
        if (folder / "chat_template.jinja").is_file() and (folder / "tokenizer_config.json").is_file():
            return folder
    return None


def _registry_names() -> list[str]:
    from specrt.models import MODELS

    return sorted(MODELS)


@pytest.mark.parametrize("name", _registry_names())
def test_registry_template_renders_as_transformers(name: str, tmp_path: Path) -> None:
    """The registry model's converted folder: ``ChatTemplate.from_folder`` (its BOS / EOS strings from the folder)
    equals transformers' ``AutoTokenizer.from_pretrained(folder)``, case for case.

    The folder is the cached one's ``tokenizer.json``, ``chat_template.jinja`` and ``specrt_config.json`` with the
    ``tokenizer_config.json`` that ``specrt convert`` writes today (its own function, from those ids): what this checks
    is the converter's output and our renderer, not whatever an older converter (or a tool) left in the cache."""
    from tokenizers import Tokenizer

    from specrt.convert.tokenizer import hf_tokenizer_config

    cached = _registry_folder(name)
    if cached is None:
        from specrt.models import cache_dir

        if (cache_dir() / "models" / name).is_dir():
            pytest.skip(f"{name} is in the specrt cache without a chat template (a base model's GGUF carries none)")
        pytest.skip(f"{name} is not in the specrt cache (specrt models pull {name})")
    folder = tmp_path / name
    folder.mkdir()
    for f in ("tokenizer.json", "chat_template.jinja", "specrt_config.json"):
        shutil.copyfile(cached / f, folder / f)
    cfg = json.loads((folder / "specrt_config.json").read_text(encoding="utf-8"))
    tok_config = hf_tokenizer_config(
        Tokenizer.from_file(str(folder / "tokenizer.json")),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=list(cfg["eos_token_ids"]),
        pad_token_id=cfg.get("pad_token_id"),
        chat_template=(folder / "chat_template.jinja").read_text(encoding="utf-8"),
        model_max_length=int(cfg["max_position_embeddings"]),
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config), encoding="utf-8")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    ours = _specrt.ChatTemplate.from_folder(folder, now=FIXED_NOW)
    assert ours.special_tokens == hf.special_tokens_map
    source = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    outcomes = _compare(name, source, hf.special_tokens_map, ours=ours, hf=hf)
    print(_report(outcomes))
    assert not _unexpected(outcomes), _report(outcomes)
    assert sum(o.status == "match" for o in outcomes) >= 5


# ----- llama.cpp's collection ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_cpp_templates() -> dict[str, str]:
    """stem -> source of every ``models/templates/*.jinja`` of the llama.cpp vendored in llama-cpp-python's sdist
    (the version ``specrt bench``'s llama.cpp peer builds), fetched once into ``<specrt cache>/llama.cpp/<version>``
    where ``setup_llama_cpp.sh`` looks for it; skip when it cannot be fetched."""
    from specrt.bench.peers import LLAMA_CPP_PYTHON_VERSION
    from specrt.models import cache_dir

    version = LLAMA_CPP_PYTHON_VERSION
    root = cache_dir() / "llama.cpp" / version
    sdist = root / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.is_file():
        tmp = root / "download.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary=llama-cpp-python"]
        try:
            r = subprocess.run(
                [*cmd, f"llama-cpp-python=={version}", "-d", str(tmp)], capture_output=True, text=True, timeout=600
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            pytest.skip(f"cannot fetch the llama-cpp-python {version} sdist from PyPI: {e}")
        got = tmp / sdist.name
        if r.returncode != 0 or not got.is_file():
            shutil.rmtree(tmp, ignore_errors=True)
            pytest.skip(f"cannot fetch the llama-cpp-python {version} sdist from PyPI: {r.stderr.strip()[-300:]}")
        got.replace(sdist)
        shutil.rmtree(tmp, ignore_errors=True)
    templates = {}
    try:
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                parent, _, file = member.name.rpartition("/")
                if parent.endswith("/vendor/llama.cpp/models/templates") and file.endswith(".jinja"):
                    f = tar.extractfile(member)
                    if f is not None:
                        templates[file.removesuffix(".jinja")] = f.read().decode("utf-8")
    except (tarfile.TarError, OSError, EOFError) as e:
        pytest.skip(f"{sdist} is unreadable ({e}); delete it to fetch it again")
    if not templates:
        pytest.skip(f"{sdist} holds no models/templates/*.jinja")
    return templates


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_template_renders_as_transformers(family: str, llama_cpp_templates: dict[str, str]) -> None:
    """A model family's template from llama.cpp's collection: every case transformers renders, ours renders the
    same; every case the template refuses with ``raise_exception``, ours refuses with the same message."""
    stem = FAMILIES[family]
    if stem not in llama_cpp_templates:
        pytest.skip(f"{stem}.jinja is not in this llama.cpp's models/templates")
    outcomes = _compare(stem, llama_cpp_templates[stem], _special_tokens(stem))
    print(_report(outcomes))
    assert not _unexpected(outcomes), _report(outcomes)
    assert any(o.status == "match" for o in outcomes), _report(outcomes)


def test_every_llama_cpp_template_renders_as_transformers(llama_cpp_templates: dict[str, str]) -> None:
    """All of llama.cpp's collection x :data:`CASES`: only :data:`KNOWN_DIFFERENCES` differ (the report, printed,
    counts the pairs that match, that transformers cannot render, and that both refuse)."""
    outcomes = [
        o for stem, source in sorted(llama_cpp_templates.items()) for o in _compare(stem, source, _special_tokens(stem))
    ]
    report = _report(outcomes)
    print(report)
    assert not _unexpected(outcomes), report
    assert sum(o.status == "match" for o in outcomes) >= 10 * len(llama_cpp_templates) // 2, report


# ----- the renderer's own contract -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("{{ messages | from_json }}", ["unknown filter", "from_json", "line 1"]),
        ("\n{% if messages is palindrome %}x{% endif %}", ["unknown test", "palindrome", "line 2"]),
        ("{{ messages[0].content.zfill(3) }}", ["unknown method", "zfill"]),
        ("{{ undefined_function_x() }}", ["undefined_function_x"]),
    ],
)
def test_an_unsupported_construct_raises_config_error_naming_it(source: str, names: list[str]) -> None:
    t = _specrt.ChatTemplate(source)
    with pytest.raises(ConfigError) as e:
        t.render([{"role": "user", "content": "hi"}])
    for n in names:
        assert n in str(e.value)


def test_an_unknown_statement_fails_at_compile_time_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"unknown statement trans.*line 3"):
        _specrt.ChatTemplate("a\nb\n{% trans %}hi{% endtrans %}")


def test_raise_exception_message_reaches_config_error() -> None:
    t = _specrt.ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
    )
    with pytest.raises(ConfigError, match=r"^chat template failed: first must be user$"):
        t.render([{"role": "system", "content": "x"}])


def test_tojson_is_pythons_json_dumps() -> None:
    import json

    value = {"b": "<a & 'q'> é\n", "a": [1, 2.5, 1e20, 1e-7, True, None], "c": {}}
    src = "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(separators=(',', ':'), sort_keys=true) }}"
    got = _specrt.ChatTemplate(src).render([], x=value).split("|")
    assert got == [
        json.dumps(value, ensure_ascii=False),
        json.dumps(value, ensure_ascii=False, indent=2),
        json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True),
    ]
    assert _specrt.ChatTemplate("{{ x | tojson(ensure_ascii=true) }}").render([], x=value) == json.dumps(value)


def test_strftime_now_defaults_to_the_current_utc_date() -> None:
    before = dt.datetime.now(dt.timezone.utc).date()
    got = _specrt.ChatTemplate("{{ strftime_now('%Y-%m-%d') }}").render([])
    after = dt.datetime.now(dt.timezone.utc).date()
    assert got in {before.isoformat(), after.isoformat()}
    fixed = _specrt.ChatTemplate("{{ strftime_now('%d %B %Y') }}", now=FIXED_NOW).render([])
    assert fixed == FIXED_NOW.strftime("%d %B %Y")


def test_python_values_are_passed_as_transformers_passes_them() -> None:
    """Tuples are lists, None-valued message keys are dropped, pydantic models are dumped, other objects are
    placeholders naming their type, as transformers' ``_plain_template_data``; a non-str key is a ConfigError."""
    pydantic = pytest.importorskip("pydantic")

    class Fn(pydantic.BaseModel):
        name: str

    t = _specrt.ChatTemplate("{% for m in messages %}{{ m | tojson }}{% endfor %}|{{ extra | tojson }}")
    got = t.render([{"role": "user", "content": "hi", "name": None}], extra=(Fn(name="f"), object()))
    assert got == '{"role": "user", "content": "hi"}|[{"name": "f"}, "<object>"]'
    with pytest.raises(ConfigError, match=r"key 1 is a int"):
        t.render([{"role": "user", 1: "x"}])
    with pytest.raises(ConfigError, match="not finite"):
        t.render([], extra=float("nan"))


def test_from_folder_takes_bos_and_eos_from_tokenizer_config(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}")
    (tmp_path / "tokenizer_config.json").write_text(
        '{"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}, "pad_token": null}'
    )
    t = _specrt.ChatTemplate.from_folder(tmp_path)
    assert t.special_tokens == {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    assert t.render([{"role": "user", "content": "hi"}]) == "<|begin_of_text|>hi<|eot_id|>"


def test_from_folder_names_the_ids_of_specrt_config_without_tokenizer_config(tmp_path: Path) -> None:
    """A folder converted before ``tokenizer_config.json`` existed: ``specrt_config.json``'s ids, named through
    ``tokenizer.json``."""
    from tokenizers import AddedToken, Tokenizer, models

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "specrt_config.json").write_text('{"bos_token_id": 2, "eos_token_ids": [3, 1]}')
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}x{{ eos_token }}")
    t = _specrt.ChatTemplate.from_folder(tmp_path)
    assert t.render([]) == "<s>x</s>"


def test_from_folder_without_a_template_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(ModelFileNotFoundError, match=r"chat_template\.jinja"):
        _specrt.ChatTemplate.from_folder(tmp_path)


def test_generation_blocks_render_their_body_as_transformers() -> None:
    """``{% generation %}`` (transformers' assistant-mask block) renders its body, whitespace control kept."""
    src = (
        "{% for m in messages %}{% if m.role == 'assistant' %}"
        "{%- generation -%} <{{ m.content }}> {%- endgeneration -%}"
        "{% else %}{{ m.content }}\n{% endif %}{% endfor %}"
    )
    outcomes = _compare("generation-block", src, {})
    assert not _unexpected(outcomes), _report(outcomes)
    assert any(o.status == "match" for o in outcomes)
