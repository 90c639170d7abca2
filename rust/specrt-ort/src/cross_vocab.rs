//! The vocabulary map of a draft whose tokenizer differs from its target's ([`specrt_core::cross_vocab`]), built
//! from the two `tokenizer.json` files, and what it reports.

use std::collections::HashMap;

use serde_json::{json, Value};
use specrt_core::{
    Backend, BatchBackend, CrossVocabBatchDraft, CrossVocabDraft, Result, VocabMap, VocabOverlap,
};
use specrt_grammar::{token_bytes, SPECIAL_TOKEN_MARKER};
use specrt_text::tokenizer::Tokenizer;

/// The method name [`DraftVocabulary::report`] gives a cross-vocabulary pair.
pub const TOKEN_LEVEL_INTERSECTION: &str = "token-level intersection";
/// The method name [`DraftVocabulary::report`] gives a pair of one tokenizer.
pub const SAME_TOKENIZER: &str = "same tokenizer";

/// A short English and code sample, tokenized by the target to estimate how much of a typical text the draft can
/// propose at all ([`CrossVocabReport::sample_shared_fraction`]).
const SAMPLE: &str = "The quick brown fox jumps over the lazy dog. Speculative decoding lets a small model propose \
    several tokens that the large model then checks in one pass.\n\ndef fibonacci(n: int) -> int:\n    \"\"\"Return \
    the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    \
    return a\n\nprint({\"answer\": fibonacci(10), \"items\": [1, 2, 3]})\n";

/// How a draft's vocabulary relates to its target's, decided from their tokenizers before any session loads.
#[derive(Clone, Debug)]
pub enum DraftVocabulary {
    /// One tokenizer (or none to compare): logits widths may differ in padding rows beyond `tokenizer_vocab`
    /// ([`specrt_core::check_draft_width`]).
    Same {
        /// The tokenizer's size (largest id + 1), if known.
        tokenizer_vocab: Option<usize>,
    },
    /// Two tokenizers: the draft proposes through token-level intersection.
    Other {
        /// The target's tokenizer.
        target: Box<Tokenizer>,
        /// The draft's tokenizer.
        draft: Box<Tokenizer>,
    },
}

/// What a cross-vocabulary pair shares, reported at load.
#[derive(Clone, Debug, PartialEq)]
pub struct CrossVocabReport {
    /// The map's counts.
    pub overlap: VocabOverlap,
    /// Of the target's tokens for a short English and code sample, the fraction whose string the draft has: the
    /// draft can propose only those, so this bounds the share of tokens that can be accepted on such text (the
    /// others always come from the target's own rows).
    pub sample_shared_fraction: f64,
}

impl CrossVocabReport {
    /// As JSON (what the Python binding's `draft_vocabulary` returns): `method`, `target_vocab_size`,
    /// `draft_vocab_size`, `shared_tokens`, `multi_token_spellings`, `sample_shared_fraction`.
    #[must_use]
    pub fn to_json(&self) -> Value {
        json!({
            "method": TOKEN_LEVEL_INTERSECTION,
            "target_vocab_size": self.overlap.target_width,
            "draft_vocab_size": self.overlap.draft_width,
            "shared_tokens": self.overlap.shared,
            "multi_token_spellings": self.overlap.multi_token_spellings,
            "sample_shared_fraction": self.sample_shared_fraction,
        })
    }
}

