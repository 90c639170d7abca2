//! Helpers shared by the integration tests.

use specrt_core::{BatchEngine, GenerationConfig, GenerationOutput};

/// `a` and `b` emitted the same tokens with the same sources, log-probabilities, alternatives, prompt scores and
/// finish reason (statistics are each test's to compare).
#[allow(dead_code)] // not every test crate that shares these helpers compares outputs this way
pub fn assert_same_tokens(a: &GenerationOutput, b: &GenerationOutput, what: &str) {
    assert_eq!(a.tokens, b.tokens, "{what}: tokens");
    assert_eq!(a.sources, b.sources, "{what}: sources");
    assert_eq!(a.logprobs, b.logprobs, "{what}: logprobs");
    assert_eq!(a.top_logprobs, b.top_logprobs, "{what}: top_logprobs");
    assert_eq!(a.prompt, b.prompt, "{what}: prompt scores");
    assert_eq!(a.finish_reason, b.finish_reason, "{what}: finish reason");
}

/// Every request through the batched engine (all added at once, ids 0..), each step's rows error-free; each output in
/// order.
#[allow(dead_code)] // not every test crate that shares these helpers runs batches
pub fn run_batch(
    e: &mut BatchEngine,
    reqs: &[(Vec<u32>, GenerationConfig)],
) -> Vec<GenerationOutput> {
    for (i, (p, c)) in reqs.iter().enumerate() {
        e.add(i as u64, p, c.clone()).unwrap();
    }
    let mut guard = 0;
    while !e.is_idle() {
        for s in e.step().unwrap() {
            assert!(s.error.is_none(), "{:?}", s.error);
        }
        guard += 1;
        assert!(guard < 10_000, "the batch never drained");
    }
    (0..reqs.len())
        .map(|i| e.take_output(i as u64).expect("finished"))
        .collect()
}
