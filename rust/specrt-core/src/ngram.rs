//! Prompt-lookup (n-gram) drafting: a model-free proposer that copies what followed an earlier occurrence of the
//! text's last few tokens (vLLM's `prompt_lookup_min` / `prompt_lookup_max`; Saxena 2023, "Prompt Lookup
//! Decoding"). Its proposals are point masses, verified with [`crate::VerifyMode::Deterministic`].
//!
//! # Index
//! An exact suffix trie of bounded depth over the committed tokens, stored as one hash map: the n-gram
//! `g = [a_1 .. a_n]` has the node id `id(g) = map[(a_1, id([a_2 .. a_n]))]`, with `id([]) = ROOT`. Keys are exact
//! `(token, child id)` pairs, so there are no hash collisions to get wrong (a hash of the n tokens could only be
//! checked, and a collision that overwrote an entry would silently lose a match). Because each node is keyed by
//! its *first* token and the id of the rest, all n-grams ending at one position are found by walking backwards
//! from that position, `n = 1, 2, ..`: `max_n` map operations per position, no per-position state.
//!
//! `last_end[id]` is the end (exclusive) of the most recent occurrence of the n-gram that has a continuation,
//! i.e. that ends strictly before the current end. Appending the token at position `t` gives the n-grams ending
//! at `t` (`tokens[t - n..t]`, `n <= max_n`) their continuation, so those are the ones recorded then; the
//! n-grams ending at the current end are not recorded yet, which is exactly why the current suffix never matches
//! itself. An undo log of `(id, previous last_end)` makes [`NgramProposer::truncate`] exact.
//!
//! # Worked example
//! Tokens `[1, 2, 3, 4, 1, 2]`, `min_n = 1`, `max_n = 3`, `k = 3`. Suffix 1-gram `[2]`: last recorded end 2;
//! 2-gram `[1, 2]`: end 2; 3-gram `[4, 1, 2]`: never recorded, stop. Longest match `n = 2` at end 2: propose
//! `tokens[2..5] = [3, 4, 1]`.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use crate::error::{Result, SpecError};

/// Largest supported `max_n` (vLLM's `prompt_lookup_max` is typically 3 to 5).
pub const MAX_NGRAM_LEN: usize = 32;

/// Trie node id of the empty n-gram.
const ROOT: u32 = 0;
/// `last_end` sentinel: no occurrence with a continuation.
const NO_END: u32 = u32::MAX;

/// Prompt-lookup drafting (vLLM's `prompt_lookup_min` / `prompt_lookup_max`): propose the continuation of the
/// longest suffix n-gram (`min_n <= n <= max_n`) that occurred earlier in the prompt + generated text.
///
/// Feed it the committed sequence with [`extend`](Self::extend) (the prompt, then the emitted tokens of each
/// round), cut it with [`truncate`](Self::truncate) when output is cut at a stop string, and call
/// [`propose`](Self::propose) once per round. Cost: `O(max_n)` hash-map operations per appended token and per
/// proposal, whatever the context length. Memory: up to `max_n` trie nodes and `max_n - min_n + 1` undo entries
/// per token (about 0.5 MB per 1k tokens at `max_n = 32`, 60 kB at `max_n = 4`).
#[derive(Clone)]
pub struct NgramProposer {
    min_n: usize,
    max_n: usize,
    /// `[len]` committed token ids: the prompt, then the emitted tokens.
    tokens: Vec<u32>,
    /// Trie edges: `key(first token, id of the rest)` -> node id (ids start at 1; `ROOT` is the empty n-gram).
    nodes: HashMap<u64, u32, BuildHasherDefault<FoldHasher>>,
    /// `[number of node ids]` end (exclusive) of the most recent occurrence with a continuation, `NO_END` if none.
    /// Only written for n-grams with `n >= min_n`; shorter ones are trie structure only.
    last_end: Vec<u32>,
    /// `(node id, previous last_end)` in the order written; `truncate` pops it.
    undo: Vec<(u32, u32)>,
}

