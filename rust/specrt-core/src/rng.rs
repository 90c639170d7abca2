//! Seeded, per-request random numbers: a wrapper over `rand_pcg::Pcg64` (PCG XSL-RR 128/64) that is the twin of
//! NumPy's `numpy.random.PCG64`.
//!
//! No global state: every sampling entry point takes an explicit [`Rng`]. The `u64 -> f64` conversion is owned here
//! (`(u >> 11) as f64 * 2^-53`, in `[0, 1)`), so `numpy.random.Generator(PCG64).random()` reproduces
//! [`Rng::next_f64`] draw for draw once the NumPy bit generator is given [`Rng::state`]:
//!
//! ```python
//! bg = numpy.random.PCG64()
//! bg.state = {"bit_generator": "PCG64", "state": {"state": s, "inc": inc}, "has_uint32": 0, "uinteger": 0}
//! numpy.random.Generator(bg).random()  # == Rng::next_f64()
//! ```
//!
//! `rand_pcg` has no getters for its internal state, so this wrapper keeps a mirror of the 128-bit LCG state (one
//! extra 128-bit multiply-add per draw, a few per verification round).

use rand_core::Rng as _;
use rand_pcg::Pcg64;

use crate::error::{Result, SpecError};

/// The PCG 128-bit LCG multiplier (same constant as `rand_pcg` and NumPy's `PCG64`).
const PCG_MULTIPLIER: u128 = 0x2360_ED05_1FC6_5DA4_4385_DF64_9FCC_F645;

/// PCG's default stream (`rand_pcg` docs); [`Rng::seed_from_u64`] uses it, so `inc = (stream << 1) | 1`.
pub const DEFAULT_STREAM: u128 = 0x0a02_bdbf_7bb3_c0a7_ac28_fa16_a64a_bf96;

/// Inverse of [`PCG_MULTIPLIER`] modulo 2^128 (Newton iteration; each step doubles the correct low bits).
const PCG_MULTIPLIER_INV: u128 = {
    let mut inv = PCG_MULTIPLIER; // correct to 3 bits: m * m == 1 (mod 8) for odd m
    let mut i = 0;
    while i < 7 {
        inv = inv.wrapping_mul(2u128.wrapping_sub(PCG_MULTIPLIER.wrapping_mul(inv)));
        i += 1;
    }
    inv
};

/// 2^-53: the spacing of the doubles produced by [`Rng::next_f64`].
const TWO_POW_M53: f64 = 1.0 / 9_007_199_254_740_992.0;

/// The full state of the generator: NumPy's `PCG64` `{"state": state, "inc": inc}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PcgState {
    /// The 128-bit LCG state (the next draw steps it once, then outputs XSL-RR of it).
    pub state: u128,
    /// The 128-bit LCG increment (always odd).
    pub inc: u128,
}

/// A per-request PCG64 generator with a NumPy twin. Clone it to checkpoint.
#[derive(Clone, Debug)]
pub struct Rng {
    pcg: Pcg64,
    // Mirror of the internal state of `pcg` (rand_pcg does not expose it).
    mirror: PcgState,
}

/// One step of splitmix64 (Steele, Lea, Flood 2014): spreads a small seed over 64 bits.
fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator from a 64-bit seed.
    ///
    /// Derivation (reproduced by `specrt.reference_sampling.pcg_state_from_seed`): `lo = splitmix64(seed)`,
    /// `hi = splitmix64(...)` (second output), then `rand_pcg::Pcg64::new((hi << 64) | lo, DEFAULT_STREAM)`, i.e.
    /// `inc = (DEFAULT_STREAM << 1) | 1` and `state = ((hi << 64 | lo) + inc) * M + inc (mod 2^128)`.
    #[must_use]
    pub fn seed_from_u64(seed: u64) -> Self {
        let mut sm = seed;
        let lo = splitmix64(&mut sm);
        let hi = splitmix64(&mut sm);
        let init = (u128::from(hi) << 64) | u128::from(lo);
        let inc = (DEFAULT_STREAM << 1) | 1;
        let state = init
            .wrapping_add(inc)
            .wrapping_mul(PCG_MULTIPLIER)
            .wrapping_add(inc);
        Self {
            pcg: Pcg64::new(init, DEFAULT_STREAM),
            mirror: PcgState { state, inc },
        }
    }

    /// A generator at an exact state (e.g. one taken from [`Rng::state`] or from NumPy's `PCG64.state`).
    ///
    /// Errors: [`SpecError::Config`] if `inc` is even (PCG increments are odd).
    pub fn from_state(state: PcgState) -> Result<Self> {
        if state.inc & 1 == 0 {
            return Err(SpecError::Config(format!(
                "PCG64 increment {} is invalid (expected an odd number)",
                state.inc
            )));
        }
        // `Pcg64::new(init, stream)` sets inc = (stream << 1) | 1 and state = (init + inc) * M + inc; invert that.
        let init = state
            .state
            .wrapping_sub(state.inc)
            .wrapping_mul(PCG_MULTIPLIER_INV)
            .wrapping_sub(state.inc);
        Ok(Self {
            pcg: Pcg64::new(init, state.inc >> 1),
            mirror: state,
        })
    }

    /// The current state, for checkpoints and for the NumPy twin (`PCG64.state = {"state": .., "inc": ..}`).
    #[must_use]
    pub fn state(&self) -> PcgState {
        self.mirror
    }

    /// The next raw 64-bit output (NumPy: `PCG64.random_raw()`).
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.mirror.state = self
            .mirror
            .state
            .wrapping_mul(PCG_MULTIPLIER)
            .wrapping_add(self.mirror.inc);
        self.pcg.next_u64()
    }

    /// A uniform double in `[0, 1)`: `(u >> 11) * 2^-53` (NumPy: `Generator(PCG64).random()`).
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        #[allow(clippy::cast_precision_loss)] // < 2^53: exact
        let top = (self.next_u64() >> 11) as f64;
        top * TWO_POW_M53
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PCG XSL-RR output of a state, written out independently of rand_pcg.
    fn xsl_rr(state: u128) -> u64 {
        let rot = (state >> 122) as u32;
        let xored = ((state >> 64) as u64) ^ (state as u64);
        xored.rotate_right(rot)
    }

    #[test]
    fn mirror_state_predicts_every_draw() {
        let mut rng = Rng::seed_from_u64(42);
        for _ in 0..1000 {
            let s = rng.state();
            let next = s.state.wrapping_mul(PCG_MULTIPLIER).wrapping_add(s.inc);
            assert_eq!(rng.next_u64(), xsl_rr(next));
        }
    }

    #[test]
    fn from_state_resumes_the_same_stream() {
        let mut a = Rng::seed_from_u64(7);
        for _ in 0..13 {
            a.next_u64();
        }
        let mut b = Rng::from_state(a.state()).unwrap();
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn multiplier_inverse_is_an_inverse() {
        assert_eq!(PCG_MULTIPLIER.wrapping_mul(PCG_MULTIPLIER_INV), 1);
    }

    #[test]
    fn even_increment_is_rejected() {
        let err = Rng::from_state(PcgState { state: 1, inc: 2 }).unwrap_err();
        assert!(matches!(err, SpecError::Config(m) if m.contains("odd")));
    }

    #[test]
    fn doubles_are_in_unit_interval() {
        let mut rng = Rng::seed_from_u64(0);
        for _ in 0..10_000 {
            let u = rng.next_f64();
            assert!((0.0..1.0).contains(&u));
        }
    }
}
