//! Prefix caching (ARCHITECTURE.md, "Prefix caching"): after a generation a model's cache still holds the KV of a
//! prefix of the sequence it ran; a later prompt that begins with the same token ids reuses those positions and
//! prefills only the rest. As llama.cpp's server keeps a slot's cache for the next request and vLLM's automatic
//! prefix caching keeps blocks, minus the block granularity: the reused prefix is matched token by token.
//!
//! Only exact token-id matches are reused, so the output is the one a fresh prefill gives up to the pass shape's
//! rounding (the reused rows were computed by other passes: prefill chunks, decode steps, verification blocks). A
//! chat's next turn re-tokenizes the previous answer from its text: where those ids differ from the generated ones
//! (a merge across the answer's boundary, a template that strips or reformats it), the match ends there and
//! everything after it is prefilled.

/// Whether the engines reuse cached prompt prefixes unless told otherwise (as vLLM's `enable_prefix_caching`
/// and llama.cpp's `cache_prompt`, on by default).
pub const DEFAULT_PREFIX_CACHING: bool = true;

/// Length of the longest common prefix of `a` and `b` (token ids).
#[must_use]
pub fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Positions of a new prompt each model may reuse, given the token ids whose KV its cache holds.
///
/// At most `prompt.len() - 1` positions: the last prompt token is always fed (its prefill row gives the first
/// token). `score_prompt` (the request scores its prompt: `prompt_logprobs`)
/// reuses nothing in the target, whose prefill must compute every position's row; the draft still reuses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixReuse {
    /// Leading prompt positions whose target KV is reused.
    pub n_tgt: usize,
    /// Leading prompt positions whose draft KV is reused.
    pub n_dft: usize,
}

impl PrefixReuse {
    /// The reuse for `prompt` (non-empty) over caches holding `cached_tgt` / `cached_dft`.
    #[must_use]
    pub fn of(prompt: &[u32], cached_tgt: &[u32], cached_dft: &[u32], score_prompt: bool) -> Self {
        let head = &prompt[..prompt.len().saturating_sub(1)];
        Self {
            n_tgt: if score_prompt {
                0
            } else {
                common_prefix_len(cached_tgt, head)
            },
            n_dft: common_prefix_len(cached_dft, head),
        }
    }
}

/// Default budget of the batched engine's prefix store ([`crate::BatchOptions::prefix_cache_bytes`]): 1 GiB of
/// kept KV (all models together), about 18,000 positions of Qwen2.5-1.5B in float32 (57,344 bytes each) or 23,000
/// of SmolLM2-135M.
pub const DEFAULT_PREFIX_CACHE_BYTES: usize = 1 << 30;

/// One kept prefix in the batched engine's store: the token ids whose KV was copied out of a finished row's slots,
/// and how many of them each model holds.
#[derive(Clone, Debug)]
pub(crate) struct KeptPrefix {
    /// The backends' key of the stored copies.
    pub(crate) key: u64,
    /// `[max(n_tgt, n_dft)]` token ids.
    pub(crate) tokens: Vec<u32>,
    pub(crate) n_tgt: usize,
    pub(crate) n_dft: usize,
    pub(crate) bytes: usize,
    // LRU clock value of the last store or use.
    last_used: u64,
}

/// The index of the batched engine's prefix store (the KV copies live in the backends, under each entry's key):
/// longest-prefix lookup, a byte budget, least-recently-used eviction. An entry that a newer one extends (the next
/// turn of the same chat) is dropped when the newer one is stored.
#[derive(Debug)]
pub(crate) struct PrefixPool {
    entries: Vec<KeptPrefix>,
    budget: usize,
    used: usize,
    clock: u64,
    next_key: u64,
}

