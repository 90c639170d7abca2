"""Read a Hugging Face model folder (``llama`` / ``qwen2`` / ``qwen3`` / ``mistral`` / ``phi3``): config, safetensors
weights, tokenizer, defaults. Phi-3's fused ``qkv_proj`` / ``gate_up_proj`` are handed out as their parts
(:func:`specrt.convert.gguf_reader.fused_rows`).

A folder holds ``config.json``, ``model.safetensors`` (or shards listed by ``model.safetensors.index.json``),
``tokenizer.json``, and optionally ``tokenizer_config.json`` (chat template, BOS/EOS tokens) and
``generation_config.json`` (EOS ids, sampling defaults). :class:`HFModel` presents it with the same interface the
converter uses for GGUF files: tensors are addressed by their GGUF names (``blk.0.attn_q.weight``) and returned as
float32 ``[out, in]``. Hugging Face checkpoints already use the half-split rotary layout, so nothing is permuted.

Tensors are read with ``safetensors`` (numpy framework) one at a time; bfloat16, which numpy cannot represent, is read
from the file's own header offsets and widened to float32 exactly. No file stays open between calls: each read opens
and closes its file (:meth:`HFModel.close` exists so both readers can be used with ``with``).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specrt.convert.errors import ConversionError, ModelFileError, UnsupportedArchitectureError, UnsupportedModelError
from specrt.convert.families import ARCH_INFO, GGUF_ONLY, ModelSpec, checked_sliding_window, fused_rows
from specrt.convert.quant import BlockQuant, quantize_rtn
from specrt.convert.rope import LongRope, hf_rope

__all__ = ["HFFormatError", "HFModel", "hf_tokenizer", "is_hf_folder"]


class HFFormatError(ConversionError, ModelFileError):
    """A Hugging Face folder that is incomplete or inconsistent: a missing file or tensor, a tensor of the wrong
    shape, an unreadable config or safetensors file."""


#: GGUF name -> Hugging Face name (``{i}`` = layer index) of every tensor a llama / qwen2 / qwen3 decoder may have.
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
#: The fused tensors of a family with :attr:`ArchInfo.fused` (Phi-3), GGUF name -> Hugging Face name: they replace
#: ``_LAYER_NAMES``' q/k/v and gate/up (``ffn_up`` is then both halves, gate first, as llama.cpp stores it).
_FUSED_LAYER_NAMES = {"attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"}


def layer_names(arch: str) -> dict[str, str]:
    """GGUF name -> Hugging Face name (``model.layers.{i}.`` omitted) of the layer tensors of family ``arch``."""
    if not ARCH_INFO[arch].fused:
        return _LAYER_NAMES
    unfused = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "ffn_gate.weight")
    return {**{g: h for g, h in _LAYER_NAMES.items() if g not in unfused}, **_FUSED_LAYER_NAMES}


_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": None}


def is_hf_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder with a ``config.json`` (a Hugging Face model folder, complete or not)."""
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


@dataclass(frozen=True)
class _TensorInfo:
    """Where one tensor lives: file, dtype, shape, byte range of its data."""

    file: Path
    hf_name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1


def _read_header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's JSON header and the offset where the data starts."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                raise ValueError(f"header length {n} is implausible")
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error) as e:
        raise HFFormatError(f"{path}: not a readable safetensors file ({e})") from None
    return header, 8 + n


