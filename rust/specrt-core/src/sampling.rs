//! Logits processing and sampling of one row, in Hugging Face's order:
//! penalties (repetition as HF; frequency / presence as OpenAI / vLLM), then temperature, top-k, top-p, min-p.
//!
//! The hot path ([`Sampler`]) allocates nothing per call: one `Sampler` per vocabulary size holds reusable buffers.
//! A processed row is kept as unnormalised weights `w` (`exp((x - max) / T)`, so the top token has weight exactly
//! 1), a keep-threshold and the f64 total of the kept weights:
//! `p(x) = (w[x] >= threshold ? w[x] : 0) / total`. Exact zeros (masked, `-inf` logits, or `exp` below `e^-87`,
//! i.e. probability < 1.7e-38 relative to the top token) are never emitted.
//!
//! Exact definitions (mirrored by `python/specrt/reference.py`):
//! - penalties, for every token `t` seen so far (prompt or output): repetition (HF
//!   `RepetitionPenaltyLogitsProcessor`): `x < 0 ? x * r : x / r` if `t` is in the prompt or the output; then
//!   (vLLM / OpenAI) `x -= count_out(t) * frequency + (count_out(t) > 0) * presence`, counting output tokens only.
//! - temperature `T`: `w = exp((x - max) * (1 / T))`; `T < MIN_TEMPERATURE` means greedy (argmax, lowest id on ties).
//! - top-k (HF `TopKLogitsWarper`): keep tokens whose logit is >= the k-th largest logit (ties at the boundary kept).
//! - top-p (HF `TopPLogitsWarper`): keep a token iff the mass of the tokens strictly more probable than it is < p,
//!   i.e. walk the tokens in descending order until the cumulative mass reaches `p`; all tokens tied with the last
//!   one walked are kept too.
//! - min-p (HF `MinPLogitsWarper`): keep tokens with `p >= min_p * p_max`, i.e. `w >= min_p` (the top weight is 1).
//! - sampling with a uniform `u` in `[0, 1)`: the first token `i` whose running (f64) sum of kept weights exceeds
//!   `u * total` (inverse CDF, no sort).

use crate::error::{Result, SpecError};
use crate::rng::Rng;

/// Temperatures below this are greedy (as vLLM's `_SAMPLING_EPS`): `1 / T` would overflow the exponent.
pub const MIN_TEMPERATURE: f32 = 1e-5;

/// Logits below `max - 87 * T` get weight 0 (their probability relative to the top token is < e^-87 = 1.6e-38).
const EXP_FLOOR: f32 = -87.0;

/// Candidate thresholds for top-p, as fractions of the total mass: at most 2^10, then 2^16 candidates, then all.
const NUCLEUS_LEVELS: [f64; 3] = [1.0 / 1024.0, 1.0 / 65536.0, 0.0];

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
    fn acts(&self) -> bool {
        !self.seen.is_empty() || !self.banned.is_empty()
    }
}

/// `e^x` for `x <= 0` (or `-inf`), 0 below [`EXP_FLOOR`]; about 1 ulp (Cephes `expf` polynomial). Branch-free, so
/// loops over it vectorise.
#[inline(always)]
fn exp_nonpos(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer kept in the low mantissa bits
    let xc = if x < EXP_FLOOR { EXP_FLOOR } else { x };
    // Plain multiply-adds, not `mul_add`: without the `fma` target feature that is a slow libm call.
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut y = 1.987_569_1e-4_f32;
    y = y * r + 1.398_199_9e-3;
    y = y * r + 8.333_452e-3;
    y = y * r + 4.166_579_6e-2;
    y = y * r + 1.666_666_5e-1;
    y = y * r + 0.5;
    let y = (y * r) * r + r + 1.0;
    // n in [-126, 0]: 2^n is a normal float whose biased exponent is n + 127.
    let scale = f32::from_bits(t.to_bits().wrapping_sub(0x4B40_0000).wrapping_add(127) << 23);
    if x < EXP_FLOOR {
        0.0
    } else {
        y * scale
    }
}

/// Rows are scanned in blocks of this many values; the max pass records each block's max (argmax without a
/// second pass over the row; candidate tokens for top-p / min-p / top-k found by scanning only the blocks that can
/// hold one).
const MAX_BLOCK: usize = 512;

/// Largest candidate set the sparse path keeps (beyond it the row is processed densely).
const MAX_CAND: usize = 16_384;

/// Candidate levels for top-p, as `-ln` of the smallest candidate weight (the top weight is 1): weights
/// >= 2^-10, >= 2^-16, then every non-zero weight.
const NUCLEUS_LOG_LEVELS: [f32; 3] = [6.931_472, 11.090_355, f32::INFINITY];

/// Run a kernel (a plain-Rust function written to auto-vectorise over 16 lanes) compiled for the best x86 vector
/// extension found at run time (AVX-512F, AVX2, else the default SSE2 build). The kernels use no FMA and the same
/// per-lane operation order at every width, so results are bit-identical on every machine.
macro_rules! dispatch {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $generic:ident;) => {
        $(#[$meta])*
        fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2")]
                unsafe fn v512($($arg: $ty),*) -> $ret {
                    $generic($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                unsafe fn v256($($arg: $ty),*) -> $ret {
                    $generic($($arg),*)
                }
                if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512dq") && std::is_x86_feature_detected!("avx512vl")
                {
                    // SAFETY: the CPU supports the features `v512` is compiled for (checked just above).
                    return unsafe { v512($($arg),*) };
                }
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2 (checked just above).
                    return unsafe { v256($($arg),*) };
                }
            }
            $generic($($arg),*)
        }
    };
}

/// `(max, bad)` of `x`, writing the max of each `MAX_BLOCK` block into `bmax` (`len >= ceil(len / MAX_BLOCK)`).
/// `bad` is true iff some value is NaN or +inf.
// `!(x < inf)` is deliberate: one comparison that is true for NaN and +inf alike, and it vectorises.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
#[inline(always)]
fn max_blocks_generic(x: &[f32], bmax: &mut [f32]) -> (f32, bool) {
    const L: usize = 16;
    let mut m = f32::NEG_INFINITY;
    let mut bad = [0u32; L];
    let mut bad_rest = false;
    for (blk, bm) in x.chunks(MAX_BLOCK).zip(bmax.iter_mut()) {
        let mut acc = [f32::NEG_INFINITY; L];
        let c = blk.chunks_exact(L);
        let rest = c.remainder();
        for v in c {
            for j in 0..L {
                acc[j] = if v[j] > acc[j] { v[j] } else { acc[j] };
                bad[j] |= u32::from(!(v[j] < f32::INFINITY));
            }
        }
        let mut b = f32::NEG_INFINITY;
        for &v in rest {
            b = if v > b { v } else { b };
            bad_rest |= !(v < f32::INFINITY);
        }
        for &a in &acc {
            b = if a > b { a } else { b };
        }
        *bm = b;
        m = if b > m { b } else { m };
    }
    (m, bad_rest || bad.iter().any(|&b| b != 0))
}

dispatch! {
    fn max_blocks(x: &[f32], bmax: &mut [f32]) -> (f32, bool) = max_blocks_generic;
}

