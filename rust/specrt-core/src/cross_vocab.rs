//! A draft whose tokenizer differs from the target's: token-level intersection (TLI).
//!
//! Timor et al., "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for Heterogeneous
//! Vocabularies" (ICML 2025, arXiv:2502.05202), Algorithm 4. The tokens whose strings (bytes) both vocabularies hold
//! are the intersection. The draft's distribution is restricted to it and renormalised, and each of its tokens is
//! named by the target's id of the same string: `q(t) = q_draft(d) / sum over shared d' of q_draft(d')` for the
//! target id `t` of a shared draft id `d`, and `q(t) = 0` for every target id outside the intersection. That `q` is a
//! distribution over the target's vocabulary from which the proposal is drawn, which is all modified rejection
//! sampling needs of it (Leviathan et al. 2023, arXiv:2211.17192, Theorem 1): the output keeps the target's
//! distribution exactly at any temperature; target-only tokens come from the residual `norm(max(0, p - q))` or the
//! bonus row. Greedy drafts are proposals only.
//!
//! The draft keeps its context in its own tokenization. Every target token committed or proposed is fed to it as
//! its spelling in draft ids ([`VocabMap::spelling`]): the one shared draft id when the string is shared (so a
//! proposal is fed back as the very token the draft drew), else the draft tokenizer's encoding of the token's
//! string (byte tokens for a partial UTF-8 sequence). A rollback of `n` target positions rolls the draft back to
//! where the first kept target token's spelling ends. How the draft tokenizes the context changes only its
//! proposals (the acceptance), never the output.
//!
//! [`VocabMap`] is the mapping (built from the two tokenizers by the runtime crate); [`CrossVocabDraft`] and
//! [`CrossVocabBatchDraft`] wrap a draft [`Backend`] / [`BatchBackend`] so that the engines see a draft of the
//! target's width fed target ids.

use std::collections::HashMap;

use crate::backend::{Backend, BatchBackend, BatchRow};
use crate::error::{Result, SpecError};

/// The mapping between a draft's vocabulary and its target's (module docs).
#[derive(Clone, Debug)]
pub struct VocabMap {
    target_width: usize,
    draft_width: usize,
    /// `(draft id, target id)` of every shared string, ascending by draft id.
    shared: Vec<(u32, u32)>,
    /// Draft ids spelling target id `t`: `spelled[offsets[t]..offsets[t + 1]]` (`[target_width + 1]` offsets).
    offsets: Vec<u32>,
    spelled: Vec<u32>,
}

/// What a [`VocabMap`] shares, for reports (`Decoder.draft_vocabulary`, the server's log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VocabOverlap {
    /// Ids (logits rows) of the target.
    pub target_width: usize,
    /// Ids (logits rows) of the draft.
    pub draft_width: usize,
    /// Strings both vocabularies hold (the intersection's size).
    pub shared: usize,
    /// Target ids spelled by more than one draft token (fed to the draft as several positions).
    pub multi_token_spellings: usize,
}

