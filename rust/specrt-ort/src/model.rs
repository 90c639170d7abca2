//! Model folder resolution, `specrt_config.json`, and the analysis of a decoder's inputs/outputs (layout
//! detection). Everything here works on plain descriptions, so it is unit-tested without ONNX Runtime.

use std::path::{Path, PathBuf};

use specrt_core::{Result, SpecError};

use crate::options::KvLayout;

/// The vocabulary size of a `[.., .., vocab]` logits output: its last dimension, or `vocab_size` from the config when
/// that dimension is dynamic.
///
/// Errors: [`SpecError::ModelFormat`] when neither gives it.
fn logits_width(logits: &TensorDesc, config: &SpecrtConfig) -> Result<usize> {
    match logits.dim(2) {
        Some(v) if v > 0 => Ok(usize::try_from(v).expect("positive")),
        _ => config.vocab_size.ok_or_else(|| {
            SpecError::ModelFormat(format!(
                "vocab size unknown: logits has shape {:?} and no vocab_size in {CONFIG_FILE}",
                logits.shape
            ))
        }),
    }
}

/// The names of `descs`, comma-separated (for error messages).
fn names(descs: &[TensorDesc]) -> String {
    descs
        .iter()
        .map(|d| d.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Name of the model file inside a model folder.
pub const MODEL_FILE: &str = "model.onnx";
/// Name of the specrt model description beside the model.
pub const CONFIG_FILE: &str = "specrt_config.json";

/// One graph input or output as ONNX Runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDesc {
    /// Input/output name.
    pub name: String,
    /// Element type, lower case ONNX-ish names: `"float32"`, `"float16"`, `"bfloat16"`, `"int64"`, ...
    pub dtype: String,
    /// Dimensions; `-1` for a dynamic one.
    pub shape: Vec<i64>,
    /// Symbolic names of the dimensions (empty string when the dimension has none).
    pub symbols: Vec<String>,
}

impl TensorDesc {
    fn dim(&self, i: usize) -> Option<i64> {
        self.shape.get(i).copied()
    }

    fn symbol(&self, i: usize) -> &str {
        self.symbols.get(i).map_or("", String::as_str)
    }
}

/// What `specrt_config.json` says (all fields optional; absent file = all `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecrtConfig {
    /// `vocab_size`.
    pub vocab_size: Option<usize>,
    /// `max_position_embeddings`: the longest sequence the model supports.
    pub max_position_embeddings: Option<usize>,
    /// `kv_layout`.
    pub kv_layout: Option<KvLayout>,
    /// A pruned-vocabulary model (`specrt convert --vocab-subset N`): the full vocabulary size
    /// (`full_vocab_size`) and the `N` ascending token ids its logits score, in order (read from the file named by
    /// `vocab_subset`, a JSON object with `token_ids`).
    pub vocab_subset: Option<(usize, Vec<u32>)>,
    /// A second graph of the same contract for passes of many tokens (prompt prefill, a draft's catch-up), written by
    /// `specrt convert --prefill-graph`: `prefill_graph` (a file name beside the model) and the fewest new tokens per
    /// row a pass must have to run on it (`prefill_min_tokens`, default [`DEFAULT_PREFILL_MIN_TOKENS`]). Used by a
    /// draft model only ([`crate::OrtOptions::prefill_graph`]).
    pub prefill_graph: Option<(PathBuf, usize)>,
    /// `min_onnxruntime`: the oldest ONNX Runtime whose operators compute this graph as converted (e.g. `"1.24"`
    /// for a sliding window: GroupQueryAttention's `local_window_size` counts the window's keys from 1.24 on, one
    /// more before). Checked against the loaded library when a session is made ([`crate::runtime`]).
    pub min_onnxruntime: Option<String>,
}

/// Fewest new tokens per row for which a pass runs on the prefill graph when `specrt_config.json` does not say.
pub const DEFAULT_PREFILL_MIN_TOKENS: usize = 16;

impl SpecrtConfig {
    /// The pruned-vocabulary subset of a model whose logits score `model_vocab` tokens (`None` for a full model).
    ///
    /// Errors: [`SpecError::ModelFormat`] if the subset's id count differs from `model_vocab` or its ids are invalid.
    pub fn vocab_subset_for(
        &self,
        model_vocab: usize,
        model_file: &Path,
    ) -> Result<Option<specrt_core::VocabSubset>> {
        match &self.vocab_subset {
            Some((full, ids)) => {
                if ids.len() != model_vocab {
                    return Err(SpecError::ModelFormat(format!(
                        "{}: the vocabulary subset has {} ids but the model scores {model_vocab} tokens",
                        model_file.display(),
                        ids.len(),
                    )));
                }
                Ok(Some(specrt_core::VocabSubset::new(ids.clone(), *full)?))
            }
            None => Ok(None),
        }
    }

