//! Suffix decoding: a model-free proposer that drafts the most frequent continuation of the text's longest
//! matching suffix, over the current request's prompt and output and, when the caller shares a [`SuffixCache`],
//! the prompts and outputs of earlier requests (Oliaro et al. 2024, "SuffixDecoding", arXiv:2411.04975; vLLM's
//! `suffix` method through Arctic Inference). Its proposals are point masses, verified with
//! [`crate::VerifyMode::Deterministic`] like prompt lookup's, so whatever it proposes the output is the target's.
//!
//! # Index
//! A continuation trie of bounded depth ([`SUFFIX_MAX_DEPTH`]): the context `c = [a_1 .. a_n]` has the node id
//! `id(c) = map[(a_1, id([a_2 .. a_n]))]` (exact keys, as [`crate::ngram`]'s trie), and each node counts the tokens
//! that followed its context. Appending token `t` at position `i` counts `t` under every context ending at `i - 1`
//! (`n = 1 ..= depth`): `O(depth)` map operations per token. A node exists only once it has a counted
//! continuation, so the current suffix never matches itself.
//!
//! # Proposal
//! From the committed text, walk the trie backwards to the deepest context seen before (at least `min_match`
//! tokens; in the request's own index and in the shared one, the deeper match wins and equal depths pool their
//! counts); propose its most frequent continuation, append it to the context and repeat. A path stops where the
//! product of its tokens' frequencies (`count / total` of each step's context) falls below [`SUFFIX_MIN_PROB`], or
//! at `ceil(SUFFIX_SPEC_FACTOR * n)` tokens for a first match of `n` tokens (a long match predicts a long copy), or
//! at `k`. Greedy on frequencies, a path rather than SuffixDecoding's tree: our verification scores one row per
//! token.
//!
//! # Sharing across requests
//! A [`SuffixCache`] holds earlier requests' prompts and outputs (the committed tokens, published when the
//! request's proposer is reset or dropped), bounded by a token budget: over it, the oldest half of the sequences is
//! dropped and the index rebuilt (`O(depth)` per kept token, amortised over the half budget of new tokens). A
//! proposer reads it with a non-blocking lock and drafts from its own text alone while a publish holds it, so
//! decoding never waits on another request. **Privacy**: with a shared cache one request's text can shape another's
//! *drafts* (what is proposed, and so how fast it decodes), never its output distribution, which is the target's
//! whatever is proposed; a service that must keep tenants' texts apart keeps one cache per tenant or none.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use crate::error::{Result, SpecError};
use crate::ngram::FoldHasher;

/// Deepest context the index keys (SuffixDecoding's tree depth; Arctic Inference's default is 24).
pub const SUFFIX_MAX_DEPTH: usize = 16;

/// A proposal path stops where the product of its tokens' continuation frequencies falls below this
/// (Arctic Inference's `suffix_min_token_prob`).
pub const SUFFIX_MIN_PROB: f64 = 0.1;

/// A proposal is at most `ceil(factor * n)` tokens long for a first match of `n` tokens (Arctic Inference's
/// `suffix_max_spec_factor`).
pub const SUFFIX_SPEC_FACTOR: f64 = 1.0;

/// Largest token budget of a shared [`SuffixCache`] (about 1 KB a token in the worst case: 64 Mi tokens would be
/// 64 GB).
pub const MAX_SUFFIX_CACHE_TOKENS: usize = 1 << 26;

/// `suffix_cache_tokens`' allowed values, as messages word them (from [`MAX_SUFFIX_CACHE_TOKENS`]).
#[must_use]
pub fn suffix_cache_tokens_expected() -> String {
    format!("an integer 0 <= suffix_cache_tokens <= {MAX_SUFFIX_CACHE_TOKENS}, 0 = no sharing")
}