impl VocabMap {
    /// A map between a target of `target_width` logits rows and a draft of `draft_width`.
    ///
    /// - `target_of_draft`: `[draft_width]`, the target id whose string equals draft id `d`'s, or `None`. No two
    ///   draft ids may name one target id.
    /// - `spellings`: for each target id (at most `target_width`; missing ones count as empty), the draft ids
    ///   that spell its string (the draft tokenizer's encoding). A shared target id's spelling is replaced by its
    ///   one draft id, so that a proposal is fed back to the draft as the token it drew.
    /// - `fallback`: the draft id fed for a target id whose spelling is empty (ids beyond the target's tokenizer,
    ///   tokens of no string).
    ///
    /// Errors: [`SpecError::Vocab`] for a width of 0, no shared string, an id out of range (named with its
    /// position) or two draft ids naming one target id.
    pub fn new(
        target_width: usize,
        draft_width: usize,
        target_of_draft: &[Option<u32>],
        spellings: &[Vec<u32>],
        fallback: u32,
    ) -> Result<Self> {
        if target_width == 0 || draft_width == 0 {
            return Err(SpecError::Vocab(format!(
                "vocabulary map: target width {target_width} and draft width {draft_width} (expected both >= 1)"
            )));
        }
        if target_of_draft.len() != draft_width {
            return Err(SpecError::Vocab(format!(
                "vocabulary map: {} draft entries for a draft of width {draft_width}",
                target_of_draft.len()
            )));
        }
        if spellings.len() > target_width {
            return Err(SpecError::Vocab(format!(
                "vocabulary map: {} spellings for a target of width {target_width}",
                spellings.len()
            )));
        }
        let in_draft = |d: u32, what: &str| -> Result<()> {
            if (d as usize) < draft_width {
                Ok(())
            } else {
                Err(SpecError::Vocab(format!(
                    "vocabulary map: {what} draft id {d} is out of range (expected < draft width {draft_width})"
                )))
            }
        };
        in_draft(fallback, "the fallback")?;
        let mut draft_of_target: Vec<Option<u32>> = vec![None; target_width];
        let mut shared = Vec::new();
        for (d, t) in target_of_draft.iter().enumerate() {
            let Some(t) = *t else { continue };
            let d =
                u32::try_from(d).map_err(|_| SpecError::Vocab("draft width too large".into()))?;
            let slot = draft_of_target.get_mut(t as usize).ok_or_else(|| {
                SpecError::Vocab(format!(
                    "vocabulary map: draft id {d} names target id {t} (expected < target width {target_width})"
                ))
            })?;
            if let Some(other) = *slot {
                return Err(SpecError::Vocab(format!(
                    "vocabulary map: draft ids {other} and {d} both name target id {t}"
                )));
            }
            *slot = Some(d);
            shared.push((d, t));
        }
        if shared.is_empty() {
            return Err(SpecError::Vocab(
                "the draft's and the target's vocabularies share no token string: the draft cannot propose any \
                 target token"
                    .into(),
            ));
        }
        let mut offsets = Vec::with_capacity(target_width + 1);
        let mut spelled = Vec::with_capacity(target_width);
        offsets.push(0u32);
        for (t, own) in draft_of_target.iter().enumerate() {
            match (own, spellings.get(t).map(Vec::as_slice)) {
                (Some(d), _) => spelled.push(*d),
                (None, Some(s)) if !s.is_empty() => {
                    for &d in s {
                        in_draft(d, &format!("target id {t}'s spelling holds"))?;
                    }
                    spelled.extend_from_slice(s);
                }
                _ => spelled.push(fallback),
            }
            let end = u32::try_from(spelled.len())
                .map_err(|_| SpecError::Vocab("vocabulary map: spellings too long".into()))?;
            offsets.push(end);
        }
        Ok(Self {
            target_width,
            draft_width,
            shared,
            offsets,
            spelled,
        })
    }

    /// Ids (logits rows) of the target: the width of the rows [`CrossVocabDraft`] gives.
    #[must_use]
    pub fn target_width(&self) -> usize {
        self.target_width
    }

    /// Ids (logits rows) of the draft.
    #[must_use]
    pub fn draft_width(&self) -> usize {
        self.draft_width
    }

    /// What the two vocabularies share.
    #[must_use]
    pub fn overlap(&self) -> VocabOverlap {
        VocabOverlap {
            target_width: self.target_width,
            draft_width: self.draft_width,
            shared: self.shared.len(),
            multi_token_spellings: self.offsets.windows(2).filter(|w| w[1] - w[0] > 1).count(),
        }
    }

    /// The draft ids target id `t` is fed to the draft as (at least one).
    ///
    /// Errors: [`SpecError::Vocab`] for `t >= target_width`.
    pub fn spelling(&self, t: u32) -> Result<&[u32]> {
        let t = t as usize;
        if t >= self.target_width {
            return Err(SpecError::Vocab(format!(
                "token id {t} is out of range (expected < target vocab size {})",
                self.target_width
            )));
        }
        Ok(&self.spelled[self.offsets[t] as usize..self.offsets[t + 1] as usize])
    }

    /// The target id of draft id `d`'s string, if the target has it.
    #[must_use]
    pub fn target_of(&self, d: u32) -> Option<u32> {
        self.shared
            .binary_search_by_key(&d, |&(dd, _)| dd)
            .ok()
            .map(|i| self.shared[i].1)
    }