    /// Parse the JSON text of `specrt_config.json` (`origin` names the file in errors).
    ///
    /// Errors: [`SpecError::ModelFormat`] for malformed JSON or a field of the wrong type;
    /// [`SpecError::Config`] for an unknown `kv_layout`.
    pub fn parse(text: &str, origin: &Path) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            SpecError::ModelFormat(format!("{} is not valid JSON: {e}", origin.display()))
        })?;
        let obj = value.as_object().ok_or_else(|| {
            SpecError::ModelFormat(format!("{} is not a JSON object", origin.display()))
        })?;
        let usize_field = |key: &str| -> Result<Option<usize>> {
            match obj.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| {
                        SpecError::ModelFormat(format!(
                            "{}: {key} = {v} is invalid (expected a non-negative integer)",
                            origin.display()
                        ))
                    }),
            }
        };
        let kv_layout = match obj.get("kv_layout") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(s.parse::<KvLayout>()?),
            Some(v) => {
                return Err(SpecError::ModelFormat(format!(
                    "{}: kv_layout = {v} is invalid (expected a string)",
                    origin.display()
                )))
            }
        };
        let vocab_subset = match obj.get("vocab_subset") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(file)) => {
                let full = usize_field("full_vocab_size")?.ok_or_else(|| {
                    SpecError::ModelFormat(format!(
                        "{}: vocab_subset is set but full_vocab_size is missing",
                        origin.display()
                    ))
                })?;
                Some((full, read_subset_ids(&origin.with_file_name(file))?))
            }
            Some(v) => {
                return Err(SpecError::ModelFormat(format!(
                    "{}: vocab_subset = {v} is invalid (expected a file name)",
                    origin.display()
                )))
            }
        };
        let prefill_graph = match obj.get("prefill_graph") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(file)) if !file.is_empty() => {
                let min = usize_field("prefill_min_tokens")?.unwrap_or(DEFAULT_PREFILL_MIN_TOKENS);
                if min == 0 {
                    return Err(SpecError::ModelFormat(format!(
                        "{}: prefill_min_tokens = 0 is invalid (expected an integer >= 1)",
                        origin.display()
                    )));
                }
                Some((origin.with_file_name(file), min))
            }
            Some(v) => {
                return Err(SpecError::ModelFormat(format!(
                    "{}: prefill_graph = {v} is invalid (expected a file name)",
                    origin.display()
                )))
            }
        };
        let min_onnxruntime = match obj.get("min_onnxruntime") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(v)) if version_numbers(v).is_some() => Some(v.clone()),
            Some(v) => {
                return Err(SpecError::ModelFormat(format!(
                "{}: min_onnxruntime = {v} is invalid (expected a version string such as \"1.24\")",
                origin.display()
            )))
            }
        };
        Ok(SpecrtConfig {
            min_onnxruntime,
            vocab_size: usize_field("vocab_size")?,
            max_position_embeddings: usize_field("max_position_embeddings")?,
            kv_layout,
            vocab_subset,
            prefill_graph,
        })
    }

    /// Read `specrt_config.json` beside `model_file` if present.
    pub fn read_beside(model_file: &Path) -> Result<Self> {
        let path = model_file.with_file_name(CONFIG_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(&text, &path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(SpecrtConfig::default()),
            Err(e) => Err(SpecError::io(
                format_args!("cannot read {}", path.display()),
                &e,
            )),
        }
    }
}

/// The `token_ids` list of a vocabulary-subset file (`{"token_ids": [...], ...}`).
fn read_subset_ids(path: &Path) -> Result<Vec<u32>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| SpecError::io(format_args!("cannot read {}", path.display()), &e))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        SpecError::ModelFormat(format!("{} is not valid JSON: {e}", path.display()))
    })?;
    let ids = value
        .get("token_ids")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| {
            SpecError::ModelFormat(format!("{} has no token_ids list", path.display()))
        })?;
    ids.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    SpecError::ModelFormat(format!(
                        "{}: token_ids[{i}] = {v} is invalid (expected a token id)",
                        path.display()
                    ))
                })
        })
        .collect()
}

/// Resolve a model folder (holding `model.onnx`) or a `.onnx` file path to the model file.
///
/// Errors: [`SpecError::NotFound`] naming the path when it does not exist or the folder has no `model.onnx`.
pub fn resolve_model_file(path: &Path) -> Result<PathBuf> {
    if path.is_dir() {
        let file = path.join(MODEL_FILE);
        if file.is_file() {
            Ok(file)
        } else {
            Err(SpecError::NotFound(format!(
                "model file not found: {} (the folder {} has no {MODEL_FILE})",
                file.display(),
                path.display()
            )))
        }
    } else if path.is_file() {
        Ok(path.to_path_buf())
    } else {
        Err(SpecError::NotFound(format!(
            "model file not found: {} (expected a model folder holding {MODEL_FILE}, or an .onnx file)",
            path.display()
        )))
    }
}

/// The decoder interface found in a model: what the backend binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecoderIo {
    /// KV layout (see [`analyze`] for how it is chosen).
    pub layout: KvLayout,
    /// Number of layers (pairs of `past_key_values.{i}.key/value`).
    pub n_layers: usize,
    /// KV heads (dim 1 of the past inputs).
    pub kv_heads: usize,
    /// Head width (dim 3 of the past inputs).
    pub head_dim: usize,
    /// Element type of the KV tensors (`"float32"`, `"float16"`, ...).
    pub kv_dtype: String,
    /// Logits width.
    pub vocab_size: usize,
    /// The graph has an `attention_mask` input.
    pub has_attention_mask: bool,
    /// The graph has a `position_ids` input.
    pub has_position_ids: bool,
    /// `num_logits_to_keep` can be fed (graph input or overridable initializer).
    pub has_num_logits_to_keep: bool,
    /// The graph form (`specrt convert --attention gqa-graph`): `seqlens_k` (int32 `[1]`) and
    /// `total_sequence_length` (int32 scalar) are inputs, fed instead of `attention_mask`.
    pub has_sequence_inputs: bool,
    /// `logits_index` (int64 `[n]`, the positions whose logits are returned) is an input.
    pub has_logits_index: bool,
    /// An `argmax` output (int64 `[1, n]`, the first maximum of each logits row) exists.
    pub has_argmax: bool,
    /// Static length of the shared KV buffer, when the graph fixes it.
    pub static_kv_len: Option<usize>,
}

