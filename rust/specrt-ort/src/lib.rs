//! specrt-ort: the ONNX Runtime backend of specrt (ort crate with `load-dynamic`).
//!
//! [`OrtBackend`] runs one ONNX decoder and implements [`specrt_core::backend::Backend`]. Build one from a model
//! folder (or `.onnx` file) and [`OrtOptions`]:
//!
//! ```no_run
//! use specrt_core::backend::Backend;
//! use specrt_ort::{OrtBackend, OrtOptions, Provider};
//!
//! let mut options = OrtOptions::new("/abs/site-packages/onnxruntime/capi/libonnxruntime.so.1.32.0");
//! options.provider = Provider::Cpu;
//! options.max_seq_len = Some(2048);
//! let mut target = OrtBackend::new("/models/qwen2.5-1.5b", &options)?;
//! let logits = target.forward(&[1, 2, 3], 0, 1)?; // [1, vocab] f32
//! # Ok::<(), specrt_core::SpecError>(())
//! ```
//!
//! Two KV layouts are supported (detected from the model, see [`model::analyze`]):
//! - **shared buffer** (the specrt contract, ARCHITECTURE.md): one `[1, kv_heads, max_seq_len, head_dim]` buffer
//!   per past/present pair, allocated once on the provider's device and bound as both input and output; rollback is
//!   a smaller `n_past`. No per-call allocation of the cache.
//! - **Optimum** (`present = concat(past, new)`): the presents become the next pasts; a rollback copies the first
//!   `n_past` positions into new contiguous pasts. CPU only.
//!
//! [`BatchedOrtBackend`] runs the batched contract (`specrt convert --attention batched`, `kv_layout:
//! "batched_rows"`; ARCHITECTURE.md "Batched rounds") and implements [`specrt_core::backend::BatchBackend`]: rows
//! of a batch on their own cache slots (host buffers allocated once, bound in place), each pass's new keys / values
//! written by the backend at each row's offset. CPU only.
//!
//! ONNX Runtime is `dlopen`ed from [`OrtOptions::ort_library`] (absolute path) once per process by
//! [`runtime::init_runtime`]; `ort` errors become [`specrt_core::SpecError::Backend`].
//!
//! ## From Rust alone
//!
//! A service that embeds specrt without Python uses two more pieces:
//! - [`find_ort_library`] ([`discover`]) finds `libonnxruntime.so`: an explicit path (a `--ort-library` flag),
//!   `$SPECRT_ORT_LIBRARY`, `$ORT_DYLIB_PATH`, the `onnxruntime` / `onnxruntime-gpu` wheel of `$SPECRT_PYTHON`, else
//!   of the active venv, the checkout's `.venv` (current folder or above) or `python3`, then a system install (`/usr/local/lib`, `/usr/lib`, `/usr/lib/x86_64-linux-gnu`,
//!   `/opt/onnxruntime/lib`). Without any of them: `pip install onnxruntime` (CPU) or
//!   `pip install 'onnxruntime-gpu[cuda,cudnn]'` (CUDA), or unpack an ONNX Runtime release (>= 1.20) and pass its
//!   `lib/libonnxruntime.so.1.x`.
//! - [`Pipeline`] ([`pipeline`]) loads a target folder and an optional draft folder and generates from token ids
//!   with the behaviour of Python's `specrt.Decoder`: the folder's `generation_config.json` defaults and EOS ids,
//!   stop token ids, sampling and penalty settings, K fixed or auto, the proposer. Tokenization, chat templates and
//!   stop strings stay with the caller.
//!
//! ```no_run
//! use std::path::Path;
//! use specrt_ort::{find_ort_library, GenerationRequest, OrtOptions, Pipeline};
//!
//! let options = OrtOptions::new(find_ort_library(None)?);
//! let mut pipeline = Pipeline::load(Path::new("/models/target"), None, &options)?;
//! let out = pipeline.generate(&[1, 2, 3], &GenerationRequest::default())?;
//! println!("{:?} ({})", out.tokens, out.finish_reason.as_str());
//! # Ok::<(), specrt_core::SpecError>(())
//! ```
//!
//! The `generate` example (`cargo run --release -p specrt-ort --example generate -- --help`) adds a tokenizer
//! (the `tokenizers` crate) and prints text and statistics.
#![deny(missing_docs)]

mod batched;
pub mod constraint_compiler;
pub mod cross_vocab;
mod cuda_graph;
pub mod discover;
pub mod driver;
pub mod folder;
pub mod graph_session;
mod kv_binding;
pub mod model;
pub mod ops;
pub mod options;
mod ort_backend;
pub mod pipeline;
pub mod request_settings;
pub mod runtime;

pub use batched::{
    check_max_batch, max_batch_expected, BatchedOrtBackend, KV_WINDOW_STEP, MAX_BATCH,
};
pub use constraint_compiler::ConstraintCompiler;
pub use cuda_graph::MAX_GRAPH_TOKENS;
pub use discover::find_ort_library;
pub use driver::{Driver, DriverEvent};
pub use folder::{check_draft_folder, FolderDefaults};
pub use graph_session::{GraphOutput, GraphSession};
pub use options::{
    physical_cores, Attention, DecoderOptions, KvLayout, Memory, MemoryPlan, OrtOptions, Provider,
    DEFAULT_MAX_SEQ_LEN,
};
pub use ort_backend::{check_cuda_provider, OrtBackend};
pub use pipeline::{Pipeline, TextOutput, TextStep};
pub use request_settings::{
    check_ids, resolve_request, GenerationRequest, PreparedRequest, Proposer, RequestScope,
    SpeculativeTokens, AUTO_K_MAX,
};
pub use runtime::{
    init_runtime, init_runtime_with_threads, loaded_library, runtime_info, RuntimeInfo,
    CUDA_PROVIDER_LIBRARY,
};
/// The core crate (engine, settings, outputs, statistics, errors), re-exported so that one dependency suffices.
pub use specrt_core;
/// The structured-output crate (llguidance constraints) this crate builds on.
pub use specrt_grammar;
pub use specrt_grammar::OutputConstraint;
/// The text crate (tokenizer, detokenization, stop strings, chat templates), re-exported likewise.
pub use specrt_text;
/// Which text a request gets ([`GenerationRequest::text`]): vLLM's `skip_special_tokens` and
/// `include_stop_str_in_output`.
pub use specrt_text::detok::TextOptions;