/// Number of `MAX_BLOCK` blocks of a row of `n` values.
fn n_blocks(n: usize) -> usize {
    n.div_ceil(MAX_BLOCK)
}

/// The error for a row whose max pass found a NaN / +inf (`bad`) or whose max is -inf (all -inf).
#[allow(clippy::neg_cmp_op_on_partial_ord)]
fn nonfinite_error(logits: &[f32], row: usize, bad: bool) -> SpecError {
    if bad {
        if let Some((token, &x)) = logits
            .iter()
            .enumerate()
            .find(|(_, x)| !(**x < f32::INFINITY))
        {
            return SpecError::NonFinite {
                row,
                token,
                value: format!("{x}"),
                what: if x.is_nan() { "NaN" } else { "+inf" }.to_owned(),
            };
        }
    }
    SpecError::NonFinite {
        row,
        token: 0,
        value: "-inf".to_owned(),
        what: "all -inf".to_owned(),
    }
}

/// Checked max with the block maxima in `bmax` (resized as needed).
fn checked_max_blocks(logits: &[f32], row: usize, bmax: &mut Vec<f32>) -> Result<f32> {
    let nb = n_blocks(logits.len());
    if bmax.len() < nb {
        bmax.resize(nb, f32::NEG_INFINITY);
    }
    let (m, bad) = max_blocks(logits, bmax);
    if bad || m == f32::NEG_INFINITY {
        return Err(nonfinite_error(logits, row, bad));
    }
    Ok(m)
}

/// First index of the max `m` given the block maxima from the max pass: only the first block holding `m` is read.
fn argmax_from_blocks(x: &[f32], bmax: &[f32], m: f32) -> u32 {
    let b = bmax.iter().position(|&v| v == m).unwrap_or(0);
    let start = b * MAX_BLOCK;
    let end = (start + MAX_BLOCK).min(x.len());
    let i = x[start..end].iter().position(|&v| v == m).unwrap_or(0);
    #[allow(clippy::cast_possible_truncation)]
    let i = (start + i) as u32;
    i
}

/// Greedy choice of every row of `logits` (`[rows, vocab] float32`, row-major) into `out` (`[rows]`, cleared
/// first): the first index of each row's maximum, as [`Sampler::argmax`] picks without penalties.
///
/// Errors: [`SpecError::Shape`] if `vocab` is 0 or does not divide `logits.len()`; [`SpecError::NonFinite`] for a
/// row with NaN, +inf or only -inf (named by its row index).
pub fn argmax_rows(logits: &[f32], vocab: usize, out: &mut Vec<u32>) -> Result<()> {
    if vocab == 0 || !logits.len().is_multiple_of(vocab) {
        return Err(SpecError::Shape(format!(
            "logits have {} values, not a whole number of rows of vocab {vocab}",
            logits.len()
        )));
    }
    out.clear();
    let mut bmax = Vec::new();
    for (r, row) in logits.chunks_exact(vocab).enumerate() {
        let m = checked_max_blocks(row, r, &mut bmax)?;
        out.push(argmax_from_blocks(row, &bmax, m));
    }
    Ok(())
}

/// Max of a row, checking for NaN / +inf / all -inf. `row` is used in the error only.
///
/// Errors: [`SpecError::NonFinite`] with the row and the first bad token.
pub fn checked_max(logits: &[f32], row: usize) -> Result<f32> {
    let mut bmax = [f32::NEG_INFINITY; 512];
    if n_blocks(logits.len()) <= bmax.len() {
        let (m, bad) = max_blocks(logits, &mut bmax);
        if bad || m == f32::NEG_INFINITY {
            return Err(nonfinite_error(logits, row, bad));
        }
        return Ok(m);
    }
    checked_max_blocks(logits, row, &mut Vec::new())
}

/// Argmax of a row (lowest id on ties), checking for non-finite values as [`checked_max`]. One pass over the row.
///
/// Errors: [`SpecError::NonFinite`].
pub fn checked_argmax(logits: &[f32], row: usize) -> Result<u32> {
    let mut bmax = Vec::new();
    let m = checked_max_blocks(logits, row, &mut bmax)?;
    Ok(argmax_from_blocks(logits, &bmax, m))
}

/// Natural log of the softmax of a raw row at `token` (no penalties, temperature 1): the target's log-probability
/// of an emitted token. Output in (-inf, 0].
///
/// Costs two vectorised passes over the row; when the row was just processed by [`Sampler::process`] (or
/// [`crate::verify()`]) at temperature 1 without penalties or top-k, [`log_softmax_with`] and the row's
/// [`RowNorm`] give the same value without touching the row.
///
/// Errors: [`SpecError::NonFinite`] (bad row), [`SpecError::Vocab`] (token >= row length).
pub fn log_softmax_at(logits: &[f32], token: u32, row: usize) -> Result<f32> {
    let t = token as usize;
    if t >= logits.len() {
        return Err(SpecError::Vocab(format!(
            "token id {token} is out of range (expected < vocab size {})",
            logits.len()
        )));
    }
    let m = checked_max(logits, row)?;
    // The same sum as `Sampler::process` at temperature 1 (so `log_softmax_with` agrees exactly).
    let sum = exp_total(logits, m, 1.0, f32::NEG_INFINITY);
    #[allow(clippy::cast_possible_truncation)]
    Ok((f64::from(logits[t] - m) - sum.ln()) as f32)
}

/// Most alternatives [`top_logprobs`] returns per position (OpenAI's chat `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The `k` most likely tokens of a raw logits row (`[vocab] float32`) with their log-probabilities (log-softmax of
/// the raw row, natural log, the normaliser of [`log_softmax_at`]), most likely first; equal logits in ascending
/// id order, so the first is the token greedy decoding picks (the first index of the maximum, as
/// [`argmax_rows`]). Fewer than `k` when the row is shorter.
///
/// Example: logits `[1, 3, 3, 0]`, k = 2 -> `[(1, ln(e^3 / z)), (2, ln(e^3 / z))]` with `z = e + 2e^3 + 1`.
///
/// Errors: [`SpecError::NonFinite`] for a row with NaN, +inf or only -inf (named by `row`).
pub fn top_logprobs(logits: &[f32], k: usize, row: usize) -> Result<Vec<(u32, f32)>> {
    let m = checked_max(logits, row)?;
    let log_sum = exp_total(logits, m, 1.0, f32::NEG_INFINITY).ln();
    // [<= k] (logit, id), sorted by logit descending then id ascending; ids arrive ascending, so an equal logit
    // never displaces an earlier id.
    let mut top: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (i, &x) in logits.iter().enumerate() {
        if k == 0 || (top.len() == k && x <= top[k - 1].0) {
            continue;
        }
        let at = top.partition_point(|&(v, _)| v >= x);
        #[allow(clippy::cast_possible_truncation)]
        top.insert(at, (x, i as u32));
        top.truncate(k);
    }
    #[allow(clippy::cast_possible_truncation)]
    Ok(top
        .into_iter()
        .map(|(x, id)| (id, (f64::from(x - m) - log_sum) as f32))
        .collect())
}

