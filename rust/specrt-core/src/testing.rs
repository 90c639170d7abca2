//! A deterministic mock model for tests and benches of the decode loop (no runtime needed).
//!
//! Its logits at each position are a pseudo-random function of the last three tokens and the position, so any
//! bookkeeping error (a wrong `n_past`, a token fed twice or skipped) changes the outputs. It keeps the token
//! sequence as its "KV cache" and rejects an `n_past` beyond what it holds. With
//! [`MockModel::with_full_context`] the logits depend on the whole prefix instead, so a cache reused for other
//! tokens (prefix caching) changes every later row.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::backend::{Backend, BatchBackend, BatchRow};
use crate::error::{Result, SpecError};

/// A mock causal language model.
#[derive(Clone, Debug)]
pub struct MockModel {
    vocab: usize,
    max_seq: usize,
    seed: u64,
    noise_seed: u64,
    noise: f32,
    scale: f32,
    boost: Option<(u32, f32)>,
    // Tokens (the last ones) each row's logits depend on.
    window: usize,
    // Tokens fed in all forward calls, shared with the test that made the model.
    fed: Option<Arc<AtomicUsize>>,
    // The tokens whose KV the cache holds.
    cache: Vec<u32>,
    // [n_logits, vocab] output of the last call.
    out: Vec<f32>,
    /// Forward calls made.
    pub n_calls: usize,
    /// Tokens fed in all forward calls.
    pub n_tokens_fed: usize,
}

