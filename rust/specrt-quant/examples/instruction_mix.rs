//! The AVX2 kernel's instruction mix on this core, in isolation: `vpmaddubsw` alone, `vpaddw` alone, and the mixes
//! of broadcast loads, `vpmaddubsw` and `vpaddw` the Q4_K rows run (benches/RESULTS.md, "The GGUF-block operator
//! without libm and iterator calls"). x86-64 with AVX2 only. `cargo run --release -p specrt-quant --example
//! instruction_mix`; ns per iteration of each unrolled block and per its first-named instruction, 3 rounds.
#![allow(clippy::pedantic)]

#[cfg(target_arch = "x86_64")]
use std::arch::asm;
#[cfg(target_arch = "x86_64")]
use std::time::Instant;

#[cfg(target_arch = "x86_64")]
macro_rules! bench {
    ($name:expr, $iters:expr, $ops:expr, $body:literal) => {{
        let t = Instant::now();
        unsafe {
            asm!(
                "vpxor ymm0, ymm0, ymm0", "vpxor ymm1, ymm1, ymm1", "vpxor ymm2, ymm2, ymm2", "vpxor ymm3, ymm3, ymm3",
                "vpxor ymm4, ymm4, ymm4", "vpxor ymm5, ymm5, ymm5", "vpxor ymm6, ymm6, ymm6", "vpxor ymm7, ymm7, ymm7",
                "vpxor ymm8, ymm8, ymm8", "vpxor ymm9, ymm9, ymm9", "vpxor ymm10, ymm10, ymm10", "vpxor ymm11, ymm11, ymm11",
                "vpxor ymm12, ymm12, ymm12", "vpxor ymm13, ymm13, ymm13", "vpxor ymm14, ymm14, ymm14", "vpxor ymm15, ymm15, ymm15",
                "2:", "/* {p} */",
                $body,
                "dec {n}", "jnz 2b",
                n = inout(reg) $iters => _, p = in(reg) BUF.as_ptr(),
                out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
            );
        }
        let ns = t.elapsed().as_secs_f64() * 1e9 / ($iters as f64);
        format!("{}: {:.3} ns/iter ({:.3} ns per {})", $name, ns, ns / $ops as f64, "op")
    }};
}

#[cfg(target_arch = "x86_64")]
static BUF: [u8; 4096] = [1; 4096];

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("x86-64 only");
}

