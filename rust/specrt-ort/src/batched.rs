//! [`BatchedOrtBackend`]: the batched decoder contract (`specrt convert --attention batched`, ARCHITECTURE.md
//! "Batched rounds") in one ONNX Runtime session on the CPU, implementing [`specrt_core::backend::BatchBackend`].
//!
//! The KV cache is host memory allocated once for `max_seq_len` positions a slot, laid out per layer as `key_t`
//! `[max_batch, kv_heads, head_dim, W]` and `value` `[max_batch, kv_heads, W, head_dim]` float32 (keys transposed, as
//! the graph reads them) with a *window* `W <= max_seq_len` that follows the longest cached row: it grows in steps of
//! [`KV_WINDOW_STEP`] positions (by at least a quarter) when a pass needs more, and shrinks to half or less when the
//! rows it held are gone, the cached positions moved in place. The graph's attention reads all `W` positions of a
//! row (masked beyond its length), so a pass costs what the longest row's context costs, not what `max_seq_len`
//! does (benches/RESULTS.md, "The batched layout's KV window"). A pass over the slots `[first_slot, first_slot + B)`
//! binds views of that contiguous slot range as the `past_key_values.{i}.*` inputs (no copy); the graph returns the pass's keys and values as `new.{i}.key` / `new.{i}.value` `[B, kv_heads, S,
//! head_dim]`, and the backend writes row `b`'s first `m_b` (its real token count) at offset `past_lengths[b]` of its
//! slot (keys transposed into `key_t`). Pads are never written. Inputs, the new-KV outputs and the logits are views
//! of grow-only host buffers, so a steady decode loop allocates no buffers.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

use ort::{
    session::{IoBinding, Session},
    value::{TensorRef, TensorRefMut},
    AsPointer,
};
use specrt_core::backend::{BatchBackend, BatchRow};
use specrt_core::subset::VocabSubset;
use specrt_core::{Result, SpecError};

use crate::model::{
    analyze_batched, batched_new_name, batched_past_name, check_min_onnxruntime,
    choose_max_seq_len, resolve_model_file, BatchedIo, SpecrtConfig,
};
use crate::options::{KvLayout, OrtOptions, Provider, DEFAULT_MAX_SEQ_LEN};
use crate::ort_backend::{build_session, describe, overridable_initializers, prefill_session};
use crate::runtime::{init_runtime_with_threads, ort_err};

/// Largest `max_batch` [`BatchedOrtBackend::new`] accepts.
pub const MAX_BATCH: usize = 64;

/// What `max_batch` may be, as messages say it (from [`MAX_BATCH`]).
#[must_use]
pub fn max_batch_expected() -> String {
    format!("an integer 1 <= max_batch <= {MAX_BATCH}")
}

/// The one check of `max_batch`, for the decoder options and [`BatchedOrtBackend::new`].
///
/// Errors: [`SpecError::Setting`] (`max_batch`) naming the value and [`max_batch_expected`].
pub fn check_max_batch(max_batch: i64) -> Result<()> {
    if (1..=MAX_BATCH as i64).contains(&max_batch) {
        return Ok(());
    }
    Err(SpecError::setting(
        "max_batch",
        format!(
            "max_batch {max_batch} is invalid (expected {})",
            max_batch_expected()
        ),
    ))
}

/// Token id fed at padded positions and for rows that sit a pass out (their outputs are never read).
const PAD_TOKEN: i64 = 0;

/// Precomputed input/output names of one layer.
struct LayerNames {
    key_t: String,
    value: String,
    new_key: CString,
    new_value: CString,
}

/// Bind output `name` to a `shape` float32 view of `data` (host memory the backend owns).
///
/// ort's safe `IoBinding::bind_output` takes an owned value, which a borrowed view is not; ONNX Runtime's `BindOutput`
/// keeps its own reference to the tensor (not to its data), so the view itself may be dropped. Outputs are rebound
/// before every run (their buffers may have grown), so ONNX Runtime never writes through a stale pointer.
fn bind_output_view(
    binding: &mut IoBinding,
    name: &CStr,
    shape: &[usize],
    data: &mut [f32],
) -> Result<()> {
    let what = || format!("binding output {}", name.to_string_lossy());
    let view =
        TensorRefMut::from_array_view_mut((shape, data)).map_err(|e| ort_err(&what(), &e))?;
    // SAFETY: valid binding and value pointers; `name` is NUL-terminated. ONNX Runtime copies the value handle.
    let status = unsafe { (ort::api().BindOutput)(binding.ptr_mut(), name.as_ptr(), view.ptr()) };
    // SAFETY: `status` was just returned by ONNX Runtime.
    unsafe { ort::Error::result_from_status(status) }.map_err(|e| ort_err(&what(), &e))
}

