"""Every form of every converter family (llama, qwen2, qwen3, llama3; each family's own features are checked against
the NumPy reference in tests/convert/test_convert*.py, test_qwen3.py, test_llama3.py): the family's tiny GGUF
(``family_checks.FAMILIES``: every structural feature of the family on) in int4 / int8 on their own weights, fp16
loosely, cache chunks and rollbacks in each dtype, the graph form, the batched layout, the prefill graph and a pruned
vocabulary against fp32; greedy speculative decoding equal to the target alone (a self-draft and a layer-truncated
draft, each attention form); and the seeded Monte Carlo losslessness certificate with the broken sampler it must
catch. A new family is one row of ``FAMILIES``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from family_checks import FAMILIES, FORMS, check_certificate, check_greedy_speculative, sessions, speculative_pair
from specrt.convert import UnsupportedModelError, convert
from specrt.convert.families import ARCH_INFO
from specrt.convert.tiny import write_tiny_gguf
from test_batched_graph import Batch, Solo
from test_batched_graph import test_each_row_equals_its_solo_run as rows_equal_solo_runs
from test_convert_formats import IDS, Runner
from test_convert_formats import test_chunk_on_cache_equals_full_prefill_and_rollback_forgets as cache_check
from test_convert_formats import test_fp16_graph_stays_close_to_the_reference as fp16_check
from test_convert_formats import test_quantized_graph_equals_the_reference_on_its_own_weights as quantized_check
from test_graph_form import test_graph_form_gives_the_default_forms_logits as graph_form_check


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def gguf(family: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp(family) / "m.gguf", seed=1, **FAMILIES[family])


@pytest.mark.parametrize("storage", ["int4", "int8"])
def test_quantized_forms_equal_the_reference_on_their_own_weights(family: str, tmp_path: Path, storage: str) -> None:
    quantized_check(tmp_path, FAMILIES[family], storage)


def fp16_refused(family: str, tmp_path: Path) -> bool:
    """Whether the family refuses fp16 (its activations exceed float16's range: gemma3), having checked that the
    refusal names the dtype and the family before anything is written."""
    if ARCH_INFO[FAMILIES[family]["arch"]].float16_range:
        return False
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **FAMILIES[family])
    with pytest.raises(UnsupportedModelError, match=f"dtype fp16 is refused for {FAMILIES[family]['arch']}"):
        convert(g, tmp_path / "fp16", dtype="fp16", progress=False)
    assert not (tmp_path / "fp16").exists()
    return True


def test_fp16_stays_close_to_the_reference(family: str, tmp_path: Path) -> None:
    if not fp16_refused(family, tmp_path):
        fp16_check(tmp_path, FAMILIES[family])


@pytest.mark.parametrize("dtype", ["fp16", "int4", "int8"])
def test_cache_chunk_rollback_and_step_in_every_dtype(family: str, tmp_path: Path, dtype: str) -> None:
    if dtype != "fp16" or not fp16_refused(family, tmp_path):
        cache_check(tmp_path, FAMILIES[family], dtype)


@pytest.mark.parametrize("dtype", ["fp32", "int4"])
def test_graph_form_gives_the_default_forms_logits(gguf: Path, tmp_path: Path, dtype: str) -> None:
    forms = sessions(gguf, tmp_path, ["gqa", "gqa-graph"], dtype)
    for total_is_capacity in (False, True):
        graph_form_check(forms, total_is_capacity)


def test_batched_rows_equal_their_solo_runs(gguf: Path, tmp_path: Path) -> None:
    rows_equal_solo_runs(sessions(gguf, tmp_path, ["gqa", "batched"]))


@pytest.mark.parametrize("attention", ["gqa", "batched"])
def test_the_prefill_graph_is_the_same_model(gguf: Path, tmp_path: Path, attention: str) -> None:
    # As the qwen2 prefill-graph test: per-tensor uint8 activations on a tiny random model lose a few percent
    # (relative RMS of the logits); a wrong weight or layout is ~100%.
    folder = convert(gguf, tmp_path / "m", progress=False, attention=attention, prefill_graph=True)
    cfg = json.loads((folder / "specrt_config.json").read_text())
    so = ort.SessionOptions()
    so.log_severity_level = 3
    files = ["model.onnx", cfg["prefill_graph"]]
    runs = [ort.InferenceSession(str(folder / f), so, providers=["CPUExecutionProvider"]) for f in files]
    ids = [int(t) for t in IDS]
    if attention == "gqa":
        ref, got = (Solo(s, cfg).run(ids) for s in runs)
    else:
        ref, got = (Batch(s, cfg, 1).run([ids])[0] for s in runs)
    rel_rms = np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref**2))
    assert 0 < rel_rms < 0.15, rel_rms


def test_a_pruned_vocabulary_scores_the_same_logits(gguf: Path, tmp_path: Path) -> None:
    keep = [3, 5, 17, 42, 99, 200, 261, 262, 263]
    full = Runner(convert(gguf, tmp_path / "full", progress=False))(IDS, 0)
    sub = Runner(convert(gguf, tmp_path / "sub", progress=False, vocab_subset=keep))(IDS, 0)
    np.testing.assert_allclose(sub, full[:, keep], rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def pair(family: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 2-layer target of the family and its first layer as the draft, in the default, graph and batched forms."""
    return speculative_pair(tmp_path_factory.mktemp(f"{family}-pair"), **dict(FAMILIES[family], tied=True))


@pytest.mark.parametrize("form", FORMS)
def test_greedy_speculative_decoding_equals_the_target_alone(pair: dict[str, Path], form: str) -> None:
    check_greedy_speculative(pair, form)


def test_sampling_is_lossless_on_the_pair_and_a_broken_sampler_is_caught(pair: dict[str, Path]) -> None:
    check_certificate(pair)
