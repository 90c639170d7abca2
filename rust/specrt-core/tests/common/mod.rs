//! Helpers shared by the integration tests.

use specrt_core::GenerationOutput;

/// `a` and `b` emitted the same tokens with the same sources, log-probabilities, alternatives, prompt scores and
/// finish reason (statistics are each test's to compare).
pub fn assert_same_tokens(a: &GenerationOutput, b: &GenerationOutput, what: &str) {
    assert_eq!(a.tokens, b.tokens, "{what}: tokens");
    assert_eq!(a.sources, b.sources, "{what}: sources");
    assert_eq!(a.logprobs, b.logprobs, "{what}: logprobs");
    assert_eq!(a.top_logprobs, b.top_logprobs, "{what}: top_logprobs");
    assert_eq!(a.prompt, b.prompt, "{what}: prompt scores");
    assert_eq!(a.finish_reason, b.finish_reason, "{what}: finish reason");
}