/// Name of the past input of layer `i` (`kind` = `"key"` or `"value"`).
pub fn past_name(i: usize, kind: &str) -> String {
    format!("past_key_values.{i}.{kind}")
}

/// Name of the present output of layer `i` (`kind` = `"key"` or `"value"`).
pub fn present_name(i: usize, kind: &str) -> String {
    format!("present.{i}.{kind}")
}

/// The numbers of a version string (`"1.24"` -> `[1, 24]`, `"1.32.0"` -> `[1, 32, 0]`); `None` unless it is
/// dot-separated integers.
pub(crate) fn version_numbers(v: &str) -> Option<Vec<u64>> {
    v.split('.').map(|n| n.parse::<u64>().ok()).collect()
}

/// Refuse a model whose `specrt_config.json` asks for a newer ONNX Runtime (`min_onnxruntime`) than the loaded
/// library `version`: its graph would run, and compute something else (e.g. a sliding window one key wider).
///
/// Errors: [`SpecError::Setting`] (`ort_library`) naming the model, both versions and the fix.
pub(crate) fn check_min_onnxruntime(
    config: &SpecrtConfig,
    version: &str,
    model_file: &Path,
) -> Result<()> {
    let Some(min) = &config.min_onnxruntime else {
        return Ok(());
    };
    let (Some(want), Some(have)) = (version_numbers(min), version_numbers(version)) else {
        return Ok(()); // an unparsable library version (a custom build): nothing to compare
    };
    if have < want {
        return Err(SpecError::setting(
            "ort_library",
            format!(
            "{} needs ONNX Runtime >= {min} (specrt_config.json min_onnxruntime: its operators compute this graph \
             differently before that), but the loaded library is {version}; install a newer onnxruntime (or \
             onnxruntime-gpu) wheel, or point SPECRT_ORT_LIBRARY at one",
            model_file.display()
        )));
    }
    Ok(())
}

