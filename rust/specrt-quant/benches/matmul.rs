//! The GGUF-block matmul on one thread per path, Qwen2.5-Coder-1.5B's down projection (`[N = 1536, K = 8960]`,
//! Q4_K and Q6_K) and gate|up (`[17920, 1536]`, Q4_K), for M = 1, 2, 3, 5, 8, 17 rows, and the activation quantizers
//! alone (`-- quantize`), and the load-time repack (`-- pack`). `cargo bench -p specrt-quant`.
//! (Beside ONNX Runtime's MatMulNBits, in one process: benches/bench_gguf_matmul.py.)

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use specrt_quant::{
    matmul, quantize_rows, quantize_rows_super, wants_packed, GgmlType, KernelPath, Packed,
    QMatrix, Scratch, Serial,
};

fn random_bytes(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 56) as u8
        })
        .collect()
}

/// Random blocks with small finite float16 scales.
fn blocks(ty: GgmlType, n: usize, k: usize) -> Vec<u8> {
    let mut data = random_bytes(n * ty.row_bytes(k).unwrap(), 7);
    let offsets: &[usize] = match ty {
        GgmlType::Q6_K => &[208],
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q4_1 => &[0, 2],
        _ => &[0],
    };
    for blk in data.chunks_exact_mut(ty.block_bytes()) {
        for &o in offsets {
            blk[o..o + 2].copy_from_slice(&half::f16::from_f32(0.003).to_le_bytes());
        }
    }
    data
}

fn bench(c: &mut Criterion) {
    for (label, ty, n, k) in [
        ("down", GgmlType::Q4_K, 1536, 8960),
        ("down", GgmlType::Q6_K, 1536, 8960),
        ("gate_up", GgmlType::Q4_K, 17920, 1536),
    ] {
        let data = blocks(ty, n, k);
        let w = QMatrix::new(ty, n, k, &data).unwrap();
        // packed once, as the operator does at its first run
        let packed = Packed::new(&w);
        let mut group = c.benchmark_group(format!("{label} {} N={n} K={k}", ty.name()));
        group.sample_size(20);
        for path in KernelPath::ALL
            .into_iter()
            .filter(|p| p.is_available() && *p != KernelPath::Portable)
        {
            for m in [1usize, 2, 3, 5, 8, 17] {
                let x: Vec<f32> = random_bytes(m * k, 3)
                    .iter()
                    .map(|&b| f32::from(b) / 64.0 - 2.0)
                    .collect();
                let mut out = vec![0.0f32; m * n];
                let mut scratch = Scratch::default();
                group.throughput(Throughput::Bytes(data.len() as u64));
                group.bench_with_input(
                    BenchmarkId::new(path.name(), format!("M={m}")),
                    &m,
                    |b, &m| {
                        b.iter(|| {
                            match &packed {
                                p if wants_packed(path) => p.matmul(
                                    black_box(&x),
                                    m,
                                    &mut out,
                                    path,
                                    &mut scratch,
                                    &Serial,
                                ),
                                _ => matmul(
                                    &w,
                                    black_box(&x),
                                    m,
                                    &mut out,
                                    path,
                                    &mut scratch,
                                    &Serial,
                                ),
                            }
                            .unwrap()
                        });
                    },
                );
            }
        }
        group.finish();
    }
}

/// The activation quantizers alone, five rows of the down projection's input (`[5, 8960]`), per path.
fn bench_quantize(c: &mut Criterion) {
    let (m, k) = (5usize, 8960usize);
    let x: Vec<f32> = random_bytes(m * k, 3)
        .iter()
        .map(|&b| f32::from(b) / 64.0 - 2.0)
        .collect();
    let mut group = c.benchmark_group(format!("quantize [{m}, {k}]"));
    group.throughput(Throughput::Elements((m * k) as u64));
    for path in KernelPath::ALL.into_iter().filter(|p| p.is_available()) {
        let mut supers = Vec::new();
        group.bench_function(BenchmarkId::new("super-blocks", path.name()), |b| {
            b.iter(|| quantize_rows_super(black_box(&x), m, k, &mut supers, path));
        });
        let mut blocks = Vec::new();
        group.bench_function(BenchmarkId::new("blocks", path.name()), |b| {
            b.iter(|| quantize_rows(black_box(&x), m, k, &mut blocks, path));
        });
    }
    group.finish();
}

/// The load-time repack (`Packed::new`, one thread) of the down projection in each format of the registry's GGUFs.
fn bench_pack(c: &mut Criterion) {
    let (n, k) = (1536usize, 8960usize);
    let mut group = c.benchmark_group(format!("pack [{n}, {k}]"));
    group.sample_size(10);
    group.throughput(Throughput::Elements((n * k) as u64));
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
    ] {
        let k = k.next_multiple_of(ty.block_len());
        let data = blocks(ty, n, k);
        let w = QMatrix::new(ty, n, k, &data).unwrap();
        group.bench_function(ty.name(), |b| b.iter(|| Packed::new(black_box(&w))));
    }
    group.finish();
}

criterion_group!(benches, bench, bench_quantize, bench_pack);
criterion_main!(benches);