/// Load a batched model's prefill graph and check that it has the model's contract (layers, KV shape, logits width).
fn load_prefill_graph(
    file: &Path,
    options: &OrtOptions,
    config: &SpecrtConfig,
    io: &BatchedIo,
) -> Result<Session> {
    let (session, found) = prefill_session(file, options, |inputs, outputs, overridable| {
        analyze_batched(inputs, outputs, overridable, config)
    })?;
    let shape = |x: &BatchedIo| (x.n_layers, x.kv_heads, x.head_dim, x.vocab_size);
    if shape(&found) != shape(io) {
        return Err(SpecError::ModelFormat(format!(
            "prefill graph {}: (layers, kv heads, head dim, logits width) {:?} differ from the model's {:?}",
            file.display(),
            shape(&found),
            shape(io)
        )));
    }
    Ok(session)
}

/// The KV window's granularity, in positions: a window is a multiple of it (or `max_seq_len`).
pub const KV_WINDOW_STEP: usize = 128;

/// The window for `live` cached positions now in a window of `window` (`max_seq_len` at most): `window` when it
/// fits and `live` would not fit in half of it; else `live` rounded up to [`KV_WINDOW_STEP`], and when growing at least
/// `window + window / 4` (few moves as a context grows a token at a time).
fn window_for(live: usize, window: usize, max_seq_len: usize) -> usize {
    let fit = |n: usize| n.max(1).div_ceil(KV_WINDOW_STEP) * KV_WINDOW_STEP;
    let w = if live > window {
        fit(live.max(window + window / 4))
    } else if fit(live) * 2 <= window {
        fit(live)
    } else {
        window
    };
    w.min(max_seq_len)
}

/// Rows `0..rows` of `buf`, at a stride of `old` values, to a stride of `new`, keeping each row's first `len(i)`
/// values. Rows move to larger offsets when growing (the last row first) and to smaller ones when shrinking (the
/// first row first), so no row is overwritten before it moves; `copy_within` handles a row's own overlap.
fn move_rows(buf: &mut [f32], rows: usize, old: usize, new: usize, len: impl Fn(usize) -> usize) {
    let mut move_row = |i: usize| {
        let n = len(i);
        buf.copy_within(i * old..i * old + n, i * new);
    };
    if new > old {
        (0..rows).rev().for_each(&mut move_row);
    } else {
        (0..rows).for_each(&mut move_row);
    }
}

fn c_name(name: String) -> Result<CString> {
    CString::new(name)
        .map_err(|e| SpecError::Internal(format!("a model name holds a NUL byte: {e}")))
}

/// A batched-contract decoder (kv_layout `batched_rows`) in one CPU ONNX Runtime session, with `max_batch` KV cache
/// slots of `max_seq_len` positions each.
///
/// Logits of a pruned-vocabulary model (`specrt convert --vocab-subset N`) are expanded to the full vocabulary with
/// `-inf` outside the subset ([`VocabSubset::expand`]), as [`crate::OrtBackend`] does.
///
/// Field order is drop order: the binding (which references the buffers) goes first, the session last.
pub struct BatchedOrtBackend {
    binding: IoBinding,
    /// The prefill graph's binding (see [`OrtOptions::prefill_graph`]); bound afresh for each pass it runs.
    prefill_binding: Option<IoBinding>,
    /// Per layer room for `max_seq_len` positions a slot, laid out `[max_batch, kv_heads, head_dim, window]`
    /// float32 in its first entries: the keys, transposed.
    key_t: Vec<Box<[f32]>>,
    /// Per layer, laid out `[max_batch, kv_heads, window, head_dim]` float32 in its first entries: the values.
    value: Vec<Box<[f32]>>,
    /// Positions a slot's rows hold now (the `L` of the passes' cache inputs): at least every slot's `cached`, a
    /// multiple of [`KV_WINDOW_STEP`] or `max_seq_len` (module docs).
    window: usize,
    /// Per layer, grow-only: the `new.{i}.key` output `[B, kv_heads, S, head_dim]` in the first entries.
    new_key: Vec<Vec<f32>>,
    /// Per layer, grow-only: the `new.{i}.value` output `[B, kv_heads, S, head_dim]` in the first entries.
    new_value: Vec<Vec<f32>>,
    /// Grow-only: the `logits` output `[B, n_logits, width]` in the first entries.
    logits: Vec<f32>,
    /// Grow-only: `input_ids` `[B, S]` int64 in the first entries.
    ids: Vec<i64>,
    /// Grow-only: `positions` `[B, S]` int64 in the first entries.
    positions: Vec<i64>,
    /// `[max_batch]` int64: `past_lengths` in the first `B` entries.
    past_lengths: Box<[i64]>,
    /// `[1]` int64: `num_logits_to_keep` (bound as a scalar).
    n_keep: Box<[i64]>,
    /// Per slot: positions with valid KV (written by a pass or [`BatchBackend::move_slot`]).
    cached: Box<[usize]>,
    /// The prefix store ([`BatchBackend::store_prefix`]): key -> copies of a slot's first positions.
    stored: std::collections::HashMap<u64, StoredPrefix>,
    names: Vec<LayerNames>,
    /// Passes with at least this many new tokens per row run on the prefill graph (when loaded).
    prefill_min_tokens: usize,
    prefill_session: Option<Session>,
    session: Session,
    io: BatchedIo,
    max_seq_len: usize,
    max_batch: usize,
    fallback_reason: Option<String>,
    model_file: PathBuf,
    /// A pruned-vocabulary model: its `[rows, N]` logits are expanded to `[rows, vocab]` (`-inf` outside).
    subset: Option<VocabSubset>,
}