/// The one check of a `suffix_cache_tokens` setting: the budget as a count.
///
/// Errors: [`SpecError::Setting`] `suffix_cache_tokens` outside `0..=MAX_SUFFIX_CACHE_TOKENS`, with the allowed
/// values.
pub fn check_suffix_cache_tokens(n: i64) -> Result<usize> {
    usize::try_from(n)
        .ok()
        .filter(|&v| v <= MAX_SUFFIX_CACHE_TOKENS)
        .ok_or_else(|| {
            SpecError::setting(
                "suffix_cache_tokens",
                format!(
                    "suffix_cache_tokens {n} is invalid (expected {})",
                    suffix_cache_tokens_expected()
                ),
            )
        })
}

/// Trie node id of the empty context.
const ROOT: u32 = 0;

/// The counted continuations of one context: `(token, count)`, the most frequent first.
#[derive(Clone, Debug, Default)]
struct Continuations {
    counts: Vec<(u32, u32)>,
    total: u32,
}

impl Continuations {
    fn add(&mut self, token: u32) {
        self.total = self.total.saturating_add(1);
        match self.counts.iter().position(|&(t, _)| t == token) {
            Some(i) => {
                self.counts[i].1 = self.counts[i].1.saturating_add(1);
                // keep the most frequent first (ties: the one that got there first stays)
                if i > 0 && self.counts[i].1 > self.counts[0].1 {
                    self.counts.swap(0, i);
                }
            }
            None => self.counts.push((token, 1)),
        }
    }
}

/// A continuation trie over one or more token sequences (see the module docs).
#[derive(Clone, Default)]
struct Index {
    nodes: HashMap<u64, u32, BuildHasherDefault<FoldHasher>>,
    /// `[node id]` the continuations of that node's context (index 0: the empty context, unused).
    next: Vec<Continuations>,
}

fn key(first: u32, rest: u32) -> u64 {
    (u64::from(first) << 32) | u64::from(rest)
}

impl Index {
    fn clear(&mut self) {
        self.nodes.clear();
        self.next.clear();
    }

    /// Count `seq[i]` under every context ending at `i - 1`.
    fn count_at(&mut self, seq: &[u32], i: usize) {
        if self.next.is_empty() {
            self.next.push(Continuations::default());
        }
        let mut node = ROOT;
        for n in 1..=SUFFIX_MAX_DEPTH.min(i) {
            let next_id = self.next.len();
            let id = *self
                .nodes
                .entry(key(seq[i - n], node))
                .or_insert_with(|| u32::try_from(next_id).expect("suffix trie exceeds u32 ids"));
            if id as usize == next_id {
                self.next.push(Continuations::default());
            }
            self.next[id as usize].add(seq[i]);
            node = id;
        }
    }

    /// Count every continuation of `seq`.
    fn add_sequence(&mut self, seq: &[u32]) {
        for i in 1..seq.len() {
            self.count_at(seq, i);
        }
    }

    /// The continuations of the node `found` (a [`Index::deepest`] result) when it is `depth` tokens deep.
    fn continuations(&self, found: Option<(usize, u32)>, depth: usize) -> Option<&Continuations> {
        found
            .filter(|&(n, _)| n == depth)
            .map(|(_, id)| &self.next[id as usize])
    }

    /// The deepest context of at least `min_match` tokens that ends `ctx` and was seen: `(depth, node id)`.
    fn deepest(&self, ctx: &[u32], min_match: usize) -> Option<(usize, u32)> {
        let mut node = ROOT;
        let mut best = None;
        for n in 1..=SUFFIX_MAX_DEPTH.min(ctx.len()) {
            let Some(&id) = self.nodes.get(&key(ctx[ctx.len() - n], node)) else {
                break;
            };
            if n >= min_match {
                best = Some((n, id));
            }
            node = id;
        }
        best
    }
}

/// The sequences a [`SuffixCache`] holds and their index.
#[derive(Default)]
struct Shared {
    sequences: std::collections::VecDeque<Vec<u32>>,
    tokens: usize,
    index: Index,
}

/// Earlier requests' prompts and outputs, shared by the suffix proposers of one process (or one tenant), bounded
/// by a token budget (see the module docs for its cost, eviction and privacy).
pub struct SuffixCache {
    max_tokens: usize,
    shared: RwLock<Shared>,
    /// Serialises publishers, so that one rebuild runs at a time while readers keep the old index.
    publish: Mutex<()>,
}