/// Analyse a decoder's inputs/outputs and choose the KV layout.
///
/// Layout, first rule that applies: (1) `forced` (the `layout` option); (2) `kv_layout` of `specrt_config.json`;
/// (3) `num_logits_to_keep` is an input or an overridable initializer -> shared buffer (the contract's marker);
/// (4) past and present share dim 2 (same symbolic name, or the same static size) -> shared buffer;
/// (5) otherwise Optimum (Optimum exports name them `past_sequence_length` / `total_sequence_length`).
///
/// Errors: [`SpecError::ModelFormat`] naming what is missing or malformed (no `input_ids`, no KV inputs, a past without
/// its present, dynamic head sizes, non-float32 logits, unknown vocab, shared layout without `attention_mask`), and
/// for the batched contract ([`KvLayout::BatchedRows`], which [`analyze_batched`] reads).
pub fn analyze(
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    overridable: &[String],
    config: &SpecrtConfig,
    forced: Option<KvLayout>,
) -> Result<DecoderIo> {
    let input = |name: &str| inputs.iter().find(|d| d.name == name);
    let output = |name: &str| outputs.iter().find(|d| d.name == name);

    if forced.or(config.kv_layout) == Some(KvLayout::BatchedRows)
        || input(&batched_past_name(0, "key_t")).is_some()
    {
        return Err(SpecError::ModelFormat(
            "model holds the batched decoder contract (kv_layout batched_rows, `specrt convert --attention \
             batched`), which runs on BatchedOrtBackend only (expected a batch-1 decoder: convert with --attention \
             gqa, the default)"
                .into(),
        ));
    }
    let ids = input("input_ids").ok_or_else(|| {
        SpecError::ModelFormat(format!(
            "model has no input_ids input (inputs: {})",
            names(inputs)
        ))
    })?;
    if ids.dtype != "int64" {
        return Err(SpecError::ModelFormat(format!(
            "input_ids has type {} (expected int64)",
            ids.dtype
        )));
    }
    let logits = output("logits").ok_or_else(|| {
        SpecError::ModelFormat(format!(
            "model has no logits output (outputs: {})",
            names(outputs)
        ))
    })?;
    if logits.dtype != "float32" {
        return Err(SpecError::ModelFormat(format!(
            "logits output has type {} (expected float32; cast in the graph)",
            logits.dtype
        )));
    }
    if logits.shape.len() != 3 {
        return Err(SpecError::ModelFormat(format!(
            "logits output has rank {} (expected [batch, sequence, vocab])",
            logits.shape.len()
        )));
    }

    let n_layers = (0..)
        .take_while(|&i| input(&past_name(i, "key")).is_some())
        .count();
    if n_layers == 0 {
        return Err(SpecError::ModelFormat(format!(
            "model has no past_key_values.0.key input: not a decoder with a KV cache (inputs: {})",
            names(inputs)
        )));
    }
    let first = input(&past_name(0, "key")).expect("counted above");
    let (Some(kv_heads), Some(head_dim)) = (first.dim(1), first.dim(3)) else {
        return Err(SpecError::ModelFormat(format!(
            "{} has shape {:?} (expected [batch, kv_heads, seq, head_dim])",
            first.name, first.shape
        )));
    };
    if first.shape.len() != 4 || kv_heads <= 0 || head_dim <= 0 {
        return Err(SpecError::ModelFormat(format!(
            "{} has shape {:?} (expected [batch, kv_heads, seq, head_dim] with static kv_heads and head_dim)",
            first.name, first.shape
        )));
    }
    for i in 0..n_layers {
        for kind in ["key", "value"] {
            let past = input(&past_name(i, kind)).ok_or_else(|| {
                SpecError::ModelFormat(format!("model has no {} input", past_name(i, kind)))
            })?;
            let present = output(&present_name(i, kind)).ok_or_else(|| {
                SpecError::ModelFormat(format!(
                    "model has {} but no {} output",
                    past.name,
                    present_name(i, kind)
                ))
            })?;
            if past.dtype != first.dtype || present.dtype != first.dtype {
                return Err(SpecError::ModelFormat(format!(
                    "{} / {} have types {} / {} (expected {} like {})",
                    past.name, present.name, past.dtype, present.dtype, first.dtype, first.name
                )));
            }
            if past.shape.len() != 4
                || past.dim(1) != Some(kv_heads)
                || past.dim(3) != Some(head_dim)
            {
                return Err(SpecError::ModelFormat(format!(
                    "{} has shape {:?} (expected [1, {kv_heads}, seq, {head_dim}] like {})",
                    past.name, past.shape, first.name
                )));
            }
        }
    }
    if !matches!(first.dtype.as_str(), "float32" | "float16" | "bfloat16") {
        return Err(SpecError::ModelFormat(format!(
            "KV cache type {} is not supported (expected float32, float16 or bfloat16)",
            first.dtype
        )));
    }

    let has_nltk = input("num_logits_to_keep").is_some()
        || overridable.iter().any(|n| n == "num_logits_to_keep");
    let present0 = output(&present_name(0, "key")).expect("checked above");
    let shares_dim = {
        let (ps, qs) = (first.symbol(2), present0.symbol(2));
        (!ps.is_empty() && ps == qs)
            || (first.dim(2).is_some_and(|d| d > 0) && first.dim(2) == present0.dim(2))
    };
    let layout = forced
        .or(config.kv_layout)
        .unwrap_or(if has_nltk || shares_dim {
            KvLayout::SharedBuffer
        } else {
            KvLayout::Optimum
        });
    let has_attention_mask = input("attention_mask").is_some();
    // Whether an optional tensor is there, checking its type when it is.
    let optional = |d: Option<&TensorDesc>, dtype: &str, kind: &str| -> Result<bool> {
        match d {
            Some(d) if d.dtype != dtype => Err(SpecError::ModelFormat(format!(
                "{kind} {} has type {} (expected {dtype})",
                d.name, d.dtype
            ))),
            Some(_) => Ok(true),
            None => Ok(false),
        }
    };
    let has_seqlens = optional(input("seqlens_k"), "int32", "input")?;
    let has_total = optional(input("total_sequence_length"), "int32", "input")?;
    if has_seqlens != has_total {
        return Err(SpecError::ModelFormat(
            "model has only one of seqlens_k / total_sequence_length (the graph form has both inputs)".into(),
        ));
    }
    let has_logits_index = optional(input("logits_index"), "int64", "input")?;
    let has_argmax = optional(output("argmax"), "int64", "output")?;
    if layout == KvLayout::SharedBuffer && !has_attention_mask && !has_seqlens {
        return Err(SpecError::ModelFormat(
            "shared-buffer model has no attention_mask input (the contract derives seqlens_k and \
             total_sequence_length from it) and no seqlens_k / total_sequence_length inputs (the graph form)"
                .into(),
        ));
    }
    let vocab_size = logits_width(logits, config)?;
    let static_kv_len = match (layout, first.dim(2)) {
        (KvLayout::SharedBuffer, Some(d)) if d > 0 => Some(usize::try_from(d).expect("positive")),
        _ => None,
    };
    Ok(DecoderIo {
        layout,
        n_layers,
        kv_heads: usize::try_from(kv_heads).expect("positive"),
        head_dim: usize::try_from(head_dim).expect("positive"),
        kv_dtype: first.dtype.clone(),
        vocab_size,
        has_attention_mask,
        has_position_ids: input("position_ids").is_some(),
        has_num_logits_to_keep: has_nltk,
        has_sequence_inputs: has_seqlens,
        has_logits_index,
        has_argmax,
        static_kv_len,
    })
}

/// Name of a batched-contract past input of layer `i` (`kind` = `"key_t"` or `"value"`).
pub fn batched_past_name(i: usize, kind: &str) -> String {
    format!("past_key_values.{i}.{kind}")
}

/// Name of a batched-contract new-KV output of layer `i` (`kind` = `"key"` or `"value"`).
pub fn batched_new_name(i: usize, kind: &str) -> String {
    format!("new.{i}.{kind}")
}

/// The batched decoder interface found in a model ([`KvLayout::BatchedRows`]; ARCHITECTURE.md "Batched rounds").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchedIo {
    /// Number of layers (pairs of `past_key_values.{i}.key_t` / `.value`).
    pub n_layers: usize,
    /// KV heads (dim 1 of the past inputs).
    pub kv_heads: usize,
    /// Head width (dim 2 of `key_t`, dim 3 of `value`).
    pub head_dim: usize,
    /// Logits width (`N` for a pruned-vocabulary model).
    pub vocab_size: usize,
    /// Static cache length, when the graph fixes it (dim 3 of `key_t`).
    pub static_kv_len: Option<usize>,
}

