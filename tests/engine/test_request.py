"""The one request resolver (``specrt_ort::resolve_request``, through ``_specrt.resolve_request``): Python's
``Decoder`` takes its defaults and checks from Rust, and the three places where Python and Rust used to disagree
have one answer each (docs: ARCHITECTURE.md, "One front door")."""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path

import pytest

import specrt
from specrt import _specrt
from specrt.errors import ConfigError, ModelFileError, SequenceLengthError, VocabError


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specrt.convert import convert
    from specrt.convert.tiny import write_tiny_gguf

    root = tmp_path_factory.mktemp("request")
    return convert(write_tiny_gguf(root / "t.gguf", arch="qwen2", seed=2, n_layers=1), root / "t", progress=False)


def test_stream_defaults_are_the_rust_request_defaults() -> None:
    params = inspect.signature(specrt.Decoder.stream).parameters
    rust = _specrt.request_defaults()
    for name, value in rust.items():
        assert params[name].default == value, name
    # Every request setting of stream() has its default from Rust (prompt / messages are the input, _fault a
    # test hook).
    settings = set(params) - {"self", "prompt", "messages", "_fault"}
    assert settings == set(rust)


def test_the_binding_takes_every_rust_setting_by_its_name() -> None:
    # request_defaults names every GenerationRequest field (it destructures the struct: a new field does not compile
    # until named there); request_of must take each of those names, with its default value, and no other.
    rust = _specrt.request_defaults()
    for name, value in rust.items():
        _specrt.resolve_request({name: value}, has_draft=True)
    _specrt.resolve_request(dict(rust), has_draft=True)
    with pytest.raises(TypeError, match="max_tokens"):
        _specrt.resolve_request({"max_tokens": 4}, has_draft=True)


def test_a_null_sampling_value_in_generation_config_is_unset(tiny_target: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(tiny_target, folder)
    gen = json.loads((folder / "generation_config.json").read_text())
    gen.update({"temperature": None, "top_k": None, "top_p": 0.5})
    (folder / "generation_config.json").write_text(json.dumps(gen))
    dec = specrt.Decoder(folder)
    assert "temperature" not in dec.defaults and "top_k" not in dec.defaults
    assert dec.defaults["top_p"] == 0.5
    config = dec.prepare(prompt=[1, 2], max_new_tokens=3).config
    assert config.sampling["temperature"] == 1.0  # unset: the neutral value
    assert config.sampling["top_p"] == 0.5
    assert len(dec.generate([1, 2], max_new_tokens=3, seed=1).token_ids) >= 1


def test_a_malformed_generation_config_names_the_file_and_field(tiny_target: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(tiny_target, folder)
    (folder / "generation_config.json").write_text(json.dumps({"temperature": "hot"}))
    with pytest.raises(ModelFileError, match=r"generation_config\.json: temperature = \"hot\" is invalid"):
        specrt.Decoder(folder)


def test_max_seq_len_defaults_to_rusts_4096_capped_by_the_model(tiny_target: Path) -> None:
    mpe = json.loads((tiny_target / "specrt_config.json").read_text())["max_position_embeddings"]
    assert _specrt.DEFAULT_MAX_SEQ_LEN == 4096
    assert inspect.signature(specrt.Decoder).parameters["max_seq_len"].default == 4096
    assert specrt.Decoder(tiny_target).max_seq_len == min(4096, mpe)


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"max_new_tokens": 0}, ConfigError, r"^max_new_tokens 0 is invalid \(expected an integer >= 1\)"),
        ({"max_new_tokens": "8"}, ConfigError, r"^max_new_tokens '8' is invalid"),
        ({"num_speculative_tokens": "many"}, ConfigError, r"^num_speculative_tokens 'many' is invalid"),
        ({"num_speculative_tokens": 65}, ConfigError, r"^num_speculative_tokens 65 is invalid"),
        ({"num_speculative_tokens": True}, ConfigError, r"^num_speculative_tokens True is invalid"),
        ({"proposer": "magic"}, ConfigError, r"^proposer \"magic\" is invalid \(expected one of: \"draft\""),
        ({"proposer": "draft"}, ConfigError, r"^proposer \"draft\" needs a draft model"),
        ({"temperature": -1.0}, ConfigError, r"^temperature -1 is invalid"),
        ({"temperature": "hot"}, ConfigError, r"^temperature 'hot' is invalid \(expected a number\)"),
        ({"top_k": -1}, ConfigError, r"^top_k -1 is invalid"),
        ({"top_k": 1.5}, ConfigError, r"^top_k 1.5 is invalid"),
        ({"seed": -1}, ConfigError, r"^seed -1 is invalid \(expected an integer 0 <= seed < 2\*\*64\)"),
        ({"seed": 2**64}, ConfigError, r"^seed 18446744073709551616 is invalid"),
        ({"stop": ["ok", ""]}, ConfigError, r"^stop strings must be non-empty"),
        ({"stop": [1]}, ConfigError, r"^stop \[1\] is invalid \(expected a string or a list of strings\)"),
        ({"stop_token_ids": [10**9]}, VocabError, r"^stop_token_ids token 1000000000 at position 0 is out of range"),
        ({"stop_token_ids": [-1]}, VocabError, r"^stop_token_ids token -1 at position 0 is out of range"),
        ({"ignore_eos": "false"}, ConfigError, r"^ignore_eos 'false' is invalid \(expected True or False\)"),
        ({"top_logprobs": 21}, ConfigError, r"top_logprobs 21 is invalid"),
        ({"min_tokens": -2}, ConfigError, r"^min_tokens -2 is invalid"),
        ({"pinned_costs": {"c_draft": 1.0}}, ConfigError, r"^pinned_costs \{'c_draft': 1.0\} is invalid"),
        (
            {"num_speculative_tokens": "auto", "pinned_costs": {"c_draft": 1.0, "c_verify": "x"}},
            ConfigError,
            r"^pinned_costs .* is invalid",
        ),
        (
            {"pinned_costs": {"c_draft": 1.0, "c_verify": [1.0] * 9}},
            ConfigError,
            r"pinned_costs only apply with num_speculative_tokens",
        ),
        (
            {"proposer": "ngram", "prompt_lookup_min": -1},
            ConfigError,
            r"^n-gram lengths prompt_lookup_min = -1, prompt_lookup_max = 4 are invalid",
        ),
        ({"proposer": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 3}, ConfigError, r"n-gram"),
        ({"max_new_tokens": 2**70}, SequenceLengthError, r"exceeds the maximum sequence length"),
    ],
)
def test_each_bad_setting_is_refused_naming_it(tiny_target: Path, settings, error, message) -> None:
    dec = _decoder(tiny_target)
    with pytest.raises(error, match=message):
        dec.generate([1, 2, 3], **settings)
    with pytest.raises(error, match=message):
        dec.prepare(prompt=[1, 2, 3], **settings)  # the Scheduler's path: the same resolver