impl std::fmt::Debug for SuffixCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SuffixCache")
            .field("max_tokens", &self.max_tokens)
            .field("tokens", &self.tokens())
            .finish_non_exhaustive()
    }
}

impl SuffixCache {
    /// A cache holding at most `max_tokens` tokens of earlier requests.
    ///
    /// Errors: [`SpecError::Setting`] `suffix_cache_tokens` above [`MAX_SUFFIX_CACHE_TOKENS`]
    /// ([`check_suffix_cache_tokens`]); [`SpecError::Config`] for 0, a cache that holds nothing
    /// ([`SuffixCache::for_setting`] gives `None` for it).
    pub fn new(max_tokens: usize) -> Result<Arc<Self>> {
        check_suffix_cache_tokens(i64::try_from(max_tokens).unwrap_or(i64::MAX))?;
        if max_tokens == 0 {
            return Err(SpecError::Config(
                "SuffixCache::new(0): a cache of 0 tokens holds nothing (for_setting(0) gives None)".into(),
            ));
        }
        Ok(Arc::new(Self {
            max_tokens,
            shared: RwLock::new(Shared::default()),
            publish: Mutex::new(()),
        }))
    }

    /// The cache for a `suffix_cache_tokens` setting: `None` for 0 (no sharing).
    ///
    /// Errors: as [`check_suffix_cache_tokens`].
    pub fn for_setting(suffix_cache_tokens: i64) -> Result<Option<Arc<Self>>> {
        match check_suffix_cache_tokens(suffix_cache_tokens)? {
            0 => Ok(None),
            n => Self::new(n).map(Some),
        }
    }

    /// The token budget.
    #[must_use]
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Tokens held now.
    #[must_use]
    pub fn tokens(&self) -> usize {
        self.shared
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .tokens
    }

    /// Sequences held now.
    #[must_use]
    pub fn sequences(&self) -> usize {
        self.shared
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .sequences
            .len()
    }

    /// Add one finished request's committed tokens (prompt and output). A sequence longer than the budget keeps
    /// its last `max_tokens` tokens; over the budget, the oldest sequences are dropped until half of it is left
    /// and the index is rebuilt from the rest.
    pub fn publish(&self, tokens: &[u32]) {
        if tokens.len() < 2 {
            return;
        }
        let seq = &tokens[tokens.len().saturating_sub(self.max_tokens)..];
        let _one_publisher = self.publish.lock().unwrap_or_else(PoisonError::into_inner);
        let over = {
            let held = self.shared.read().unwrap_or_else(PoisonError::into_inner);
            held.tokens + seq.len() > self.max_tokens
        };
        if over {
            // Rebuild beside the readers, then swap it in: a decode step never waits on the rebuild. The oldest
            // sequences go until the new one fits in half the budget.
            let (mut kept, n) = {
                let held = self.shared.read().unwrap_or_else(PoisonError::into_inner);
                let mut n = held.tokens;
                let dropped = held
                    .sequences
                    .iter()
                    .take_while(|s| {
                        let drop = n + seq.len() > self.max_tokens / 2;
                        if drop {
                            n -= s.len();
                        }
                        drop
                    })
                    .count();
                let kept: std::collections::VecDeque<Vec<u32>> =
                    held.sequences.iter().skip(dropped).cloned().collect();
                (kept, n)
            };
            let mut index = Index::default();
            for s in &kept {
                index.add_sequence(s);
            }
            index.add_sequence(seq);
            kept.push_back(seq.to_vec());
            let mut held = self.shared.write().unwrap_or_else(PoisonError::into_inner);
            *held = Shared {
                sequences: kept,
                tokens: n + seq.len(),
                index,
            };
        } else {
            let mut held = self.shared.write().unwrap_or_else(PoisonError::into_inner);
            held.index.add_sequence(seq);
            held.tokens += seq.len();
            held.sequences.push_back(seq.to_vec());
        }
    }

    /// Forget every sequence.
    pub fn clear(&self) {
        let _one_publisher = self.publish.lock().unwrap_or_else(PoisonError::into_inner);
        *self.shared.write().unwrap_or_else(PoisonError::into_inner) = Shared::default();
    }
}

