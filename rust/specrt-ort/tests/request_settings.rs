//! `RequestScope::prepare`: a request resolved and checked once against what a pipeline holds (no model needed).

use specrt_core::SpecError;
use specrt_ort::{FolderDefaults, GenerationRequest, RequestScope};

fn scope(has_tokenizer: bool) -> RequestScope {
    RequestScope {
        defaults: FolderDefaults {
            temperature: Some(0.5),
            eos_token_ids: vec![7],
            ..FolderDefaults::default()
        },
        has_draft: false,
        vocab_size: 100,
        max_seq_len: 16,
        has_tokenizer,
    }
}

fn request(max_new_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        max_new_tokens,
        ..GenerationRequest::default()
    }
}

#[test]
fn a_prepared_request_carries_what_the_resolver_made_of_it() {
    let prepared = scope(true).prepare(vec![1, 2, 3], request(5)).unwrap();
    assert_eq!(prepared.prompt_ids, [1, 2, 3]);
    assert_eq!(prepared.config.max_new_tokens, 5);
    assert!((prepared.config.sampling.temperature - 0.5).abs() < f32::EPSILON); // the folder's default
    assert_eq!(prepared.config.eos_token_ids, [7]);
    assert_eq!(prepared.config.num_speculative_tokens, 0); // no draft: target-only
}

#[test]
fn the_prompt_and_the_settings_are_checked_against_the_scope() {
    let s = scope(true);
    let err = s.prepare(vec![], request(5)).unwrap_err();
    assert_eq!(err.field(), Some("prompt"), "{err}");
    let err = s.prepare(vec![1, 100], request(5)).unwrap_err();
    assert!(
        matches!(&err, SpecError::Vocab(m) if m.contains("position 1")),
        "{err}"
    );
    let err = s.prepare(vec![1; 12], request(5)).unwrap_err(); // 12 + 5 > 16
    assert!(matches!(err, SpecError::Length(_)), "{err}");
    s.prepare(vec![1; 11], request(5)).unwrap(); // 11 + 5 = 16 fits
    let bad = GenerationRequest {
        temperature: Some(-1.0),
        ..request(5)
    };
    assert_eq!(
        s.prepare(vec![1], bad).unwrap_err().field(),
        Some("temperature")
    );
}

#[test]
fn stop_strings_need_a_tokenizer() {
    let stop = GenerationRequest {
        stop: vec!["end".into()],
        ..request(5)
    };
    scope(true).prepare(vec![1], stop.clone()).unwrap();
    let err = scope(false).prepare(vec![1], stop).unwrap_err();
    assert_eq!(err.field(), Some("stop"), "{err}");
}
