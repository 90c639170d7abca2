//! Steady-state rounds of the decode loop allocate nothing (counted with a global allocator that tallies this
//! thread's allocations). The models here are mock models; the ONNX Runtime backend's own buffers are checked in
//! `rust/specrt-ort` (KV and logits buffers reused across calls).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use specrt_core::testing::MockModel;
use specrt_core::{AutoK, Engine, GenerationConfig, PinnedCosts, SamplingParams};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Allocations during rounds 8.. of a long generation (rounds 0..8 warm the buffers up).
fn steady_state_allocs(cfg: GenerationConfig, noise: f32) -> (u64, u64) {
    let vocab = 4096;
    let t = MockModel::new(vocab, 4096, 5, 6.0);
    let d = MockModel::new(vocab, 4096, 5, 6.0).with_noise(9, noise);
    let mut e = Engine::new(Box::new(t), Some(Box::new(d))).unwrap();
    e.start(&[1, 2, 3, 4, 5, 6, 7, 8], cfg).unwrap();
    for _ in 0..8 {
        e.step().unwrap();
    }
    let before = allocs();
    let mut rounds = 0;
    while e.finish_reason().is_none() {
        e.step().unwrap();
        rounds += 1;
    }
    (allocs() - before, rounds)
}

#[test]
fn steady_state_rounds_allocate_nothing() {
    let base = GenerationConfig {
        max_new_tokens: 600,
        num_speculative_tokens: 4,
        ignore_eos: true,
        ..GenerationConfig::default()
    };
    let cases = [
        (
            "greedy",
            GenerationConfig {
                sampling: SamplingParams::greedy(),
                ..base.clone()
            },
        ),
        (
            "T=1 top_p=0.9",
            GenerationConfig {
                sampling: SamplingParams {
                    temperature: 1.0,
                    top_p: 0.9,
                    ..SamplingParams::default()
                },
                ..base.clone()
            },
        ),
        (
            "T=0.7 top_k=50 penalties",
            GenerationConfig {
                sampling: SamplingParams {
                    temperature: 0.7,
                    top_k: 50,
                    repetition_penalty: 1.1,
                    ..SamplingParams::default()
                },
                ..base.clone()
            },
        ),
        (
            "auto K",
            GenerationConfig {
                auto_k: Some(AutoK {
                    pinned: Some(PinnedCosts {
                        c_draft: 1.0,
                        c_verify: vec![10.0; 9],
                    }),
                    ..AutoK::default()
                }),
                ..base.clone()
            },
        ),
    ];
    for (name, cfg) in cases {
        let (n, rounds) = steady_state_allocs(cfg, 0.5);
        assert!(rounds > 50, "{name}: only {rounds} rounds measured");
        assert_eq!(
            n, 0,
            "{name}: {n} allocations in {rounds} steady-state rounds"
        );
    }
}