/// Analyse a model for the batched contract: int64 `input_ids` / `positions` `[B, S]`, `past_lengths` `[B]`,
/// `num_logits_to_keep` (input or overridable initializer), float32 `past_key_values.{i}.key_t`
/// `[B, kv_heads, head_dim, L]` and `.value` `[B, kv_heads, L, head_dim]`, float32 outputs `logits` `[B, n, vocab]`
/// and `new.{i}.key` / `new.{i}.value` `[B, kv_heads, S, head_dim]`. `config.kv_layout` must be absent or
/// `batched_rows`.
///
/// Errors: [`SpecError::ModelFormat`] naming what was found and what is expected (another `kv_layout`, a missing or
/// malformed input or output, a KV type other than float32, unknown vocab).
pub fn analyze_batched(
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    overridable: &[String],
    config: &SpecrtConfig,
) -> Result<BatchedIo> {
    const CONVERT: &str = "convert the model with `specrt convert --attention batched`";
    let input = |name: &str| inputs.iter().find(|d| d.name == name);
    let output = |name: &str| outputs.iter().find(|d| d.name == name);
    if let Some(layout) = config.kv_layout {
        if layout != KvLayout::BatchedRows {
            return Err(SpecError::ModelFormat(format!(
                "model has kv_layout {layout} in {CONFIG_FILE} (expected batched_rows: {CONVERT})"
            )));
        }
    }
    let expect = |name: &str, dtype: &str, rank: usize| -> Result<&TensorDesc> {
        let d = input(name).ok_or_else(|| {
            SpecError::ModelFormat(format!(
                "model has no {name} input, so it is not the batched decoder contract (inputs: {}; expected \
                 input_ids, positions, past_lengths, past_key_values.{{i}}.key_t / .value: {CONVERT})",
                names(inputs)
            ))
        })?;
        if d.dtype != dtype || d.shape.len() != rank {
            return Err(SpecError::ModelFormat(format!(
                "{name} is {} {:?} (expected {dtype} of rank {rank})",
                d.dtype, d.shape
            )));
        }
        Ok(d)
    };
    expect("input_ids", "int64", 2)?;
    expect("positions", "int64", 2)?;
    expect("past_lengths", "int64", 1)?;
    let first = expect(&batched_past_name(0, "key_t"), "float32", 4)?;
    if input("num_logits_to_keep").is_none()
        && !overridable.iter().any(|n| n == "num_logits_to_keep")
    {
        return Err(SpecError::ModelFormat(format!(
            "model has no num_logits_to_keep input (inputs: {}; {CONVERT})",
            names(inputs)
        )));
    }
    let (h, d) = match (first.dim(1), first.dim(2)) {
        (Some(h), Some(d)) if h > 0 && d > 0 => (h, d),
        _ => {
            return Err(SpecError::ModelFormat(format!(
                "{} has shape {:?} (expected [batch, kv_heads, head_dim, max_seq] with static kv_heads and head_dim)",
                first.name, first.shape
            )))
        }
    };
    let n_layers = (0..)
        .take_while(|&i| input(&batched_past_name(i, "key_t")).is_some())
        .count();
    let static_len = first.dim(3).filter(|&d| d > 0);
    for i in 0..n_layers {
        let key_t = expect(&batched_past_name(i, "key_t"), "float32", 4)?;
        let value = expect(&batched_past_name(i, "value"), "float32", 4)?;
        if key_t.dim(1) != Some(h)
            || key_t.dim(2) != Some(d)
            || key_t.dim(3).filter(|&x| x > 0) != static_len
        {
            return Err(SpecError::ModelFormat(format!(
                "{} has shape {:?} (expected [batch, {h}, {d}, max_seq] like {})",
                key_t.name, key_t.shape, first.name
            )));
        }
        if value.dim(1) != Some(h)
            || value.dim(3) != Some(d)
            || value.dim(2).filter(|&x| x > 0) != static_len
        {
            return Err(SpecError::ModelFormat(format!(
                "{} has shape {:?} (expected [batch, {h}, max_seq, {d}] like {})",
                value.name, value.shape, first.name
            )));
        }
        for kind in ["key", "value"] {
            let name = batched_new_name(i, kind);
            let new = output(&name).ok_or_else(|| {
                SpecError::ModelFormat(format!(
                    "model has {} but no {name} output (outputs: {})",
                    key_t.name,
                    names(outputs)
                ))
            })?;
            if new.dtype != "float32"
                || new.shape.len() != 4
                || new.dim(1) != Some(h)
                || new.dim(3) != Some(d)
            {
                return Err(SpecError::ModelFormat(format!(
                    "{name} is {} {:?} (expected float32 [batch, {h}, seq, {d}])",
                    new.dtype, new.shape
                )));
            }
        }
    }
    let logits = output("logits").ok_or_else(|| {
        SpecError::ModelFormat(format!(
            "model has no logits output (outputs: {})",
            names(outputs)
        ))
    })?;
    if logits.dtype != "float32" || logits.shape.len() != 3 {
        return Err(SpecError::ModelFormat(format!(
            "logits output is {} {:?} (expected float32 [batch, n, vocab])",
            logits.dtype, logits.shape
        )));
    }
    let vocab_size = logits_width(logits, config)?;
    Ok(BatchedIo {
        n_layers,
        kv_heads: usize::try_from(h).expect("positive"),
        head_dim: usize::try_from(d).expect("positive"),
        vocab_size,
        static_kv_len: static_len.map(|x| usize::try_from(x).expect("positive")),
    })
}