/// The map between a draft of `draft_width` logits rows and a target of `target_width` (each at least its
/// tokenizer's size), and its report.
///
/// Strings are compared as bytes ([`specrt_grammar::token_bytes`]: a byte-level `Ġthe` and a SentencePiece `▁the`
/// are both ` the`; special tokens match only special tokens of the same content). A target token whose string
/// the draft lacks is spelled by the draft tokenizer's encoding of its text (without added special tokens), or
/// byte by byte through the draft's single-byte tokens when the bytes are not UTF-8 (a piece of a character); ids
/// beyond the target's tokenizer, and tokens of no string, are fed as the draft's first single-byte token (else its
/// id 0).
///
/// Errors: [`specrt_core::SpecError::Vocab`] when no string is shared or a tokenizer has more ids than its model
/// has rows; [`specrt_core::SpecError::ModelFormat`] for a tokenizer llguidance cannot read.
pub fn vocab_map(
    target: &Tokenizer,
    target_width: usize,
    draft: &Tokenizer,
    draft_width: usize,
) -> Result<(VocabMap, CrossVocabReport)> {
    let tb = token_bytes(target)?;
    let db = token_bytes(draft)?;
    for (bytes, width, who) in [(&tb, target_width, "target"), (&db, draft_width, "draft")] {
        if bytes.len() > width {
            return Err(specrt_core::SpecError::Vocab(format!(
                "the {who}'s tokenizer has {} ids, more than its model's {width} logits rows",
                bytes.len()
            )));
        }
    }
    // First id of each string in the target (a later duplicate is left unshared).
    let mut target_ids: HashMap<&[u8], u32> = HashMap::with_capacity(tb.len());
    for (t, b) in tb.iter().enumerate() {
        if !b.is_empty() {
            target_ids.entry(b.as_slice()).or_insert(t as u32);
        }
    }
    let mut taken = vec![false; target_width];
    let mut target_of_draft = vec![None; draft_width];
    let mut byte_token = [None::<u32>; 256];
    for (d, b) in db.iter().enumerate() {
        if let [one] = b.as_slice() {
            byte_token[usize::from(*one)].get_or_insert(d as u32);
        }
        if let Some(&t) = target_ids.get(b.as_slice()) {
            if !std::mem::replace(&mut taken[t as usize], true) {
                target_of_draft[d] = Some(t);
            }
        }
    }
    let fallback = byte_token.iter().flatten().next().copied().unwrap_or(0);
    // Unshared target strings that are text are spelled by the draft's tokenizer, all in one batch (on every core:
    // Gemma 3's 216k unshared strings took 4.2 s one by one); other bytes by the draft's single-byte tokens. A
    // shared one is spelled by its shared draft id (the map's own), so its spelling here stays empty.
    let mut spellings = vec![Vec::new(); tb.len()];
    let mut texts: Vec<(usize, &str)> = Vec::new();
    for (t, b) in tb.iter().enumerate() {
        if taken[t] {
            continue;
        }
        let text = b.strip_prefix(&[SPECIAL_TOKEN_MARKER]).unwrap_or(b);
        match std::str::from_utf8(text) {
            Ok(s) if !s.is_empty() => texts.push((t, s)),
            _ => {
                spellings[t] = text
                    .iter()
                    .filter_map(|&x| byte_token[usize::from(x)])
                    .collect();
            }
        }
    }
    let strs: Vec<&str> = texts.iter().map(|&(_, s)| s).collect();
    for ((t, _), ids) in texts.iter().zip(draft.encode_batch(&strs, false)?) {
        spellings[*t] = ids;
    }
    let map = VocabMap::new(
        target_width,
        draft_width,
        &target_of_draft,
        &spellings,
        fallback,
    )?;
    let sample = target.encode(SAMPLE, false)?;
    let shared = sample.iter().filter(|&&t| taken[t as usize]).count();
    let report = CrossVocabReport {
        overlap: map.overlap(),
        sample_shared_fraction: shared as f64 / sample.len().max(1) as f64,
    };
    Ok((map, report))
}

impl DraftVocabulary {
    /// What [`crate::Driver::draft_vocabulary`] reports for a pair of one tokenizer.
    #[must_use]
    pub fn same_report(tokenizer_vocab: Option<usize>) -> Value {
        json!({"method": SAME_TOKENIZER, "tokenizer_vocab_size": tokenizer_vocab})
    }
}

/// How the loaders fit a draft to its target: as it is (one tokenizer: the engines' width rule with the tokenizer's
/// size) or through a [`VocabMap`] (another tokenizer: wrapped in [`CrossVocabDraft`] / [`CrossVocabBatchDraft`]).
pub(crate) enum DraftFit {
    /// One tokenizer, of this size if known.
    Same(Option<usize>),
    /// Another tokenizer.
    Mapped(VocabMap),
}

impl DraftFit {
    /// The fit of a draft of `draft_width` logits rows to a target of `target_width`, and the report of
    /// [`crate::Driver::draft_vocabulary`].
    ///
    /// Errors: as [`vocab_map`].
    pub(crate) fn new(
        vocabulary: DraftVocabulary,
        target_width: usize,
        draft_width: usize,
    ) -> Result<(Self, Value)> {
        Ok(match vocabulary {
            DraftVocabulary::Same { tokenizer_vocab } => (
                Self::Same(tokenizer_vocab),
                DraftVocabulary::same_report(tokenizer_vocab),
            ),
            DraftVocabulary::Other { target, draft } => {
                let (map, report) = vocab_map(&target, target_width, &draft, draft_width)?;
                (Self::Mapped(map), report.to_json())
            }
        })
    }

    /// A single-stream draft as the engine takes it, with the tokenizer size for its width rule.
    ///
    /// Errors: as [`CrossVocabDraft::new`].
    pub(crate) fn single(
        self,
        draft: Box<dyn Backend>,
    ) -> Result<(Box<dyn Backend>, Option<usize>)> {
        match self {
            Self::Same(n) => Ok((draft, n)),
            Self::Mapped(map) => Ok((Box::new(CrossVocabDraft::new(draft, map)?), None)),
        }
    }

    /// A batched draft as the engine takes it, with the tokenizer size for its width rule.
    ///
    /// Errors: as [`CrossVocabBatchDraft::new`].
    pub(crate) fn batched(
        self,
        draft: Box<dyn BatchBackend>,
    ) -> Result<(Box<dyn BatchBackend>, Option<usize>)> {
        match self {
            Self::Same(n) => Ok((draft, n)),
            Self::Mapped(map) => Ok((Box::new(CrossVocabBatchDraft::new(draft, map)?), None)),
        }
    }
}
