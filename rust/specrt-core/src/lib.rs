//! specrt-core: the lossless speculative decoding core.
//!
//! Pure Rust (no Python, no ONNX Runtime types). Holds logits processing, the seeded RNG, one verification
//! round (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023, arXiv:2302.01318), the cost model of
//! `shared/seed`, and the draft/verify loop over a [`backend::Backend`] trait. All 2-D data is row-major.
#![deny(missing_docs)]

pub mod adaptive;
pub mod backend;
pub mod batch;
mod constrained_round;
pub mod constraint;
pub mod cost;
pub mod coupled;
pub mod cross_vocab;
pub mod engine;
pub mod error;
pub mod lookup;
pub mod ngram;
pub mod prefix;
pub mod request;
pub mod request_engine;
pub mod rng;
pub mod sampling;
pub mod single_stream;
pub mod stats;
pub mod subset;
pub mod suffix;
pub mod testing;
pub mod verify;
pub mod vocab;

pub use adaptive::{AutoK, KController, PinnedCosts, RoundKind};
pub use backend::{Backend, BatchBackend, BatchRow};
pub use batch::{BatchEngine, BatchOptions, DEFAULT_MAX_PREFILL_TOKENS};
pub use constraint::{apply_mask, mask_allows, mask_set, mask_words, next_mask, Constraint};
pub use coupled::CoupledNoise;
pub use cross_vocab::{CrossVocabBatchDraft, CrossVocabDraft, VocabMap, VocabOverlap};
pub use engine::Engine;
pub use error::{Result, SpecError};
pub use lookup::LookupProposer;
pub use ngram::{NgramProposer, MAX_NGRAM_LEN};
pub use prefix::{
    common_prefix_len, PrefixReuse, DEFAULT_PREFIX_CACHE_BYTES, DEFAULT_PREFIX_CACHING,
};
pub use request::{
    check_num_speculative_tokens, check_prompt, invalid_num_speculative_tokens,
    num_speculative_tokens_expected, FinishReason, GenerationConfig, GenerationOutput,
    LookupMethod, NgramConfig, PromptLogprobs, StepOutput, TokenSource, PROMPT_LOGPROBS_CHUNK,
};
pub use request_engine::{RequestEngine, RowStep};
pub use rng::{PcgState, Rng};
pub use sampling::{PenaltyContext, Sampler, SamplingParams, MAX_TOP_LOGPROBS};
pub use single_stream::SingleStream;
pub use stats::Stats;
pub use subset::{SubsetBackend, VocabSubset};
pub use suffix::{
    check_suffix_cache_tokens, suffix_cache_tokens_expected, SuffixCache, SuffixProposer,
    MAX_SUFFIX_CACHE_TOKENS, SUFFIX_MAX_DEPTH,
};
pub use verify::{
    check_draft_count, verify, verify_coupled_into, verify_greedy_ids_into, LastToken,
    Verification, VerifyMode, MAX_DRAFT_TOKENS,
};
pub use vocab::{check_draft_width, FittedBatchDraft, FittedDraft};