/// The log-softmax normaliser of a raw row: its max and `ln sum exp(x - max)`. Recorded by [`Sampler::process`]
/// for rows processed at temperature 1 without penalties or top-k (see [`Sampler::row_norm`],
/// [`crate::verify::Verification::row_norms`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowNorm {
    /// Max of the row.
    pub max: f32,
    /// `ln sum_i exp(x_i - max)` (f64; the sum of f32 weights, each 0 below `e^-87`), exactly as
    /// [`log_softmax_at`] computes it.
    pub log_sum: f64,
}

/// [`log_softmax_at`] from a row's [`RowNorm`]: `(x[token] - max) - log_sum`, no pass over the row. Returns `None`
/// for a token out of range.
#[must_use]
pub fn log_softmax_with(logits: &[f32], token: u32, norm: RowNorm) -> Option<f32> {
    let x = *logits.get(token as usize)?;
    #[allow(clippy::cast_possible_truncation)]
    Some((f64::from(x - norm.max) - norm.log_sum) as f32)
}

/// Reusable scratch for processing and sampling rows of one vocabulary size. Holds the last processed row.
///
/// A processed row is stored densely (`w`, all `vocab` weights) or, when top-p / min-p / top-k leave few tokens,
/// sparsely: only the kept tokens (ascending ids) and their weights, found without writing `vocab` weights.
/// Both give the same distribution and the same draws.
#[derive(Clone, Debug)]
pub struct Sampler {
    vocab: usize,
    // [vocab] weights of the last processed row when dense.
    w: Vec<f32>,
    // [vocab] penalised copy of the logits.
    logits: Vec<f32>,
    // [vocab] residual max(0, p - q) (dense rows).
    resid: Vec<f32>,
    // Min-heap of the top-k logits.
    heap: Vec<f32>,
    // Candidate weights for top-p (selection scratch).
    cand: Vec<f32>,
    // [ceil(vocab / MAX_BLOCK)] block maxima of the last max pass.
    bmax: Vec<f32>,
    // Sparse row: true when the last processed row is `(kidx, kw)` rather than `w`.
    sparse: bool,
    // Kept token ids (ascending) and their weights, for a sparse row.
    kidx: Vec<u32>,
    kw: Vec<f32>,
    // Residual weights over `kidx` (sparse rows).
    rw: Vec<f32>,
    // Keep-threshold on `w` and f64 total of kept weights, for the last processed row.
    threshold: f32,
    total: f64,
    // Log-softmax normaliser of the last processed row, when it was raw logits at temperature 1 without top-k.
    norm: Option<RowNorm>,
    // A deliberate fault (tests of the tests only): see `Sampler::inject_fault`.
    fault: Option<Fault>,
}

/// Deliberate sampler faults, to show that a statistical test catches them. Never set outside tests.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// On rejection, sample the recovered token from the draft row `q` instead of `norm(max(0, p - q))` (a real
    /// bug class: the output is then no longer distributed as `p`).
    ResidualFromDraft,
    /// Constrained decoding: the draft samples from its masked `q`, but verification is given the unmasked `q` (the
    /// mask applied to the target's `p` only).
    MaskTargetOnly,
    /// Constrained decoding: the constraint is not truncated back to the committed tokens after verification
    /// (refusals of the emitted tokens are then ignored).
    NoConstraintRollback,
    /// Constrained decoding: grammar-forced tokens are emitted without verification.
    ForcedUnverified,
}

impl Sampler {
    /// Scratch for rows of `vocab` logits (allocates `3 * vocab` floats once).
    #[must_use]
    pub fn new(vocab: usize) -> Self {
        Self {
            vocab,
            w: vec![0.0; vocab],
            logits: vec![0.0; vocab],
            resid: vec![0.0; vocab],
            heap: Vec::new(),
            // Sparse-row scratch sized once for the largest candidate set, so rounds never reallocate.
            cand: Vec::with_capacity(vocab.min(MAX_CAND) + 1),
            bmax: vec![f32::NEG_INFINITY; n_blocks(vocab)],
            sparse: false,
            kidx: Vec::with_capacity(vocab.min(MAX_CAND) + 1),
            kw: Vec::with_capacity(vocab.min(MAX_CAND) + 1),
            rw: Vec::with_capacity(vocab.min(MAX_CAND) + 1),
            threshold: 0.0,
            total: 0.0,
            norm: None,
            fault: None,
        }
    }

    /// Set or clear a deliberate fault (tests of the tests only: [`Fault`]).
    #[doc(hidden)]
    pub fn inject_fault(&mut self, fault: Option<Fault>) {
        self.fault = fault;
    }

    /// The vocabulary size this scratch serves.
    #[must_use]
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The log-softmax normaliser of the last row given to [`Sampler::process`], when that row was used as is
    /// (no penalty changed it), at temperature 1 and without top-k; `None` otherwise (also after a greedy row).
    /// With it, [`log_softmax_with`] gives [`log_softmax_at`] of that row without another pass over it.
    #[must_use]
    pub fn row_norm(&self) -> Option<RowNorm> {
        self.norm
    }

    fn check_row(&self, logits: &[f32]) -> Result<()> {
        if logits.len() != self.vocab {
            return Err(SpecError::Shape(format!(
                "logits row has {} values, expected [vocab] = [{}]",
                logits.len(),
                self.vocab
            )));
        }
        Ok(())
    }