    /// The row a draft that cannot read its context gives (`[target_width] float32`): `0.0` on every shared
    /// string's target id, `-inf` elsewhere (uniform over the intersection).
    pub fn uninformed_row(&self, out: &mut [f32]) {
        out.fill(f32::NEG_INFINITY);
        for &(_, t) in &self.shared {
            out[t as usize] = 0.0;
        }
    }

    /// One row of draft logits (`[draft_width] float32`) as target logits (`out`: `[target_width] float32`): each
    /// shared draft id's logit at its target id, `-inf` elsewhere, so that the softmax is the draft's distribution
    /// restricted to the intersection and renormalised (module docs).
    pub fn map_row(&self, draft_row: &[f32], out: &mut [f32]) {
        out.fill(f32::NEG_INFINITY);
        for &(d, t) in &self.shared {
            out[t as usize] = draft_row[d as usize];
        }
    }
}

/// The draft tokens of one sequence and where each target token's spelling ends in them.
#[derive(Clone, Debug, Default)]
struct Track {
    /// The draft ids of the target tokens fed.
    draft: Vec<u32>,
    /// `ends[i]`: `draft.len()` after target token `i` (one entry per target token fed).
    ends: Vec<usize>,
    /// Leading draft ids whose KV the draft model's cache holds (`<= draft.len()`; less after a pass the model's
    /// cache could not hold: the next pass feeds the rest again).
    cached: usize,
}

impl Track {
    /// Draft positions that hold the first `n` target tokens.
    fn draft_len(&self, n: usize) -> Result<usize> {
        match n {
            0 => Ok(0),
            n if n <= self.ends.len() => Ok(self.ends[n - 1]),
            n => Err(SpecError::Internal(format!(
                "cross-vocabulary draft: {n} positions named valid, {} fed",
                self.ends.len()
            ))),
        }
    }

    /// Keep the first `n` target tokens; returns the draft positions kept.
    fn rewind(&mut self, n: usize) -> Result<usize> {
        let d = self.draft_len(n)?;
        self.ends.truncate(n);
        self.draft.truncate(d);
        self.cached = self.cached.min(d);
        Ok(d)
    }

    /// The first `n` target tokens' track.
    fn prefix(&self, n: usize) -> Result<Self> {
        let d = self.draft_len(n)?;
        Ok(Self {
            draft: self.draft[..d].to_vec(),
            ends: self.ends[..n].to_vec(),
            cached: self.cached.min(d),
        })
    }

    /// Append target tokens as their spellings.
    fn push(&mut self, map: &VocabMap, tokens: &[u32]) -> Result<()> {
        for &t in tokens {
            self.draft.extend_from_slice(map.spelling(t)?);
            self.ends.push(self.draft.len());
        }
        Ok(())
    }
}

/// A draft [`Backend`] of another tokenizer, seen by the engine as a draft of the target's width fed target ids
/// (module docs). Its [`Backend::max_seq_len`] is the inner model's, in the inner model's positions; a context
/// whose spelling in draft tokens outgrows it gets rows without context ([`VocabMap::uninformed_row`]: proposals
/// rarely accepted, the output unchanged) until a rollback brings it back within.
pub struct CrossVocabDraft {
    inner: Box<dyn Backend>,
    map: VocabMap,
    track: Track,
    /// `[n_logits, target_width]`: the mapped rows of the last call.
    out: Vec<f32>,
}

impl CrossVocabDraft {
    /// Wrap `inner` (a model of `map.draft_width()` logits).
    ///
    /// Errors: [`SpecError::Vocab`] when the inner model's width is not the map's draft width.
    pub fn new(inner: Box<dyn Backend>, map: VocabMap) -> Result<Self> {
        check_inner_width(inner.vocab_size(), &map)?;
        Ok(Self {
            inner,
            map,
            track: Track::default(),
            out: Vec::new(),
        })
    }
}

fn check_inner_width(width: usize, map: &VocabMap) -> Result<()> {
    if width == map.draft_width {
        Ok(())
    } else {
        Err(SpecError::Vocab(format!(
            "the draft model has {width} logits rows, its vocabulary map {}",
            map.draft_width
        )))
    }
}

impl Backend for CrossVocabDraft {
    fn vocab_size(&self) -> usize {
        self.map.target_width
    }

    fn max_seq_len(&self) -> usize {
        self.inner.max_seq_len()
    }

