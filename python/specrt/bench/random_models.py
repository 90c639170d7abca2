"""Random-weight models in real shapes, for ``specrt bench --random-shapes`` (GPU time does not depend on the weights).

A forward pass costs the same whatever the weight values are, so the GPU costs of the real Qwen2.5-Coder pair (t(n),
c_q, c_p) can be measured on random weights of the same shapes where the real files are not at hand; acceptance is a
property of the real weights and comes from a CPU run (``--acceptance``). :func:`ensure_random_models` writes, once
per shape pair and dtype, under ``<specrt cache>/random/<pair>-<dtype>/``:

- ``target/``: the target shape, with every decoder-layer weight scaled by :data:`TARGET_LAYER_SCALE`, so the residual
  stream stays close to the token's embedding;
- ``draft/``: the draft shape (plain random weights: its full-scale layers decide its output, so it agrees with the
  target about as often as chance, a ~ 0; the report shows the measured acceptance);
- ``target-L<n>/``: the target cut to its first n layers. Since the layers barely move the residual stream, the cut
  copy predicts what the full target does: a synthetic pair whose acceptance is ~1 (``shared/notes/gpu.md``).

Each is a Hugging Face folder (float16 safetensors, std :data:`WEIGHT_STD`, norms 1) converted by
:func:`specrt.convert.convert`; the Hugging Face folders are removed after conversion. The weights are *tiled*: one
block of random normal values per model (:data:`BLOCK_VALUES`, a prime), every tensor a cyclic window of it at a random
offset, scaled to its std (recorded in ``recipe.json`` as ``weights``): writing the 7.6B weights of the 7B shape is then
disk-bound instead of drawing 7.6B normals; no row repeats within a tensor (the block's length is a prime above every
row's), and a forward pass costs the same.

Pairs (:data:`SHAPE_PAIRS`): ``qwen2.5-coder`` (1.5B target, 0.5B draft), ``qwen2.5-coder-7b`` (7B target, 0.5B
draft) and ``qwen2.5-coder-7b-1.5b`` (7B target, 1.5B draft). The 7B's logits are 152,064 wide and the small models'
151,936, over one tokenizer: the pair runs as Qwen's real pair does (``specrt_core::vocab``, the draft fitted to the
target's width). Each pair is cached on its own, so both 7B pairs hold a copy of the 7B target (fp16: 15.2 GB each).

The tokenizer is the real Qwen2.5 one when found (``tokenizer=`` or specrt's cache of the real models), else a
265-token byte-level stand-in (prompts then take more tokens than with Qwen's tokenizer: recorded in ``recipe.json``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Logits width of the Qwen2.5 0.5B / 1.5B / 3B models (151,665 tokens padded to a multiple of 128).
QWEN2_5_VOCAB = 151936

#: Logits width of the Qwen2.5 7B / 14B / 32B models (the same tokenizer, padded further).
QWEN2_5_VOCAB_LARGE = 152064

#: Standard deviation of the random weights (``initializer_range`` of Qwen2's config).
WEIGHT_STD = 0.02

#: Scale of the target's decoder-layer weights (attention, MLP; not the embedding, not the norms). At 1/20 a layer's
#: contribution to the residual stream is ~1e-3 of the embedding's, so a layer-truncated copy agrees with the target.
TARGET_LAYER_SCALE = 0.05

#: ``recipe.json`` format; a different number rebuilds the folders (2: tiled weights, :func:`write_random_hf`).
RECIPE_FORMAT = 2

#: Values of the random block a model's tensors are cut from: the largest prime below 2^24 (a smaller model uses the
#: smallest prime at or above its largest tensor's size).
BLOCK_VALUES = 16_777_213

#: How the weights are made, as ``recipe.json`` records it.
WEIGHTS_RECIPE = (
    "tiled: one block of N(0, 1) values per model (numpy default_rng(seed), length a prime: min(BLOCK_VALUES, the "
    "smallest prime >= the largest tensor's size)), each tensor a cyclic window of it at an offset drawn from the same "
    "generator, scaled to its std, rounded to float16"
)

#: Where the stand-in tokenizer is named in ``recipe.json``.
STAND_IN_TOKENIZER = "byte-level stand-in (specrt.convert.tiny.tiny_vocab, 265 tokens, ChatML template)"


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Qwen2 decoder as Hugging Face's ``config.json`` names them."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int = QWEN2_5_VOCAB
    max_position_embeddings: int = 32768
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


#: Shapes by name. The Qwen2.5-Coder ones are the ``config.json`` values of Qwen/Qwen2.5-Coder-7B-Instruct,
#: -1.5B-Instruct and -0.5B-Instruct (the 1.5B and 0.5B tie the lm_head to the embedding; the GGUF files specrt
#: converts the real models from carry a separate ``output.weight``, which costs the same: the head is one
#: [vocab, hidden] Gemm either way; the 7B has its own lm_head and 152,064 rows). Parameter counts: 7,615,616,512,
#: 1,543,714,304 and 494,032,768 (the model cards' 7.61B, 1.54B and 0.49B).
SHAPES: dict[str, ModelShape] = {
    # name: ModelShape(hidden, intermediate, layers, attention heads, KV heads, ...)
    "qwen2.5-coder-7b": ModelShape(3584, 18944, 28, 28, 4, vocab_size=QWEN2_5_VOCAB_LARGE, tie_word_embeddings=False),
    "qwen2.5-coder-1.5b": ModelShape(1536, 8960, 28, 12, 2),
    "qwen2.5-coder-0.5b": ModelShape(896, 4864, 24, 14, 2),
    # Test-sized (head_dim 16 like the tiny GGUF models); the logits are wider than the stand-in tokenizer, as
    # Qwen's are. At this width the layers barely move the residual stream, so any tied model repeats its input
    # token; the draft's own random head makes it disagree with the target (a ~ 0), as the 24 full-scale layers of
    # the real draft shape do.
    "tiny-target": ModelShape(64, 128, 2, 4, 2, vocab_size=512, max_position_embeddings=1024),
    "tiny-draft": ModelShape(32, 64, 1, 2, 1, vocab_size=512, max_position_embeddings=1024, tie_word_embeddings=False),
}


@dataclass(frozen=True)
class ShapePair:
    """A target shape, a draft shape and how many target layers the full-acceptance draft keeps."""

    target: str
    draft: str
    truncated_layers: int
    #: Registry name of the real target whose converted folder (specrt's cache) has the tokenizer, if any.
    real_target: str | None = None


#: ``--random-shapes`` names. The 7B pairs take the tokenizer of the converted 1.5B (one tokenizer for every Qwen2.5
#: size; no 7B in the registry) and keep 2 of the target's 28 layers in the full-acceptance draft (with the 7B's own
#: 545M-weight head: about 1.0B weights a token, between the 0.5B and 1.5B drafts' 0.49B and 1.54B).
SHAPE_PAIRS: dict[str, ShapePair] = {
    "qwen2.5-coder": ShapePair("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", 4, "qwen2.5-coder-1.5b-instruct"),
    "qwen2.5-coder-7b": ShapePair("qwen2.5-coder-7b", "qwen2.5-coder-0.5b", 2, "qwen2.5-coder-1.5b-instruct"),
    "qwen2.5-coder-7b-1.5b": ShapePair("qwen2.5-coder-7b", "qwen2.5-coder-1.5b", 2, "qwen2.5-coder-1.5b-instruct"),
    "tiny": ShapePair("tiny-target", "tiny-draft", 1),
}


def hf_config(shape: ModelShape) -> dict[str, Any]:
    """The ``config.json`` of a random Qwen2 model of ``shape`` (what :func:`write_random_hf` writes)."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **asdict(shape),
        "hidden_act": "silu",
        "use_sliding_window": False,
        "torch_dtype": "float16",
    }