/// Suffix decoding over the request's own text and, optionally, a shared [`SuffixCache`] of earlier requests.
///
/// Fed like [`crate::NgramProposer`]: [`extend`](Self::extend) with the prompt and then the emitted tokens,
/// [`truncate`](Self::truncate) when output is cut at a stop string, [`propose`](Self::propose) once per round.
/// [`reset`](Self::reset) (the next request) and dropping the proposer publish the committed tokens to the shared
/// cache, if any.
pub struct SuffixProposer {
    min_match: usize,
    tokens: Vec<u32>,
    local: Index,
    shared: Option<Arc<SuffixCache>>,
}

impl std::fmt::Debug for SuffixProposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SuffixProposer")
            .field("min_match", &self.min_match)
            .field("len", &self.tokens.len())
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl SuffixProposer {
    /// A proposer matching suffixes of at least `min_match` tokens (the request's `prompt_lookup_min`), with an
    /// optional shared cache of earlier requests.
    ///
    /// Errors: [`SpecError::Setting`] `prompt_lookup_min` unless `1 <= min_match <= SUFFIX_MAX_DEPTH`.
    pub fn new(min_match: usize, shared: Option<Arc<SuffixCache>>) -> Result<Self> {
        if !(1..=SUFFIX_MAX_DEPTH).contains(&min_match) {
            return Err(SpecError::setting(
                "prompt_lookup_min",
                format!(
                    "prompt_lookup_min {min_match} is invalid for suffix decoding (expected 1 <= \
                     prompt_lookup_min <= {SUFFIX_MAX_DEPTH})"
                ),
            ));
        }
        Ok(Self {
            min_match,
            tokens: Vec::new(),
            local: Index::default(),
            shared,
        })
    }

    /// Shortest suffix that may match.
    #[must_use]
    pub fn min_match(&self) -> usize {
        self.min_match
    }

    /// The shared cache, if any.
    #[must_use]
    pub fn shared(&self) -> Option<&Arc<SuffixCache>> {
        self.shared.as_ref()
    }

    /// The committed tokens indexed.
    #[must_use]
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Publish the committed tokens to the shared cache (if any) and forget them (the next request).
    pub fn reset(&mut self) {
        if let Some(cache) = &self.shared {
            cache.publish(&self.tokens);
        }
        self.tokens.clear();
        self.local.clear();
    }

    /// Append committed tokens: `O(SUFFIX_MAX_DEPTH)` map operations per token.
    pub fn extend(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.tokens.push(t);
            self.local.count_at(&self.tokens, self.tokens.len() - 1);
        }
    }

    /// Keep only the first `len` tokens (output cut at a stop string): the request's index is rebuilt from them.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.tokens.len() {
            return;
        }
        self.tokens.truncate(len);
        self.local.clear();
        self.local.add_sequence(&self.tokens);
    }

    /// Propose up to `k` draft tokens (see the module docs): clears `out`, writes the path, returns its length (0
    /// when no suffix of at least `min_match` tokens was seen before). `O(k * SUFFIX_MAX_DEPTH)` map lookups.
    pub fn propose(&self, k: usize, out: &mut Vec<u32>) -> usize {
        out.clear();
        if k == 0 {
            return 0;
        }
        let shared = self.shared.as_ref().and_then(|c| c.shared.try_read().ok());
        // the context's tail followed by the proposal so far
        let tail = self.tokens.len().saturating_sub(SUFFIX_MAX_DEPTH);
        let mut ctx: Vec<u32> = Vec::with_capacity(SUFFIX_MAX_DEPTH + k);
        ctx.extend_from_slice(&self.tokens[tail..]);
        let mut prob = 1.0f64;
        let mut limit = k;
        while out.len() < limit {
            let local = self.local.deepest(&ctx, self.min_match);
            let global = shared
                .as_ref()
                .and_then(|s| s.index.deepest(&ctx, self.min_match));
            let depth = match (local, global) {
                (None, None) => break,
                (l, g) => l.map_or(0, |x| x.0).max(g.map_or(0, |x| x.0)),
            };
            // the deeper match; equal depths pool their counts
            let mine = self.local.continuations(local, depth);
            let theirs = shared
                .as_ref()
                .and_then(|s| s.index.continuations(global, depth));
            let (token, count, total) = match (mine, theirs) {
                // one source: its most frequent continuation is kept first
                (Some(c), None) | (None, Some(c)) => (c.counts[0].0, c.counts[0].1, c.total),
                (Some(a), Some(b)) => {
                    let mut pooled = a.counts.clone();
                    for &(t, cnt) in &b.counts {
                        match pooled.iter_mut().find(|(u, _)| *u == t) {
                            Some(e) => e.1 = e.1.saturating_add(cnt),
                            None => pooled.push((t, cnt)),
                        }
                    }
                    let (t, cnt) = pooled
                        .into_iter()
                        .reduce(|best, e| if e.1 > best.1 { e } else { best })
                        .expect("a node has a continuation");
                    (t, cnt, a.total.saturating_add(b.total))
                }
                (None, None) => break,
            };
            prob *= f64::from(count) / f64::from(total.max(1));
            if prob < SUFFIX_MIN_PROB {
                break;
            }
            if out.is_empty() {
                limit = k
                    .min((SUFFIX_SPEC_FACTOR * depth as f64).ceil() as usize)
                    .max(1);
            }
            out.push(token);
            ctx.push(token);
        }
        out.len()
    }
}

