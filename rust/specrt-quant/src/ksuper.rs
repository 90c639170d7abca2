//! One K-quant super-block (Q4_K, Q5_K, Q6_K: 256 weights) decoded into the terms the kernels compute with: an
//! unsigned code per weight, an integer scale per sub-block, the float16 scales, the integer mins. The portable
//! path computes from these terms and [`crate::packed`] lays them out for the SIMD paths, so both read a block one
//! way (checked against gguf-py's dequantization by the tests).

use crate::dequant::q6k_codes;
use crate::format::{scales_mins_k4, GgmlType};
use crate::packed::block_offset;

/// A decoded K-quant super-block: weight `e` is `d * scales[e / sub_len] * (codes[e] - offset) - dmin * mins[e / 32]`
/// (`offset` 32 for Q6_K, else 0; no mins for Q6_K).
#[derive(Debug, Clone, Copy)]
pub(crate) struct KSuper {
    /// Unsigned codes: 0..16 (Q4_K), 0..32 (Q5_K), 0..64 (Q6_K).
    pub codes: [u8; 256],
    /// Sub-block scales: 8 unsigned 6-bit (Q4_K / Q5_K; the last 8 entries 0), 16 signed 8-bit (Q6_K).
    pub scales: [i32; 16],
    /// Weights per sub-block: 32, or 16 for Q6_K.
    pub sub_len: usize,
    /// The float16 bits of `d`.
    pub d: u16,
    /// The float16 bits of `dmin` and the eight 6-bit mins (Q4_K / Q5_K).
    pub mins: Option<(u16, [i32; 8])>,
}

impl KSuper {
    /// Sub-blocks per super-block (8 or 16).
    pub fn sub_blocks(&self) -> usize {
        256 / self.sub_len
    }

    /// Whether the codes carry Q6_K's offset of 32.
    pub fn has_offset(&self) -> bool {
        self.mins.is_none()
    }
}

fn f16_bits(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

/// Decode super-block `blk` (`ty.block_bytes()` bytes) of K-quant `ty`.
///
/// # Panics
/// When `ty` is not a K-quant (callers dispatch on the type first).
pub(crate) fn decode(ty: GgmlType, blk: &[u8]) -> KSuper {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (sc, mn) = scales_mins_k4(&blk[4..16]);
            let (qh, qs) = if ty == GgmlType::Q5_K {
                (Some(&blk[16..48]), &blk[48..176])
            } else {
                (None, &blk[16..144])
            };
            // sub-block j, weight l: nibble j % 2 of qs[32 (j / 2) + l], plus bit j of qh[l] (Q5_K); in loops the
            // compiler vectorizes (the load-time repack decodes every super-block of the model)
            let mut codes = [0u8; 256];
            for (pair, (q, out)) in qs
                .chunks_exact(32)
                .zip(codes.chunks_exact_mut(64))
                .enumerate()
            {
                let (lo, hi) = out.split_at_mut(32);
                for l in 0..32 {
                    lo[l] = q[l] & 0xF;
                    hi[l] = q[l] >> 4;
                }
                if let Some(qh) = qh {
                    for l in 0..32 {
                        lo[l] |= ((qh[l] >> (2 * pair)) & 1) << 4;
                        hi[l] |= ((qh[l] >> (2 * pair + 1)) & 1) << 4;
                    }
                }
            }
            KSuper {
                codes,
                scales: std::array::from_fn(|j| if j < 8 { i32::from(sc[j]) } else { 0 }),
                sub_len: 32,
                d: f16_bits(blk),
                mins: Some((
                    f16_bits(&blk[2..]),
                    std::array::from_fn(|j| i32::from(mn[j])),
                )),
            }
        }
        GgmlType::Q6_K => {
            let mut codes = [0u8; 256];
            for half in 0..2 {
                let ql = &blk[64 * half..64 * half + 64];
                let qh = &blk[128 + 32 * half..128 + 32 * half + 32];
                for l in 0..32 {
                    for (t, q) in q6k_codes(ql, qh, l).into_iter().enumerate() {
                        codes[128 * half + 32 * t + l] = q;
                    }
                }
            }
            KSuper {
                codes,
                scales: std::array::from_fn(|k| i32::from(blk[192 + k] as i8)),
                sub_len: 16,
                d: f16_bits(&blk[208..]),
                mins: None,
            }
        }
        _ => panic!("{} is not a K-quant", ty.name()),
    }
}

/// A decoded block of a 32-long format (Q4_0, Q4_1, Q5_0, Q8_0): weight `e` is `d * (codes[e] - offset) + m`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KBlock {
    /// Unsigned codes: 0..16 (Q4_0, Q4_1), 0..32 (Q5_0), `q + 128` (Q8_0's signed `q`).
    pub codes: [u8; 32],
    /// The codes' offset: 8 (Q4_0), 16 (Q5_0), 128 (Q8_0), 0 (Q4_1).
    pub offset: i32,
    /// The float16 bits of `d`.
    pub d: u16,
    /// The float16 bits of Q4_1's `m`.
    pub m: Option<u16>,
}

/// Decode block `blk` (`ty.block_bytes()` bytes) of 32-long format `ty`.
///
/// # Panics
/// When `ty` is a K-quant (callers dispatch on the type first).
pub(crate) fn decode32(ty: GgmlType, blk: &[u8]) -> KBlock {
    let nibbles = |qs: &[u8], e: usize| if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 };
    let d = f16_bits(blk);
    match ty {
        GgmlType::Q4_0 => KBlock {
            codes: std::array::from_fn(|e| nibbles(&blk[2..18], e)),
            offset: block_offset(ty),
            d,
            m: None,
        },
        GgmlType::Q4_1 => KBlock {
            codes: std::array::from_fn(|e| nibbles(&blk[4..20], e)),
            offset: block_offset(ty),
            d,
            m: Some(f16_bits(&blk[2..])),
        },
        GgmlType::Q5_0 => {
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            KBlock {
                codes: std::array::from_fn(|e| {
                    nibbles(&blk[6..22], e) | ((((qh >> e) & 1) as u8) << 4)
                }),
                offset: block_offset(ty),
                d,
                m: None,
            }
        }
        GgmlType::Q8_0 => KBlock {
            codes: std::array::from_fn(|e| blk[2 + e] ^ 0x80),
            offset: block_offset(ty),
            d,
            m: None,
        },
        _ => panic!("{} is a K-quant", ty.name()),
    }
}
