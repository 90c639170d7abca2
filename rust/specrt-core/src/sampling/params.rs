//! The settings of one row's processing ([`SamplingParams`]) and their validation.

use crate::error::{Result, SpecError};

/// Temperatures below this are greedy (as vLLM's `_SAMPLING_EPS`): `1 / T` would overflow the exponent.
pub const MIN_TEMPERATURE: f32 = 1e-5;

/// How one row is turned into a distribution. `Default` is plain sampling at temperature 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature, >= 0. Values below [`MIN_TEMPERATURE`] (e.g. 0) mean greedy decoding.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 = off.
    pub top_k: u32,
    /// Nucleus mass in (0, 1]; 1 = off.
    pub top_p: f32,
    /// Keep tokens with probability >= `min_p` times the top probability, in [0, 1]; 0 = off.
    pub min_p: f32,
    /// HF repetition penalty, > 0; 1 = off. Divides positive / multiplies negative logits of seen tokens.
    pub repetition_penalty: f32,
    /// OpenAI / vLLM frequency penalty (finite; 0 = off): subtract `count * frequency_penalty`.
    pub frequency_penalty: f32,
    /// OpenAI / vLLM presence penalty (finite; 0 = off): subtract it once from every generated token.
    pub presence_penalty: f32,
    /// vLLM's `min_tokens` (0 = off): while fewer output tokens than this are counted, the ids the
    /// [`PenaltyContext`] bans ([`PenaltyContext::ban_before_min_tokens`]: the EOS and stop token ids) get logit
    /// -inf. Applied with the penalties, so a draft row and the target row of the same position see the same ban.
    pub min_tokens: u32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            min_tokens: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (temperature 0, no penalties).
    #[must_use]
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// True when the row is decoded by argmax (temperature below [`MIN_TEMPERATURE`]).
    #[must_use]
    pub fn is_greedy(&self) -> bool {
        self.temperature < MIN_TEMPERATURE
    }

    /// True when any penalty (or `min_tokens`) is active (the row then needs a [`PenaltyContext`]).
    #[must_use]
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
            || self.min_tokens > 0
    }

    /// Check every value against its allowed range.
    ///
    /// Errors: [`SpecError::Setting`] naming the setting, the bad value and the allowed range.
    pub fn validate(&self) -> Result<()> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(SpecError::setting(
                "temperature",
                format!("temperature {t} is invalid (expected a finite value >= 0; 0 = greedy)"),
            ));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(SpecError::setting(
                "top_p",
                format!("top_p {p} is invalid (expected 0 < top_p <= 1; 1 = off)"),
            ));
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return Err(SpecError::setting(
                "min_p",
                format!("min_p {m} is invalid (expected 0 <= min_p <= 1; 0 = off)"),
            ));
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(SpecError::setting(
                "repetition_penalty",
                format!("repetition_penalty {r} is invalid (expected a finite value > 0; 1 = off)"),
            ));
        }
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !v.is_finite() {
                return Err(SpecError::setting(
                    name,
                    format!("{name} {v} is invalid (expected a finite value; 0 = off)"),
                ));
            }
        }
        Ok(())
    }
}