class HFModel:
    """A Hugging Face decoder folder opened for conversion (tensors read lazily, one at a time).

    Args:
        path: the folder.

    Raises:
        HFFormatError: ``config.json``, ``tokenizer.json`` or the safetensors files are missing or unreadable, or
            the index names a shard that does not exist.
        UnsupportedArchitectureError: ``model_type`` not in ``ARCH_INFO`` (``llama``, ``qwen2``, ``qwen3``,
            ``mistral``, ``phi3``).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        cfg_path = self.path / "config.json"
        if not cfg_path.is_file():
            raise HFFormatError(f"{self.path}: no config.json (not a Hugging Face model folder)")
        try:
            self.config: dict[str, Any] = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise HFFormatError(f"{cfg_path}: cannot be parsed ({e})") from None
        arch = str(self.config.get("model_type", ""))
        if arch not in ARCH_INFO:
            raise UnsupportedArchitectureError(arch or "<missing model_type>", sorted(ARCH_INFO))
        if arch in GGUF_ONLY:
            raise UnsupportedModelError(f"{self.path}: {GGUF_ONLY[arch]}")
        self.arch_name = arch
        self.files = self._weight_files()
        self._by_hf: dict[str, _TensorInfo] = {}
        for f in self.files:
            header, base = _read_header(f)
            for name, meta in header.items():
                if name == "__metadata__":
                    continue
                start, end = meta["data_offsets"]
                self._by_hf[name] = _TensorInfo(f, name, meta["dtype"], tuple(meta["shape"]), base + start, base + end)
        self.tensors: dict[str, _TensorInfo] = {}
        n_layers = int(self.config.get("num_hidden_layers", 0))
        for gguf_name, hf_name in _GLOBAL_NAMES.items():
            if hf_name in self._by_hf:
                self.tensors[gguf_name] = self._by_hf[hf_name]
        for i in range(n_layers):
            for g, h in layer_names(arch).items():
                hf_name = f"model.layers.{i}.{h}"
                if hf_name in self._by_hf:
                    self.tensors[f"blk.{i}.{g}"] = self._by_hf[hf_name]

    def close(self) -> None:
        """Nothing to release (every read opens and closes its file); for interface parity with
        :meth:`GGUFModel.close <specrt.convert.gguf_reader.GGUFModel.close>`."""

    def __enter__(self) -> HFModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _weight_files(self) -> list[Path]:
        index = self.path / "model.safetensors.index.json"
        single = self.path / "model.safetensors"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError) as e:
                raise HFFormatError(f"{index}: cannot be parsed ({e})") from None
            files = [self.path / f for f in sorted(set(weight_map.values()))]
            for f in files:
                if not f.is_file():
                    raise HFFormatError(f"{index} lists shard {f.name}, which is missing from {self.path}")
            return files
        if single.is_file():
            return [single]
        raise HFFormatError(
            f"{self.path}: no weights (expected model.safetensors or model.safetensors.index.json with its shards)"
        )

    # ----- metadata (the GGUFModel interface the converter uses) ---------------------------------------------------
    @property
    def architecture(self) -> str:
        """``llama``, ``qwen2``, ``qwen3``, ``mistral`` or ``phi3`` (``config.json`` ``model_type``)."""
        return self.arch_name

    def has(self, key: str) -> bool:
        """Whether a GGUF-style metadata key is known (only ``general.name``)."""
        return key == "general.name" and self.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        """GGUF-style metadata: ``general.name`` is the folder name; anything else is ``default``."""
        if key == "general.name":
            return self.config.get("_name_or_path") or self.path.name
        return default

    def spec(self) -> ModelSpec:
        """Hyperparameters from ``config.json``, after checking every tensor is present with the right shape.

        Raises:
            HFFormatError: a required ``config.json`` key or tensor is missing, or a tensor has the wrong shape
                (the message names the tensor, its file and both shapes).
            UnsupportedModelError: RoPE scaling other than Llama 3.x's ``llama3`` (:mod:`specrt.convert.rope`), an
                MLP without gate/up/down projections, qwen2 / qwen3's ``use_sliding_window``, or a mistral
                ``sliding_window`` that is not a positive integer or null.
        """
        c = self.config

        def req(key: str) -> Any:
            if key not in c or c[key] is None:
                raise HFFormatError(f"{self.path / 'config.json'}: required key {key!r} is missing")
            return c[key]

        if self.arch_name in ("qwen2", "qwen3") and c.get("use_sliding_window"):
            raise UnsupportedModelError("sliding-window attention (config.json use_sliding_window) is not implemented")
        hidden, n_heads = int(req("hidden_size")), int(req("num_attention_heads"))
        n_kv = int(c.get("num_key_value_heads") or n_heads)
        head_dim = int(c.get("head_dim") or hidden // n_heads)
        # transformers < 5 writes rope_theta + rope_scaling; 5.x writes rope_parameters (rope_type, rope_theta, ...).
        key = "rope_scaling" if c.get("rope_scaling") is not None else "rope_parameters"
        scaling = c.get(key)
        if scaling is not None and not isinstance(scaling, dict):
            raise HFFormatError(f"{self.path / 'config.json'}: {key} must be an object or null, got {scaling!r}")
        rope_theta = float(c.get("rope_theta") or (scaling or {}).get("rope_theta") or 10000.0)
        ffn, n_layers = int(req("intermediate_size")), int(req("num_hidden_layers"))
        max_pos = int(req("max_position_embeddings"))
        rot = self._rotary_dim(head_dim, scaling or {}, key)
        rope = hf_rope(scaling, rope_theta, rot, max_pos, c.get("original_max_position_embeddings"), key)
        longrope = rope if isinstance(rope, LongRope) else None
        freq_factors = longrope.short_factors if longrope is not None else rope
        window = None
        if ARCH_INFO[self.arch_name].sliding_window:
            window = checked_sliding_window(c.get("sliding_window"), max_pos, "config.json sliding_window")
        if "token_embd.weight" not in self.tensors:
            raise HFFormatError(f"{self.path}: tensor 'model.embed_tokens.weight' is missing")
        vocab = int(self.tensors["token_embd.weight"].shape[0])
        if int(c.get("vocab_size", vocab)) != vocab:
            raise HFFormatError(
                f"{self.path}: model.embed_tokens.weight has {vocab} rows but config.json vocab_size is "
                f"{c['vocab_size']}"
            )
        qkv_bias = "blk.0.attn_q.bias" in self.tensors
        tied = bool(c.get("tie_word_embeddings", False)) or "output.weight" not in self.tensors
        expected: dict[str, tuple[int, ...]] = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
        if not tied:
            expected["output.weight"] = (vocab, hidden)
        for i in range(n_layers):
            p = f"blk.{i}"
            expected |= {
                f"{p}.attn_norm.weight": (hidden,),
                f"{p}.attn_q.weight": (n_heads * head_dim, hidden),
                f"{p}.attn_k.weight": (n_kv * head_dim, hidden),
                f"{p}.attn_v.weight": (n_kv * head_dim, hidden),
                f"{p}.attn_output.weight": (hidden, n_heads * head_dim),
                f"{p}.ffn_norm.weight": (hidden,),
                f"{p}.ffn_gate.weight": (ffn, hidden),
                f"{p}.ffn_up.weight": (ffn, hidden),
                f"{p}.ffn_down.weight": (hidden, ffn),
            }
            if ARCH_INFO[self.arch_name].fused:
                for part in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"):
                    del expected[f"{p}.{part}.weight"]
                expected[f"{p}.attn_qkv.weight"] = ((n_heads + 2 * n_kv) * head_dim, hidden)
                expected[f"{p}.ffn_up.weight"] = (2 * ffn, hidden)
            if ARCH_INFO[self.arch_name].qk_norm:
                expected |= {f"{p}.attn_q_norm.weight": (head_dim,), f"{p}.attn_k_norm.weight": (head_dim,)}
            if qkv_bias:
                expected |= {
                    f"{p}.attn_q.bias": (n_heads * head_dim,),
                    f"{p}.attn_k.bias": (n_kv * head_dim,),
                    f"{p}.attn_v.bias": (n_kv * head_dim,),
                }
        for name, shape in expected.items():
            t = self.tensors.get(name)
            if t is None:
                hf = self._hf_name(name)
                raise HFFormatError(f"{self.path}: tensor {hf!r} is missing (needed for a {n_layers}-layer model)")
            if t.shape != shape:
                raise HFFormatError(
                    f"{t.file}: tensor {t.hf_name!r} has shape {list(t.shape)}, expected {list(shape)} "
                    f"(from config.json)"
                )
            if t.dtype not in _ST_DTYPES:
                raise HFFormatError(
                    f"{t.file}: tensor {t.hf_name!r} has dtype {t.dtype} (supported: {', '.join(_ST_DTYPES)})"
                )
        return ModelSpec(
            architecture=self.arch_name,
            num_layers=n_layers,
            hidden_size=hidden,
            intermediate_size=ffn,
            num_attention_heads=n_heads,
            num_kv_heads=n_kv,
            head_dim=head_dim,
            vocab_size=vocab,
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            max_position_embeddings=max_pos,
            tied_embeddings=tied,
            qkv_bias=qkv_bias,
            qk_norm=ARCH_INFO[self.arch_name].qk_norm,
            rope_freq_factors=None if freq_factors is None else tuple(float(f) for f in freq_factors),
            sliding_window=window,
            rotary_dim=rot if rot != head_dim else None,
            rope_long_freq_factors=None if longrope is None else longrope.long_factors,
            rope_original_context=None if longrope is None else longrope.original_max_position_embeddings,
            rope_attn_factor=1.0 if longrope is None else longrope.attention_factor,
        )

    def _rotary_dim(self, head_dim: int, scaling: dict[str, Any], key: str) -> int:
        """``head_dim * partial_rotary_factor`` (``config.json``, or inside ``rope_parameters``; default 1).

        Raises:
            UnsupportedModelError: a factor other than 1 in a family without partial rotary, or one giving an odd or
                zero width.
        """
        field, factor = "partial_rotary_factor", self.config.get("partial_rotary_factor")
        if factor is None:
            field, factor = f"{key}.partial_rotary_factor", scaling.get("partial_rotary_factor", 1.0)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            raise UnsupportedModelError(f"config.json {field} must be a number in (0, 1], got {factor!r}")
        rot = int(head_dim * factor)
        if rot == head_dim:
            return rot
        if not ARCH_INFO[self.arch_name].partial_rotary:
            raise UnsupportedModelError(
                f"partial rotary (config.json {field} = {factor}) is not implemented for {self.arch_name} (phi3 only)"
            )
        if rot < 2 or rot % 2:
            raise UnsupportedModelError(
                f"config.json {field} = {factor} gives a rotary width of {rot} of head_dim {head_dim} (must be even)"
            )
        return rot

    def _hf_name(self, gguf_name: str) -> str:
        if gguf_name in _GLOBAL_NAMES:
            return _GLOBAL_NAMES[gguf_name]
        _, i, rest = gguf_name.split(".", 2)
        return f"model.layers.{i}.{layer_names(self.arch_name)[rest]}"

    # ----- tensors ------------------------------------------------------------------------------------------------
    def tensor(self, name: str, spec: ModelSpec | None = None, *, unpermute_qk: bool = True) -> np.ndarray:
        """Tensor ``name`` (GGUF naming) as float32: ``[out, in]`` matrices, ``[n]`` vectors.

        ``spec`` and ``unpermute_qk`` exist for interface parity with :meth:`GGUFModel.tensor`: Hugging Face
        weights are already in the half-split rotary layout.

        Raises:
            HFFormatError: no such tensor, or its bytes cannot be read.
        """
        if name not in self.tensors or name.endswith(".ffn_up.weight"):
            src = fused_rows(name, spec or self.spec(), self.tensors)
            if src is not None:  # a part of a fused matrix (Phi-3's qkv_proj / gate_up_proj)
                return np.ascontiguousarray(self._read(src[0])[src[1]])
        return self._read(name)

    def _read(self, name: str) -> np.ndarray:
        """Tensor ``name`` (GGUF naming) as stored, float32."""
        t = self.tensors.get(name)
        if t is None:
            raise HFFormatError(f"{self.path}: tensor {self._hf_name(name)!r} is missing")
        try:
            if t.dtype == "BF16":
                # [n_elements] uint16 bfloat16 bits, read (not memory-mapped) so the file is closed on return
                with open(t.file, "rb") as fh:
                    fh.seek(t.start)
                    raw = np.fromfile(fh, dtype=np.uint16, count=t.n_elements)
                if raw.size != t.n_elements:
                    raise ValueError(f"file ends after {raw.size} of {t.n_elements} elements")
                out = (raw.astype(np.uint32) << 16).view(np.float32)
            else:
                from safetensors import safe_open

                with safe_open(str(t.file), framework="numpy") as f:
                    out = f.get_tensor(t.hf_name)
                out = np.asarray(out, dtype=np.float32)
        except (OSError, ValueError) as e:
            raise HFFormatError(f"{t.file}: cannot read tensor {t.hf_name!r} ({e})") from None
        return out.reshape(t.shape)

    def block_quant(self, name: str, bits: int, spec: ModelSpec | None = None, block_size: int = 32) -> BlockQuant:
        """Tensor ``name`` requantized round-to-nearest to ``bits`` (there are no quantized blocks to keep)."""
        return quantize_rtn(self.tensor(name, spec), bits, block_size)

    def files_sha256(self) -> str:
        """SHA-256 over the folder's model files: of the lines ``"<sha256 of file>  <file name>\\n"`` for
        ``config.json`` and every weight file, in name order."""
        lines = []
        for f in sorted([self.path / "config.json", *self.files], key=lambda p: p.name):
            h = hashlib.sha256()
            with open(f, "rb") as fh:
                while block := fh.read(1 << 22):
                    h.update(block)
            lines.append(f"{h.hexdigest()}  {f.name}\n")
        return hashlib.sha256("".join(lines).encode()).hexdigest()


def _token_content(value: Any) -> str | None:
    """``"<s>"`` or ``{"content": "<s>", ...}`` (tokenizer_config.json forms) -> ``"<s>"``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise HFFormatError(f"{path}: cannot be parsed ({e})") from None
    return data if isinstance(data, dict) else {}