/// Choose the cache length: the option, else `max_position_embeddings`, else `default`; capped by the model's
/// maximum (`max_position_embeddings`) and by a static KV length fixed in the graph.
///
/// Errors: [`SpecError::Setting`] (`max_seq_len`) when the option exceeds a static KV length fixed in the graph.
pub fn choose_max_seq_len(
    requested: Option<usize>,
    config: &SpecrtConfig,
    static_kv_len: Option<usize>,
    default: usize,
) -> Result<usize> {
    if let (Some(req), Some(fixed)) = (requested, static_kv_len) {
        if req > fixed {
            return Err(SpecError::setting(
                "max_seq_len",
                format!("max_seq_len {req} exceeds the KV length {fixed} fixed in the model graph"),
            ));
        }
    }
    let mut len = requested
        .or(static_kv_len)
        .or(config.max_position_embeddings)
        .unwrap_or(default);
    if let Some(model_max) = config.max_position_embeddings {
        len = len.min(model_max);
    }
    if let Some(fixed) = static_kv_len {
        len = len.min(fixed);
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_for_a_newer_onnx_runtime_is_refused_with_both_versions() {
        let parse = |text: &str| SpecrtConfig::parse(text, Path::new("m/specrt_config.json"));
        let cfg = parse(r#"{"min_onnxruntime": "1.24"}"#).unwrap();
        let model = Path::new("m/model.onnx");
        let err = check_min_onnxruntime(&cfg, "1.23.2", model).unwrap_err();
        assert!(
            matches!(&err, SpecError::Setting { field, message } if field == "ort_library" && message.contains(">= 1.24") && message.contains("1.23.2") && message.contains("m/model.onnx")),
            "{err}"
        );
        for ok in ["1.24.0", "1.24.1", "1.32.0", "2.0"] {
            check_min_onnxruntime(&cfg, ok, model).unwrap();
        }
        check_min_onnxruntime(&parse("{}").unwrap(), "1.0.0", model).unwrap();
        let err = parse(r#"{"min_onnxruntime": "new"}"#).unwrap_err();
        assert!(
            matches!(&err, SpecError::ModelFormat(m) if m.contains("min_onnxruntime")),
            "{err}"
        );
    }

    fn desc(name: &str, dtype: &str, shape: &[i64], symbols: &[&str]) -> TensorDesc {
        TensorDesc {
            name: name.into(),
            dtype: dtype.into(),
            shape: shape.to_vec(),
            symbols: symbols.iter().map(|s| (*s).to_string()).collect(),
        }
    }

    /// A 2-layer decoder; `past_sym` / `present_sym` name dim 2 of the KV tensors.
    fn decoder(
        past_sym: &str,
        present_sym: &str,
        extra_inputs: &[&str],
    ) -> (Vec<TensorDesc>, Vec<TensorDesc>) {
        let mut inputs = vec![
            desc("input_ids", "int64", &[1, -1], &["", "sequence_length"]),
            desc("attention_mask", "int64", &[1, -1], &["", "total"]),
        ];
        for name in extra_inputs {
            inputs.push(desc(name, "int64", &[1, -1], &["", "s"]));
        }
        let mut outputs = vec![desc("logits", "float32", &[1, -1, 64], &["", "n", ""])];
        for i in 0..2 {
            for kind in ["key", "value"] {
                inputs.push(desc(
                    &past_name(i, kind),
                    "float32",
                    &[1, 2, -1, 16],
                    &["", "", past_sym, ""],
                ));
                outputs.push(desc(
                    &present_name(i, kind),
                    "float32",
                    &[1, 2, -1, 16],
                    &["", "", present_sym, ""],
                ));
            }
        }
        (inputs, outputs)
    }

    #[test]
    fn shared_dim_name_means_shared_buffer() {
        let (i, o) = decoder("max_seq", "max_seq", &[]);
        let io = analyze(&i, &o, &[], &SpecrtConfig::default(), None).unwrap();
        assert_eq!(io.layout, KvLayout::SharedBuffer);
        assert_eq!(
            (io.n_layers, io.kv_heads, io.head_dim, io.vocab_size),
            (2, 2, 16, 64)
        );
        assert!(!io.has_num_logits_to_keep);
    }

    #[test]
    fn overridable_num_logits_to_keep_means_shared_buffer() {
        let (i, o) = decoder("past_sequence_length", "total_sequence_length", &[]);
        let io = analyze(
            &i,
            &o,
            &["num_logits_to_keep".into()],
            &SpecrtConfig::default(),
            None,
        )
        .unwrap();
        assert_eq!(io.layout, KvLayout::SharedBuffer);
        assert!(io.has_num_logits_to_keep);
    }

    /// The graph form's interface: sequence lengths and logit positions as inputs, an argmax output.
    fn graph_form() -> (Vec<TensorDesc>, Vec<TensorDesc>) {
        let (mut i, mut o) = decoder("max_seq", "max_seq", &[]);
        i.retain(|d| d.name != "attention_mask");
        i.push(desc("seqlens_k", "int32", &[1], &[""]));
        i.push(desc("total_sequence_length", "int32", &[], &[]));
        i.push(desc("logits_index", "int64", &[-1], &["n"]));
        o.push(desc("argmax", "int64", &[1, -1], &["", "n"]));
        (i, o)
    }

    #[test]
    fn the_graph_form_is_a_shared_buffer_with_sequence_inputs_and_argmax() {
        let (i, o) = graph_form();
        let io = analyze(&i, &o, &[], &SpecrtConfig::default(), None).unwrap();
        assert_eq!(io.layout, KvLayout::SharedBuffer);
        assert!(io.has_sequence_inputs && io.has_logits_index && io.has_argmax);
        assert!(!io.has_attention_mask && !io.has_num_logits_to_keep);
        // The default form has none of them.
        let (i, o) = decoder("max_seq", "max_seq", &[]);
        let io = analyze(&i, &o, &[], &SpecrtConfig::default(), None).unwrap();
        assert!(!io.has_sequence_inputs && !io.has_logits_index && !io.has_argmax);
    }

    #[test]
    fn a_malformed_graph_form_is_refused_by_name() {
        let (mut i, o) = graph_form();
        i.retain(|d| d.name != "total_sequence_length");
        let err = analyze(&i, &o, &[], &SpecrtConfig::default(), None).unwrap_err();
        assert!(err.to_string().contains("only one of seqlens_k"), "{err}");
        let (mut i, o) = graph_form();
        i.iter_mut().find(|d| d.name == "seqlens_k").unwrap().dtype = "int64".into();
        let err = analyze(&i, &o, &[], &SpecrtConfig::default(), None).unwrap_err();
        assert!(
            err.to_string()
                .contains("input seqlens_k has type int64 (expected int32)"),
            "{err}"
        );
        let (i, mut o) = graph_form();
        o.iter_mut().find(|d| d.name == "argmax").unwrap().dtype = "int32".into();
        let err = analyze(&i, &o, &[], &SpecrtConfig::default(), None).unwrap_err();
        assert!(
            err.to_string().contains("output argmax has type int32"),
            "{err}"
        );
        let (mut i, o) = graph_form();
        i.retain(|d| d.name != "total_sequence_length" && d.name != "seqlens_k");
        let err = analyze(&i, &o, &[], &SpecrtConfig::default(), None).unwrap_err();
        assert!(err.to_string().contains("no attention_mask input"), "{err}");
    }

    #[test]
    fn optimum_names_mean_optimum() {
        let (i, o) = decoder(
            "past_sequence_length",
            "total_sequence_length",
            &["position_ids"],
        );
        let io = analyze(&i, &o, &[], &SpecrtConfig::default(), None).unwrap();
        assert_eq!(io.layout, KvLayout::Optimum);
        assert!(io.has_position_ids);
    }

    #[test]
    fn config_and_option_override_detection() {
        let (i, o) = decoder("past_sequence_length", "total_sequence_length", &[]);
        let cfg = SpecrtConfig {
            kv_layout: Some(KvLayout::SharedBuffer),
            ..Default::default()
        };
        assert_eq!(
            analyze(&i, &o, &[], &cfg, None).unwrap().layout,
            KvLayout::SharedBuffer
        );
        assert_eq!(
            analyze(&i, &o, &[], &cfg, Some(KvLayout::Optimum))
                .unwrap()
                .layout,
            KvLayout::Optimum
        );
    }

    #[test]
    fn missing_pieces_are_model_format_errors_naming_them() {
        let (mut i, o) = decoder("m", "m", &[]);
        i.retain(|d| d.name != "input_ids");
        let msg = analyze(&i, &o, &[], &SpecrtConfig::default(), None)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("input_ids"), "{msg}");

        let (i, mut o) = decoder("m", "m", &[]);
        o.retain(|d| d.name != "present.1.value");
        let msg = analyze(&i, &o, &[], &SpecrtConfig::default(), None)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("present.1.value"), "{msg}");

        let (i, mut o) = decoder("m", "m", &[]);
        o[0].dtype = "float16".into();
        let msg = analyze(&i, &o, &[], &SpecrtConfig::default(), None)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("float16") && msg.contains("float32"), "{msg}");

        let (mut i, o) = decoder("m", "m", &[]);
        i.retain(|d| d.name != "attention_mask");
        let msg = analyze(&i, &o, &[], &SpecrtConfig::default(), None)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("attention_mask"), "{msg}");
    }

    #[test]
    fn dynamic_vocab_needs_the_config() {
        let (i, mut o) = decoder("m", "m", &[]);
        o[0].shape = vec![1, -1, -1];
        assert!(analyze(&i, &o, &[], &SpecrtConfig::default(), None).is_err());
        let cfg = SpecrtConfig {
            vocab_size: Some(99),
            ..Default::default()
        };
        assert_eq!(analyze(&i, &o, &[], &cfg, None).unwrap().vocab_size, 99);
    }

    #[test]
    fn config_parses_and_rejects_bad_json() {
        let p = Path::new("/m/specrt_config.json");
        let cfg = SpecrtConfig::parse(
            r#"{"vocab_size": 64, "max_position_embeddings": 128, "kv_layout": "shared_buffer", "x": [1]}"#,
            p,
        )
        .unwrap();
        assert_eq!(cfg.vocab_size, Some(64));
        assert_eq!(cfg.max_position_embeddings, Some(128));
        assert_eq!(cfg.kv_layout, Some(KvLayout::SharedBuffer));
        assert!(matches!(
            SpecrtConfig::parse("{", p),
            Err(SpecError::ModelFormat(_))
        ));
        assert!(matches!(
            SpecrtConfig::parse(r#"{"vocab_size": -1}"#, p),
            Err(SpecError::ModelFormat(_))
        ));
        assert!(matches!(
            SpecrtConfig::parse(r#"{"kv_layout": "paged"}"#, p),
            Err(SpecError::Config(_))
        ));
    }

    #[test]
    fn max_seq_len_is_capped_by_the_model() {
        let cfg = SpecrtConfig {
            max_position_embeddings: Some(128),
            ..Default::default()
        };
        assert_eq!(choose_max_seq_len(None, &cfg, None, 4096).unwrap(), 128);
        assert_eq!(choose_max_seq_len(Some(64), &cfg, None, 4096).unwrap(), 64);
        assert_eq!(
            choose_max_seq_len(Some(1000), &cfg, None, 4096).unwrap(),
            128
        );
        assert_eq!(
            choose_max_seq_len(None, &SpecrtConfig::default(), None, 4096).unwrap(),
            4096
        );
        assert_eq!(
            choose_max_seq_len(None, &SpecrtConfig::default(), Some(32), 4096).unwrap(),
            32
        );
        assert!(choose_max_seq_len(Some(64), &SpecrtConfig::default(), Some(32), 4096).is_err());
    }

    /// A 2-layer batched-contract decoder (kv_heads 2, head_dim 16, vocab 64).
    fn batched_decoder() -> (Vec<TensorDesc>, Vec<TensorDesc>) {
        let mut inputs = vec![
            desc(
                "input_ids",
                "int64",
                &[-1, -1],
                &["batch_size", "sequence_length"],
            ),
            desc(
                "positions",
                "int64",
                &[-1, -1],
                &["batch_size", "sequence_length"],
            ),
            desc("past_lengths", "int64", &[-1], &["batch_size"]),
        ];
        let mut outputs = vec![desc(
            "logits",
            "float32",
            &[-1, -1, 64],
            &["batch_size", "n", ""],
        )];
        for i in 0..2 {
            inputs.push(desc(
                &batched_past_name(i, "key_t"),
                "float32",
                &[-1, 2, 16, -1],
                &["batch_size", "", "", "max_sequence_length"],
            ));
            inputs.push(desc(
                &batched_past_name(i, "value"),
                "float32",
                &[-1, 2, -1, 16],
                &["batch_size", "", "max_sequence_length", ""],
            ));
            for kind in ["key", "value"] {
                outputs.push(desc(
                    &batched_new_name(i, kind),
                    "float32",
                    &[-1, 2, -1, 16],
                    &["batch_size", "", "sequence_length", ""],
                ));
            }
        }
        (inputs, outputs)
    }

    #[test]
    fn batched_contract_is_analysed() {
        let (i, o) = batched_decoder();
        let nltk = ["num_logits_to_keep".to_string()];
        let cfg = SpecrtConfig {
            kv_layout: Some(KvLayout::BatchedRows),
            ..Default::default()
        };
        let io = analyze_batched(&i, &o, &nltk, &cfg).unwrap();
        assert_eq!(
            io,
            BatchedIo {
                n_layers: 2,
                kv_heads: 2,
                head_dim: 16,
                vocab_size: 64,
                static_kv_len: None
            }
        );
        // The batch-1 analysis refuses it by name, with or without the config.
        for cfg in [cfg, SpecrtConfig::default()] {
            let msg = analyze(&i, &o, &nltk, &cfg, None).unwrap_err().to_string();
            assert!(
                msg.contains("batched") && msg.contains("--attention gqa"),
                "{msg}"
            );
        }
    }

    #[test]
    fn batched_analysis_names_what_is_wrong() {
        let (i, o) = batched_decoder();
        let nltk = ["num_logits_to_keep".to_string()];
        let shared = SpecrtConfig {
            kv_layout: Some(KvLayout::SharedBuffer),
            ..Default::default()
        };
        let msg = analyze_batched(&i, &o, &nltk, &shared)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("shared_buffer") && msg.contains("--attention batched"),
            "{msg}"
        );
        // A batch-1 decoder has no batched inputs.
        let (gi, go) = decoder("m", "m", &[]);
        let msg = analyze_batched(&gi, &go, &nltk, &SpecrtConfig::default())
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("positions") && msg.contains("--attention batched"),
            "{msg}"
        );
        let msg = analyze_batched(&i, &o, &[], &SpecrtConfig::default())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("num_logits_to_keep"), "{msg}");
        let (i2, mut o2) = batched_decoder();
        o2.retain(|d| d.name != "new.1.value");
        let msg = analyze_batched(&i2, &o2, &nltk, &SpecrtConfig::default())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("new.1.value"), "{msg}");
        let (mut i3, o3) = batched_decoder();
        i3[3].shape = vec![-1, 2, -1, 16]; // key_t laid out like a value
        let msg = analyze_batched(&i3, &o3, &nltk, &SpecrtConfig::default())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("key_t"), "{msg}");
    }

    #[test]
    fn missing_model_paths_are_io_errors_naming_the_path() {
        let err = resolve_model_file(Path::new("/no/such/model_dir")).unwrap_err();
        assert!(
            matches!(&err, SpecError::NotFound(m) if m.contains("/no/such/model_dir")),
            "{err}"
        );
    }
}