    fn forward(&mut self, tokens: &[u32], n_past: usize, n_logits: usize) -> Result<&[f32]> {
        if n_logits == 0 || n_logits > tokens.len() {
            return Err(SpecError::Config(format!(
                "forward: n_logits {n_logits} for {} tokens (expected 1..={})",
                tokens.len(),
                tokens.len()
            )));
        }
        self.track.rewind(n_past)?;
        if let Err(e) = self.track.push(&self.map, tokens) {
            self.track.rewind(n_past)?;
            return Err(e);
        }
        let total = n_past + tokens.len();
        let (dw, tw) = (self.map.draft_width, self.map.target_width);
        self.out.resize(n_logits * tw, 0.0);
        let start = self.track.cached;
        if self.track.draft.len() > self.inner.max_seq_len() {
            // The spelled context outgrew the draft model's cache: proposals without context from here on
            // (`uninformed_row`; lossless as any q the proposal is drawn from), never a failed request.
            for out in self.out.chunks_exact_mut(tw) {
                self.map.uninformed_row(out);
            }
            return Ok(&self.out);
        }
        let first = self.track.ends[total - n_logits] - 1;
        let n_inner = self.track.draft.len() - first;
        let logits = match self
            .inner
            .forward(&self.track.draft[start..], start, n_inner)
        {
            Ok(l) => l,
            Err(e) => {
                self.track.rewind(n_past)?;
                return Err(e);
            }
        };
        self.track.cached = self.track.draft.len();
        for (r, out) in self.out.chunks_exact_mut(tw).enumerate() {
            let p = self.track.ends[total - n_logits + r] - 1 - first;
            self.map.map_row(&logits[p * dw..(p + 1) * dw], out);
        }
        Ok(&self.out)
    }
}

/// A draft [`BatchBackend`] of another tokenizer, as [`CrossVocabDraft`]: one track per cache slot, and the
/// tracks of stored prefixes beside the inner model's.
pub struct CrossVocabBatchDraft {
    inner: Box<dyn BatchBackend>,
    map: VocabMap,
    slots: Vec<Track>,
    prefixes: HashMap<u64, Track>,
    /// `[rows, n_logits, target_width]`: the mapped rows of the last call.
    out: Vec<f32>,
}

impl CrossVocabBatchDraft {
    /// Wrap `inner` (a model of `map.draft_width()` logits).
    ///
    /// Errors: [`SpecError::Vocab`] when the inner model's width is not the map's draft width.
    pub fn new(inner: Box<dyn BatchBackend>, map: VocabMap) -> Result<Self> {
        check_inner_width(inner.vocab_size(), &map)?;
        let slots = vec![Track::default(); inner.max_batch()];
        Ok(Self {
            inner,
            map,
            slots,
            prefixes: HashMap::new(),
            out: Vec::new(),
        })
    }

    fn slot(&mut self, slot: usize) -> Result<&mut Track> {
        let n = self.slots.len();
        self.slots.get_mut(slot).ok_or_else(|| {
            SpecError::Config(format!(
                "slot {slot} is out of range (expected < max_batch {n})"
            ))
        })
    }
}

impl BatchBackend for CrossVocabBatchDraft {
    fn vocab_size(&self) -> usize {
        self.map.target_width
    }