    /// The logits to use for a row: the input, or a penalised copy of it.
    fn penalised<'a>(
        logits_buf: &'a mut [f32],
        logits: &'a [f32],
        params: &SamplingParams,
        penalties: Option<&PenaltyContext>,
    ) -> &'a [f32] {
        match penalties {
            Some(ctx) if params.has_penalties() && ctx.acts() => {
                logits_buf.copy_from_slice(logits);
                ctx.apply(params, logits_buf);
                logits_buf
            }
            _ => logits,
        }
    }

    /// Greedy choice for a row: argmax of the penalised logits (lowest id on ties). One pass over the row.
    ///
    /// Errors: [`SpecError::Shape`], [`SpecError::NonFinite`] (checked on the penalised logits).
    pub fn argmax(
        &mut self,
        logits: &[f32],
        row: usize,
        params: &SamplingParams,
        penalties: Option<&PenaltyContext>,
    ) -> Result<u32> {
        self.check_row(logits)?;
        let x = Self::penalised(&mut self.logits, logits, params, penalties);
        let m = checked_max_blocks(x, row, &mut self.bmax)?;
        Ok(argmax_from_blocks(x, &self.bmax, m))
    }

    /// Process one row of logits (`[vocab] float32`) into the stored distribution (see the module docs), readable
    /// with [`Sampler::prob`], [`Sampler::write_probs`], [`Sampler::sample_processed`].
    ///
    /// For a greedy `params` the distribution is the point mass on [`Sampler::argmax`].
    ///
    /// Errors: [`SpecError::Shape`] (length != vocab), [`SpecError::NonFinite`] (NaN, +inf or all -inf, reported
    /// with `row` and the token id). `params` is assumed validated ([`SamplingParams::validate`]).
    pub fn process(
        &mut self,
        logits: &[f32],
        row: usize,
        params: &SamplingParams,
        penalties: Option<&PenaltyContext>,
    ) -> Result<()> {
        self.check_row(logits)?;
        self.norm = None;
        let penalised = matches!(penalties, Some(ctx) if params.has_penalties() && ctx.acts());
        let x = Self::penalised(&mut self.logits, logits, params, penalties);
        let m = checked_max_blocks(x, row, &mut self.bmax)?;
        if params.is_greedy() {
            let a = argmax_from_blocks(x, &self.bmax, m);
            self.set_sparse_point(a);
            return Ok(());
        }
        let kth = if params.top_k > 0 && (params.top_k as usize) < x.len() {
            kth_largest(x, params.top_k as usize, &mut self.heap)
        } else {
            f32::NEG_INFINITY
        };
        let inv_t = 1.0 / params.temperature;
        // Candidate levels (as -ln of the smallest candidate weight) for the sparse path, if it may pay.
        let min_p_level = (params.min_p > 0.0).then(|| -params.min_p.ln() + 1e-3);
        let levels: &[f32] = if params.top_p < 1.0 {
            &NUCLEUS_LOG_LEVELS
        } else if min_p_level.is_some() || kth > f32::NEG_INFINITY {
            &[f32::INFINITY]
        } else {
            &[]
        };
        let sparse_done = if levels.is_empty() {
            false
        } else {
            let total = exp_total(x, m, inv_t, kth);
            if params.temperature == 1.0 && !penalised && kth == f32::NEG_INFINITY {
                self.norm = Some(RowNorm {
                    max: m,
                    log_sum: total.ln(),
                });
            }
            let mut levels = levels;
            let single;
            if params.top_p >= 1.0 {
                if let Some(c) = min_p_level {
                    single = [c];
                    levels = &single;
                }
            }
            let sp = SparseScratch {
                bmax: &self.bmax,
                kidx: &mut self.kidx,
                kw: &mut self.kw,
                cand: &mut self.cand,
            };
            match sp.run(x, m, inv_t, kth, total, params, levels) {
                Some((thr, kept_total)) => {
                    self.sparse = true;
                    self.threshold = thr;
                    self.total = kept_total;
                    true
                }
                None => false,
            }
        };
        if sparse_done {
            return Ok(());
        }
        self.sparse = false;
        let mut total = exp_pass(x, m, inv_t, kth, &mut self.w);
        if params.temperature == 1.0 && !penalised && kth == f32::NEG_INFINITY {
            self.norm = Some(RowNorm {
                max: m,
                log_sum: total.ln(),
            });
        }
        let mut thr = 0.0f32;
        if params.top_p < 1.0 {
            (thr, total) = nucleus(&self.w, total, f64::from(params.top_p), &mut self.cand);
        }
        if params.min_p > 0.0 && params.min_p > thr {
            thr = params.min_p;
            total = masked_sum(&self.w, thr);
        }
        self.threshold = thr;
        self.total = total;
        Ok(())
    }

    /// Store the point mass on `a`.
    fn set_sparse_point(&mut self, a: u32) {
        self.sparse = true;
        self.kidx.clear();
        self.kw.clear();
        self.kidx.push(a);
        self.kw.push(1.0);
        self.threshold = 0.0;
        self.total = 1.0;
    }

    /// Position of `token` in the sparse kept list.
    fn sparse_pos(&self, token: u32) -> Option<usize> {
        self.kidx.binary_search(&token).ok()
    }

    /// Probability of `token` in the last processed row, in [0, 1] (f64 of f32 weights).
    #[must_use]
    pub fn prob(&self, token: u32) -> f64 {
        if self.sparse {
            return self
                .sparse_pos(token)
                .map_or(0.0, |i| f64::from(self.kw[i]) / self.total);
        }
        let w = self.w.get(token as usize).copied().unwrap_or(0.0);
        if w >= self.threshold {
            f64::from(w) / self.total
        } else {
            0.0
        }
    }

    /// Write the last processed row, normalised, into `out` (`[vocab] float32`) and return its f64 sum (~1).
    ///
    /// Errors: [`SpecError::Shape`] if `out.len() != vocab`.
    pub fn write_probs(&self, out: &mut [f32]) -> Result<f64> {
        if out.len() != self.vocab {
            return Err(SpecError::Shape(format!(
                "probability row has {} values, expected [vocab] = [{}]",
                out.len(),
                self.vocab
            )));
        }
        #[allow(clippy::cast_possible_truncation)]
        let inv = (1.0 / self.total) as f32;
        if self.sparse {
            out.fill(0.0);
            let mut sum = 0.0f64;
            for (&i, &wv) in self.kidx.iter().zip(&self.kw) {
                let v = wv * inv;
                out[i as usize] = v;
                sum += f64::from(v);
            }
            return Ok(sum);
        }
        Ok(normalise_into(&self.w, self.threshold, inv, out))
    }

    /// The coupled choice from the last processed row at output `position` (an exponential race over the kept
    /// weights with the noise of `(seed, position)`, see [`crate::coupled`]): an exact sample of the row whose
    /// randomness depends on the position alone. For a greedy row (a point mass) it is the argmax.
    #[must_use]
    pub fn coupled_choice(&self, noise: &crate::coupled::CoupledNoise, position: u64) -> u32 {
        let mut race = crate::coupled::Race::new(position);
        if self.sparse {
            for (&i, &w) in self.kidx.iter().zip(&self.kw) {
                if w > 0.0 {
                    race.offer(noise, i, f64::from(w));
                }
            }
        } else {
            let thr = self.threshold;
            for (i, &w) in self.w.iter().enumerate() {
                if w > 0.0 && w >= thr {
                    #[allow(clippy::cast_possible_truncation)] // vocab < 2^32
                    race.offer(noise, i as u32, f64::from(w));
                }
            }
        }
        // A processed row always keeps at least one token of positive weight (its maximum).
        race.winner()
            .unwrap_or(self.kidx.first().copied().unwrap_or(0))
    }

    /// Sample from the last processed row with a uniform `u` in [0, 1) (inverse CDF over kept weights).
    #[must_use]
    pub fn sample_processed(&self, u: f64) -> u32 {
        if self.sparse {
            return inverse_cdf_sparse(&self.kidx, &self.kw, self.total, u, u32::MAX);
        }
        inverse_cdf(&self.w, self.threshold, self.total, u)
    }

    /// Process a row and sample one token from it (a target-only step, K = 0). Draws one uniform unless greedy.
    ///
    /// Errors: as [`Sampler::process`].
    pub fn sample(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        penalties: Option<&PenaltyContext>,
        rng: &mut Rng,
    ) -> Result<u32> {
        if params.is_greedy() {
            return self.argmax(logits, 0, params, penalties);
        }
        self.process(logits, 0, params, penalties)?;
        Ok(self.sample_processed(rng.next_f64()))
    }

    /// The draft's step: process a row, write the normalised distribution into `probs_out` (`[vocab] float32`,
    /// the `q` row that `verify` needs) and sample the token from exactly that row. Draws one uniform unless greedy
    /// (then `probs_out` is the point mass on the argmax).
    ///
    /// Errors: as [`Sampler::process`]; [`SpecError::Shape`] if `probs_out.len() != vocab`.
    pub fn sample_draft(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        penalties: Option<&PenaltyContext>,
        rng: &mut Rng,
        probs_out: &mut [f32],
    ) -> Result<u32> {
        self.process(logits, 0, params, penalties)?;
        let sum = self.write_probs(probs_out)?;
        if params.is_greedy() {
            return Ok(self.kidx[0]);
        }
        let u = rng.next_f64();
        if self.sparse {
            // The non-zero entries of `probs_out`, in id order: the same walk as over the whole row.
            #[allow(clippy::cast_possible_truncation)]
            let inv = (1.0 / self.total) as f32;
            let target = u * sum;
            let mut acc = 0.0f64;
            let mut last = self.kidx[0];
            for (&i, &wv) in self.kidx.iter().zip(&self.kw) {
                let v = wv * inv;
                if v <= 0.0 {
                    continue;
                }
                acc += f64::from(v);
                last = i;
                if acc > target {
                    return Ok(i);
                }
            }
            return Ok(last);
        }
        Ok(inverse_cdf(probs_out, 0.0, sum, u))
    }

    /// After [`Sampler::process`] of a target row: sample from the residual `norm(max(0, p - q))` with uniform `u`
    /// (Leviathan et al. 2023, arXiv:2211.17192, Algorithm 1; Chen et al. 2023, arXiv:2302.01318, eq. 1).
    ///
    /// `p` is the processed row in f32 (`w * f32(1 / total)`), `q` the draft row (`[vocab] float32`).
    /// If the residual mass is zero or below the smallest normal f32 (only possible through round-off: the
    /// residual mass equals the rejection probability `1 - sum min(p, q)`, so a true zero means the rejection
    /// that led here has probability 0), sample from `p` instead; this changes the output distribution by at most
    /// that (round-off sized) rejection probability.
    ///
    /// `q` is checked first: a value outside [0, 1] (or NaN) is not a probability, and a negative one would put
    /// residual mass on tokens the target cannot produce (`p = 0`), so it is an error, not a sample. With `q`
    /// valid the residual is 0 wherever `p` is, so a sparse row computes it over its kept tokens only.
    ///
    /// Errors: [`SpecError::NonFinite`] (`what = "draft probability"`) for a NaN / inf value of `q`,
    /// [`SpecError::Config`] for a finite value outside [0, 1]; `row` (the draft row index) goes into both.
    pub(crate) fn sample_residual(&mut self, q: &[f32], row: usize, u: f64) -> Result<u32> {
        if !q_all_in_range(q) {
            return Err(bad_q_error(q, row));
        }
        if self.fault == Some(Fault::ResidualFromDraft) {
            let q_total: f64 = q.iter().map(|&x| f64::from(x)).sum();
            return Ok(inverse_cdf(q, 0.0, q_total, u));
        }
        #[allow(clippy::cast_possible_truncation)]
        let inv = (1.0 / self.total) as f32;
        if self.sparse {
            self.rw.clear();
            let mut r_total = 0.0f64;
            for (&i, &wv) in self.kidx.iter().zip(&self.kw) {
                let d = wv * inv - q[i as usize];
                let r = if d > 0.0 { d } else { 0.0 };
                self.rw.push(r);
                r_total += f64::from(r);
            }
            if r_total < f64::from(f32::MIN_POSITIVE) {
                return Ok(self.sample_processed(u));
            }
            return Ok(inverse_cdf_sparse(
                &self.kidx,
                &self.rw,
                r_total,
                u,
                u32::MAX,
            ));
        }
        let r_total = residual_into(&self.w, self.threshold, inv, q, &mut self.resid);
        if r_total < f64::from(f32::MIN_POSITIVE) {
            return Ok(self.sample_processed(u));
        }
        Ok(inverse_cdf(&self.resid, 0.0, r_total, u))
    }

    /// After [`Sampler::process`]: sample from the processed row with `token` removed, renormalised (the residual of
    /// a point-mass draft, `norm(max(0, p - onehot(token)))`). Falls back to `p` when the remaining mass is
    /// round-off sized, as [`Sampler::sample_residual`].
    pub(crate) fn sample_excluding(&mut self, token: u32, u: f64) -> u32 {
        let wt = if self.sparse {
            self.sparse_pos(token)
                .map_or(0.0, |i| f64::from(self.kw[i]))
        } else {
            let t = token as usize;
            if self.w[t] >= self.threshold {
                f64::from(self.w[t])
            } else {
                0.0
            }
        };
        let rest = self.total - wt;
        if rest < self.total * f64::from(f32::EPSILON) * 1e-3 || rest <= 0.0 {
            return self.sample_processed(u);
        }
        if self.sparse {
            return inverse_cdf_sparse(&self.kidx, &self.kw, rest, u, token);
        }
        let t = token as usize;
        let saved = self.w[t];
        self.w[t] = 0.0;
        let tok = inverse_cdf(&self.w, self.threshold, rest, u);
        self.w[t] = saved;
        tok
    }
}

