"""The ONNX Runtime backend (``specrt._specrt.OrtModel`` over ``specrt-ort``) on tiny CPU models.

Oracles: the onnxruntime Python session on the same model (full-sequence logits), the backend itself (chunked
prefill == one prefill; rollback == never having seen the rolled-back tokens), and for a converted GGUF the NumPy
reference of ``specrt.convert``. Models come from ``tests/fixtures/tiny_decoders.py`` (contract layout with
GroupQueryAttention and a shared KV buffer; Hugging Face Optimum layout with Concat caches).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from fixtures.tiny_decoders import DecoderSpec, make_contract_decoder, make_optimum_decoder
from specrt._ort import cuda_provider_library, find_ort_library
from specrt._specrt import OrtModel

try:
    from specrt import errors as _errors
except ImportError:  # errors.py not there yet: the binding maps to the built-in bases
    _errors = None

# The project hierarchy subclasses the built-ins (ConfigError(SpecrtError, ValueError), ...), so these hold both ways.
ConfigError = getattr(_errors, "ConfigError", ValueError)
LengthError = getattr(_errors, "SequenceLengthError", ValueError)
VocabError = getattr(_errors, "VocabError", ValueError)
ModelFileError = getattr(_errors, "ModelFileError", OSError)
ProviderError = getattr(_errors, "ProviderError", RuntimeError)
BackendError = getattr(_errors, "BackendError", RuntimeError)

SPEC = DecoderSpec()  # vocab 64, 2 layers, 4 heads / 2 KV heads of 16, 128 positions
MAX_SEQ = 48
ATOL = 1e-4


def _tokens(n: int, seed: int = 0) -> np.ndarray:
    # [n] int64 token ids
    return np.random.default_rng(seed).integers(0, SPEC.vocab_size, n).astype(np.int64)


@pytest.fixture(scope="module")
def contract_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("contract")
    make_contract_decoder(folder, SPEC)
    return folder


@pytest.fixture(scope="module")
def optimum_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("optimum")
    make_optimum_decoder(folder, SPEC)
    return folder


@pytest.fixture(scope="module")
def ort_library() -> str:
    return find_ort_library()


def _contract_reference(model_dir: Path, tokens: np.ndarray) -> np.ndarray:
    """Full-sequence logits ``[S, vocab]`` float32 from an onnxruntime Python session (fresh zero cache)."""
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {
        "input_ids": tokens[None].astype(np.int64),
        "attention_mask": np.ones((1, len(tokens)), np.int64),
    }
    for i in range(SPEC.num_layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, SPEC.num_kv_heads, MAX_SEQ, SPEC.head_dim), np.float32)
    return sess.run(["logits"], feeds)[0][0]


def _optimum_reference(model_dir: Path, tokens: np.ndarray) -> np.ndarray:
    """Full-sequence logits ``[S, vocab]`` float32 of the Optimum fixture (empty past)."""
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    n = len(tokens)
    feeds = {
        "input_ids": tokens[None].astype(np.int64),
        "attention_mask": np.ones((1, n), np.int64),
        "position_ids": np.arange(n, dtype=np.int64)[None],
    }
    for i in range(SPEC.num_layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, SPEC.num_heads, 0, SPEC.head_dim), np.float32)
    return sess.run(["logits"], feeds)[0][0]


# ---------------------------------------------------------------------------------------------- contract layout


def test_contract_model_is_detected_and_described(contract_dir: Path, ort_library: str) -> None:
    m = OrtModel(contract_dir, ort_library=ort_library, max_seq_len=MAX_SEQ)
    assert m.layout == "shared_buffer"
    assert m.vocab_size == SPEC.vocab_size
    assert m.max_seq_len == MAX_SEQ
    assert m.num_layers == SPEC.num_layers
    assert m.kv_dtype == "float32"
    assert m.providers == ["CPUExecutionProvider"]
    assert m.fallback_reason is None
    assert m.n_cached == 0


def test_prefill_logits_equal_onnxruntime_python(contract_dir: Path) -> None:
    tokens = _tokens(12)
    m = OrtModel(contract_dir, max_seq_len=MAX_SEQ)
    got = m.forward(tokens, 0, len(tokens))
    assert got.shape == (12, SPEC.vocab_size) and got.dtype == np.float32
    np.testing.assert_allclose(got, _contract_reference(contract_dir, tokens), atol=ATOL, rtol=0)


@pytest.mark.parametrize(("n", "k"), [(1, 0), (5, 3), (9, 2), (11, 0)])
def test_prefill_then_chunk_equals_one_prefill(contract_dir: Path, n: int, k: int) -> None:
    tokens = _tokens(n + k + 1, seed=n)
    full = OrtModel(contract_dir, max_seq_len=MAX_SEQ).forward(tokens, 0, len(tokens))
    m = OrtModel(contract_dir, max_seq_len=MAX_SEQ)
    m.forward(tokens[:n], 0, 1)
    chunk = m.forward(tokens[n:], n, k + 1)  # a verify pass: k drafts + 1
    np.testing.assert_allclose(chunk, full[n:], atol=ATOL, rtol=0)
    assert m.n_cached == n + k + 1


@pytest.mark.parametrize("j", [1, 3, 6])
def test_rollback_equals_never_having_seen_the_tokens(contract_dir: Path, j: int) -> None:
    tokens = _tokens(14, seed=j)
    full = OrtModel(contract_dir, max_seq_len=MAX_SEQ).forward(tokens, 0, len(tokens))
    m = OrtModel(contract_dir, max_seq_len=MAX_SEQ)
    m.forward(tokens[:8], 0, 1)
    rejected = (tokens[8 : 8 + j] + 1) % SPEC.vocab_size  # j draft tokens that will be rejected
    seen = m.forward(rejected, 8, j)
    assert not np.allclose(seen[0], full[8], atol=1e-3), "the fixture must be sensitive to the token"
    again = m.forward(tokens[8:], 8, 6)  # roll back to 8 and continue
    np.testing.assert_allclose(again, full[8:], atol=ATOL, rtol=0)
    # decode one more after the rollback
    step = m.forward(tokens[13:14], 13, 1)
    np.testing.assert_allclose(step, full[13:14], atol=ATOL, rtol=0)


def test_n_logits_limits_rows_to_the_last_positions(contract_dir: Path) -> None:
    tokens = _tokens(10, seed=3)
    full = OrtModel(contract_dir, max_seq_len=MAX_SEQ).forward(tokens, 0, 10)
    for n_logits in (1, 3, 10):
        got = OrtModel(contract_dir, max_seq_len=MAX_SEQ).forward(tokens, 0, n_logits)
        assert got.shape == (n_logits, SPEC.vocab_size)
        np.testing.assert_allclose(got, full[-n_logits:], atol=ATOL, rtol=0)


def test_kv_cache_is_allocated_once(contract_dir: Path) -> None:
    m = OrtModel(contract_dir, max_seq_len=MAX_SEQ)
    addresses = m.kv_buffer_addresses()
    assert len(addresses) == 2 * SPEC.num_layers and all(addresses) and len(set(addresses)) == len(addresses)
    tokens = _tokens(20, seed=5)
    m.forward(tokens[:10], 0, 1)
    logits_at = m.logits_address()
    for i in range(10, 20):
        m.forward(tokens[i : i + 1], i, 1)
        assert m.kv_buffer_addresses() == addresses
        assert m.logits_address() == logits_at  # same row count -> same reused logits buffer
    m.forward(tokens[:4], 5, 4)  # rollback + verify shape change: still the same KV buffers
    assert m.kv_buffer_addresses() == addresses


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint32, np.uint16, "list"])
def test_token_arrays_of_any_integer_type_are_accepted(contract_dir: Path, dtype: object) -> None:
    tokens = _tokens(6, seed=9)
    m = OrtModel(contract_dir, max_seq_len=MAX_SEQ)
    want = m.forward(tokens, 0, 2)
    arg = tokens.tolist() if dtype == "list" else tokens.astype(dtype)
    np.testing.assert_array_equal(OrtModel(contract_dir, max_seq_len=MAX_SEQ).forward(arg, 0, 2), want)


def test_fp16_model_runs_with_an_fp16_kv_cache(tmp_path: Path, contract_dir: Path) -> None:
    # The CUDA form of the contract (fp16 weights and KV, logits cast to float32 in the graph), here on CPU.
    make_contract_decoder(tmp_path, SPEC, fp16=True)
    m = OrtModel(tmp_path, max_seq_len=MAX_SEQ)
    assert m.kv_dtype == "float16"
    tokens = _tokens(12, seed=8)
    full = m.forward(tokens, 0, 12)
    assert full.dtype == np.float32
    fp32 = OrtModel(contract_dir, max_seq_len=MAX_SEQ).forward(tokens, 0, 12)
    np.testing.assert_allclose(full, fp32, atol=2e-2, rtol=0)
    m = OrtModel(tmp_path, max_seq_len=MAX_SEQ)
    m.forward(tokens[:7], 0, 1)
    m.forward((tokens[7:10] + 1) % SPEC.vocab_size, 7, 3)
    np.testing.assert_allclose(m.forward(tokens[7:], 7, 5), full[7:], atol=2e-3, rtol=0)


def test_layout_is_detected_without_specrt_config(tmp_path: Path) -> None:
    # No specrt_config.json: the overridable num_logits_to_keep input marks the contract layout.
    make_contract_decoder(tmp_path, SPEC, write_config=False)
    m = OrtModel(tmp_path, max_seq_len=MAX_SEQ)
    assert m.layout == "shared_buffer"
    tokens = _tokens(7, seed=2)
    np.testing.assert_allclose(m.forward(tokens, 0, 7), _contract_reference(tmp_path, tokens), atol=ATOL, rtol=0)


def test_max_seq_len_is_capped_by_the_model_and_defaults_to_it(contract_dir: Path) -> None:
    assert OrtModel(contract_dir, max_seq_len=10_000).max_seq_len == SPEC.max_positions
    assert OrtModel(contract_dir).max_seq_len == SPEC.max_positions


def test_converted_gguf_runs_and_matches_numpy_reference(tmp_path: Path) -> None:
    convert_mod = pytest.importorskip("specrt.convert")
    tiny = pytest.importorskip("specrt.convert.tiny")
    reference = pytest.importorskip("specrt.convert.reference_forward")
    from specrt.convert.gguf_reader import GGUFModel

    gguf = tiny.write_tiny_gguf(tmp_path / "m.gguf", seed=3)
    out = convert_mod.convert(gguf, tmp_path / "onnx", progress=False)
    m = OrtModel(out, max_seq_len=64)
    assert m.layout == "shared_buffer"
    tokens = np.arange(1, 13, dtype=np.int64) * 7 % m.vocab_size
    want = reference.reference_logits(GGUFModel(gguf), tokens)
    m.forward(tokens[:6], 0, 1)
    m.forward(tokens[6:9] + 1, 6, 3)  # rejected drafts
    got = m.forward(tokens[6:], 6, 6)
    np.testing.assert_allclose(got, want[6:], atol=2e-3, rtol=1e-3)


# ----------------------------------------------------------------------------------------------- Optimum layout


def test_optimum_model_is_detected(optimum_dir: Path) -> None:
    m = OrtModel(optimum_dir, max_seq_len=SPEC.max_positions)
    assert m.layout == "optimum"
    assert m.vocab_size == SPEC.vocab_size


def test_optimum_prefill_chunk_rollback_match_reference(optimum_dir: Path) -> None:
    tokens = _tokens(14, seed=11)
    full = _optimum_reference(optimum_dir, tokens)
    m = OrtModel(optimum_dir, max_seq_len=SPEC.max_positions)
    np.testing.assert_allclose(m.forward(tokens, 0, 14), full, atol=ATOL, rtol=0)

    m = OrtModel(optimum_dir, max_seq_len=SPEC.max_positions)
    m.forward(tokens[:6], 0, 1)
    np.testing.assert_allclose(m.forward(tokens[6:9], 6, 3), full[6:9], atol=ATOL, rtol=0)
    # reject 2 of those 3, then feed different ones: the cache must be sliced back to 7
    wrong = m.forward((tokens[7:10] + 5) % SPEC.vocab_size, 7, 3)
    assert not np.allclose(wrong, full[7:10], atol=1e-3)
    np.testing.assert_allclose(m.forward(tokens[7:12], 7, 2), full[10:12], atol=ATOL, rtol=0)
    np.testing.assert_allclose(m.forward(tokens[12:13], 12, 1), full[12:13], atol=ATOL, rtol=0)
    # roll back to the very start
    np.testing.assert_allclose(m.forward(tokens[:3], 0, 3), full[:3], atol=ATOL, rtol=0)


def test_optimum_without_position_ids(tmp_path: Path) -> None:
    make_optimum_decoder(tmp_path, SPEC, with_position_ids=False)
    tokens = _tokens(9, seed=4)
    full = OrtModel(tmp_path, max_seq_len=64).forward(tokens, 0, 9)
    m = OrtModel(tmp_path, max_seq_len=64)
    m.forward(tokens[:4], 0, 1)
    m.forward(tokens[4:8][::-1].copy(), 4, 1)
    np.testing.assert_allclose(m.forward(tokens[4:], 4, 5), full[4:], atol=ATOL, rtol=0)


def test_unknown_layout_is_a_config_error(optimum_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r'kv layout "paged" is invalid'):
        OrtModel(optimum_dir, layout="paged")


# -------------------------------------------------------------------------------------------------- bad inputs


@pytest.fixture(scope="module")
def model(contract_dir: Path) -> OrtModel:
    return OrtModel(contract_dir, max_seq_len=16)


def test_too_long_is_a_length_error_naming_both_numbers(model: OrtModel) -> None:
    model.forward(_tokens(10), 0, 1)
    with pytest.raises(LengthError, match=r"10 \+ 7 tokens = 17 exceeds max_seq_len 16"):
        model.forward(_tokens(7), 10, 1)


def test_token_out_of_vocab_is_rejected(model: OrtModel) -> None:
    with pytest.raises(VocabError, match=r"token 64 at index 1 .*vocab size 64"):
        model.forward(np.array([1, 64, 2]), 0, 1)
    with pytest.raises(VocabError, match="token -1"):
        model.forward(np.array([-1]), 0, 1)


@pytest.mark.parametrize("n_logits", [0, 4])
def test_bad_n_logits_is_a_config_error(model: OrtModel, n_logits: int) -> None:
    with pytest.raises(ConfigError, match=f"n_logits {n_logits} is invalid"):
        model.forward(np.array([1, 2, 3]), 0, n_logits)


def test_empty_tokens_and_n_past_beyond_the_cache_are_config_errors(model: OrtModel) -> None:
    with pytest.raises(ConfigError, match="empty"):
        model.forward(np.array([], np.int64), 0, 1)
    model.forward(np.array([1, 2]), 0, 1)
    with pytest.raises(ConfigError, match="n_past 5 exceeds the 2 positions cached"):
        model.forward(np.array([1]), 5, 1)


def test_two_dimensional_tokens_are_a_type_error(model: OrtModel) -> None:
    with pytest.raises(TypeError, match="1-D"):
        model.forward(np.zeros((1, 3), np.int64), 0, 1)


def test_missing_model_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        OrtModel(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"model\.onnx"):
        OrtModel(tmp_path)  # a folder without model.onnx


def test_corrupt_onnx_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"this is not a protobuf" * 10)
    with pytest.raises(OSError, match=r"cannot load model .*model\.onnx"):
        OrtModel(tmp_path)


def test_non_decoder_graph_is_a_model_file_error(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, save

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["logits"])],
        "not_a_decoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    save(model, str(tmp_path / "model.onnx"))
    # a model file outside the decoder contract is a malformed model file (Rust ModelFormat), not a bad setting
    with pytest.raises(ModelFileError, match="input_ids") as e:
        OrtModel(tmp_path)
    assert not isinstance(e.value, ConfigError)


def test_missing_library_is_file_not_found_naming_it(contract_dir: Path, tmp_path: Path) -> None:
    missing = tmp_path / "libonnxruntime.so.1.99.0"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        OrtModel(contract_dir, ort_library=missing)


def test_relative_library_path_is_a_config_error(contract_dir: Path) -> None:
    with pytest.raises(ConfigError, match="not an absolute path"):
        OrtModel(contract_dir, ort_library="libonnxruntime.so")


def _run_isolated(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (the ONNX Runtime library is loaded once per process)."""
    env = dict(os.environ)
    env.pop("SPECRT_ORT_LIBRARY", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )


