//! Coupled sampling: the random choice at each output position is fixed by `(seed, position)` alone.
//!
//! Each output position `t` (the token's 0-based index in the whole sequence, prompt included) has its own noise
//! `u_{t,i}` in (0, 1] for every token id `i`, a pure function of `(seed, t, i)`. The token chosen from a processed
//! distribution `w` (weights, any positive scale) is the winner of an **exponential race**:
//!
//! ```text
//! x_t = argmin_i E_{t,i} / w_i   over w_i > 0,   E_{t,i} = -ln u_{t,i} ~ Exp(1) i.i.d.
//! ```
//!
//! `E_i / w_i ~ Exp(w_i)` independently, so `P(x_t = i) = w_i / sum_j w_j`: an exact sample of the processed
//! distribution. It is the Gumbel-max trick (`argmax_i log w_i + G_i` with `G_i = -ln E_i` standard Gumbel), written
//! without the second logarithm. Because the noise depends only on `(seed, t, i)`, target-only decoding and
//! speculative decoding make the same choice at every position: drafts proposed with the same noise from `q` are
//! accepted while they equal the target's choice, so the output equals target-only coupled decoding token for token,
//! for every K, draft model or n-gram proposer (and is still an exact sample of `p` at each position).
//!
//! The cost is acceptance: `P(argmin E/q = argmin E/p)` is below the `sum_i min(p_i, q_i)` of modified rejection
//! sampling (it is at least `(1 - d) / (1 + d)` for total-variation distance `d`).
//!
//! Noise: SplitMix64 (Steele, Lea and Flood 2014, "Fast splittable pseudorandom number generators") evaluated at the
//! counter `(t << 32) | i` of a stream keyed by the seed; `u = ((z >> 11) + 1) * 2^-53`. The NumPy twin is
//! `specrt.reference_sampling.coupled_uniforms` / `coupled_choice`.

/// SplitMix64's increment (the golden gamma).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
const TWO_POW_M53: f64 = 1.0 / (1u64 << 53) as f64;
/// Margin of the cheap rejection test: `exp(-x) >= 1 - x` is exact math, and the f64 rounding of `1 - r w` is far
/// below this, so a token is skipped only when it provably cannot win.
const SKIP_MARGIN: f64 = 1e-12;

#[inline]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The per-position noise of one request: a pure function of the seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoupledNoise {
    key: u64,
}

impl CoupledNoise {
    /// The noise of `seed` (the request's seed).
    #[must_use]
    pub fn new(seed: u64) -> Self {
        // Key = first SplitMix64 output of the seed, so nearby seeds give unrelated streams.
        Self {
            key: mix64(seed.wrapping_add(GAMMA)),
        }
    }

    /// `u_{position, token}` in (0, 1]: SplitMix64 at counter `(position << 32) | token`.
    #[inline]
    #[must_use]
    pub fn uniform(&self, position: u64, token: u32) -> f64 {
        let counter = (position << 32) | u64::from(token);
        let z = mix64(
            self.key
                .wrapping_add(counter.wrapping_add(1).wrapping_mul(GAMMA)),
        );
        #[allow(clippy::cast_precision_loss)] // < 2^53: exact
        let top = ((z >> 11) + 1) as f64;
        top * TWO_POW_M53
    }
}

/// Running winner of an exponential race at one position (see the module docs). Feed tokens in ascending id order;
/// ties (probability ~2^-53) go to the lowest id.
#[derive(Clone, Copy, Debug)]
pub struct Race {
    position: u64,
    best: u32,
    // E_best / w_best; +inf before the first token.
    ratio: f64,
}

impl Race {
    /// An empty race at output position `position`.
    #[must_use]
    pub fn new(position: u64) -> Self {
        Self {
            position,
            best: u32::MAX,
            ratio: f64::INFINITY,
        }
    }

