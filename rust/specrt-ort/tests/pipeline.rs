//! `Pipeline` end to end on a real ONNX model: greedy speculative output equals greedy target-only output token
//! for token, a folder's `generation_config.json` defaults apply, stop token ids stop, the request's text options
//! choose the text, bad settings are errors that name the value. Like `with_library.rs`, these run only when `SPECRT_ORT_LIBRARY` (absolute path of
//! libonnxruntime.so.1.x) and `SPECRT_TEST_MODEL` (a model folder, e.g. the tiny model `make test-rs` builds at
//! `target/test-model/model`) are set; otherwise they return early.

use std::path::{Path, PathBuf};

use specrt_core::{FinishReason, PinnedCosts, SpecError};
use specrt_ort::{
    Driver, GenerationRequest, OrtOptions, Pipeline, Proposer, SpeculativeTokens, TextOptions,
    AUTO_K_MAX,
};

fn env_paths() -> Option<(PathBuf, PathBuf)> {
    Some((
        std::env::var_os("SPECRT_ORT_LIBRARY")?.into(),
        std::env::var_os("SPECRT_TEST_MODEL")?.into(),
    ))
}

fn options(lib: &Path) -> OrtOptions {
    let mut options = OrtOptions::new(lib);
    options.max_seq_len = Some(128);
    options
}

/// A fixed prompt inside the model's vocabulary.
fn prompt(vocab: usize) -> Vec<u32> {
    (0..12u32).map(|i| (i * 37 + 5) % vocab as u32).collect()
}

fn greedy(max_new_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        max_new_tokens,
        temperature: Some(0.0),
        ignore_eos: true,
        ..GenerationRequest::default()
    }
}

/// A copy of `model` (files symlinked) whose `generation_config.json` is `generation_config`.
fn folder_with_generation_config(
    model: &Path,
    generation_config: &str,
) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("model");
    std::fs::create_dir(&folder).unwrap();
    for entry in std::fs::read_dir(model).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "generation_config.json" {
            std::os::unix::fs::symlink(entry.path(), folder.join(entry.file_name())).unwrap();
        }
    }
    std::fs::write(folder.join("generation_config.json"), generation_config).unwrap();
    (tmp, folder)
}

#[test]
fn greedy_speculative_equals_greedy_target_only() {
    let Some((lib, model)) = env_paths() else {
        return;
    };
    let options = options(&lib);
    let mut plain = Pipeline::load(&model, None, &options).unwrap();
    let mut spec = Pipeline::load(&model, Some(&model), &options).unwrap();
    let ids = prompt(plain.vocab_size());
    let reference = plain.generate(&ids, &greedy(48)).unwrap();
    assert_eq!(reference.tokens.len(), 48);
    assert_eq!(reference.stats.n_drafted, 0);
    let pinned = PinnedCosts {
        c_draft: 1.0,
        c_verify: vec![4.0; AUTO_K_MAX + 1],
    };
    let cases = [
        (SpeculativeTokens::Fixed(1), Proposer::DraftModel, None),
        (SpeculativeTokens::Fixed(4), Proposer::DraftModel, None),
        (SpeculativeTokens::Fixed(8), Proposer::DraftModel, None),
        (SpeculativeTokens::Fixed(4), Proposer::NgramThenDraft, None),
        (SpeculativeTokens::Auto, Proposer::DraftModel, Some(pinned)),
    ];
    for (k, proposer, pinned_costs) in cases {
        let mut streamed = Vec::new();
        let out = spec
            .generate_stream(
                &ids,
                &GenerationRequest {
                    num_speculative_tokens: k,
                    proposer: Some(proposer),
                    pinned_costs,
                    ..greedy(48)
                },
                |step| {
                    streamed.extend_from_slice(&step.tokens);
                    true
                },
            )
            .unwrap();
        assert_eq!(out.tokens, reference.tokens, "K {k}, proposer {proposer}");
        assert_eq!(streamed, out.tokens);
        assert!(
            out.stats.n_drafted > 0,
            "K {k}, proposer {proposer}: no drafts"
        );
        // The model is its own draft: every greedy draft token is the target's argmax (prompt-lookup drafts are
        // guesses, and may be rejected).
        assert_eq!(
            out.stats.n_accepted - out.stats.n_accepted_ngram,
            out.stats.n_drafted - out.stats.n_drafted_ngram,
            "K {k}"
        );
    }
}