fn mix(mut x: u64) -> u64 {
    // splitmix64 finaliser
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[allow(clippy::cast_precision_loss)]
fn unit(h: u64) -> f32 {
    // in [-1, 1)
    ((h >> 40) as f32 / (1u64 << 23) as f32) - 1.0
}

impl MockModel {
    /// A model over `vocab` tokens; `seed` picks the function, `scale` the logit range (larger = peakier).
    #[must_use]
    pub fn new(vocab: usize, max_seq: usize, seed: u64, scale: f32) -> Self {
        Self {
            vocab,
            max_seq,
            seed,
            noise_seed: 0,
            noise: 0.0,
            scale,
            boost: None,
            window: 3,
            fed: None,
            cache: Vec::with_capacity(max_seq),
            out: Vec::new(),
            n_calls: 0,
            n_tokens_fed: 0,
        }
    }

    /// The same model plus `noise` times another pseudo-random function (a draft that disagrees sometimes).
    #[must_use]
    pub fn with_noise(mut self, noise_seed: u64, noise: f32) -> Self {
        self.noise_seed = noise_seed;
        self.noise = noise;
        self
    }

    /// Add `amount` to the logit of `token` everywhere (e.g. to make an EOS id likely).
    #[must_use]
    pub fn with_boost(mut self, token: u32, amount: f32) -> Self {
        self.boost = Some((token, amount));
        self
    }

    /// Logits that depend on every token of the prefix, not only the last three (a reused cache holding other
    /// tokens than the engine believes changes all later rows).
    #[must_use]
    pub fn with_full_context(mut self) -> Self {
        self.window = usize::MAX;
        self
    }

    /// Count the tokens fed to this model (and its clones: each slot of a [`MockBatchModel`]) in `counter`.
    #[must_use]
    pub fn with_counter(mut self, counter: Arc<AtomicUsize>) -> Self {
        self.fed = Some(counter);
        self
    }

    /// The token ids the model's cache holds (valid or stale: the engine names how many are valid).
    #[must_use]
    pub fn cached(&self) -> &[u32] {
        &self.cache
    }

    /// Logits (`[vocab]`) after the prefix `seq` (non-empty).
    pub fn row(&self, seq: &[u32], out: &mut [f32]) {
        let n = seq.len();
        let mut h = mix(self.seed ^ (n as u64).wrapping_mul(0x1000_0001));
        for &t in &seq[n.saturating_sub(self.window)..] {
            h = mix(h ^ u64::from(t));
        }
        let hn = mix(h ^ self.noise_seed.wrapping_mul(0x5851_F42D_4C95_7F2D));
        for (v, o) in out.iter_mut().enumerate() {
            let mut x = self.scale * unit(mix(h ^ (v as u64)));
            if self.noise != 0.0 {
                x += self.noise * self.scale * unit(mix(hn ^ (v as u64)));
            }
            *o = x;
        }
        if let Some((t, a)) = self.boost {
            out[t as usize] += a;
        }
    }
}

impl Backend for MockModel {
    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn max_seq_len(&self) -> usize {
        self.max_seq
    }

    fn forward(&mut self, tokens: &[u32], n_past: usize, n_logits: usize) -> Result<&[f32]> {
        if tokens.is_empty() || n_logits == 0 || n_logits > tokens.len() {
            return Err(SpecError::Config(format!(
                "mock forward: {} tokens, n_logits {n_logits}",
                tokens.len()
            )));
        }
        if n_past > self.cache.len() {
            return Err(SpecError::Internal(format!(
                "mock forward: n_past {n_past} beyond the {} cached positions",
                self.cache.len()
            )));
        }
        if n_past + tokens.len() > self.max_seq {
            return Err(SpecError::Length(format!(
                "mock forward: {} > max_seq {}",
                n_past + tokens.len(),
                self.max_seq
            )));
        }
        self.n_calls += 1;
        self.n_tokens_fed += tokens.len();
        if let Some(c) = &self.fed {
            c.fetch_add(tokens.len(), Ordering::Relaxed);
        }
        self.cache.truncate(n_past);
        self.cache.extend_from_slice(tokens);
        let total = self.cache.len();
        let mut out = std::mem::take(&mut self.out);
        out.resize(n_logits * self.vocab, 0.0);
        for (r, row) in out.chunks_exact_mut(self.vocab).enumerate() {
            let pos = total - n_logits + r;
            self.row(&self.cache[..=pos], row);
        }
        self.out = out;
        Ok(&self.out)
    }
}

/// A batched mock: one [`MockModel`] per cache slot, so a row's logits are exactly what the model gives that row's
/// sequence alone (a row fed to the wrong slot or at a wrong `n_past` gets other logits or an error). Padded
/// positions and rows that sit a pass out get `NaN` logits: reading them is a bug the tests see.
#[derive(Clone, Debug)]
pub struct MockBatchModel {
    slots: Vec<MockModel>,
    // The prefix store: key -> the token ids of the stored positions.
    stored: std::collections::HashMap<u64, Vec<u32>>,
    kv_bytes_per_token: usize,
    out: Vec<f32>,
    /// Batched passes run.
    pub n_passes: usize,
    /// Rows fed in all passes (non-empty rows only).
    pub n_rows_fed: usize,
}

impl MockBatchModel {
    /// `max_batch` slots of `model` (each starts with an empty cache).
    #[must_use]
    pub fn new(model: &MockModel, max_batch: usize) -> Self {
        let mut m = model.clone();
        m.cache.clear();
        Self {
            slots: vec![m; max_batch],
            stored: std::collections::HashMap::new(),
            kv_bytes_per_token: 1,
            out: Vec::new(),
            n_passes: 0,
            n_rows_fed: 0,
        }
    }
}

impl MockBatchModel {
    /// Report `bytes` per cached position ([`BatchBackend::kv_bytes_per_token`]; default 1).
    #[must_use]
    pub fn with_kv_bytes_per_token(mut self, bytes: usize) -> Self {
        self.kv_bytes_per_token = bytes;
        self
    }

    /// Prefixes in the store.
    #[must_use]
    pub fn n_stored(&self) -> usize {
        self.stored.len()
    }

    fn check_slot(&self, slot: usize) -> Result<()> {
        if slot >= self.slots.len() {
            return Err(SpecError::Config(format!(
                "mock slot {slot}: {} slots",
                self.slots.len()
            )));
        }
        Ok(())
    }
}

impl BatchBackend for MockBatchModel {
    fn vocab_size(&self) -> usize {
        self.slots[0].vocab
    }

    fn max_seq_len(&self) -> usize {
        self.slots[0].max_seq
    }

    fn max_batch(&self) -> usize {
        self.slots.len()
    }

    fn forward_rows(
        &mut self,
        first_slot: usize,
        rows: &[BatchRow<'_>],
        n_logits: usize,
    ) -> Result<&[f32]> {
        let s = rows.iter().map(|r| r.tokens.len()).max().unwrap_or(0);
        if s == 0 || first_slot + rows.len() > self.slots.len() || n_logits == 0 || n_logits > s {
            return Err(SpecError::Config(format!(
                "mock forward_rows: slots {first_slot}..{} of {}, s {s}, n_logits {n_logits}",
                first_slot + rows.len(),
                self.slots.len()
            )));
        }
        let vocab = self.vocab_size();
        self.n_passes += 1;
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        out.resize(rows.len() * n_logits * vocab, f32::NAN);
        let first_kept = s - n_logits;
        for (r, row) in rows.iter().enumerate() {
            let m = row.tokens.len();
            if m == 0 {
                continue;
            }
            self.n_rows_fed += 1;
            let slot = &mut self.slots[first_slot + r];
            if m <= first_kept {
                // No kept position is real: still run the row (its cache must advance).
                slot.forward(row.tokens, row.n_past, 1)?;
                continue;
            }
            let n = m - first_kept;
            let logits = slot.forward(row.tokens, row.n_past, n)?;
            let at = r * n_logits * vocab;
            out[at..at + n * vocab].copy_from_slice(logits);
        }
        self.out = out;
        Ok(&self.out)
    }

    fn move_slot(&mut self, from: usize, to: usize, n_valid: usize) -> Result<()> {
        if from >= self.slots.len() || to >= self.slots.len() {
            return Err(SpecError::Config(format!(
                "mock move_slot {from} -> {to}: {} slots",
                self.slots.len()
            )));
        }
        let cache: Vec<u32> = self.slots[from]
            .cache
            .get(..n_valid)
            .ok_or_else(|| {
                SpecError::Internal(format!(
                    "mock move_slot: n_valid {n_valid} beyond the {} cached positions",
                    self.slots[from].cache.len()
                ))
            })?
            .to_vec();
        let dst = &mut self.slots[to].cache;
        dst.clear();
        dst.extend_from_slice(&cache);
        Ok(())
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.kv_bytes_per_token
    }

    fn store_prefix(&mut self, key: u64, slot: usize, n: usize) -> Result<()> {
        self.check_slot(slot)?;
        let cache = &self.slots[slot].cache;
        let kept = cache.get(..n).ok_or_else(|| {
            SpecError::Config(format!(
                "mock store_prefix: n {n} beyond the {} cached positions",
                cache.len()
            ))
        })?;
        self.stored.insert(key, kept.to_vec());
        Ok(())
    }

    fn load_prefix(&mut self, key: u64, slot: usize, n: usize) -> Result<()> {
        self.check_slot(slot)?;
        let kept = self
            .stored
            .get(&key)
            .and_then(|t| t.get(..n))
            .ok_or_else(|| SpecError::Config(format!("mock load_prefix: key {key}, n {n}")))?;
        let dst = &mut self.slots[slot].cache;
        dst.clear();
        dst.extend_from_slice(kept);
        Ok(())
    }

    fn drop_prefix(&mut self, key: u64) {
        self.stored.remove(&key);
    }
}

/// A deterministic finite automaton over token ids as a [`crate::Constraint`] (for tests): state 0 is the start,
/// `next[s]` lists the `(token, next state)` pairs allowed in state `s`, `accepting[s]` whether the sequence may
/// end there. A state that accepts and allows no token is complete. Forced tokens: the chain of states that allow
/// one token and do not accept, or a fixed list for a state ([`MockConstraint::with_forced`]: a canonical spelling
/// where other tokens are allowed too, as a tokenizer with several spellings of the forced bytes).
#[derive(Clone, Debug)]
pub struct MockConstraint {
    vocab: usize,
    next: std::sync::Arc<Vec<Vec<(u32, usize)>>>,
    accepting: std::sync::Arc<Vec<bool>>,
    forced: std::sync::Arc<Vec<(usize, Vec<u32>)>>,
    // [1 + consumed] the state before each consumed token, then the current one.
    states: Vec<usize>,
}

impl MockConstraint {
    /// An automaton over `vocab` tokens (see the type's docs).
    ///
    /// # Panics
    /// If the tables disagree in length, a token is `>= vocab` or a target state does not exist (test input).
    #[must_use]
    pub fn new(vocab: usize, next: Vec<Vec<(u32, usize)>>, accepting: Vec<bool>) -> Self {
        assert_eq!(next.len(), accepting.len(), "one accepting flag per state");
        for row in &next {
            for &(t, s) in row {
                assert!(
                    (t as usize) < vocab && s < next.len(),
                    "bad edge ({t}, {s})"
                );
            }
        }
        Self {
            vocab,
            next: std::sync::Arc::new(next),
            accepting: std::sync::Arc::new(accepting),
            forced: std::sync::Arc::new(Vec::new()),
            states: vec![0],
        }
    }

    /// The same automaton forcing `tokens` in `state` (whatever else that state allows).
    #[must_use]
    pub fn with_forced(mut self, state: usize, tokens: Vec<u32>) -> Self {
        let mut f = (*self.forced).clone();
        f.push((state, tokens));
        self.forced = std::sync::Arc::new(f);
        self
    }

    /// The same automaton in its start state.
    #[must_use]
    pub fn fresh(&self) -> Self {
        Self {
            states: vec![0],
            ..self.clone()
        }
    }

    fn state(&self) -> usize {
        *self.states.last().expect("never empty")
    }

    /// Whether the automaton accepts the whole of `tokens` from the start (EOS ids excluded by the caller).
    #[must_use]
    pub fn accepts(&self, tokens: &[u32]) -> bool {
        let mut s = 0;
        for &t in tokens {
            match self.next[s].iter().find(|e| e.0 == t) {
                Some(&(_, n)) => s = n,
                None => return false,
            }
        }
        self.accepting[s]
    }

    /// The tokens allowed in the current state.
    #[must_use]
    pub fn allowed(&self) -> Vec<u32> {
        self.next[self.state()].iter().map(|e| e.0).collect()
    }
}

impl crate::Constraint for MockConstraint {
    fn len(&self) -> usize {
        self.states.len() - 1
    }

    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<()> {
        if mask.len() != crate::constraint::mask_words(self.vocab) {
            return Err(SpecError::Shape(format!(
                "mask of {} words for vocab {}",
                mask.len(),
                self.vocab
            )));
        }
        mask.fill(0);
        for &(t, _) in &self.next[self.state()] {
            crate::constraint::mask_set(mask, t, true);
        }
        Ok(())
    }

    fn advance(&mut self, token: u32) -> Result<()> {
        let s = self.state();
        match self.next[s].iter().find(|e| e.0 == token) {
            Some(&(_, n)) => {
                self.states.push(n);
                Ok(())
            }
            None => Err(SpecError::Config(format!(
                "token {token} is refused in state {s}"
            ))),
        }
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len() {
            return Err(SpecError::Config(format!(
                "truncate({len}) beyond {} consumed tokens",
                self.len()
            )));
        }
        self.states.truncate(len + 1);
        Ok(())
    }

    fn is_accepting(&mut self) -> Result<bool> {
        Ok(self.accepting[self.state()])
    }

    fn is_complete(&mut self) -> Result<bool> {
        let s = self.state();
        Ok(self.accepting[s] && self.next[s].is_empty())
    }

    fn forced_tokens(&mut self, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        let mut s = self.state();
        if let Some((_, f)) = self.forced.iter().find(|e| e.0 == s) {
            out.extend_from_slice(f);
            return Ok(());
        }
        while !self.accepting[s] && self.next[s].len() == 1 && out.len() < 64 {
            let (t, n) = self.next[s][0];
            out.push(t);
            s = n;
        }
        Ok(())
    }
}

/// Upper quantile of chi-square with `df` degrees of freedom at `z` standard deviations (Wilson-Hilferty:
/// `df (1 - 2/(9 df) + z sqrt(2/(9 df)))^3`), for the Monte Carlo tests' critical values.
#[must_use]
pub fn chi2_quantile(df: f64, z: f64) -> f64 {
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}