    /// Offer token `token` with weight `w` (> 0; zero weights must not be offered).
    ///
    /// Cheap for tokens that cannot win: `E / w < r` needs `u > exp(-r w) >= 1 - r w`, so the logarithm is
    /// computed only when `u > 1 - r w` (rarely, once a large weight has been seen).
    #[inline]
    pub fn offer(&mut self, noise: &CoupledNoise, token: u32, w: f64) {
        let u = noise.uniform(self.position, token);
        if u + SKIP_MARGIN <= 1.0 - self.ratio * w {
            return;
        }
        let ratio = -u.ln() / w;
        if ratio < self.ratio {
            self.ratio = ratio;
            self.best = token;
        }
    }

    /// The winner, or `None` if no token was offered.
    #[must_use]
    pub fn winner(&self) -> Option<u32> {
        (self.best != u32::MAX).then_some(self.best)
    }
}

/// The coupled choice from a dense row of weights (`[vocab]`, non-negative, any scale): [`Race`] over `w_i > 0`.
/// `None` if every weight is zero.
#[must_use]
pub fn choose(noise: &CoupledNoise, position: u64, weights: &[f32]) -> Option<u32> {
    let mut race = Race::new(position);
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            #[allow(clippy::cast_possible_truncation)] // vocab < 2^32
            race.offer(noise, i as u32, f64::from(w));
        }
    }
    race.winner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniforms_are_in_the_unit_interval_and_depend_on_seed_position_and_token() {
        let a = CoupledNoise::new(1);
        let b = CoupledNoise::new(2);
        let mut sum = 0.0;
        let n = 100_000u32;
        for i in 0..n {
            let u = a.uniform(7, i);
            assert!(u > 0.0 && u <= 1.0);
            sum += u;
        }
        // Mean of n uniforms: sd = sqrt(1/12 / n) ~ 9.1e-4; 6 sd.
        assert!((sum / f64::from(n) - 0.5).abs() < 6.0 * (1.0 / 12.0 / f64::from(n)).sqrt());
        assert_ne!(a.uniform(7, 3), b.uniform(7, 3));
        assert_ne!(a.uniform(7, 3), a.uniform(8, 3));
        assert_ne!(a.uniform(7, 3), a.uniform(7, 4));
        assert_eq!(a.uniform(7, 3), CoupledNoise::new(1).uniform(7, 3));
    }

    #[test]
    fn pruned_race_equals_the_plain_argmin() {
        let noise = CoupledNoise::new(99);
        let mut w = vec![0.0f32; 512];
        for (i, x) in w.iter_mut().enumerate() {
            *x = if i % 7 == 0 {
                0.0
            } else {
                ((i * 37 % 101) as f32 / 10.0).exp() * 1e-3
            };
        }
        for position in 0..300 {
            let plain = w
                .iter()
                .enumerate()
                .filter(|(_, &x)| x > 0.0)
                .map(|(i, &x)| {
                    (
                        i as u32,
                        -noise.uniform(position, i as u32).ln() / f64::from(x),
                    )
                })
                .fold(
                    (u32::MAX, f64::INFINITY),
                    |b, c| if c.1 < b.1 { c } else { b },
                )
                .0;
            assert_eq!(
                choose(&noise, position, &w),
                Some(plain),
                "position {position}"
            );
        }
        assert_eq!(choose(&noise, 0, &[0.0, 0.0]), None);
    }

    #[test]
    fn choices_follow_the_distribution() {
        // p = [0.5, 0.3, 0.15, 0.05] (unnormalised weights x 2): frequencies over 40,000 positions within 5 sd.
        let w = [1.0f32, 0.6, 0.3, 0.1];
        let p = [0.5, 0.3, 0.15, 0.05];
        let noise = CoupledNoise::new(5);
        let n = 40_000u64;
        let mut counts = [0u64; 4];
        for t in 0..n {
            counts[choose(&noise, t, &w).unwrap() as usize] += 1;
        }
        for (c, p) in counts.iter().zip(p) {
            #[allow(clippy::cast_precision_loss)]
            let (f, nf) = (*c as f64 / n as f64, n as f64);
            assert!(
                (f - p).abs() < 5.0 * (p * (1.0 - p) / nf).sqrt(),
                "{counts:?}"
            );
        }
    }
}