#[test]
fn generation_config_defaults_and_eos_ids_apply() {
    let Some((lib, model)) = env_paths() else {
        return;
    };
    let options = options(&lib);
    let mut plain = Pipeline::load(&model, None, &options).unwrap();
    let ids = prompt(plain.vocab_size());
    let reference = plain.generate(&ids, &greedy(40)).unwrap();
    // An id the greedy continuation emits at position >= 5: as EOS it must end generation at its first occurrence.
    let eos = reference.tokens[5];
    let first = reference.tokens.iter().position(|&t| t == eos).unwrap();
    let (_tmp, folder) = folder_with_generation_config(
        &model,
        &format!(r#"{{"temperature": 0.0, "top_k": 3, "eos_token_id": [{eos}]}}"#),
    );
    let mut spec = Pipeline::load(&folder, Some(&model), &options).unwrap();
    assert_eq!(spec.defaults().temperature, Some(0.0));
    assert_eq!(spec.defaults().top_k, Some(3));
    assert_eq!(spec.eos_token_ids(), [eos]);
    let cfg = spec.resolve(&GenerationRequest::default()).unwrap();
    assert_eq!((cfg.sampling.temperature, cfg.sampling.top_k), (0.0, 3));
    assert_eq!(cfg.eos_token_ids, vec![eos]);
    // No temperature given: the folder's 0 makes it greedy, so the output is the reference up to the EOS id.
    let out = spec
        .generate(
            &ids,
            &GenerationRequest {
                max_new_tokens: 40,
                seed: 7,
                ..GenerationRequest::default()
            },
        )
        .unwrap();
    assert_eq!(out.tokens, reference.tokens[..=first]);
    assert_eq!(out.finish_reason, FinishReason::Eos);
    // ignore_eos goes past it; a request value overrides the folder's.
    let out = spec
        .generate(
            &ids,
            &GenerationRequest {
                ignore_eos: true,
                temperature: Some(0.0),
                max_new_tokens: 40,
                ..GenerationRequest::default()
            },
        )
        .unwrap();
    assert_eq!(out.tokens, reference.tokens);
    assert_eq!(out.finish_reason, FinishReason::Length);
}

#[test]
fn stop_token_ids_stop() {
    let Some((lib, model)) = env_paths() else {
        return;
    };
    let mut spec = Pipeline::load(&model, Some(&model), &options(&lib)).unwrap();
    let ids = prompt(spec.vocab_size());
    let reference = spec.generate(&ids, &greedy(40)).unwrap();
    let stop = reference.tokens[7];
    let first = reference.tokens.iter().position(|&t| t == stop).unwrap();
    let out = spec
        .generate(
            &ids,
            &GenerationRequest {
                stop_token_ids: vec![stop],
                ..greedy(40)
            },
        )
        .unwrap();
    assert_eq!(out.tokens, reference.tokens[..=first]);
    assert_eq!(out.finish_reason, FinishReason::Stop);
}

#[test]
fn text_options_leave_out_or_keep_the_stop_token_id_that_ended_the_generation() {
    let Some((lib, model)) = env_paths() else {
        return;
    };
    let mut p = Pipeline::load(&model, None, &options(&lib)).unwrap();
    let tokenizer = p
        .tokenizer()
        .cloned()
        .expect("the test model has a tokenizer.json");
    let ids = prompt(p.vocab_size());
    let reference = p.generate(&ids, &greedy(40)).unwrap();
    let stop = reference.tokens[7];
    let first = reference.tokens.iter().position(|&t| t == stop).unwrap();
    let kept = &reference.tokens[..=first];
    for skip_special_tokens in [true, false] {
        for include_stop_str_in_output in [false, true] {
            let request = GenerationRequest {
                stop_token_ids: vec![stop],
                text: TextOptions {
                    skip_special_tokens,
                    include_stop_str_in_output,
                },
                ..greedy(40)
            };
            let mut streamed = String::new();
            let out = p
                .generate_ids_text_stream(&ids, &request, |step| {
                    streamed.push_str(&step.text);
                    true
                })
                .unwrap();
            let shown = if include_stop_str_in_output {
                kept
            } else {
                &kept[..first]
            };
            assert_eq!(out.output.tokens, kept);
            assert_eq!(
                out.text,
                tokenizer.decode(shown, skip_special_tokens).unwrap()
            );
            assert_eq!(streamed, out.text, "the streamed pieces make the text");
        }
    }
}

#[test]
fn bad_settings_are_config_errors_naming_the_value() {
    let Some((lib, model)) = env_paths() else {
        return;
    };
    let mut plain = Pipeline::load(&model, None, &options(&lib)).unwrap();
    let ids = prompt(plain.vocab_size());
    let cases = [
        (
            GenerationRequest {
                temperature: Some(-0.5),
                ..GenerationRequest::default()
            },
            "temperature -0.5",
        ),
        (
            GenerationRequest {
                top_p: Some(1.5),
                ..GenerationRequest::default()
            },
            "top_p 1.5",
        ),
        (
            GenerationRequest {
                num_speculative_tokens: SpeculativeTokens::Fixed(99),
                ..GenerationRequest::default()
            },
            "num_speculative_tokens 99",
        ),
        (
            GenerationRequest {
                proposer: Some(Proposer::NgramThenDraft),
                ..GenerationRequest::default()
            },
            "proposer \"ngram+draft\" needs a draft model",
        ),
        (
            GenerationRequest {
                proposer: Some(Proposer::Ngram),
                prompt_lookup_min: 0,
                ..GenerationRequest::default()
            },
            "prompt_lookup_min = 0",
        ),
        (
            GenerationRequest {
                max_new_tokens: 0,
                ..GenerationRequest::default()
            },
            "max_new_tokens 0",
        ),
    ];
    for (request, needle) in cases {
        let err = plain.generate(&ids, &request).unwrap_err();
        assert!(
            matches!(&err, SpecError::Setting { message, .. } if message.contains(needle)),
            "{needle}: {err}"
        );
    }
    let err = plain
        .generate(
            &ids,
            &GenerationRequest {
                max_new_tokens: 1000,
                ..GenerationRequest::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(&err, SpecError::Length(m) if m.contains("1000")),
        "{err}"
    );
    let err = Pipeline::load(&model.join("missing"), None, &options(&lib))
        .err()
        .unwrap();
    assert!(
        matches!(&err, SpecError::NotFound(m) if m.contains("missing")),
        "{err}"
    );
}

/// Prefix caching on the real model: a session of requests (the same prompt twice, a prefix of the cached
/// sequence, a prompt diverging mid-way, a chat continuation longer than anything cached) gives the tokens a
/// pipeline without prefix caching gives, greedy and coupled at temperature 1, with the model as its own draft
/// (which runs its prefill graph) and with prompt lookup; log-probabilities agree to float32 rounding (reused KV
/// rows were computed by decode and verification passes instead of one prefill pass). Seeded sampling without
/// coupling is not compared: the draft's reused rows come from its decode graph where a fresh prefill runs its
/// int8 prefill graph, so its proposals, and with them the seeded sample, may differ (the distribution does not).
#[test]
fn prefix_caching_gives_the_tokens_of_a_full_prefill() {
    let Some((lib, model)) = env_paths() else {
        return;
    };
    let options = options(&lib);
    let mut cached = Pipeline::load(&model, Some(&model), &options).unwrap();
    // Pipeline::load turns prefix caching on; the same driver without it:
    let mut fresh =
        Pipeline::from_driver(Driver::load_single(&model, Some(&model), &options, false).unwrap());
    let vocab = cached.vocab_size() as u32;
    let base = prompt(vocab as usize);
    let extra =
        |seed: u32, n: u32| -> Vec<u32> { (0..n).map(|i| (i * 53 + seed) % vocab).collect() };
    let requests = [
        GenerationRequest {
            num_speculative_tokens: SpeculativeTokens::Fixed(4),
            ..greedy(12)
        },
        GenerationRequest {
            num_speculative_tokens: SpeculativeTokens::Fixed(3),
            temperature: Some(1.0),
            seed: 5,
            coupled: true,
            ..greedy(12)
        },
        GenerationRequest {
            num_speculative_tokens: SpeculativeTokens::Fixed(4),
            proposer: Some(Proposer::Ngram),
            ..greedy(12)
        },
    ];
    for request in &requests {
        let mut prev: Vec<u32> = Vec::new();
        for i in 0..5 {
            let p: Vec<u32> = match i {
                0 | 1 => base.clone(),
                2 => base[..7].to_vec(),
                3 => [&base[..9], &extra(3, 6)[..]].concat(),
                _ => [&prev[..], &extra(11, 9)[..]].concat(),
            };
            let a = cached.generate(&p, request).unwrap();
            let b = fresh.generate(&p, request).unwrap();
            assert_eq!(a.tokens, b.tokens, "request {i}, {request:?}");
            for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                assert!((x - y).abs() < 1e-4, "request {i}: logprob {x} vs {y}");
            }
            assert_eq!(b.stats.n_cached_tokens, 0);
            if i > 0 {
                assert!(a.stats.n_cached_tokens > 0, "request {i}: no reuse");
            }
            prev = [&p[..], &a.tokens[..]].concat();
        }
    }
}
