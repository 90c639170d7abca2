//! The tokens seen so far and the penalties they give ([`PenaltyContext`]): repetition (HF), frequency and
//! presence (OpenAI / vLLM), and `min_tokens`' ban.

use crate::error::{Result, SpecError};
use crate::sampling::SamplingParams;

/// The tokens seen so far, for penalties: prompt tokens (repetition penalty only) and output tokens with counts.
///
/// The decode loop pushes committed output tokens. To evaluate row `i` of a round with draft tokens
/// `d_1 .. d_{i-1}` counted on top, push them, evaluate, then [`PenaltyContext::truncate`] back to the committed
/// length: a rejected draft leaves no trace (`verify` does exactly this and always restores the length).
#[derive(Clone, Debug)]
pub struct PenaltyContext {
    vocab: usize,
    // [vocab] output-token counts (allocated on first use).
    counts: Vec<u32>,
    // [vocab] whether the token is in the prompt (allocated on first use).
    in_prompt: Vec<bool>,
    // Distinct seen tokens in order of first appearance (prompt first), so popping is LIFO.
    seen: Vec<u32>,
    // Output tokens in order.
    history: Vec<u32>,
    // Ids that get logit -inf while fewer than `SamplingParams::min_tokens` output tokens are counted.
    banned: Vec<u32>,
}

impl PenaltyContext {
    /// An empty context for a vocabulary of `vocab` tokens (allocates nothing until the first token).
    #[must_use]
    pub fn new(vocab: usize) -> Self {
        Self {
            vocab,
            counts: Vec::new(),
            in_prompt: Vec::new(),
            seen: Vec::new(),
            history: Vec::new(),
            banned: Vec::new(),
        }
    }

    /// The ids banned before `min_tokens` output tokens ([`SamplingParams::min_tokens`]): EOS and stop token ids.
    ///
    /// Errors: [`SpecError::Vocab`] for an id >= vocab.
    pub fn ban_before_min_tokens(&mut self, ids: &[u32]) -> Result<()> {
        for &tok in ids {
            self.check(tok)?;
            if !self.banned.contains(&tok) {
                self.banned.push(tok);
            }
        }
        Ok(())
    }

    fn check(&self, token: u32) -> Result<usize> {
        let t = token as usize;
        if t >= self.vocab {
            return Err(SpecError::Vocab(format!(
                "token id {token} is out of range (expected < vocab size {})",
                self.vocab
            )));
        }
        Ok(t)
    }

    // Lazily sized: a context that never sees a token costs nothing.
    fn alloc(&mut self) {
        if self.counts.is_empty() {
            self.counts = vec![0; self.vocab];
            self.in_prompt = vec![false; self.vocab];
        }
    }

    /// Mark prompt tokens as seen (repetition penalty only). Call before any output token is pushed.
    ///
    /// Errors: [`SpecError::Vocab`] for an id >= vocab; [`SpecError::Config`] if output tokens were pushed already.
    pub fn add_prompt(&mut self, prompt: &[u32]) -> Result<()> {
        if !self.history.is_empty() {
            return Err(SpecError::Config(
                "prompt tokens must be added before output tokens".to_owned(),
            ));
        }
        for &tok in prompt {
            self.check(tok)?;
        }
        self.alloc();
        for &tok in prompt {
            let t = tok as usize;
            if !self.in_prompt[t] {
                self.in_prompt[t] = true;
                self.seen.push(tok);
            }
        }
        Ok(())
    }

    /// Count one output token.
    ///
    /// Errors: [`SpecError::Vocab`] for an id >= vocab.
    pub fn push(&mut self, token: u32) -> Result<()> {
        let t = self.check(token)?;
        self.alloc();
        if self.counts[t] == 0 && !self.in_prompt[t] {
            self.seen.push(token);
        }
        self.counts[t] += 1;
        self.history.push(token);
        Ok(())
    }

    /// Reserve room for `additional` more tokens, so pushing them (and undoing drafts) never allocates.
    pub fn reserve(&mut self, additional: usize) {
        self.history.reserve(additional);
        self.seen.reserve(additional.min(self.vocab));
    }

    /// Number of output tokens counted.
    #[must_use]
    pub fn len(&self) -> usize {
        self.history.len()
    }

    /// True when no output token is counted.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.history.is_empty()
    }

    /// Forget output tokens beyond the first `len` (undo of [`PenaltyContext::push`]; prompt tokens stay).
    pub fn truncate(&mut self, len: usize) {
        while self.history.len() > len {
            let Some(tok) = self.history.pop() else { break };
            let t = tok as usize;
            self.counts[t] -= 1;
            if self.counts[t] == 0 && !self.in_prompt[t] {
                // First seen at this position, so it is the last entry of `seen`.
                debug_assert_eq!(self.seen.last(), Some(&tok));
                self.seen.pop();
            }
        }
    }

    /// How many times `token` occurs among the output tokens.
    #[must_use]
    pub fn count(&self, token: u32) -> u32 {
        self.counts.get(token as usize).copied().unwrap_or(0)
    }

    /// Apply the penalties of `params` to the seen tokens of `logits` (`[vocab]`, modified in place).
    pub fn apply(&self, params: &SamplingParams, logits: &mut [f32]) {
        let (r, f, pr) = (
            params.repetition_penalty,
            params.frequency_penalty,
            params.presence_penalty,
        );
        for &tok in &self.seen {
            let t = tok as usize;
            let Some(x) = logits.get_mut(t) else { continue };
            if r != 1.0 {
                *x = if *x < 0.0 { *x * r } else { *x / r };
            }
            let c = self.counts[t];
            if c > 0 {
                #[allow(clippy::cast_precision_loss)]
                let cf = c as f32;
                *x -= cf * f + pr;
            }
        }
        if (self.history.len() as u64) < u64::from(params.min_tokens) {
            for &tok in &self.banned {
                if let Some(x) = logits.get_mut(tok as usize) {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Whether [`PenaltyContext::apply`] can change a row (something seen, or a ban in force).
    pub(crate) fn acts(&self) -> bool {
        !self.seen.is_empty() || !self.banned.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_follow_hf_then_openai() {
        let logits = [2.0f32, -2.0, 1.0, 0.0];
        let params = SamplingParams {
            repetition_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..SamplingParams::default()
        };
        let mut ctx = PenaltyContext::new(4);
        ctx.add_prompt(&[2]).unwrap();
        ctx.push(0).unwrap();
        ctx.push(0).unwrap();
        ctx.push(1).unwrap();
        let mut x = logits;
        ctx.apply(&params, &mut x);
        // token 0: 2/2 - 2*0.5 - 0.25 = -0.25; token 1: -2*2 - 0.5 - 0.25 = -4.75; token 2 (prompt): 1/2.
        assert_eq!(x, [-0.25, -4.75, 0.5, 0.0]);
        ctx.truncate(1);
        assert_eq!(ctx.count(1), 0);
        assert_eq!(ctx.count(0), 1);
        assert_eq!(ctx.seen, vec![2, 0]);
    }
}