/// The first `n` positions of one slot's KV, copied out (prefix caching).
struct StoredPrefix {
    n: usize,
    /// Per layer `[kv_heads, head_dim, n]` float32: the keys, transposed as in the slot.
    key_t: Vec<Box<[f32]>>,
    /// Per layer `[kv_heads, n, head_dim]` float32: the values.
    value: Vec<Box<[f32]>>,
}

fn to_i64(x: usize) -> i64 {
    // Every value converted here is <= max_seq_len or max_batch, checked to fit at construction.
    i64::try_from(x).unwrap_or(i64::MAX)
}

impl BatchedOrtBackend {
    /// Load a batched-contract model with `max_batch` cache slots.
    ///
    /// `model` is a model folder (holding `model.onnx` and `specrt_config.json`) or an `.onnx` file, converted with
    /// `specrt convert --attention batched` (`kv_layout: "batched_rows"`). Loads ONNX Runtime from
    /// `options.ort_library` first (once per process), builds one CPU session and allocates the KV cache once:
    /// `2 * n_layers` float32 host buffers, `key_t` `[max_batch, kv_heads, head_dim, L]` and `value`
    /// `[max_batch, kv_heads, L, head_dim]`, with `L` = [`BatchBackend::max_seq_len`] chosen as
    /// [`crate::OrtBackend`] does (`options.max_seq_len`, else `max_position_embeddings`, else
    /// [`DEFAULT_MAX_SEQ_LEN`]; capped by `max_position_embeddings`, the rows of the model's rotary cache).
    /// `options.layout` must be `None` or [`KvLayout::BatchedRows`].
    ///
    /// The batched layout runs on the CPU provider only: a CUDA request is [`SpecError::Provider`], unless
    /// `options.allow_fallback`, which runs on the CPU and reports why in [`Self::fallback_reason`].
    ///
    /// Errors: [`SpecError::Setting`] for invalid options or `max_batch` ([`check_max_batch`]);
    /// [`SpecError::ModelFormat`] for a model that is not the batched contract (another `kv_layout`, missing batched
    /// inputs/outputs; the message names what was found and that `specrt convert --attention batched` writes the
    /// expected model) or a malformed config; [`SpecError::NotFound`] for a missing library or model file;
    /// [`SpecError::Io`] for an unreadable one; [`SpecError::Provider`] for CUDA without
    /// `allow_fallback`; [`SpecError::Backend`] for other ONNX Runtime failures.
    pub fn new(model: impl AsRef<Path>, options: &OrtOptions, max_batch: usize) -> Result<Self> {
        options.validate()?;
        check_max_batch(i64::try_from(max_batch).unwrap_or(i64::MAX))?;
        if let Some(layout) = options.layout {
            if layout != KvLayout::BatchedRows {
                return Err(SpecError::setting(
                    "layout",
                    format!(
                        "layout option {layout} is invalid for BatchedOrtBackend (expected none or batched_rows)"
                    ),
                ));
            }
        }
        let fallback_reason = match options.provider {
            Provider::Cpu => None,
            Provider::Cuda => {
                let reason =
                    "the CUDA provider was requested, but the batched decoder layout (kv_layout \
                              batched_rows) runs on the CPU provider only"
                        .to_string();
                if !options.allow_fallback {
                    return Err(SpecError::Provider(format!(
                        "{reason} (request provider cpu, or allow the fallback)"
                    )));
                }
                Some(reason)
            }
        };
        init_runtime_with_threads(&options.ort_library, options.effective_intra_op_threads())?;
        let model_file = resolve_model_file(model.as_ref())?;
        let config = SpecrtConfig::read_beside(&model_file)?;
        check_min_onnxruntime(&config, &crate::runtime::loaded_version()?, &model_file)?;
        let session = build_session(&model_file, options, Provider::Cpu)?;
        let inputs = describe(session.inputs());
        let outputs = describe(session.outputs());
        let overridable = overridable_initializers(&session)?;
        let io =
            analyze_batched(&inputs, &outputs, &overridable, &config).map_err(|e| match e {
                SpecError::ModelFormat(m) => {
                    SpecError::ModelFormat(format!("{}: {m}", model_file.display()))
                }
                other => other,
            })?;
        let max_seq_len = choose_max_seq_len(
            options.max_seq_len,
            &config,
            io.static_kv_len,
            DEFAULT_MAX_SEQ_LEN,
        )?;
        if i64::try_from(max_seq_len).is_err() {
            return Err(SpecError::setting(
                "max_seq_len",
                format!("max_seq_len {max_seq_len} is too large"),
            ));
        }
        let subset = config.vocab_subset_for(io.vocab_size, &model_file)?;
        let (prefill_session, prefill_min_tokens) = match &config.prefill_graph {
            Some((file, min)) if options.prefill_graph => {
                (Some(load_prefill_graph(file, options, &config, &io)?), *min)
            }
            _ => (None, usize::MAX),
        };
        let prefill_binding = prefill_session
            .as_ref()
            .map(|s| {
                s.create_binding()
                    .map_err(|e| ort_err("creating the prefill graph's IO binding", &e))
            })
            .transpose()?;
        let slot_len = io
            .kv_heads
            .checked_mul(io.head_dim)
            .and_then(|x| x.checked_mul(max_seq_len))
            .and_then(|x| x.checked_mul(max_batch))
            .filter(|&x| x <= isize::MAX as usize / 4)
            .ok_or_else(|| {
                SpecError::setting(
                    "max_seq_len",
                    format!(
                        "KV cache [{max_batch}, {}, {}, {max_seq_len}] is too large",
                        io.kv_heads, io.head_dim
                    ),
                )
            })?;
        let key_t = (0..io.n_layers)
            .map(|_| vec![0.0f32; slot_len].into_boxed_slice())
            .collect();
        let value = (0..io.n_layers)
            .map(|_| vec![0.0f32; slot_len].into_boxed_slice())
            .collect();
        let names = (0..io.n_layers)
            .map(|i| {
                Ok(LayerNames {
                    key_t: batched_past_name(i, "key_t"),
                    value: batched_past_name(i, "value"),
                    new_key: c_name(batched_new_name(i, "key"))?,
                    new_value: c_name(batched_new_name(i, "value"))?,
                })
            })
            .collect::<Result<_>>()?;
        let binding = session
            .create_binding()
            .map_err(|e| ort_err("creating the IO binding", &e))?;
        Ok(BatchedOrtBackend {
            binding,
            prefill_binding,
            key_t,
            value,
            new_key: vec![Vec::new(); io.n_layers],
            new_value: vec![Vec::new(); io.n_layers],
            logits: Vec::new(),
            ids: Vec::new(),
            positions: Vec::new(),
            past_lengths: vec![0; max_batch].into_boxed_slice(),
            n_keep: vec![0].into_boxed_slice(),
            cached: vec![0; max_batch].into_boxed_slice(),
            window: KV_WINDOW_STEP.min(max_seq_len),
            stored: std::collections::HashMap::new(),
            names,
            prefill_min_tokens,
            prefill_session,
            session,
            io,
            max_seq_len,
            max_batch,
            fallback_reason,
            model_file,
            subset,
        })
    }