/// Borrowed scratch of the sparse path of [`Sampler::process`] (the logits may live in the sampler too).
struct SparseScratch<'a> {
    bmax: &'a [f32],
    kidx: &'a mut Vec<u32>,
    kw: &'a mut Vec<f32>,
    cand: &'a mut Vec<f32>,
}

impl SparseScratch<'_> {
    /// The sparse path of [`Sampler::process`]: collect the candidate tokens (weight >= `e^-level`, from the blocks
    /// whose max can reach it), apply top-p / min-p on them, keep the survivors. Returns `None` when
    /// no level gives a usable candidate set (too many candidates, or top-p mass not reached): process densely.
    #[allow(clippy::too_many_arguments)]
    fn run(
        self,
        x: &[f32],
        m: f32,
        inv_t: f32,
        kth: f32,
        total: f64,
        params: &SamplingParams,
        levels: &[f32],
    ) -> Option<(f32, f64)> {
        let target = f64::from(params.top_p) * total;
        for &level in levels {
            let lo = -level;
            self.kidx.clear();
            self.kw.clear();
            let mut mass = 0.0f64;
            let mut too_many = false;
            for (b, &bm) in self.bmax[..n_blocks(x.len())].iter().enumerate() {
                if !((bm - m) * inv_t >= lo && bm >= kth) {
                    continue;
                }
                let start = b * MAX_BLOCK;
                let end = (start + MAX_BLOCK).min(x.len());
                // 16 values at a time: scan one by one only a chunk whose max can be a candidate (the test is
                // monotone in x, so it holds for some value iff it holds for the chunk max).
                for (ci, c) in x[start..end].chunks(16).enumerate() {
                    let cm = c
                        .iter()
                        .fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a });
                    if !((cm - m) * inv_t >= lo && cm >= kth) {
                        continue;
                    }
                    for (j, &xv) in c.iter().enumerate() {
                        if (xv - m) * inv_t >= lo && xv >= kth {
                            let wv = weight(xv, m, inv_t, kth);
                            if wv > 0.0 {
                                #[allow(clippy::cast_possible_truncation)]
                                self.kidx.push((start + ci * 16 + j) as u32);
                                self.kw.push(wv);
                                mass += f64::from(wv);
                            }
                        }
                    }
                }
                if self.kidx.len() > MAX_CAND {
                    too_many = true;
                    break;
                }
            }
            if too_many {
                return None;
            }
            let mut thr = 0.0f32;
            let mut kept_total = mass;
            if params.top_p < 1.0 {
                // Every token at least as likely as the weakest candidate is a candidate, so once the candidates
                // hold `target` mass the nucleus lies inside them.
                if self.kidx.is_empty() || mass < target {
                    continue;
                }
                self.cand.clear();
                self.cand.extend_from_slice(self.kw);
                thr = weighted_select(self.cand, target);
            }
            if params.min_p > 0.0 && params.min_p > thr {
                thr = params.min_p;
            }
            if thr > 0.0 {
                // Keep the candidates >= thr (in place, ids stay ascending).
                let mut n = 0;
                kept_total = 0.0;
                for i in 0..self.kidx.len() {
                    let wv = self.kw[i];
                    if wv >= thr {
                        self.kidx[n] = self.kidx[i];
                        self.kw[n] = wv;
                        kept_total += f64::from(wv);
                        n += 1;
                    }
                }
                self.kidx.truncate(n);
                self.kw.truncate(n);
            }
            if self.kidx.is_empty() {
                return None;
            }
            return Some((thr, kept_total));
        }
        None
    }
}