def tensor_shapes(shape: ModelShape) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> shape, for every tensor of a Qwen2 decoder of ``shape`` (tied head: no lm_head)."""
    h, f, d = shape.hidden_size, shape.intermediate_size, shape.head_dim
    q, kv = shape.num_attention_heads * d, shape.num_key_value_heads * d
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab_size, h)}
    for i in range(shape.num_hidden_layers):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.q_proj.bias": (q,),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (h, q),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (f, h),
            p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
        }
    out["model.norm.weight"] = (h,)
    if not shape.tie_word_embeddings:
        out["lm_head.weight"] = (shape.vocab_size, h)
    return out


def n_parameters(shape: ModelShape) -> int:
    """Number of weights of a model of ``shape``."""
    return sum(math.prod(s) for s in tensor_shapes(shape).values())


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def block_values(shapes: dict[str, tuple[int, ...]]) -> int:
    """Length of the random block of a model of tensor ``shapes``: :data:`BLOCK_VALUES`, or for a model whose largest
    tensor is smaller the smallest prime at or above its size."""
    n = min(BLOCK_VALUES, max(math.prod(s) for s in shapes.values()))
    while not _is_prime(n):
        n += 1
    return n


class _TiledValues:
    """Float16 chunks of the tensors of one model, cut from one random block (:data:`WEIGHTS_RECIPE`).

    For each std a float16 copy of the block, extended by its first ``chunk`` values, so that every chunk of a tensor
    (at most ``chunk`` values) is a contiguous view of it: nothing is computed per tensor but its offset.
    """

    def __init__(self, rng: np.random.Generator, length: int, chunk: int) -> None:
        self.rng, self.length, self.chunk = rng, length, chunk
        self.block = rng.standard_normal(length, dtype=np.float32)
        self._scaled: dict[float, np.ndarray] = {}

    def _extended(self, std: float) -> np.ndarray:
        if std not in self._scaled:
            b = (self.block * np.float32(std)).astype(np.float16)
            reps = -(-(self.length + self.chunk) // self.length)
            self._scaled[std] = np.tile(b, reps)[: self.length + self.chunk]
        return self._scaled[std]

    def chunks(self, n: int, std: float) -> Iterator[np.ndarray]:
        """``n`` values of std ``std`` from a random offset, in contiguous chunks of at most ``chunk`` values."""
        ext = self._extended(std)
        at = int(self.rng.integers(self.length))
        for start in range(0, n, self.chunk):
            k = min(self.chunk, n - start)
            yield ext[at : at + k]
            at = (at + k) % self.length


def _write_f16_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], values: Callable[[str], Iterator]) -> None:
    """Stream float16 tensors into one safetensors file: header from ``shapes``, then ``values(name)``'s chunks."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        size = 2 * math.prod(shape)
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name in shapes:
            for chunk in values(name):
                f.write(memoryview(np.ascontiguousarray(chunk)).cast("B"))