impl PrefixPool {
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            entries: Vec::new(),
            budget,
            used: 0,
            clock: 0,
            next_key: 0,
        }
    }

    /// Entries kept and their bytes.
    pub(crate) fn usage(&self) -> (usize, usize) {
        (self.entries.len(), self.used)
    }

    /// The entry giving `prompt` the longest target reuse (then the longest draft reuse), marked used; `None` when
    /// nothing is reusable. `use_draft`: the request runs the draft (else its draft reuse is 0).
    pub(crate) fn lookup(
        &mut self,
        prompt: &[u32],
        score_prompt: bool,
        use_draft: bool,
    ) -> Option<(u64, PrefixReuse)> {
        let (i, reuse) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let r = PrefixReuse::of(
                    prompt,
                    &e.tokens[..e.n_tgt],
                    if use_draft { &e.tokens[..e.n_dft] } else { &[] },
                    score_prompt,
                );
                (i, r)
            })
            .filter(|(_, r)| r.n_tgt > 0 || r.n_dft > 0)
            .max_by_key(|(i, r)| (r.n_tgt, r.n_dft, std::cmp::Reverse(*i)))?;
        self.clock += 1;
        self.entries[i].last_used = self.clock;
        Some((self.entries[i].key, reuse))
    }

    /// Make room for a prefix of `tokens` with `n_tgt` / `n_dft` positions costing `bytes`: returns the key to store
    /// it under and the keys of the entries to drop from the backends (extended by it, or least recently used until
    /// it fits), or `None` when it is larger than the whole budget (nothing is dropped then).
    pub(crate) fn insert(
        &mut self,
        tokens: &[u32],
        n_tgt: usize,
        n_dft: usize,
        bytes: usize,
    ) -> Option<(u64, Vec<u64>)> {
        if bytes > self.budget || n_tgt.max(n_dft) == 0 {
            return None;
        }
        let mut dropped = Vec::new();
        // Entries the new one covers in both models.
        self.entries.retain(|e| {
            let covered = e.n_tgt <= n_tgt
                && e.n_dft <= n_dft
                && common_prefix_len(&e.tokens, tokens) >= e.tokens.len();
            if covered {
                dropped.push(e.key);
            }
            !covered
        });
        let mut used: usize = self.entries.iter().map(|e| e.bytes).sum();
        while used + bytes > self.budget {
            let lru = (0..self.entries.len())
                .min_by_key(|&i| self.entries[i].last_used)
                .expect("bytes <= budget: entries remain while over it");
            let e = self.entries.swap_remove(lru);
            used -= e.bytes;
            dropped.push(e.key);
        }
        self.used = used + bytes;
        self.clock += 1;
        self.next_key += 1;
        let key = self.next_key;
        self.entries.push(KeptPrefix {
            key,
            tokens: tokens[..n_tgt.max(n_dft)].to_vec(),
            n_tgt,
            n_dft,
            bytes,
            last_used: self.clock,
        });
        Some((key, dropped))
    }

    /// Forget entry `key` (its store failed).
    pub(crate) fn remove(&mut self, key: u64) {
        self.entries.retain(|e| e.key != key);
        self.used = self.entries.iter().map(|e| e.bytes).sum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_prompt_token_is_never_reused() {
        let r = PrefixReuse::of(&[1, 2, 3], &[1, 2, 3, 4], &[1, 2, 3], false);
        assert_eq!(r, PrefixReuse { n_tgt: 2, n_dft: 2 });
        let r = PrefixReuse::of(&[7], &[7], &[7], false);
        assert_eq!(r, PrefixReuse { n_tgt: 0, n_dft: 0 });
    }

    #[test]
    fn the_match_ends_at_the_first_different_id_and_a_scored_prompt_reuses_no_target_kv() {
        assert_eq!(common_prefix_len(&[1, 2, 3, 4], &[1, 2, 9, 4]), 2);
        assert_eq!(common_prefix_len(&[], &[1]), 0);
        let r = PrefixReuse::of(&[1, 2, 9, 4, 5], &[1, 2, 3], &[1, 2, 9], true);
        assert_eq!(r, PrefixReuse { n_tgt: 0, n_dft: 3 });
    }
}