def test_unused_ngram_lengths_are_not_checked_without_an_ngram_proposer(tiny_target: Path) -> None:
    # As before: the lengths only matter to a proposer that looks n-grams up.
    out = _decoder(tiny_target).generate([1, 2, 3], max_new_tokens=2, prompt_lookup_min=-1, temperature=0)
    assert len(out.token_ids) == 2


def test_prompt_ids_are_checked_by_the_resolver(tiny_target: Path) -> None:
    dec = _decoder(tiny_target)
    with pytest.raises(VocabError, match=r"^prompt token -3 at position 1 is out of range"):
        dec.prepare(prompt=[1, -3])
    with pytest.raises(TypeError, match=r"prompt token 1.5 at position 0 is not an integer"):
        dec.prepare(prompt=[1.5])
    with pytest.raises(ConfigError, match=r"the prompt is empty"):
        dec.prepare(prompt=[])


_DECODERS: dict[Path, specrt.Decoder] = {}


def _decoder(path: Path) -> specrt.Decoder:
    if path not in _DECODERS:
        _DECODERS[path] = specrt.Decoder(path)
    return _DECODERS[path]


def test_the_first_chunk_of_a_prompt_scored_stream_carries_the_prompt_scores(tiny_target: Path) -> None:
    dec = _decoder(tiny_target)
    chunks = list(dec.stream([3, 1, 4, 1, 5], max_new_tokens=4, temperature=0, prompt_logprobs=2))
    result = chunks[-1].result
    assert result is not None and len(result.prompt_logprobs) == 5
    first = chunks[0]
    assert first.prompt_token_ids == [3, 1, 4, 1, 5]
    assert first.prompt_logprobs == result.prompt_logprobs and first.prompt_logprobs[0] is None
    assert first.prompt_top_logprobs == result.prompt_top_logprobs
    assert all(c.prompt_logprobs is None for c in chunks[1:])


def test_a_prepared_request_runs_as_it_was_resolved_and_may_run_twice(tiny_target: Path) -> None:
    # Decoder.prepare is the one resolution (Scheduler.submit and stream use it); the pipeline's submit queues the
    # prepared request as it is, and queuing it again runs the same request again.
    dec = _decoder(tiny_target)
    settings = {"max_new_tokens": 6, "temperature": 0, "stop": ["never"], "prompt_logprobs": 1}
    request = dec.prepare(prompt=[1, 2, 3], **settings)
    assert request.prompt_ids == [1, 2, 3]
    assert request.stop == ["never"]
    assert request.scored
    assert request.config.max_new_tokens == 6
    assert request.config.sampling["temperature"] == 0.0
    batch = dec.driver
    runs = []
    for _ in range(2):
        rid = batch.submit(request)
        done = None
        while done is None:
            done = next((e["done"] for e in batch.step() if e["id"] == rid and e["done"]), None)
        runs.append(done["tokens"])
    assert runs[0] == runs[1] == dec.generate([1, 2, 3], **settings).token_ids