def _load_in_fresh_process(model_dir: Path, library: Path) -> str:
    proc = _run_isolated(
        f"""
        from specrt._specrt import OrtModel
        try:
            OrtModel({str(model_dir)!r}, ort_library={str(library)!r})
        except RuntimeError as e:
            print("ERR", e)
        """
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_file_that_is_not_a_shared_library_is_a_clear_error(contract_dir: Path, tmp_path: Path) -> None:
    library = tmp_path / "libonnxruntime.so.1.32.0"
    library.write_text("not an ELF file")
    out = _load_in_fresh_process(contract_dir, library)
    assert "ERR" in out and "cannot load the ONNX Runtime library" in out and str(library) in out, out


def test_a_shared_library_that_is_not_onnxruntime_is_a_clear_error(contract_dir: Path) -> None:
    library = next((Path(np.__file__).parent / "_core").glob("_multiarray_umath*.so"))
    out = _load_in_fresh_process(contract_dir, library)
    assert "ERR" in out and "does not export OrtGetApiBase" in out and str(library) in out, out


def test_a_second_library_in_the_same_process_is_refused(contract_dir: Path, tmp_path: Path) -> None:
    OrtModel(contract_dir)  # loads the wheel's library (once per process)
    other = tmp_path / "libonnxruntime.so.1.32.0"
    other.write_bytes(Path(find_ort_library()).read_bytes()[:64])
    with pytest.raises(ConfigError, match="already loaded"):
        OrtModel(contract_dir, ort_library=other)


# ------------------------------------------------------------------------------------------------------- CUDA

needs_cpu_wheel = pytest.mark.skipif(
    cuda_provider_library(find_ort_library()) is not None, reason="onnxruntime-gpu installed: see tests/gpu/test_gpu.py"
)


@needs_cpu_wheel
def test_cuda_on_the_cpu_wheel_is_a_provider_error_naming_the_library(contract_dir: Path) -> None:
    with pytest.raises(ProviderError, match=r"libonnxruntime_providers_cuda\.so.*specrt\[cuda\]"):
        OrtModel(contract_dir, provider="cuda")
    with pytest.raises(ProviderError, match=r"libonnxruntime_providers_cuda\.so"):
        OrtModel.check_cuda(find_ort_library())


@needs_cpu_wheel
def test_cuda_with_fallback_runs_on_cpu_and_says_why(contract_dir: Path) -> None:
    m = OrtModel(contract_dir, provider="cuda", allow_fallback=True, max_seq_len=MAX_SEQ)
    assert m.providers == ["CPUExecutionProvider"]
    assert "libonnxruntime_providers_cuda.so" in m.fallback_reason
    tokens = _tokens(5)
    np.testing.assert_allclose(m.forward(tokens, 0, 5), _contract_reference(contract_dir, tokens), atol=ATOL, rtol=0)


def test_unknown_provider_names_the_valid_set(contract_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"provider 'tpu' is invalid \(expected one of: 'cpu', 'cuda'\)"):
        OrtModel(contract_dir, provider="tpu")


# ----------------------------------------------------------------------------------------------- library finder


def test_find_ort_library_returns_the_wheel_library_by_absolute_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECRT_ORT_LIBRARY", raising=False)
    path = find_ort_library()
    assert os.path.isabs(path) and os.path.isfile(path)
    assert Path(path).parent == Path(ort.__file__).parent / "capi"
    assert Path(path).name.startswith("libonnxruntime.so.1")


def test_cuda_requests_preload_the_pip_cuda_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    from specrt import _ort

    calls: list[str | None] = []
    monkeypatch.setattr(_ort, "preload_cuda_dlls", lambda lib=None: calls.append(lib))
    find_ort_library("cpu")
    assert calls == []
    lib = find_ort_library("cuda")
    assert calls == [lib]


def test_find_ort_library_honours_the_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "libonnxruntime.so.1.40.0"
    fake.write_text("x")
    monkeypatch.setenv("SPECRT_ORT_LIBRARY", str(fake))
    assert find_ort_library() == str(fake)
    monkeypatch.setenv("SPECRT_ORT_LIBRARY", str(tmp_path / "missing.so"))
    with pytest.raises(FileNotFoundError, match="SPECRT_ORT_LIBRARY"):
        find_ort_library()
