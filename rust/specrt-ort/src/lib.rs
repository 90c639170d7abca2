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
//! ONNX Runtime is `dlopen`ed from [`OrtOptions::ort_library`] (absolute path) once per process by
//! [`runtime::init_runtime`]; `ort` errors become [`specrt_core::SpecError::Backend`].
#![deny(missing_docs)]

mod backend;
pub mod model;
pub mod options;
pub mod runtime;

pub use backend::{check_cuda_provider, OrtBackend};
pub use options::{physical_cores, KvLayout, OrtOptions, Provider, DEFAULT_MAX_SEQ_LEN};
pub use runtime::{init_runtime, init_runtime_with_threads, loaded_library, CUDA_PROVIDER_LIBRARY};