impl fmt::Debug for NgramProposer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NgramProposer")
            .field("min_n", &self.min_n)
            .field("max_n", &self.max_n)
            .field("len", &self.tokens.len())
            .field("n_nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

fn key(first: u32, rest: u32) -> u64 {
    (u64::from(first) << 32) | u64::from(rest)
}

impl NgramProposer {
    /// A proposer matching n-grams of `min_n ..= max_n` tokens.
    ///
    /// Errors: [`SpecError::Setting`] unless `1 <= min_n <= max_n <= 32` (naming `prompt_lookup_max` when only it
    /// is out of range, else `prompt_lookup_min`).
    pub fn new(min_n: usize, max_n: usize) -> Result<Self> {
        if !(1 <= min_n && min_n <= max_n && max_n <= MAX_NGRAM_LEN) {
            let field = if 1 <= min_n && min_n <= max_n {
                "prompt_lookup_max"
            } else {
                "prompt_lookup_min"
            };
            return Err(SpecError::setting(
                field,
                format!(
                    "n-gram lengths prompt_lookup_min = {min_n}, prompt_lookup_max = {max_n} are invalid \
                     (expected 1 <= prompt_lookup_min <= prompt_lookup_max <= {MAX_NGRAM_LEN})"
                ),
            ));
        }
        Ok(Self {
            min_n,
            max_n,
            tokens: Vec::new(),
            nodes: HashMap::default(),
            last_end: vec![NO_END],
            undo: Vec::new(),
        })
    }

    /// Shortest n-gram that may match (`prompt_lookup_min`).
    #[must_use]
    pub fn min_n(&self) -> usize {
        self.min_n
    }

    /// Longest n-gram tried (`prompt_lookup_max`).
    #[must_use]
    pub fn max_n(&self) -> usize {
        self.max_n
    }

    /// Forget everything (new request). Keeps allocations.
    pub fn reset(&mut self) {
        self.tokens.clear();
        self.nodes.clear();
        self.last_end.clear();
        self.last_end.push(NO_END);
        self.undo.clear();
    }

    /// Number of tokens indexed.
    #[must_use]
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether no token is indexed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The indexed tokens (the committed sequence as given).
    #[must_use]
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Append committed tokens (the prompt, then emitted tokens as they are committed). `O(max_n)` map operations
    /// per token: the n-grams that end just before each new token get it as their continuation.
    ///
    /// Panics if the sequence would exceed `u32::MAX - 1` tokens.
    pub fn extend(&mut self, tokens: &[u32]) {
        self.tokens.reserve(tokens.len());
        for &tok in tokens {
            self.record_ngrams_ending_at_end();
            self.tokens.push(tok);
        }
    }

    /// Record the n-grams `tokens[t - n..t]` (`t` = current length) as occurrences ending at `t`: the caller is about
    /// to append `tokens[t]`, their continuation.
    fn record_ngrams_ending_at_end(&mut self) {
        let t = self.tokens.len();
        let end = u32::try_from(t)
            .ok()
            .filter(|&e| e != NO_END)
            .expect("n-gram index holds at most u32::MAX - 1 tokens");
        let mut node = ROOT;
        for n in 1..=self.max_n.min(t) {
            let next_id = self.last_end.len();
            let id = *self
                .nodes
                .entry(key(self.tokens[t - n], node))
                .or_insert_with(|| u32::try_from(next_id).expect("n-gram trie exceeds u32 ids"));
            if id as usize == next_id {
                self.last_end.push(NO_END);
            }
            if n >= self.min_n {
                self.undo.push((id, self.last_end[id as usize]));
                self.last_end[id as usize] = end;
            }
            node = id;
        }
    }

    /// Keep only the first `len` tokens (the caller cut the output at a stop string); no-op if `len >= self.len()`.
    /// `O(removed * max_n)`: restores every overwritten `last_end` from the undo log. Trie nodes stay (harmless:
    /// nodes without a recorded occurrence never match).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.tokens.len() {
            return;
        }
        // Entries were written in increasing end order, so the top entry's node still holds the end it wrote.
        // Occurrences ending at `t >= len` lose their continuation `tokens[t]`.
        while let Some(&(id, prev)) = self.undo.last() {
            if (self.last_end[id as usize] as usize) < len {
                break;
            }
            self.last_end[id as usize] = prev;
            self.undo.pop();
        }
        self.tokens.truncate(len);
    }

    /// Propose up to `k` draft tokens. Finds the longest `n` in `[min_n, max_n]` such that the last `n` tokens
    /// occurred earlier (an occurrence ending strictly before the current end), and copies the tokens that
    /// followed its most recent occurrence. Clears `out`, writes the proposal, returns its length: `k` on a match,
    /// 0 when nothing matches (or `k = 0`). `O(max_n)` map lookups; no allocation once `out` has capacity `k`.
    ///
    /// Most recent occurrence, because when text is rewritten (code edits, refactors, a quoted passage revised)
    /// the copy being reproduced is usually the latest one, which already carries the earlier edits; in
    /// repetitive text it is also the shortest period, the best guess of what repeats next.
    ///
    /// When the copied continuation reaches the current end (the match is fewer than `k` tokens back), copying
    /// continues from the proposal itself, as an LZ77 overlapping copy does: a match at distance `d` predicts a
    /// repeat with period `d`. Without it, text repeating with a period shorter than `k` (a word said over and
    /// over, an indented block of identical lines) could only ever be drafted `d` tokens at a time. The tokens
    /// read are always ones that exist (committed, or proposed just before).
    ///
    /// Example: tokens `[7, 8, 9, 7, 8]`, `min_n = 1`, `k = 4`: suffix `[7, 8]` last occurred ending at 2,
    /// continuation `[9, 7, 8]` reaches the end, then repeats from the proposal: `[9, 7, 8, 9]`.
    pub fn propose(&self, k: usize, out: &mut Vec<u32>) -> usize {
        out.clear();
        let len = self.tokens.len();
        let Some(start) = self.longest_match_end(len) else {
            return 0;
        };
        for j in 0..k {
            let src = start + j;
            let tok = if src < len {
                self.tokens[src]
            } else {
                out[src - len]
            };
            out.push(tok);
        }
        out.len()
    }

    /// End of the most recent earlier occurrence of the longest matching suffix n-gram, if any.
    fn longest_match_end(&self, len: usize) -> Option<usize> {
        let mut node = ROOT;
        let mut best = None;
        for n in 1..=self.max_n.min(len) {
            let Some(&id) = self.nodes.get(&key(self.tokens[len - n], node)) else {
                break;
            };
            if n >= self.min_n {
                let end = self.last_end[id as usize];
                // Any occurrence of a longer suffix is one of this n-gram, recorded at the same end: none left.
                if end == NO_END {
                    break;
                }
                best = Some(end as usize);
            }
            node = id;
        }
        best
    }
}