#[cfg(target_arch = "x86_64")]
fn main() {
    assert!(std::arch::is_x86_feature_detected!("avx2"), "needs AVX2");
    let n: u64 = 20_000_000;
    for _ in 0..3 {
        // 8 independent maddubs
        println!("{}", bench!("8 maddubs", n, 8,
            "vpmaddubsw ymm0, ymm8, ymm9\nvpmaddubsw ymm1, ymm8, ymm9\nvpmaddubsw ymm2, ymm8, ymm9\nvpmaddubsw ymm3, ymm8, ymm9\nvpmaddubsw ymm4, ymm8, ymm9\nvpmaddubsw ymm5, ymm8, ymm9\nvpmaddubsw ymm6, ymm8, ymm9\nvpmaddubsw ymm7, ymm8, ymm9"));
        // 8 independent addw
        println!("{}", bench!("8 addw", n, 8,
            "vpaddw ymm0, ymm8, ymm9\nvpaddw ymm1, ymm8, ymm9\nvpaddw ymm2, ymm8, ymm9\nvpaddw ymm3, ymm8, ymm9\nvpaddw ymm4, ymm8, ymm9\nvpaddw ymm5, ymm8, ymm9\nvpaddw ymm6, ymm8, ymm9\nvpaddw ymm7, ymm8, ymm9"));
        // 4 maddubs + 4 independent addw
        println!("{}", bench!("4 maddubs + 4 addw", n, 4,
            "vpmaddubsw ymm0, ymm8, ymm9\nvpmaddubsw ymm1, ymm8, ymm9\nvpmaddubsw ymm2, ymm8, ymm9\nvpmaddubsw ymm3, ymm8, ymm9\nvpaddw ymm4, ymm8, ymm9\nvpaddw ymm5, ymm8, ymm9\nvpaddw ymm6, ymm8, ymm9\nvpaddw ymm7, ymm8, ymm9"));
        // 4 maddubs + 4 bcast loads
        println!("{}", bench!("4 maddubs + 4 bcast", n, 4,
            "vpmaddubsw ymm0, ymm8, ymm9\nvpmaddubsw ymm1, ymm8, ymm9\nvpmaddubsw ymm2, ymm8, ymm9\nvpmaddubsw ymm3, ymm8, ymm9\nvpbroadcastd ymm4, [{p}]\nvpbroadcastd ymm5, [{p}+4]\nvpbroadcastd ymm6, [{p}+8]\nvpbroadcastd ymm7, [{p}+12]"));
        // 4 maddubs with a memory-broadcast... the pattern: bcast -> maddubs -> addw chain
        println!("{}", bench!("4x(bcast, maddubs, addw)", n, 4,
            "vpbroadcastd ymm4, [{p}]\nvpmaddubsw ymm0, ymm8, ymm4\nvpaddw ymm12, ymm12, ymm0\nvpbroadcastd ymm5, [{p}+4]\nvpmaddubsw ymm1, ymm8, ymm5\nvpaddw ymm13, ymm13, ymm1\nvpbroadcastd ymm6, [{p}+8]\nvpmaddubsw ymm2, ymm8, ymm6\nvpaddw ymm14, ymm14, ymm2\nvpbroadcastd ymm7, [{p}+12]\nvpmaddubsw ymm3, ymm8, ymm7\nvpaddw ymm15, ymm15, ymm3"));
        println!("{}", bench!("4x(bcast, 2 maddubs, 2 addw)", n, 8,
            "vpbroadcastd ymm4, [{p}]\nvpmaddubsw ymm0, ymm8, ymm4\nvpaddw ymm12, ymm12, ymm0\nvpmaddubsw ymm1, ymm9, ymm4\nvpaddw ymm13, ymm13, ymm1\nvpbroadcastd ymm5, [{p}+4]\nvpmaddubsw ymm2, ymm8, ymm5\nvpaddw ymm14, ymm14, ymm2\nvpmaddubsw ymm3, ymm9, ymm5\nvpaddw ymm15, ymm15, ymm3\nvpbroadcastd ymm6, [{p}+8]\nvpmaddubsw ymm0, ymm8, ymm6\nvpaddw ymm12, ymm12, ymm0\nvpmaddubsw ymm1, ymm9, ymm6\nvpaddw ymm13, ymm13, ymm1\nvpbroadcastd ymm7, [{p}+12]\nvpmaddubsw ymm2, ymm8, ymm7\nvpaddw ymm14, ymm14, ymm2\nvpmaddubsw ymm3, ymm9, ymm7\nvpaddw ymm15, ymm15, ymm3"));
        println!("{}", bench!("2x(bcast, 4 maddubs, 4 addw)", n, 8,
            "vpbroadcastd ymm4, [{p}]\nvpmaddubsw ymm0, ymm8, ymm4\nvpaddw ymm12, ymm12, ymm0\nvpmaddubsw ymm1, ymm9, ymm4\nvpaddw ymm13, ymm13, ymm1\nvpmaddubsw ymm2, ymm10, ymm4\nvpaddw ymm14, ymm14, ymm2\nvpmaddubsw ymm3, ymm11, ymm4\nvpaddw ymm15, ymm15, ymm3\nvpbroadcastd ymm5, [{p}+4]\nvpmaddubsw ymm0, ymm8, ymm5\nvpaddw ymm12, ymm12, ymm0\nvpmaddubsw ymm1, ymm9, ymm5\nvpaddw ymm13, ymm13, ymm1\nvpmaddubsw ymm2, ymm10, ymm5\nvpaddw ymm14, ymm14, ymm2\nvpmaddubsw ymm3, ymm11, ymm5\nvpaddw ymm15, ymm15, ymm3"));
        println!("{}", bench!("8 bcast", n, 8,
            "vpbroadcastd ymm0, [{p}]\nvpbroadcastd ymm1, [{p}+4]\nvpbroadcastd ymm2, [{p}+8]\nvpbroadcastd ymm3, [{p}+12]\nvpbroadcastd ymm4, [{p}+16]\nvpbroadcastd ymm5, [{p}+20]\nvpbroadcastd ymm6, [{p}+24]\nvpbroadcastd ymm7, [{p}+28]"));
        println!("{}", bench!("8 vmovdqu loads", n, 8,
            "vmovdqu ymm0, [{p}]\nvmovdqu ymm1, [{p}+32]\nvmovdqu ymm2, [{p}+64]\nvmovdqu ymm3, [{p}+96]\nvmovdqu ymm4, [{p}+128]\nvmovdqu ymm5, [{p}+160]\nvmovdqu ymm6, [{p}+192]\nvmovdqu ymm7, [{p}+224]"));
        println!("{}", bench!("4 maddubs + 4 pshufd", n, 4,
            "vpmaddubsw ymm0, ymm8, ymm9\nvpmaddubsw ymm1, ymm8, ymm9\nvpmaddubsw ymm2, ymm8, ymm9\nvpmaddubsw ymm3, ymm8, ymm9\nvpshufd ymm4, ymm10, 0\nvpshufd ymm5, ymm10, 0x55\nvpshufd ymm6, ymm10, 0xaa\nvpshufd ymm7, ymm10, 0xff"));
        println!();
    }
}