def write_random_hf(
    shape: ModelShape,
    folder: str | os.PathLike[str],
    *,
    tokenizer_dir: str | os.PathLike[str],
    seed: int = 0,
    layer_scale: float = 1.0,
) -> Path:
    """Write a random-weight Qwen2 Hugging Face folder of ``shape`` that :func:`specrt.convert.convert` reads.

    Weights: std ``WEIGHT_STD * s`` in float16, with s = ``layer_scale`` for the decoder layers' matrices and biases
    and 1 for the embedding and head; every norm weight is 1; tiled (:data:`WEIGHTS_RECIPE`: windows of one random
    normal block, so that writing is disk-bound). Deterministic for a given ``seed``. Memory: the block, two float16
    copies (about 200 MB at :data:`BLOCK_VALUES`), whatever the model size (the 1.5B shape: a 3.1 GB file; the 7B
    shape: 15.2 GB).

    Args:
        shape: the sizes (:data:`SHAPES`).
        folder: the folder to create (``config.json``, ``model.safetensors``, ``generation_config.json`` and the
            tokenizer files).
        tokenizer_dir: a folder with ``tokenizer.json`` and optionally ``tokenizer_config.json`` and
            ``chat_template.jinja`` (copied).
        seed: RNG seed.
        layer_scale: factor on the decoder layers' weights (:data:`TARGET_LAYER_SCALE` for a target whose
            truncated copy agrees with it).

    Returns:
        ``Path(folder)``.

    Raises:
        FileNotFoundError: ``tokenizer_dir`` has no ``tokenizer.json``.
    """
    tokenizer_dir, folder = Path(tokenizer_dir), Path(folder)
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{tokenizer_dir} has no tokenizer.json (expected a tokenizer folder)")
    folder.mkdir(parents=True, exist_ok=True)
    shapes = tensor_shapes(shape)
    tiles = _TiledValues(np.random.default_rng(seed), block_values(shapes), 1 << 24)

    def values(name: str) -> Iterator[np.ndarray]:
        dims = shapes[name]
        if name.endswith("norm.weight"):
            return iter([np.ones(dims, np.float16)])
        in_layer = name.startswith("model.layers.")
        return tiles.chunks(math.prod(dims), WEIGHT_STD * (layer_scale if in_layer else 1.0))

    _write_f16_safetensors(folder / "model.safetensors", shapes, values)
    (folder / "config.json").write_text(json.dumps(hf_config(shape), indent=1) + "\n", encoding="utf-8")
    # Random weights emit random tokens: greedy by default, EOS whatever the tokenizer names (the bench ignores it).
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": False}) + "\n", encoding="utf-8")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, folder / name)
    return folder


