//! Text in, text out: the pieces between a request's text and the engine's token ids, shared by the Rust
//! `Pipeline`, the Python binding and `specrt serve`.
//!
//! - [`tokenizer`]: a model folder's `tokenizer.json` through the `tokenizers` crate (the same version as the
//!   Python package's, so both give identical ids).
//! - [`detok`]: incremental detokenization that never emits a partial UTF-8 sequence.
//! - [`stop`]: stop strings matched across token boundaries.
//! - [`chat`]: chat templates rendered with `minijinja` as Hugging Face transformers' `apply_chat_template` does.
//!   Its rooms: `chat_time.rs` (the calendar and `strftime` behind `strftime_now`) and `python_values.rs` (values
//!   written as Python's `json.dumps`, `str()` and `repr()` write them).

pub mod chat;
mod chat_time;
pub mod detok;
mod python_values;
pub mod stop;
pub mod tokenizer;