/// The k-th largest value of `x` (k >= 1, k < len) via a size-k min-heap in `heap` (reused).
fn kth_largest(x: &[f32], k: usize, heap: &mut Vec<f32>) -> f32 {
    heap.clear();
    heap.extend_from_slice(&x[..k]);
    // Heapify (min-heap).
    for i in (0..k / 2).rev() {
        sift_down(heap, i);
    }
    for &v in &x[k..] {
        if v > heap[0] {
            heap[0] = v;
            sift_down(heap, 0);
        }
    }
    heap[0]
}

fn sift_down(h: &mut [f32], mut i: usize) {
    let n = h.len();
    loop {
        let l = 2 * i + 1;
        if l >= n {
            return;
        }
        let r = l + 1;
        let c = if r < n && h[r] < h[l] { r } else { l };
        if h[c] < h[i] {
            h.swap(c, i);
            i = c;
        } else {
            return;
        }
    }
}

/// Lanes and block size of the summing loops: f32 lane accumulators over a block of `SUM_BLOCK` values (16 per
/// lane, relative rounding <= 16 * 2^-24, the precision of the f32 weights themselves), then added into f64 lane
/// accumulators, summed at the end. Mixing f64 into the inner loop stops it from vectorising (measured 3.5x
/// slower). 64 lanes keep four AVX-512 (eight AVX2) exponential chains in flight.
const SUM_LANES: usize = 64;
const SUM_BLOCK: usize = 16 * SUM_LANES;

/// Map `f(a[i], b[i]) -> v` (into `out` when `WRITE`) blockwise and return the (f32 lanes, f64 blocks) sum of `v`.
/// The sum does not depend on `WRITE`.
#[inline(always)]
fn map_sum<const WRITE: bool>(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    f: impl Fn(f32, f32) -> f32,
) -> f64 {
    let mut acc64 = [0f64; SUM_LANES];
    let mut rest64 = 0f64;
    for (bi, (ab, bb)) in a.chunks(SUM_BLOCK).zip(b.chunks(SUM_BLOCK)).enumerate() {
        let mut acc = [0f32; SUM_LANES];
        let ac = ab.chunks_exact(SUM_LANES);
        let ar = ac.remainder();
        let bc = bb.chunks_exact(SUM_LANES);
        let br = bc.remainder();
        let ob: &mut [f32] = if WRITE {
            &mut out[bi * SUM_BLOCK..bi * SUM_BLOCK + ab.len()]
        } else {
            &mut []
        };
        if WRITE {
            let mut oc = ob.chunks_exact_mut(SUM_LANES);
            for ((av, bv), ov) in ac.zip(bc).zip(&mut oc) {
                for j in 0..SUM_LANES {
                    let v = f(av[j], bv[j]);
                    ov[j] = v;
                    acc[j] += v;
                }
            }
            let mut rest = 0f32;
            for ((&av, &bv), ov) in ar.iter().zip(br).zip(oc.into_remainder()) {
                let v = f(av, bv);
                *ov = v;
                rest += v;
            }
            for j in 0..SUM_LANES {
                acc64[j] += f64::from(acc[j]);
            }
            rest64 += f64::from(rest);
        } else {
            for (av, bv) in ac.zip(bc) {
                for j in 0..SUM_LANES {
                    acc[j] += f(av[j], bv[j]);
                }
            }
            let mut rest = 0f32;
            for (&av, &bv) in ar.iter().zip(br) {
                rest += f(av, bv);
            }
            for j in 0..SUM_LANES {
                acc64[j] += f64::from(acc[j]);
            }
            rest64 += f64::from(rest);
        }
    }
    acc64.iter().sum::<f64>() + rest64
}

/// The weight of a logit: `x >= kth ? exp((x - m) * inv_t) : 0`.
#[inline(always)]
fn weight(x: f32, m: f32, inv_t: f32, kth: f32) -> f32 {
    let e = exp_nonpos((x - m) * inv_t);
    if x >= kth {
        e
    } else {
        0.0
    }
}

/// `w_i = weight(x_i)`; returns the sum.
#[inline(always)]
fn exp_pass_generic(x: &[f32], m: f32, inv_t: f32, kth: f32, w: &mut [f32]) -> f64 {
    // `b` is unused here; pass `x` twice.
    map_sum::<true>(x, x, w, |xv, _| weight(xv, m, inv_t, kth))
}

/// The sum of `weight(x_i)` (bit-identical to the sum [`exp_pass`] returns), nothing written.
#[inline(always)]
fn exp_total_generic(x: &[f32], m: f32, inv_t: f32, kth: f32) -> f64 {
    map_sum::<false>(x, x, &mut [], |xv, _| weight(xv, m, inv_t, kth))
}

/// f64 sum of the weights >= `thr` (blockwise as [`map_sum`], no output).
#[inline(always)]
fn masked_sum_generic(w: &[f32], thr: f32) -> f64 {
    map_sum::<false>(w, w, &mut [], |wv, _| if wv >= thr { wv } else { 0.0 })
}

/// `out_i = (w_i >= thr ? w_i : 0) * inv`; returns the sum of `out`.
#[inline(always)]
fn normalise_into_generic(w: &[f32], thr: f32, inv: f32, out: &mut [f32]) -> f64 {
    map_sum::<true>(w, w, out, |wv, _| if wv >= thr { wv * inv } else { 0.0 })
}

/// True for a valid probability value (false for NaN).
fn q_in_range(v: f32) -> bool {
    (0.0..=1.0).contains(&v)
}

/// True iff every value of `q` is a probability in [0, 1] (chunked flag reduction, no early exit, so it vectorises).
#[inline(always)]
fn q_all_in_range_generic(q: &[f32]) -> bool {
    let mut bad = [0u32; SUM_LANES];
    let c = q.chunks_exact(SUM_LANES);
    let rest = c.remainder();
    for qs in c {
        for j in 0..SUM_LANES {
            bad[j] |= u32::from(!q_in_range(qs[j]));
        }
    }
    bad.iter().all(|&b| b == 0) && rest.iter().all(|&v| q_in_range(v))
}