    /// The provider the session runs on: always [`Provider::Cpu`].
    pub fn provider(&self) -> Provider {
        Provider::Cpu
    }

    /// Why CUDA was not used, when it was requested with `allow_fallback`.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    /// The batched interface found in the model (layers, KV heads, head size, logits width).
    pub fn batched_io(&self) -> &BatchedIo {
        &self.io
    }

    /// The model file this backend runs.
    pub fn model_file(&self) -> &Path {
        &self.model_file
    }

    /// Whether the model's prefill graph is loaded, and the fewest new tokens per row a pass needs to run on it.
    pub fn prefill_graph(&self) -> Option<usize> {
        self.prefill_session
            .as_ref()
            .map(|_| self.prefill_min_tokens)
    }

    /// Positions with valid KV in `slot` (written by [`BatchBackend::forward_rows`] or
    /// [`BatchBackend::move_slot`]; 0 at first); `None` for a slot `>= max_batch`.
    pub fn cached_len(&self, slot: usize) -> Option<usize> {
        self.cached.get(slot).copied()
    }

    /// Positions a slot's rows hold now: the cache length `L` the next pass reads (module docs), at least the
    /// longest cached row and at most `max_seq_len`.
    pub fn kv_window(&self) -> usize {
        self.window
    }

    /// Make the window fit `needed` positions in a slot (and every slot's cached ones): grow or shrink it
    /// ([`window_for`]), moving each slot's cached positions to the new row length in place.
    fn fit_window(&mut self, needed: usize) {
        let live = self.cached.iter().copied().max().unwrap_or(0).max(needed);
        let new = window_for(live, self.window, self.max_seq_len);
        let old = self.window;
        if new == old {
            return;
        }
        let (kvh, hd) = (self.io.kv_heads, self.io.head_dim);
        let cached = &self.cached;
        for (key_t, value) in self.key_t.iter_mut().zip(self.value.iter_mut()) {
            // key_t: a row per (slot, head, dim) of `window` positions; value: a block per (slot, head) of `window`
            // positions of `head_dim`.
            move_rows(key_t, self.max_batch * kvh * hd, old, new, |i| {
                cached[i / (kvh * hd)]
            });
            move_rows(value, self.max_batch * kvh, old * hd, new * hd, |i| {
                cached[i / kvh] * hd
            });
        }
        self.window = new;
    }

