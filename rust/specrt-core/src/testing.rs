//! A deterministic mock model for tests and benches of the decode loop (no runtime needed).
//!
//! Its logits at each position are a pseudo-random function of the last three tokens and the position, so any
//! bookkeeping error (a wrong `n_past`, a token fed twice or skipped) changes the outputs. It keeps the token
//! sequence as its "KV cache" and rejects an `n_past` beyond what it holds.

use crate::backend::Backend;
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

    /// Logits (`[vocab]`) after the prefix `seq` (non-empty).
    pub fn row(&self, seq: &[u32], out: &mut [f32]) {
        let n = seq.len();
        let mut h = mix(self.seed ^ (n as u64).wrapping_mul(0x1000_0001));
        for &t in &seq[n.saturating_sub(3)..] {
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