/// `r_i = max(0, p_i - q_i)` with `p_i = (w_i >= thr ? w_i : 0) * inv` (f32). Returns the sum of `r`.
#[inline(always)]
fn residual_into_generic(w: &[f32], thr: f32, inv: f32, q: &[f32], r: &mut [f32]) -> f64 {
    map_sum::<true>(w, q, r, |wv, qv| {
        let p = if wv >= thr { wv * inv } else { 0.0 };
        let d = p - qv;
        if d > 0.0 {
            d
        } else {
            0.0
        }
    })
}

dispatch! {
    fn exp_pass(x: &[f32], m: f32, inv_t: f32, kth: f32, w: &mut [f32]) -> f64 = exp_pass_generic;
}
dispatch! {
    fn exp_total(x: &[f32], m: f32, inv_t: f32, kth: f32) -> f64 = exp_total_generic;
}
dispatch! {
    fn masked_sum(w: &[f32], thr: f32) -> f64 = masked_sum_generic;
}
dispatch! {
    fn normalise_into(w: &[f32], thr: f32, inv: f32, out: &mut [f32]) -> f64 = normalise_into_generic;
}
dispatch! {
    fn q_all_in_range(q: &[f32]) -> bool = q_all_in_range_generic;
}
dispatch! {
    fn residual_into(w: &[f32], thr: f32, inv: f32, q: &[f32], r: &mut [f32]) -> f64 = residual_into_generic;
}

/// The first out-of-range value of a draft row as an error (`row` = the draft row index).
fn bad_q_error(q: &[f32], row: usize) -> SpecError {
    let (token, &v) = q
        .iter()
        .enumerate()
        .find(|(_, v)| !q_in_range(**v))
        .unwrap_or((0, &f32::NAN));
    if v.is_finite() {
        SpecError::Config(format!(
            "draft_probs[{row}, {token}] = {v} is invalid (expected 0 <= q <= 1: each draft row is the \
             distribution its token was drawn from)"
        ))
    } else {
        SpecError::NonFinite {
            row,
            token,
            value: format!("{v}"),
            what: "draft probability".to_owned(),
        }
    }
}

/// Inverse CDF over a sparse row (`idx` ascending, `w` its weights, all other weights 0): the first token whose
/// sequential f64 running sum exceeds `u * total`, skipping `skip` (a token id, or `u32::MAX` for none). Never a
/// zero weight; if round-off leaves the target unreached, the last non-zero one.
fn inverse_cdf_sparse(idx: &[u32], w: &[f32], total: f64, u: f64, skip: u32) -> u32 {
    let target = u * total;
    let mut acc = 0.0f64;
    let mut last = idx.first().copied().unwrap_or(0);
    for (&i, &v) in idx.iter().zip(w) {
        if i == skip || v <= 0.0 {
            continue;
        }
        acc += f64::from(v);
        last = i;
        if acc > target {
            return i;
        }
    }
    last
}

/// Top-p threshold: returns `(threshold, kept_total)` for weights `w` with f64 total `total`.
fn nucleus(w: &[f32], total: f64, top_p: f64, cand: &mut Vec<f32>) -> (f32, f64) {
    let target = top_p * total;
    let mut mass = 0.0f64;
    for level in NUCLEUS_LEVELS {
        #[allow(clippy::cast_possible_truncation)]
        let tau = (total * level) as f32;
        cand.clear();
        mass = 0.0;
        for &x in w {
            if x >= tau && x > 0.0 {
                cand.push(x);
                mass += f64::from(x);
            }
        }
        // All tokens at least as likely as the weakest candidate are candidates, so once the candidates hold
        // `target` mass the nucleus lies inside them.
        if mass >= target {
            break;
        }
    }
    if cand.is_empty() || mass < target {
        // Round-off: the full set holds slightly less than top_p * total. Keep everything.
        return (0.0, total);
    }
    let v = weighted_select(cand, target);
    let kept: f64 = cand
        .iter()
        .filter(|&&x| x >= v)
        .map(|&x| f64::from(x))
        .sum();
    (v, kept)
}

/// The value at which the descending cumulative sum of `s` first reaches `target` (weighted quickselect with
/// `select_nth_unstable_by`; average O(len)). `s` is non-empty; it is reordered.
fn weighted_select(s: &mut [f32], mut target: f64) -> f32 {
    let mut lo = 0usize;
    let mut hi = s.len();
    while hi - lo > 1 {
        let part = &mut s[lo..hi];
        let mid = (part.len() - 1) / 2;
        part.select_nth_unstable_by(mid, |a, b| b.total_cmp(a));
        let upper: f64 = part[..=mid].iter().map(|&x| f64::from(x)).sum();
        if upper >= target {
            hi = lo + mid + 1;
        } else {
            target -= upper;
            lo += mid + 1;
        }
    }
    s[lo]
}

/// First index whose running f64 sum of kept weights (`w_i >= thr`) exceeds `u * total`. Chunked: a chunk is
/// scanned element by element only when its sum crosses the target. Never returns a zero-weight token; if round-off
/// leaves the target unreached, returns the last kept token.
#[inline(always)]
fn inverse_cdf_generic(w: &[f32], thr: f32, total: f64, u: f64) -> u32 {
    const L: usize = 64;
    let target = u * total;
    let mut acc = 0.0f64;
    for (ci, c) in w.chunks(L).enumerate() {
        let mut cs = [0f64; 4];
        let quads = c.chunks_exact(4);
        let qrest = quads.remainder();
        for q in quads {
            for j in 0..4 {
                cs[j] += f64::from(if q[j] >= thr { q[j] } else { 0.0 });
            }
        }
        let mut csum = cs[0] + cs[1] + cs[2] + cs[3];
        for &v in qrest {
            csum += f64::from(if v >= thr { v } else { 0.0 });
        }
        if acc + csum > target {
            for (j, &v) in c.iter().enumerate() {
                let v = if v >= thr { v } else { 0.0 };
                acc += f64::from(v);
                if acc > target && v > 0.0 {
                    #[allow(clippy::cast_possible_truncation)]
                    return (ci * L + j) as u32;
                }
            }
        } else {
            acc += csum;
        }
    }
    let last = w.iter().rposition(|&v| v >= thr && v > 0.0).unwrap_or(0);
    #[allow(clippy::cast_possible_truncation)]
    let last = last as u32;
    last
}

dispatch! {
    fn inverse_cdf(w: &[f32], thr: f32, total: f64, u: f64) -> u32 = inverse_cdf_generic;
}

