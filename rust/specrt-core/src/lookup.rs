//! The model-free proposers behind one type: prompt lookup ([`crate::ngram`]) and suffix decoding
//! ([`crate::suffix`]). Both propose point masses from committed text, verified with
//! [`crate::VerifyMode::Deterministic`], and the engines and auto K treat them alike (a round of either is an
//! n-gram round, [`crate::RoundKind::Ngram`]).

use std::sync::Arc;

use crate::error::Result;
use crate::ngram::NgramProposer;
use crate::request::{LookupMethod, NgramConfig};
use crate::suffix::{SuffixCache, SuffixProposer};

/// A request's model-free proposer, as its [`NgramConfig`] asks.
#[derive(Debug)]
pub enum LookupProposer {
    /// Prompt lookup: the most recent continuation of the longest matching n-gram of the request's text.
    PromptLookup(NgramProposer),
    /// Suffix decoding: the most frequent continuation over the request's text and a shared cache.
    Suffix(SuffixProposer),
}

impl LookupProposer {
    /// The proposer `cfg` asks for; suffix decoding reads and feeds `shared` (earlier requests) when given.
    ///
    /// Errors: [`crate::SpecError::Setting`] naming `prompt_lookup_min` / `prompt_lookup_max` when out of range.
    pub fn new(cfg: &NgramConfig, shared: Option<&Arc<SuffixCache>>) -> Result<Self> {
        Ok(match cfg.method {
            LookupMethod::PromptLookup => Self::PromptLookup(NgramProposer::new(
                cfg.prompt_lookup_min,
                cfg.prompt_lookup_max,
            )?),
            LookupMethod::Suffix => {
                Self::Suffix(SuffixProposer::new(cfg.prompt_lookup_min, shared.cloned())?)
            }
        })
    }

    /// Whether this proposer is the one `cfg` and `shared` ask for (so an engine may reuse it).
    #[must_use]
    pub fn fits(&self, cfg: &NgramConfig, shared: Option<&Arc<SuffixCache>>) -> bool {
        match (self, cfg.method) {
            (Self::PromptLookup(p), LookupMethod::PromptLookup) => {
                p.min_n() == cfg.prompt_lookup_min && p.max_n() == cfg.prompt_lookup_max
            }
            (Self::Suffix(p), LookupMethod::Suffix) => {
                p.min_match() == cfg.prompt_lookup_min
                    && match (p.shared(), shared) {
                        (None, None) => true,
                        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                        _ => false,
                    }
            }
            _ => false,
        }
    }

    /// Forget the request's text (suffix decoding first publishes it to its shared cache).
    pub fn reset(&mut self) {
        match self {
            Self::PromptLookup(p) => p.reset(),
            Self::Suffix(p) => p.reset(),
        }
    }

    /// Append committed tokens.
    pub fn extend(&mut self, tokens: &[u32]) {
        match self {
            Self::PromptLookup(p) => p.extend(tokens),
            Self::Suffix(p) => p.extend(tokens),
        }
    }

    /// Keep only the first `len` committed tokens.
    pub fn truncate(&mut self, len: usize) {
        match self {
            Self::PromptLookup(p) => p.truncate(len),
            Self::Suffix(p) => p.truncate(len),
        }
    }

    /// The committed tokens indexed.
    #[must_use]
    pub fn tokens(&self) -> &[u32] {
        match self {
            Self::PromptLookup(p) => p.tokens(),
            Self::Suffix(p) => p.tokens(),
        }
    }

    /// Propose up to `k` tokens into `out` (cleared); returns how many (0: nothing matched).
    pub fn propose(&self, k: usize, out: &mut Vec<u32>) -> usize {
        match self {
            Self::PromptLookup(p) => p.propose(k, out),
            Self::Suffix(p) => p.propose(k, out),
        }
    }
}