impl Drop for SuffixProposer {
    fn drop(&mut self) {
        if let Some(cache) = &self.shared {
            cache.publish(&self.tokens);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proposal(p: &SuffixProposer, k: usize) -> Vec<u32> {
        let mut out = Vec::new();
        let n = p.propose(k, &mut out);
        assert_eq!(n, out.len());
        out
    }

    #[test]
    fn the_most_frequent_continuation_of_the_deepest_match_is_proposed() {
        // after [1, 2]: 3 twice, 4 once; prompt lookup would copy the most recent (4)
        let mut p = SuffixProposer::new(1, None).unwrap();
        p.extend(&[1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2]);
        assert_eq!(proposal(&p, 1), vec![3]);
        // a deeper context decides over a shallower one: [5, 1, 2] was followed by 4 only
        let mut q = SuffixProposer::new(1, None).unwrap();
        q.extend(&[1, 2, 3, 1, 2, 3, 5, 1, 2, 4, 7, 5, 1, 2]);
        assert_eq!(proposal(&q, 1), vec![4]);
    }

    #[test]
    fn nothing_is_proposed_without_an_earlier_match_of_min_match_tokens() {
        let mut p = SuffixProposer::new(2, None).unwrap();
        p.extend(&[1, 2, 3, 4]);
        assert!(
            proposal(&p, 4).is_empty(),
            "the current suffix must not match itself"
        );
        p.extend(&[9, 4]);
        // [4] was seen (followed by 9) but a match needs 2 tokens: [9, 4] was not
        assert!(proposal(&p, 4).is_empty());
        assert!(proposal(&SuffixProposer::new(1, None).unwrap(), 3).is_empty());
    }

    #[test]
    fn a_path_stops_at_the_probability_floor_and_the_match_length() {
        // a long repeated run: the path follows it while the match is long
        let run: Vec<u32> = (10..30).collect();
        let mut p = SuffixProposer::new(1, None).unwrap();
        p.extend(&run);
        p.extend(&run[..8]);
        // a first match of 8 tokens (SUFFIX_SPEC_FACTOR 1) allows 8 tokens, all frequency 1
        assert_eq!(proposal(&p, 16), (18..26).collect::<Vec<u32>>());
        assert_eq!(proposal(&p, 3), vec![18, 19, 20], "k caps the path");
        // after [1]: eleven different continuations, each 1/11 of the time: below the floor at once
        let mut q = SuffixProposer::new(1, None).unwrap();
        for t in 100..111 {
            q.extend(&[1, t]);
        }
        q.extend(&[1]);
        assert!(proposal(&q, 4).is_empty());
    }

    #[test]
    fn truncate_forgets_the_cut_tokens() {
        let mut p = SuffixProposer::new(1, None).unwrap();
        p.extend(&[1, 2, 3, 1, 2]);
        assert_eq!(proposal(&p, 1), vec![3]);
        p.truncate(3);
        p.extend(&[7, 1, 2]);
        assert_eq!(p.tokens(), &[1, 2, 3, 7, 1, 2]);
        assert_eq!(proposal(&p, 2), vec![3, 7]);
        p.truncate(2);
        // [1, 2] now has no earlier occurrence
        assert!(proposal(&p, 2).is_empty());
    }

    #[test]
    fn a_shared_cache_carries_earlier_requests_and_the_request_s_own_text_too() {
        let cache = SuffixCache::new(1000).unwrap();
        let mut a = SuffixProposer::new(2, Some(Arc::clone(&cache))).unwrap();
        a.extend(&[5, 6, 7, 8, 9]);
        assert_eq!(
            cache.tokens(),
            0,
            "nothing is shared while the request runs"
        );
        a.reset();
        assert_eq!((cache.tokens(), cache.sequences()), (5, 1));
        // a new request that starts like the earlier one drafts its continuation
        a.extend(&[1, 5, 6]);
        assert_eq!(proposal(&a, 3), vec![7, 8]);
        drop(a);
        assert_eq!(
            (cache.tokens(), cache.sequences()),
            (8, 2),
            "dropping publishes too"
        );
        // without the cache the same request has nothing to draft
        let mut b = SuffixProposer::new(2, None).unwrap();
        b.extend(&[1, 5, 6]);
        assert!(proposal(&b, 3).is_empty());
        cache.clear();
        assert_eq!(cache.tokens(), 0);
    }

    #[test]
    fn the_cache_keeps_within_its_budget_and_drops_the_oldest_first() {
        let cache = SuffixCache::new(10).unwrap();
        cache.publish(&[1, 2, 3, 4]);
        cache.publish(&[5, 6, 7, 8]);
        assert_eq!(cache.tokens(), 8);
        // over the budget: the oldest go until half of it (5) is left, then the new one is added
        cache.publish(&[9, 10, 11]);
        assert_eq!((cache.tokens(), cache.sequences()), (3, 1));
        let mut p = SuffixProposer::new(1, Some(Arc::clone(&cache))).unwrap();
        p.extend(&[1]);
        assert!(
            proposal(&p, 2).is_empty(),
            "the dropped sequence no longer drafts"
        );
        p.truncate(0);
        p.extend(&[9]);
        assert_eq!(proposal(&p, 2), vec![10]);
        p.truncate(0);
        // a sequence longer than the budget keeps its last tokens
        cache.publish(&(100..130).collect::<Vec<u32>>());
        assert!(cache.tokens() <= 10);
        assert!(SuffixCache::new(0).is_err());
        assert!(SuffixCache::for_setting(0).unwrap().is_none());
        for bad in [-1, MAX_SUFFIX_CACHE_TOKENS as i64 + 1] {
            let err = SuffixCache::for_setting(bad).unwrap_err();
            assert_eq!(err.field(), Some("suffix_cache_tokens"), "{err}");
            assert!(
                err.to_string().contains(&suffix_cache_tokens_expected()),
                "{err}"
            );
        }
        assert!(SuffixCache::new(MAX_SUFFIX_CACHE_TOKENS + 1).is_err());
    }

    #[test]
    fn equal_depths_pool_their_counts() {
        // the request saw [1, 2] -> 3 once; earlier requests saw [1, 2] -> 4 twice: pooled, 4 wins
        let cache = SuffixCache::new(100).unwrap();
        cache.publish(&[1, 2, 4]);
        cache.publish(&[1, 2, 4]);
        let mut p = SuffixProposer::new(2, Some(Arc::clone(&cache))).unwrap();
        p.extend(&[1, 2, 3, 0, 1, 2]);
        assert_eq!(proposal(&p, 1), vec![4]);
        p.truncate(0);
    }
}