#[cfg(test)]
mod tests {
    #[test]
    fn top_logprobs_are_the_log_softmax_of_the_k_largest_first_argmax_first() {
        let row = [1.0_f32, 3.0, 3.0, 0.0, -2.0];
        let top = top_logprobs(&row, 3, 0).unwrap();
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 2, 0]);
        let mut greedy = Vec::new();
        argmax_rows(&row, row.len(), &mut greedy).unwrap();
        assert_eq!(greedy[0], ids[0]);
        for &(id, lp) in &top {
            assert!((lp - log_softmax_at(&row, id, 0).unwrap()).abs() < 1e-6);
        }
        // k beyond the row, and k = 0.
        assert_eq!(top_logprobs(&row, 9, 0).unwrap().len(), 5);
        assert!(top_logprobs(&row, 0, 0).unwrap().is_empty());
        assert!(top_logprobs(&[f32::NAN, 1.0], 1, 4).is_err());
    }

    use super::*;

    fn probs(logits: &[f32], params: &SamplingParams, ctx: Option<&PenaltyContext>) -> Vec<f32> {
        let mut s = Sampler::new(logits.len());
        s.process(logits, 0, params, ctx).unwrap();
        let mut out = vec![0.0; logits.len()];
        s.write_probs(&mut out).unwrap();
        out
    }

    fn softmax(x: &[f64]) -> Vec<f64> {
        let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    #[test]
    fn fast_exp_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let got = f64::from(exp_nonpos(x));
            let want = f64::from(x).exp();
            worst = worst.max((got - want).abs() / want);
            x += 0.001_3;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpos(-90.0), 0.0);
    }

    #[test]
    fn plain_softmax_matches_f64() {
        let logits = [1.0f32, 2.0, 3.0, -1.0, 0.5];
        let p = probs(&logits, &SamplingParams::default(), None);
        let want = softmax(&logits.map(f64::from));
        for (a, b) in p.iter().zip(&want) {
            assert!((f64::from(*a) - b).abs() < 1e-6);
        }
    }

    #[test]
    fn top_k_keeps_ties_at_boundary() {
        let logits = [1.0f32, 3.0, 2.0, 2.0, 0.0];
        let params = SamplingParams {
            top_k: 2,
            ..SamplingParams::default()
        };
        let p = probs(&logits, &params, None);
        // 2nd largest logit is 2.0, tied: tokens 1, 2, 3 kept.
        assert_eq!(p[0], 0.0);
        assert_eq!(p[4], 0.0);
        assert!(p[1] > 0.0 && p[2] > 0.0 && p[3] > 0.0);
    }

    #[test]
    fn top_p_walks_descending_until_mass_reached() {
        // p = [0.5, 0.3, 0.15, 0.05] (as logits of the probabilities).
        let logits = [0.5f32, 0.3, 0.15, 0.05].map(f32::ln);
        for (top_p, kept) in [
            (0.45f32, 1usize),
            (0.6, 2),
            (0.75, 2),
            (0.85, 3),
            (0.9, 3),
            (0.97, 4),
        ] {
            let params = SamplingParams {
                top_p,
                ..SamplingParams::default()
            };
            let p = probs(&logits, &params, None);
            let n = p.iter().filter(|&&v| v > 0.0).count();
            assert_eq!(n, kept, "top_p {top_p}: {p:?}");
        }
    }

    #[test]
    fn top_p_on_large_flat_vocab_uses_fallback_levels() {
        let logits = vec![0.0f32; 100_000];
        let params = SamplingParams {
            top_p: 0.5,
            ..SamplingParams::default()
        };
        let p = probs(&logits, &params, None);
        // Every token tied: all are kept.
        assert!(p.iter().all(|&v| v > 0.0));
    }

    #[test]
    fn min_p_threshold_is_relative_to_top() {
        let logits = [0.5f32, 0.3, 0.15, 0.05].map(f32::ln);
        let params = SamplingParams {
            min_p: 0.3,
            ..SamplingParams::default()
        };
        let p = probs(&logits, &params, None);
        // Threshold 0.3 * 0.5 = 0.15: tokens 0..=2 kept.
        assert!(p[2] > 0.0 && p[3] == 0.0);
    }

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

    #[test]
    fn non_finite_logits_are_reported_with_position() {
        let mut s = Sampler::new(40);
        let mut row = vec![0.0f32; 40];
        row[33] = f32::NAN;
        let e = s
            .process(&row, 3, &SamplingParams::default(), None)
            .unwrap_err();
        assert!(
            matches!(
                e,
                SpecError::NonFinite {
                    row: 3,
                    token: 33,
                    ..
                }
            ),
            "{e}"
        );
        row[33] = f32::INFINITY;
        let e = s
            .process(&row, 1, &SamplingParams::default(), None)
            .unwrap_err();
        assert!(
            matches!(e, SpecError::NonFinite { row: 1, token: 33, ref what, .. } if what == "+inf")
        );
        let row = vec![f32::NEG_INFINITY; 40];
        let e = s
            .process(&row, 0, &SamplingParams::default(), None)
            .unwrap_err();
        assert!(matches!(e, SpecError::NonFinite { ref what, .. } if what == "all -inf"));
    }

    #[test]
    fn validate_names_value_and_range() {
        let bad = [
            (
                "temperature",
                SamplingParams {
                    temperature: -1.0,
                    ..SamplingParams::default()
                },
            ),
            (
                "top_p",
                SamplingParams {
                    top_p: 0.0,
                    ..SamplingParams::default()
                },
            ),
            (
                "top_p",
                SamplingParams {
                    top_p: 1.5,
                    ..SamplingParams::default()
                },
            ),
            (
                "min_p",
                SamplingParams {
                    min_p: -0.1,
                    ..SamplingParams::default()
                },
            ),
            (
                "repetition_penalty",
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..SamplingParams::default()
                },
            ),
            (
                "frequency_penalty",
                SamplingParams {
                    frequency_penalty: f32::NAN,
                    ..SamplingParams::default()
                },
            ),
            (
                "presence_penalty",
                SamplingParams {
                    presence_penalty: f32::INFINITY,
                    ..SamplingParams::default()
                },
            ),
        ];
        for (field, p) in bad {
            let e = p.validate().unwrap_err();
            // The error names its setting (the field the message starts with).
            assert_eq!(e.field(), Some(field), "{e}");
            assert!(
                matches!(e, SpecError::Setting { ref message, .. }
                    if message.contains("expected") && message.starts_with(&format!("{field} "))),
                "{e}"
            );
        }
        SamplingParams::default().validate().unwrap();
        SamplingParams::greedy().validate().unwrap();
    }

    #[test]
    fn inverse_cdf_never_returns_zero_weight() {
        let w = [0.0f32, 1.0, 0.0, 2.0, 0.0];
        assert_eq!(inverse_cdf(&w, 0.0, 3.0, 0.0), 1);
        assert_eq!(inverse_cdf(&w, 0.0, 3.0, 0.34), 3);
        assert_eq!(inverse_cdf(&w, 0.0, 3.0, 0.999_999_999), 3);
        // Round-off beyond the total: last kept token.
        assert_eq!(inverse_cdf(&w, 0.0, 3.1, 0.999_999), 3);
    }

    #[test]
    fn log_softmax_matches_f64() {
        let logits = [1.0f32, 2.0, 3.0];
        let want = softmax(&[1.0, 2.0, 3.0])[1].ln();
        let got = log_softmax_at(&logits, 1, 0).unwrap();
        assert!((f64::from(got) - want).abs() < 1e-6);
    }
}