    fn max_seq_len(&self) -> usize {
        self.inner.max_seq_len()
    }

    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }

    fn forward_rows(
        &mut self,
        first_slot: usize,
        rows: &[BatchRow<'_>],
        n_logits: usize,
    ) -> Result<&[f32]> {
        let s = rows.iter().map(|r| r.tokens.len()).max().unwrap_or(0);
        if n_logits == 0 || n_logits > s {
            return Err(SpecError::Config(format!(
                "forward_rows: n_logits {n_logits} for rows of up to {s} tokens (expected 1..={s})"
            )));
        }
        if first_slot + rows.len() > self.slots.len() {
            return Err(SpecError::Config(format!(
                "forward_rows: slots {first_slot}..{} (expected up to max_batch {})",
                first_slot + rows.len(),
                self.slots.len()
            )));
        }
        // Each row's tokens fed; the inner model is fed `track.draft[start..]` (what its cache lacks), unless the
        // spelled context outgrew its cache (`over`: rows without context, `VocabMap::uninformed_row`).
        let max_inner = self.inner.max_seq_len();
        let mut start = vec![0; rows.len()];
        let mut live = vec![false; rows.len()];
        let mut over = vec![false; rows.len()];
        for (r, row) in rows.iter().enumerate() {
            if row.tokens.is_empty() {
                continue;
            }
            let map = &self.map;
            let track = &mut self.slots[first_slot + r];
            track.rewind(row.n_past)?;
            if let Err(e) = track.push(map, row.tokens) {
                track.rewind(row.n_past)?;
                return Err(e);
            }
            start[r] = track.cached;
            over[r] = track.draft.len() > max_inner;
            live[r] = !over[r];
        }
        let s_d = (0..rows.len())
            .filter(|&r| live[r])
            .map(|r| self.slots[first_slot + r].draft.len() - start[r])
            .max()
            .unwrap_or(0);
        // The draft position (in the padded inner frame) of row r's padded target position j, if meaningful.
        let inner_pos = |slots: &[Track], r: usize, j: usize| -> Option<usize> {
            let row = &rows[r];
            (j < row.tokens.len())
                .then(|| slots[first_slot + r].ends[row.n_past + j] - 1 - start[r])
        };
        let n_inner = (0..rows.len())
            .filter(|&r| live[r])
            .filter_map(|r| inner_pos(&self.slots, r, s - n_logits))
            .map(|p| s_d - p)
            .max()
            .unwrap_or(1);
        let logits = if live.iter().any(|&l| l) {
            let inputs: Vec<BatchRow<'_>> = (0..rows.len())
                .map(|r| {
                    if live[r] {
                        BatchRow {
                            tokens: &self.slots[first_slot + r].draft[start[r]..],
                            n_past: start[r],
                        }
                    } else {
                        BatchRow::EMPTY
                    }
                })
                .collect();
            match self.inner.forward_rows(first_slot, &inputs, n_inner) {
                Ok(l) => l,
                Err(e) => {
                    for (r, row) in rows.iter().enumerate() {
                        if !row.tokens.is_empty() {
                            self.slots[first_slot + r].rewind(row.n_past)?;
                        }
                    }
                    return Err(e);
                }
            }
        } else {
            &[]
        };
        let (dw, tw) = (self.map.draft_width, self.map.target_width);
        self.out.clear();
        self.out.resize(rows.len() * n_logits * tw, 0.0);
        for r in 0..rows.len() {
            if live[r] {
                let track = &mut self.slots[first_slot + r];
                track.cached = track.draft.len();
            }
            for jj in 0..n_logits {
                let at = (r * n_logits + jj) * tw;
                let out = &mut self.out[at..at + tw];
                // Padding positions hold zeros (nothing meaningful, as the trait says).
                if let Some(p) = inner_pos(&self.slots, r, s - n_logits + jj) {
                    if over[r] {
                        self.map.uninformed_row(out);
                    } else {
                        let i = r * n_inner + p - (s_d - n_inner);
                        self.map.map_row(&logits[i * dw..(i + 1) * dw], out);
                    }
                }
            }
        }
        Ok(&self.out)
    }

    fn move_slot(&mut self, from: usize, to: usize, n_valid: usize) -> Result<()> {
        let kept = self.slot(from)?.prefix(n_valid)?;
        self.slot(to)?;
        self.inner.move_slot(from, to, kept.cached)?;
        self.slots[to] = kept;
        Ok(())
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.inner.kv_bytes_per_token()
    }

    fn store_prefix(&mut self, key: u64, slot: usize, n: usize) -> Result<()> {
        let kept = self.slot(slot)?.prefix(n)?;
        self.inner.store_prefix(key, slot, kept.cached)?;
        self.prefixes.insert(key, kept);
        Ok(())
    }

    fn load_prefix(&mut self, key: u64, slot: usize, n: usize) -> Result<()> {
        let kept = self
            .prefixes
            .get(&key)
            .ok_or_else(|| SpecError::Config(format!("no prefix stored under key {key}")))?
            .prefix(n)?;
        self.slot(slot)?;
        self.inner.load_prefix(key, slot, kept.cached)?;
        self.slots[slot] = kept;
        Ok(())
    }

    fn drop_prefix(&mut self, key: u64) {
        self.prefixes.remove(&key);
        self.inner.drop_prefix(key);
    }
}