def write_stand_in_tokenizer(folder: str | os.PathLike[str]) -> Path:
    """Write the 265-token byte-level BPE tokenizer of the tiny test models (ChatML template) into ``folder``."""
    from specrt.convert.gguf_reader import GGUFModel
    from specrt.convert.tiny import CHATML_TEMPLATE, write_tiny_gguf
    from specrt.convert.tokenizer import build_tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with GGUFModel(write_tiny_gguf(Path(tmp) / "tokenizer.gguf", arch="qwen2", n_layers=1)) as model:
            tok, _ = build_tokenizer(model)
        tok.save(str(folder / "tokenizer.json"))
    tok_cfg = {
        "add_bos_token": False,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHATML_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1) + "\n", encoding="utf-8")
    return folder


def find_tokenizer(pair: ShapePair) -> Path | None:
    """The real tokenizer of ``pair``: a converted folder of its real target in specrt's cache (any dtype) or None."""
    from specrt.models import cache_dir

    if pair.real_target is None:
        return None
    base = cache_dir() / "models" / pair.real_target
    found = sorted(base.glob("*/tokenizer.json")) if base.is_dir() else []
    return found[0].parent if found else None


def random_dir() -> Path:
    """``<specrt cache>/random`` (``$SPECRT_CACHE_DIR/random`` or ``~/.cache/specrt/random``)."""
    from specrt.models import cache_dir

    return cache_dir() / "random"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class RandomModels:
    """The converted folders of one shape pair (:func:`ensure_random_models`)."""

    name: str
    dtype: str
    root: Path
    target: Path
    draft: Path
    truncated_draft: Path
    recipe: dict[str, Any]

    def complete(self) -> bool:
        """Whether every folder is a converted model and the recipe on disk is this one."""
        folders = (self.target, self.draft, self.truncated_draft)
        if not all((p / "model.onnx").is_file() and (p / "specrt_config.json").is_file() for p in folders):
            return False
        try:
            on_disk = json.loads((self.root / "recipe.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return _comparable(on_disk) == _comparable(self.recipe)

    def describe(self) -> dict[str, Any]:
        """JSON-ready: the folders and the recipe (shapes, scales, seed, tokenizer)."""
        return {
            "folders": {
                "target": str(self.target),
                "draft": str(self.draft),
                "truncated_draft": str(self.truncated_draft),
            },
            **self.recipe,
        }


def _comparable(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe without where the tokenizer was read from (the same file from another path is the same model)."""
    tok = {k: v for k, v in recipe.get("tokenizer", {}).items() if k != "source"}
    return {**recipe, "tokenizer": tok}


def ensure_random_models(
    name: str,
    dtype: str,
    *,
    tokenizer: str | os.PathLike[str] | None = None,
    seed: int = 0,
    root: str | os.PathLike[str] | None = None,
    force: bool = False,
    log: Callable[[str], None] | None = None,
    attention: str = "gqa",
) -> RandomModels:
    """The random-weight target, draft and truncated draft of shape pair ``name`` in ``dtype``, written if absent.

    Cached in ``root`` (default ``random_dir() / f"{name}-{dtype}"``) with a ``recipe.json``; a folder whose recipe
    differs (shapes, seed, scales, tokenizer file) is rebuilt. Time on a 16-core machine for ``qwen2.5-coder`` in
    fp16: about a minute (the 1.5B conversion alone took 21 s on the GPU machine); disk while writing: the 3.1 GB
    float16 safetensors of the target beside its conversions.

    The 7B pairs, estimated from the 7B shape cut to 1 and 3 layers on a 2-core machine (where the 1.5B converts in
    22 s, as on the GPU machine): the tiled writer is disk-bound (0.45-0.75 GB/s there; numpy's normals would add
    15 ns a weight, about 2 minutes for 7.6B) and the fp16 conversion takes 20 s for the embedding and head plus 5 s
    a layer. ``qwen2.5-coder-7b`` in fp16: writing the 15.2 GB ~20-35 s, converting the target ~160 s and
    ``target-L2`` ~30 s, the 0.5B draft ~11 s (the 1.5B ~26 s): about 4 minutes. Peak memory: 0.34 GB writing,
    3.2 GB converting whatever the layer count (one tensor at a time; the largest, the [152064, 3584] head, in
    float32 and float16). Disk: about 35 GB at the peak (the safetensors beside the conversions), 19 GB kept (21 GB
    with the 1.5B draft).

    Args:
        name: a key of :data:`SHAPE_PAIRS`.
        dtype: ``"fp16"`` (CUDA), ``"fp32"``, ``"int4"`` or ``"int8"`` (:func:`specrt.convert.convert`).
        tokenizer: a folder with ``tokenizer.json`` (default: :func:`find_tokenizer`, else the byte-level stand-in).
        seed: RNG seed (the draft uses ``seed + 1``).
        root: where the folders go.
        force: rebuild even when the cached folders match.
        log: called with a line before each slow step.
        attention: ``"gqa"`` or ``"gqa-graph"`` (the graph form, for CUDA graphs; cached with a ``-G`` suffix).

    Raises:
        ValueError: unknown ``name`` (the known ones are listed).
        FileNotFoundError: ``tokenizer`` has no ``tokenizer.json``.
    """
    from specrt.convert import convert

    if name not in SHAPE_PAIRS:
        raise ValueError(f"random shapes {name!r} are unknown (expected one of: {', '.join(SHAPE_PAIRS)})")
    pair = SHAPE_PAIRS[name]
    target_shape, draft_shape = SHAPES[pair.target], SHAPES[pair.draft]
    from specrt.models import ATTENTION_SUFFIX

    root = Path(root) if root is not None else random_dir() / f"{name}-{dtype}{ATTENTION_SUFFIX.get(attention, '')}"
    say = log or (lambda _line: None)
    tok_src = Path(tokenizer) if tokenizer is not None else find_tokenizer(pair)
    if tok_src is not None and not (tok_src / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{tok_src} has no tokenizer.json (expected a tokenizer folder)")
    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = tok_src if tok_src is not None else write_stand_in_tokenizer(Path(tmp) / "tokenizer")
        recipe = {
            "format": RECIPE_FORMAT,
            "name": name,
            "dtype": dtype,
            "attention": attention,
            "seed": seed,
            "weights": WEIGHTS_RECIPE,
            "weight_std": WEIGHT_STD,
            "target_layer_scale": TARGET_LAYER_SCALE,
            "truncated_layers": pair.truncated_layers,
            "target_shape": {"name": pair.target, **asdict(target_shape), "n_parameters": n_parameters(target_shape)},
            "draft_shape": {"name": pair.draft, **asdict(draft_shape), "n_parameters": n_parameters(draft_shape)},
            "tokenizer": {
                "source": str(tok_src) if tok_src is not None else STAND_IN_TOKENIZER,
                "stand_in": tok_src is None,
                "sha256": _sha256(tok_dir / "tokenizer.json"),
            },
        }
        models = RandomModels(
            name=name,
            dtype=dtype,
            root=root,
            target=root / "target",
            draft=root / "draft",
            truncated_draft=root / f"target-L{pair.truncated_layers}",
            recipe=recipe,
        )
        if not force and models.complete():
            return models
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        # The weights follow from the recipe: its hash stands for the source's (no 3 GB hashing pass).
        source_sha = hashlib.sha256(json.dumps(_comparable(recipe), sort_keys=True).encode()).hexdigest()
        provenance = f"random weights written by specrt.bench.random_models: {json.dumps(_comparable(recipe))}"

        def build(shape_name: str, hf: Path, seed_: int, layer_scale: float, outs: dict[Path, int | None]) -> None:
            say(f"writing random weights in the {shape_name} shape ({n_parameters(SHAPES[shape_name]):,} weights)")
            write_random_hf(SHAPES[shape_name], hf, tokenizer_dir=tok_dir, seed=seed_, layer_scale=layer_scale)
            for out, layers in outs.items():
                say(f"converting {out.name} to {dtype}")
                convert(
                    hf,
                    out,
                    dtype=dtype,
                    source_sha256=source_sha,
                    provenance=provenance,
                    progress=False,
                    num_layers=layers,
                    attention=attention,
                )
            shutil.rmtree(hf)

        build(
            pair.target,
            root / "hf-target",
            seed,
            TARGET_LAYER_SCALE,
            {models.target: None, models.truncated_draft: pair.truncated_layers},
        )
        build(pair.draft, root / "hf-draft", seed + 1, 1.0, {models.draft: None})
        (root / "recipe.json").write_text(json.dumps(recipe, indent=1) + "\n", encoding="utf-8")
    return models
