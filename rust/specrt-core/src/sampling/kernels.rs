//! The row kernels: a branch-free `exp`, block maxima and argmax, log-softmax and top log-probabilities, the
//! weight / sum / normalise / residual passes and the inverse CDF, each compiled for the best x86 vector extension
//! found at run time (`dispatch!`) with bit-identical results at every width.

use crate::error::{Result, SpecError};

/// Logits below `max - 87 * T` get weight 0 (their probability relative to the top token is < e^-87 = 1.6e-38).
const EXP_FLOOR: f32 = -87.0;
/// Candidate thresholds for top-p, as fractions of the total mass: at most 2^10, then 2^16 candidates, then all.
const NUCLEUS_LEVELS: [f64; 3] = [1.0 / 1024.0, 1.0 / 65536.0, 0.0];

/// `e^x` for `x <= 0` (or `-inf`), 0 below [`EXP_FLOOR`]; about 1 ulp (Cephes `expf` polynomial). Branch-free, so
/// loops over it vectorise.
#[inline(always)]
pub(crate) fn exp_nonpos(x: f32) -> f32 {
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
pub(crate) const MAX_BLOCK: usize = 512;

/// Largest candidate set the sparse path keeps (beyond it the row is processed densely).
pub(crate) const MAX_CAND: usize = 16_384;

/// Candidate levels for top-p, as `-ln` of the smallest candidate weight (the top weight is 1): weights
/// >= 2^-10, >= 2^-16, then every non-zero weight.
pub(crate) const NUCLEUS_LOG_LEVELS: [f32; 3] = [6.931_472, 11.090_355, f32::INFINITY];

/// Run a kernel (a plain-Rust function written to auto-vectorise over 16 lanes) compiled for the best x86 vector
/// extension found at run time (AVX-512F, AVX2, else the default SSE2 build). The kernels use no FMA and the same
/// per-lane operation order at every width, so results are bit-identical on every machine.
macro_rules! dispatch {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $generic:ident;) => {
        $(#[$meta])*
        pub(crate) fn $name($($arg: $ty),*) -> $ret {
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
pub(crate) fn max_blocks_generic(x: &[f32], bmax: &mut [f32]) -> (f32, bool) {
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
pub(crate) fn n_blocks(n: usize) -> usize {
    n.div_ceil(MAX_BLOCK)
}

/// The error for a row whose max pass found a NaN / +inf (`bad`) or whose max is -inf (all -inf).
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub(crate) fn nonfinite_error(logits: &[f32], row: usize, bad: bool) -> SpecError {
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
pub(crate) fn checked_max_blocks(logits: &[f32], row: usize, bmax: &mut Vec<f32>) -> Result<f32> {
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
pub(crate) fn argmax_from_blocks(x: &[f32], bmax: &[f32], m: f32) -> u32 {
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

/// The k-th largest value of `x` (k >= 1, k < len) via a size-k min-heap in `heap` (reused).
pub(crate) fn kth_largest(x: &[f32], k: usize, heap: &mut Vec<f32>) -> f32 {
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

pub(crate) fn sift_down(h: &mut [f32], mut i: usize) {
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
pub(crate) const SUM_LANES: usize = 64;
pub(crate) const SUM_BLOCK: usize = 16 * SUM_LANES;

/// Map `f(a[i], b[i]) -> v` (into `out` when `WRITE`) blockwise and return the (f32 lanes, f64 blocks) sum of `v`.
/// The sum does not depend on `WRITE`.
#[inline(always)]
pub(crate) fn map_sum<const WRITE: bool>(
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
pub(crate) fn weight(x: f32, m: f32, inv_t: f32, kth: f32) -> f32 {
    let e = exp_nonpos((x - m) * inv_t);
    if x >= kth {
        e
    } else {
        0.0
    }
}

/// `w_i = weight(x_i)`; returns the sum.
#[inline(always)]
pub(crate) fn exp_pass_generic(x: &[f32], m: f32, inv_t: f32, kth: f32, w: &mut [f32]) -> f64 {
    // `b` is unused here; pass `x` twice.
    map_sum::<true>(x, x, w, |xv, _| weight(xv, m, inv_t, kth))
}

/// The sum of `weight(x_i)` (bit-identical to the sum [`exp_pass`] returns), nothing written.
#[inline(always)]
pub(crate) fn exp_total_generic(x: &[f32], m: f32, inv_t: f32, kth: f32) -> f64 {
    map_sum::<false>(x, x, &mut [], |xv, _| weight(xv, m, inv_t, kth))
}

/// f64 sum of the weights >= `thr` (blockwise as [`map_sum`], no output).
#[inline(always)]
pub(crate) fn masked_sum_generic(w: &[f32], thr: f32) -> f64 {
    map_sum::<false>(w, w, &mut [], |wv, _| if wv >= thr { wv } else { 0.0 })
}

/// `out_i = (w_i >= thr ? w_i : 0) * inv`; returns the sum of `out`.
#[inline(always)]
pub(crate) fn normalise_into_generic(w: &[f32], thr: f32, inv: f32, out: &mut [f32]) -> f64 {
    map_sum::<true>(w, w, out, |wv, _| if wv >= thr { wv * inv } else { 0.0 })
}

/// True for a valid probability value (false for NaN).
pub(crate) fn q_in_range(v: f32) -> bool {
    (0.0..=1.0).contains(&v)
}

/// True iff every value of `q` is a probability in [0, 1] (chunked flag reduction, no early exit, so it vectorises).
#[inline(always)]
pub(crate) fn q_all_in_range_generic(q: &[f32]) -> bool {
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
pub(crate) fn residual_into_generic(
    w: &[f32],
    thr: f32,
    inv: f32,
    q: &[f32],
    r: &mut [f32],
) -> f64 {
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
pub(crate) fn bad_q_error(q: &[f32], row: usize) -> SpecError {
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
pub(crate) fn inverse_cdf_sparse(idx: &[u32], w: &[f32], total: f64, u: f64, skip: u32) -> u32 {
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
pub(crate) fn nucleus(w: &[f32], total: f64, top_p: f64, cand: &mut Vec<f32>) -> (f32, f64) {
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
pub(crate) fn weighted_select(s: &mut [f32], mut target: f64) -> f32 {
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
pub(crate) fn inverse_cdf_generic(w: &[f32], thr: f32, total: f64, u: f64) -> u32 {
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