    /// Addresses of the KV buffers' data (`[l0.key_t, l0.value, l1.key_t, ...]`): allocated once, never moved. For
    /// tests and diagnostics.
    pub fn kv_buffer_addresses(&self) -> Vec<usize> {
        self.key_t
            .iter()
            .zip(&self.value)
            .flat_map(|(k, v)| [k.as_ptr() as usize, v.as_ptr() as usize])
            .collect()
    }

    /// Check a pass's arguments; returns the padded length `s`.
    fn validate(&self, first_slot: usize, rows: &[BatchRow<'_>], n_logits: usize) -> Result<usize> {
        if rows.is_empty() {
            return Err(SpecError::Config(format!(
                "rows is empty (expected 1 to max_batch {} rows)",
                self.max_batch
            )));
        }
        let end = first_slot.checked_add(rows.len());
        if end.is_none_or(|end| end > self.max_batch) {
            return Err(SpecError::Config(format!(
                "slots {first_slot}..{first_slot}+{} run past max_batch {} (expected first_slot + rows <= {})",
                rows.len(),
                self.max_batch,
                self.max_batch
            )));
        }
        let s = rows.iter().map(|r| r.tokens.len()).max().unwrap_or(0);
        if s == 0 {
            return Err(SpecError::Config(format!(
                "every one of the {} rows is empty (expected at least one row with tokens)",
                rows.len()
            )));
        }
        if n_logits == 0 || n_logits > s {
            return Err(SpecError::Config(format!(
                "n_logits {n_logits} is invalid (expected 1 <= n_logits <= padded row length {s})"
            )));
        }
        let vocab = self
            .subset
            .as_ref()
            .map_or(self.io.vocab_size, VocabSubset::full_vocab);
        for (r, row) in rows.iter().enumerate() {
            let slot = first_slot + r;
            let m = row.tokens.len();
            if row
                .n_past
                .checked_add(m)
                .is_none_or(|t| t > self.max_seq_len)
            {
                return Err(SpecError::Length(format!(
                    "row {r} (slot {slot}): n_past {} + {m} tokens exceeds max_seq_len {}",
                    row.n_past, self.max_seq_len
                )));
            }
            if m > 0 && row.n_past > self.cached[slot] {
                return Err(SpecError::Config(format!(
                    "row {r}: n_past {} exceeds the {} positions cached in slot {slot}",
                    row.n_past, self.cached[slot]
                )));
            }
            if let Some((j, &t)) = row
                .tokens
                .iter()
                .enumerate()
                .find(|(_, &t)| t as usize >= vocab)
            {
                return Err(SpecError::Vocab(format!(
                    "row {r}: token {t} at index {j} is out of range (vocab size {vocab})"
                )));
            }
        }
        Ok(s)
    }

    /// Fill and bind the inputs and outputs of a pass over `rows.len()` rows padded to `s` (to the prefill graph's
    /// binding when `prefill`).
    fn bind(
        &mut self,
        first_slot: usize,
        rows: &[BatchRow<'_>],
        s: usize,
        n_logits: usize,
        prefill: bool,
    ) -> Result<()> {
        let b = rows.len();
        let (kvh, hd, l, w) = (
            self.io.kv_heads,
            self.io.head_dim,
            self.max_seq_len,
            self.window,
        );
        let n = b * s;
        if self.ids.len() < n {
            self.ids.resize(n, PAD_TOKEN);
            self.positions.resize(n, 0);
        }
        for (r, row) in rows.iter().enumerate() {
            let m = row.tokens.len();
            let ids = &mut self.ids[r * s..(r + 1) * s];
            let positions = &mut self.positions[r * s..(r + 1) * s];
            for (j, (id, pos)) in ids.iter_mut().zip(positions.iter_mut()).enumerate() {
                *id = row.tokens.get(j).map_or(PAD_TOKEN, |&t| i64::from(t));
                // Pads repeat the row's last real position (an empty row: n_past, at most L - 1): always a valid
                // rotary index, whatever the other rows' lengths.
                *pos = to_i64(if m == 0 {
                    row.n_past.min(l - 1)
                } else {
                    row.n_past + j.min(m - 1)
                });
            }
            self.past_lengths[r] = to_i64(row.n_past);
        }
        self.n_keep[0] = to_i64(n_logits);

        let binding = match self.prefill_binding.as_mut() {
            Some(b) if prefill => b,
            _ => &mut self.binding,
        };
        let bind_err = |what: &str| {
            let what = what.to_string();
            move |e: ort::Error| ort_err(&format!("binding {what}"), &e)
        };
        let ids = TensorRef::from_array_view(([b, s], &self.ids[..n]))
            .map_err(|e| ort_err("input_ids", &e))?;
        binding
            .bind_input("input_ids", &ids)
            .map_err(bind_err("input_ids"))?;
        let positions = TensorRef::from_array_view(([b, s], &self.positions[..n]))
            .map_err(|e| ort_err("positions", &e))?;
        binding
            .bind_input("positions", &positions)
            .map_err(bind_err("positions"))?;
        let lens = TensorRef::from_array_view(([b], &self.past_lengths[..b]))
            .map_err(|e| ort_err("past_lengths", &e))?;
        binding
            .bind_input("past_lengths", &lens)
            .map_err(bind_err("past_lengths"))?;
        let keep = TensorRef::from_array_view((Vec::<i64>::new(), &self.n_keep[..]))
            .map_err(|e| ort_err("num_logits_to_keep", &e))?;
        binding
            .bind_input("num_logits_to_keep", &keep)
            .map_err(bind_err("num_logits_to_keep"))?;

        // The slot range's caches: views of the host buffers, no copy.
        let per_slot = kvh * hd * w;
        let range = first_slot * per_slot..(first_slot + b) * per_slot;
        let n_new = b * kvh * s * hd;
        for (i, names) in self.names.iter().enumerate() {
            let key_t =
                TensorRef::from_array_view(([b, kvh, hd, w], &self.key_t[i][range.clone()]))
                    .map_err(|e| ort_err("a key_t view", &e))?;
            binding
                .bind_input(names.key_t.as_str(), &key_t)
                .map_err(bind_err(&names.key_t))?;
            let value =
                TensorRef::from_array_view(([b, kvh, w, hd], &self.value[i][range.clone()]))
                    .map_err(|e| ort_err("a value view", &e))?;
            binding
                .bind_input(names.value.as_str(), &value)
                .map_err(bind_err(&names.value))?;
            for (buf, name) in [
                (&mut self.new_key[i], &names.new_key),
                (&mut self.new_value[i], &names.new_value),
            ] {
                if buf.len() < n_new {
                    buf.resize(n_new, 0.0);
                }
                bind_output_view(binding, name, &[b, kvh, s, hd], &mut buf[..n_new])?;
            }
        }
        let width = self.io.vocab_size;
        let n_out = b * n_logits * width;
        if self.logits.len() < n_out {
            self.logits.resize(n_out, 0.0);
        }
        bind_output_view(
            binding,
            c"logits",
            &[b, n_logits, width],
            &mut self.logits[..n_out],
        )?;
        Ok(())
    }

    /// Write each non-empty row's first `m` new keys / values at its slot's offset `n_past`.
    fn write_kv(&mut self, first_slot: usize, rows: &[BatchRow<'_>], s: usize) {
        let (kvh, hd, l) = (self.io.kv_heads, self.io.head_dim, self.window);
        for layer in 0..self.io.n_layers {
            let (key_t, value) = (&mut self.key_t[layer], &mut self.value[layer]);
            let (new_k, new_v) = (&self.new_key[layer], &self.new_value[layer]);
            for (r, row) in rows.iter().enumerate() {
                let (m, past) = (row.tokens.len(), row.n_past);
                if m == 0 {
                    continue;
                }
                let slot = first_slot + r;
                for h in 0..kvh {
                    let src = (r * kvh + h) * s * hd; // new_*[r, h, 0, 0]
                    let k_head = (slot * kvh + h) * hd * l; // key_t[slot, h, 0, 0]
                    for d in 0..hd {
                        let dst = &mut key_t[k_head + d * l + past..k_head + d * l + past + m];
                        for (j, x) in dst.iter_mut().enumerate() {
                            *x = new_k[src + j * hd + d];
                        }
                    }
                    let v_dst = ((slot * kvh + h) * l + past) * hd; // value[slot, h, past, 0]
                    value[v_dst..v_dst + m * hd].copy_from_slice(&new_v[src..src + m * hd]);
                }
            }
        }
        for (r, row) in rows.iter().enumerate() {
            if !row.tokens.is_empty() {
                self.cached[first_slot + r] = row.n_past + row.tokens.len();
            }
        }
    }
}

impl BatchBackend for BatchedOrtBackend {
    /// The full vocabulary (a pruned-vocabulary model included: its rows are `-inf` outside its subset).
    fn vocab_size(&self) -> usize {
        self.subset
            .as_ref()
            .map_or(self.io.vocab_size, VocabSubset::full_vocab)
    }

    fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// See [`BatchBackend::forward_rows`]. Pads (positions `>= tokens.len()` of a row, and every position of an
    /// empty row) feed token 0 at the row's last real position (an empty row: `min(n_past, max_seq_len - 1)`); their
    /// keys and values are never written. Also [`SpecError::Vocab`] for a token id `>= vocab_size`, and
    /// [`SpecError::Config`] when a non-empty row's `n_past` exceeds the positions cached in its slot
    /// ([`BatchedOrtBackend::cached_len`]). On an error nothing in the cache changes.
    fn forward_rows(
        &mut self,
        first_slot: usize,
        rows: &[BatchRow<'_>],
        n_logits: usize,
    ) -> Result<&[f32]> {
        let s = self.validate(first_slot, rows, n_logits)?;
        let prefill = s >= self.prefill_min_tokens; // usize::MAX without a prefill graph
                                                    // validated: n_past + m <= max_seq_len for every row
        let needed = rows
            .iter()
            .map(|r| r.n_past + r.tokens.len())
            .max()
            .unwrap_or(0);
        self.fit_window(needed);
        self.bind(first_slot, rows, s, n_logits, prefill)?;
        let (session, binding) = match (&self.prefill_session, &self.prefill_binding) {
            (Some(session), Some(binding)) if prefill => (session, binding),
            _ => (&self.session, &self.binding),
        };
        // Every output is preallocated and read from our own buffers: call RunWithBinding directly (no
        // GetBoundOutputValues per call).
        // SAFETY: valid session and binding pointers (the binding was created from this session); a null run-options
        // pointer is allowed. Every bound input/output views memory owned by `self` and bound just above.
        let status = unsafe {
            (ort::api().RunWithBinding)(session.ptr().cast_mut(), std::ptr::null(), binding.ptr())
        };
        // SAFETY: `status` was just returned by ONNX Runtime.
        unsafe { ort::Error::result_from_status(status) }
            .map_err(|e| ort_err("running the model", &e))?;
        self.write_kv(first_slot, rows, s);
        let rows_out = rows.len() * n_logits;
        let kept = &self.logits[..rows_out * self.io.vocab_size];
        match self.subset.as_mut() {
            Some(subset) => subset.expand(kept, rows_out),
            None => Ok(kept),
        }
    }

    /// See [`BatchBackend::move_slot`]: copies the first `n_valid` positions of every layer's `key_t` / `value` rows
    /// of slot `from` into slot `to` (`from == to`: nothing to do). Also [`SpecError::Config`] when `n_valid`
    /// exceeds the positions cached in `from` ([`BatchedOrtBackend::cached_len`]).
    fn move_slot(&mut self, from: usize, to: usize, n_valid: usize) -> Result<()> {
        for (what, slot) in [("from", from), ("to", to)] {
            if slot >= self.max_batch {
                return Err(SpecError::Config(format!(
                    "slot {what} = {slot} is out of range (expected < max_batch {})",
                    self.max_batch
                )));
            }
        }
        if n_valid > self.max_seq_len {
            return Err(SpecError::Config(format!(
                "n_valid {n_valid} exceeds max_seq_len {}",
                self.max_seq_len
            )));
        }
        if n_valid > self.cached[from] {
            return Err(SpecError::Config(format!(
                "n_valid {n_valid} exceeds the {} positions cached in slot {from}",
                self.cached[from]
            )));
        }
        if from == to {
            return Ok(());
        }
        // n_valid <= cached[from] <= window: no window change is needed
        let (kvh, hd, l) = (self.io.kv_heads, self.io.head_dim, self.window);
        for (key_t, value) in self.key_t.iter_mut().zip(self.value.iter_mut()) {
            for h in 0..kvh {
                for d in 0..hd {
                    let src = ((from * kvh + h) * hd + d) * l;
                    let dst = ((to * kvh + h) * hd + d) * l;
                    key_t.copy_within(src..src + n_valid, dst);
                }
                let src = (from * kvh + h) * l * hd;
                let dst = (to * kvh + h) * l * hd;
                value.copy_within(src..src + n_valid * hd, dst);
            }
        }
        self.cached[to] = n_valid;
        Ok(())
    }

    /// Keys and values of every layer, float32: `2 * layers * kv_heads * head_dim * 4` bytes.
    fn kv_bytes_per_token(&self) -> usize {
        2 * self.key_t.len() * self.io.kv_heads * self.io.head_dim * std::mem::size_of::<f32>()
    }

    /// See [`BatchBackend::store_prefix`]: copies the first `n` positions of every layer's `key_t` / `value` rows
    /// of `slot` into host buffers of their own (`n * kv_bytes_per_token` bytes).
    fn store_prefix(&mut self, key: u64, slot: usize, n: usize) -> Result<()> {
        if slot >= self.max_batch || n > self.cached[slot] {
            return Err(SpecError::Config(format!(
                "store_prefix: slot {slot} (of {}), n {n} (it caches {})",
                self.max_batch,
                self.cached.get(slot).copied().unwrap_or(0)
            )));
        }
        let (kvh, hd, l) = (self.io.kv_heads, self.io.head_dim, self.window);
        let mut kept = StoredPrefix {
            n,
            key_t: Vec::with_capacity(self.key_t.len()),
            value: Vec::with_capacity(self.value.len()),
        };
        for (key_t, value) in self.key_t.iter().zip(&self.value) {
            let mut k = Vec::with_capacity(kvh * hd * n);
            let mut v = Vec::with_capacity(kvh * n * hd);
            for h in 0..kvh {
                for d in 0..hd {
                    let src = ((slot * kvh + h) * hd + d) * l;
                    k.extend_from_slice(&key_t[src..src + n]);
                }
                let src = (slot * kvh + h) * l * hd;
                v.extend_from_slice(&value[src..src + n * hd]);
            }
            kept.key_t.push(k.into_boxed_slice());
            kept.value.push(v.into_boxed_slice());
        }
        self.stored.insert(key, kept);
        Ok(())
    }

    /// See [`BatchBackend::load_prefix`]: the stored rows are copied back into `slot`'s `key_t` / `value` rows.
    fn load_prefix(&mut self, key: u64, slot: usize, n: usize) -> Result<()> {
        let stored = self
            .stored
            .get(&key)
            .filter(|k| n <= k.n && slot < self.max_batch);
        let Some(m) = stored.map(|k| k.n) else {
            return Err(SpecError::Config(format!(
                "load_prefix: key {key} (stored: {}), n {n}, slot {slot} (of {})",
                self.stored.contains_key(&key),
                self.max_batch
            )));
        };
        self.fit_window(n);
        let kept = &self.stored[&key];
        let (kvh, hd, l) = (self.io.kv_heads, self.io.head_dim, self.window);
        for ((key_t, value), (k, v)) in self
            .key_t
            .iter_mut()
            .zip(self.value.iter_mut())
            .zip(kept.key_t.iter().zip(&kept.value))
        {
            for h in 0..kvh {
                for d in 0..hd {
                    let dst = ((slot * kvh + h) * hd + d) * l;
                    let src = (h * hd + d) * m;
                    key_t[dst..dst + n].copy_from_slice(&k[src..src + n]);
                }
                let dst = (slot * kvh + h) * l * hd;
                let src = h * m * hd;
                value[dst..dst + n * hd].copy_from_slice(&v[src..src + n * hd]);
            }
        }
        self.cached[slot] = n;
        Ok(())
    }

    fn drop_prefix(&mut self, key: u64) {
        self.stored.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::{window_for, KV_WINDOW_STEP as STEP};

    #[test]
    fn the_window_grows_by_steps_and_a_quarter_and_shrinks_only_to_half_or_less() {
        let max = 4096;
        // fits: unchanged
        assert_eq!(window_for(0, STEP, max), STEP);
        assert_eq!(window_for(STEP, STEP, max), STEP);
        // grows to the next step, by at least a quarter
        assert_eq!(window_for(STEP + 1, STEP, max), 2 * STEP);
        assert_eq!(window_for(8 * STEP + 1, 8 * STEP, max), 10 * STEP);
        assert_eq!(window_for(12 * STEP, 8 * STEP, max), 12 * STEP);
        // capped at max_seq_len, which need not be a multiple of the step
        assert_eq!(window_for(300, 256, 300), 300);
        assert_eq!(window_for(4000, 3 * STEP, max), max);
        // shrinks when the live positions fit in half of it, not before
        assert_eq!(window_for(4 * STEP, 8 * STEP, max), 4 * STEP);
        assert_eq!(window_for(4 * STEP + 1, 8 * STEP, max), 8 * STEP);
        assert_eq!(window_for(1, 8 * STEP, max), STEP);
        // every result holds the live positions
        for live in 0..=max {
            for window in [STEP, 3 * STEP, 8 * STEP, max] {
                let w = window_for(live, window, max);
                assert!(w >= live && w <= max, "{live} {window} -> {w}");
            }
        }
    }
}