#: generation_config.json keys copied as sampling defaults (names the Decoder reads).
_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")


def hf_tokenizer(model: HFModel) -> tuple[Any, Any, dict[str, Any]]:
    """The tokenizer of a Hugging Face folder, what the runtime needs about it, and the generation defaults.

    Returns:
        ``(tokenizers.Tokenizer, TokenizerInfo, defaults)``. ``TokenizerInfo.eos_token_ids``:
        generation_config.json's ``eos_token_id`` (int or list) first, then config.json's, then tokenizer_config's
        ``eos_token``, then every end-of-turn control token the vocabulary has (as for GGUF files). ``defaults``:
        ``temperature`` / ``top_k`` / ``top_p`` / ``min_p`` / ``repetition_penalty`` from generation_config.json;
        ``do_sample: false`` there becomes ``temperature: 0`` (Hugging Face decodes greedily then).

    Raises:
        HFFormatError: ``tokenizer.json`` is missing or cannot be loaded, or a JSON file cannot be parsed.
    """
    from tokenizers import Tokenizer

    from specrt.convert.tokenizer import END_OF_TURN_TOKENS, TokenizerInfo

    path = model.path
    tok_file = path / "tokenizer.json"
    if not tok_file.is_file():
        raise HFFormatError(f"{path}: no tokenizer.json (slow / sentencepiece-only tokenizers are not supported)")
    try:
        tok = Tokenizer.from_file(str(tok_file))
    except Exception as e:  # tokenizers raises a plain Exception
        raise HFFormatError(f"{tok_file}: cannot be loaded by tokenizers ({e})") from None
    tcfg = _read_json(path / "tokenizer_config.json")
    gcfg = _read_json(path / "generation_config.json")
    cfg = model.config
    vocab = tok.get_vocab(with_added_tokens=True)
    special = {t.content: int(i) for i, t in tok.get_added_tokens_decoder().items() if t.special}

    def ids_of(value: Any) -> list[int]:
        if value is None:
            return []
        return [int(v) for v in (value if isinstance(value, list) else [value])]

    eos: list[int] = []
    for candidate in (
        ids_of(gcfg.get("eos_token_id")),
        ids_of(cfg.get("eos_token_id")),
        [vocab[c]] if (c := _token_content(tcfg.get("eos_token"))) in vocab else [],
        [vocab[t] for t in END_OF_TURN_TOKENS if t in special],
    ):
        eos.extend(i for i in candidate if i not in eos)
    bos = gcfg.get("bos_token_id", cfg.get("bos_token_id"))
    if bos is None and (c := _token_content(tcfg.get("bos_token"))) in vocab:
        bos = vocab[c]
    pad = gcfg.get("pad_token_id", cfg.get("pad_token_id"))
    if pad is None and (c := _token_content(tcfg.get("pad_token"))) in vocab:
        pad = vocab[c]
    template = tcfg.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")
    info = TokenizerInfo(
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=eos,
        pad_token_id=None if pad is None else int(pad),
        add_bos_token=bool(tcfg.get("add_bos_token", False)),
        special_tokens=special,
        chat_template=template if isinstance(template, str) else None,
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
    )
    defaults = {k: gcfg[k] for k in _SAMPLING_KEYS if k in gcfg}
    if gcfg.get("do_sample") is False:
        defaults["temperature"] = 0.0
    return tok, info, defaults