/// Hasher for the trie keys: one 64x64 -> 128-bit multiply folded to 64 bits (as in foldhash / ahash's fallback).
/// Unlike a plain FxHash multiply, the low bits (hashbrown's bucket index) depend on every input bit; keys that
/// differ only in the high half (siblings with the same child id) would otherwise share their low bits.
#[derive(Default, Clone, Copy)]
pub(crate) struct FoldHasher(u64);

impl Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        const K: u64 = 0x9E37_79B9_7F4A_7C15;
        let m = u128::from(self.0 ^ 0x2D35_8DCC_AA6C_78A5) * u128::from(K);
        #[allow(clippy::cast_possible_truncation)]
        let lo = m as u64;
        lo ^ (m >> 64) as u64
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by the trie; a generic fallback keeps the type a correct `Hasher`.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = self.0.rotate_left(23) ^ x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proposal(p: &NgramProposer, k: usize) -> Vec<u32> {
        let mut out = Vec::new();
        p.propose(k, &mut out);
        out
    }

    #[test]
    fn worked_example_from_module_docs() {
        let mut p = NgramProposer::new(1, 3).unwrap();
        p.extend(&[1, 2, 3, 4, 1, 2]);
        assert_eq!(proposal(&p, 3), vec![3, 4, 1]);
    }

    #[test]
    fn continuation_reaching_the_end_repeats_with_the_match_distance() {
        let mut p = NgramProposer::new(1, 4).unwrap();
        p.extend(&[7, 8, 9, 7, 8]);
        assert_eq!(proposal(&p, 4), vec![9, 7, 8, 9]);
        // A constant run: the match is 1 back, so the proposal is the run continued.
        p.reset();
        p.extend(&[5, 5, 5]);
        assert_eq!(proposal(&p, 6), vec![5; 6]);
    }

    #[test]
    fn longest_n_wins_over_a_more_recent_shorter_match() {
        let mut p = NgramProposer::new(1, 3).unwrap();
        // Suffix [1, 2, 3]: the 3-gram occurred at 0..3 (followed by 10); [2, 3] occurred later at 5..7 (then 20).
        p.extend(&[1, 2, 3, 10, 9, 2, 3, 20, 1, 2, 3]);
        assert_eq!(proposal(&p, 1), vec![10]);
        // With max_n = 2 only [2, 3] is tried: its most recent earlier occurrence is 5..7 (then 20); the suffix
        // itself (9..11) does not count.
        let mut q = NgramProposer::new(1, 2).unwrap();
        q.extend(p.tokens());
        assert_eq!(proposal(&q, 1), vec![20]);
    }

    #[test]
    fn most_recent_occurrence_wins() {
        let mut p = NgramProposer::new(2, 2).unwrap();
        p.extend(&[1, 2, 30, 1, 2, 40, 1, 2]);
        assert_eq!(proposal(&p, 2), vec![40, 1]);
    }

    #[test]
    fn no_match_below_min_n_and_suffix_never_matches_itself() {
        let mut p = NgramProposer::new(2, 3).unwrap();
        p.extend(&[1, 2, 3, 4, 3]);
        // [4, 3] never occurred before; [3] did, but 1 < min_n.
        assert_eq!(proposal(&p, 4), Vec::<u32>::new());
        let mut q = NgramProposer::new(1, 1).unwrap();
        q.extend(&[9]);
        assert_eq!(proposal(&q, 4), Vec::<u32>::new());
        assert_eq!(q.propose(0, &mut Vec::new()), 0);
    }

    #[test]
    fn truncate_restores_earlier_occurrences() {
        let mut p = NgramProposer::new(1, 2).unwrap();
        p.extend(&[1, 2, 3, 1, 2, 4, 1, 2]);
        assert_eq!(proposal(&p, 1), vec![4]);
        p.truncate(5); // [1, 2, 3, 1, 2]: the occurrence followed by 4 is gone.
        assert_eq!(p.len(), 5);
        assert_eq!(proposal(&p, 1), vec![3]);
        p.truncate(2); // [1, 2]: nothing earlier.
        assert_eq!(proposal(&p, 1), Vec::<u32>::new());
        p.truncate(10);
        assert_eq!(p.len(), 2);
    }

    #[test]
    fn config_errors_name_the_values_and_the_range() {
        for (lo, hi) in [(0, 3), (4, 3), (1, 33), (0, 0)] {
            let e = NgramProposer::new(lo, hi).unwrap_err();
            let SpecError::Setting { field, message: m } = e else {
                panic!("expected Setting, got {e:?}")
            };
            let want = if lo >= 1 && lo <= hi {
                "prompt_lookup_max"
            } else {
                "prompt_lookup_min"
            };
            assert_eq!(field, want, "({lo}, {hi})");
            assert!(
                m.contains(&format!("prompt_lookup_min = {lo}"))
                    && m.contains(&format!("prompt_lookup_max = {hi}"))
                    && m.contains("1 <= prompt_lookup_min <= prompt_lookup_max <= 32"),
                "{m}"
            );
        }
        assert!(NgramProposer::new(32, 32).is_ok());
    }

    #[test]
    fn fold_hasher_spreads_sibling_keys_over_low_bits() {
        use std::hash::BuildHasher;
        let b = BuildHasherDefault::<FoldHasher>::default();
        let mut low = std::collections::HashSet::new();
        for tok in 0..1024u32 {
            low.insert(b.hash_one(key(tok, 7)) & 1023);
        }
        // 1024 keys into 1024 buckets: a random function leaves about 1 - 1/e = 63% occupied.
        assert!(low.len() > 550, "{} distinct low-10-bit values", low.len());
    }
}
