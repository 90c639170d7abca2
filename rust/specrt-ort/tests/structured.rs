//! Structured output on a real model: greedy JSON-schema-constrained output of SmolLM2-135M-Instruct is valid JSON
//! of the schema and ends by grammar completion, and greedy constrained speculative output (int4 draft) equals
//! greedy constrained target-only output token for token; a regex and a choice likewise; a bad schema is a
//! ConfigError before anything runs; batched rounds (the `-B` folders) give each constrained row the single-stream
//! greedy output. Runs when `SPECRT_ORT_LIBRARY` is set and the SmolLM2 folders exist
//! (`SPECRT_TEST_SMOLLM2`, default `~/.cache/specrt/models/smollm2-135m-instruct`, with `fp32/` and `int4/`);
//! otherwise returns early.

use std::path::PathBuf;

use serde_json::{json, Value};
use specrt_core::{BatchOptions, FinishReason, SpecError};
use specrt_ort::{
    Driver, GenerationRequest, OrtOptions, OutputConstraint, Pipeline, Proposer, SpeculativeTokens,
};

fn folders() -> Option<(PathBuf, PathBuf, PathBuf)> {
    let lib: PathBuf = std::env::var_os("SPECRT_ORT_LIBRARY")?.into();
    let root: PathBuf = match std::env::var_os("SPECRT_TEST_SMOLLM2") {
        Some(p) => p.into(),
        None => PathBuf::from(std::env::var_os("HOME")?)
            .join(".cache/specrt/models/smollm2-135m-instruct"),
    };
    let (t, d) = (root.join("fp32"), root.join("int4"));
    (t.is_dir() && d.is_dir()).then_some((lib, t, d))
}

fn pipeline() -> Option<Pipeline> {
    let (lib, t, d) = folders()?;
    let mut options = OrtOptions::new(&lib);
    options.max_seq_len = Some(512);
    Some(Pipeline::load(&t, Some(&d), &options).unwrap())
}

fn greedy(constraint: OutputConstraint, proposer: Proposer) -> GenerationRequest {
    GenerationRequest {
        max_new_tokens: 80,
        temperature: Some(0.0),
        num_speculative_tokens: SpeculativeTokens::Fixed(4),
        proposer: Some(proposer),
        constraint: Some(constraint),
        ..GenerationRequest::default()
    }
}

fn person_schema() -> OutputConstraint {
    OutputConstraint::JsonSchema {
        schema: json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 24},
                "age": {"type": "integer", "minimum": 0, "maximum": 130},
                "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]}
            },
            "required": ["name", "age", "city"],
            "additionalProperties": false
        }),
        strict: true,
    }
}

#[test]
fn greedy_json_schema_output_is_valid_and_speculation_changes_no_token() {
    let Some(mut p) = pipeline() else { return };
    let prompt = p
        .chat_prompt_ids(&[json!({"role": "user",
            "content": "Give me a JSON object describing a person: name, age and city."})])
        .unwrap();
    let tok = p.tokenizer().unwrap().clone();
    let reference = p
        .generate(&prompt, &greedy(person_schema(), Proposer::TargetOnly))
        .unwrap();
    let spec = p
        .generate(&prompt, &greedy(person_schema(), Proposer::DraftModel))
        .unwrap();
    let text = tok.decode(&reference.tokens, true).unwrap();
    eprintln!(
        "{text}  [{} tokens, {:?}; speculative: {} drafted, {} accepted, {} forced drafted, {} forced accepted, \
         mask {:.1} ms]",
        reference.tokens.len(),
        reference.finish_reason,
        spec.stats.n_drafted,
        spec.stats.n_accepted,
        spec.stats.n_drafted_forced,
        spec.stats.n_accepted_forced,
        spec.stats.mask_ms
    );
    assert_eq!(reference.finish_reason, FinishReason::Grammar, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let obj = v.as_object().unwrap();
    assert_eq!(obj.len(), 3, "{text}");
    assert!(obj["name"]
        .as_str()
        .is_some_and(|s| s.chars().count() <= 24));
    assert!(obj["age"].as_u64().is_some_and(|a| a <= 130));
    assert!(["Paris", "London", "Tokyo"].contains(&obj["city"].as_str().unwrap()));
    assert_eq!(spec.tokens, reference.tokens);
    assert_eq!(spec.finish_reason, reference.finish_reason);
    assert!(
        spec.stats.n_drafted_forced > 0,
        "the schema forces keys and separators"
    );
}

#[test]
fn greedy_regex_and_choice_outputs_match_and_speculation_changes_no_token() {
    let Some(mut p) = pipeline() else { return };
    let tok = p.tokenizer().unwrap().clone();
    let prompt = p
        .chat_prompt_ids(&[
            json!({"role": "user", "content": "What is the date of the first moon landing?"}),
        ])
        .unwrap();
    let date = OutputConstraint::Regex(r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])".into());
    let choice =
        OutputConstraint::Choice(vec!["1969".into(), "1970".into(), "I don't know".into()]);
    for c in [date, choice] {
        let reference = p
            .generate(&prompt, &greedy(c.clone(), Proposer::TargetOnly))
            .unwrap();
        let spec = p
            .generate(&prompt, &greedy(c.clone(), Proposer::DraftModel))
            .unwrap();
        let text = tok.decode(&reference.tokens, true).unwrap();
        eprintln!("{}: {text:?}", c.kind());
        assert_eq!(reference.finish_reason, FinishReason::Grammar, "{text}");
        match &c {
            OutputConstraint::Choice(options) => assert!(options.contains(&text), "{text}"),
            _ => assert!(
                text.len() == 10 && text.as_bytes()[4] == b'-' && text.as_bytes()[7] == b'-',
                "{text}"
            ),
        }
        assert_eq!(spec.tokens, reference.tokens, "{}", c.kind());
    }
}

#[test]
fn a_bad_schema_is_a_config_error_before_anything_runs() {
    let Some(mut p) = pipeline() else { return };
    let bad = OutputConstraint::JsonSchema {
        schema: json!({"type": "object", "properties": {"a": {"type": "nope"}}}),
        strict: true,
    };
    match p.generate(&[1, 2, 3], &greedy(bad, Proposer::DraftModel)) {
        Err(SpecError::Setting { field, message }) => {
            assert_eq!(field, "json_schema");
            assert!(message.starts_with("json_schema "), "{message}");
        }
        other => panic!("expected a ConfigError, got {other:?}"),
    }
}

#[test]
fn greedy_batched_constrained_rows_equal_single_stream_constrained_output() {
    // The batched layout (`fp32-B` target, `int4-B` draft): four constrained rows of different constraints and one
    // unconstrained row share rounds; each equals the single-stream pipeline's greedy output token for token.
    let Some((lib, t, d)) = folders() else { return };
    let root = t.parent().unwrap();
    let (tb, db) = (root.join("fp32-B"), root.join("int4-B"));
    if !(tb.is_dir() && db.is_dir()) {
        return;
    }
    let mut options = OrtOptions::new(&lib);
    options.max_seq_len = Some(512);
    let mut solo = Pipeline::load(&t, Some(&d), &options).unwrap();
    let mut batch = Driver::load(&tb, Some(&db), &options, 4, BatchOptions::default()).unwrap();
    let ask = |p: &Pipeline, q: &str| {
        p.chat_prompt_ids(&[json!({"role": "user", "content": q})])
            .unwrap()
    };
    let date = OutputConstraint::Regex(r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])".into());
    let choice =
        OutputConstraint::Choice(vec!["1969".into(), "1970".into(), "I don't know".into()]);
    let cases: Vec<(Vec<u32>, GenerationRequest)> = vec![
        (
            ask(
                &solo,
                "Give me a JSON object describing a person: name, age and city.",
            ),
            greedy(person_schema(), Proposer::DraftModel),
        ),
        (
            ask(&solo, "What is the date of the first moon landing?"),
            greedy(date, Proposer::DraftModel),
        ),
        (
            ask(&solo, "In which year did people first land on the moon?"),
            greedy(choice, Proposer::TargetOnly),
        ),
        (
            ask(&solo, "Describe a cat as a JSON object."),
            greedy(OutputConstraint::JsonObject, Proposer::DraftModel),
        ),
        (
            ask(&solo, "Name three colours."),
            GenerationRequest {
                constraint: None,
                max_new_tokens: 24,
                ..greedy(person_schema(), Proposer::DraftModel)
            },
        ),
    ];
    let ids: Vec<u64> = cases
        .iter()
        .map(|(p, r)| batch.submit_ids(p, r).unwrap())
        .collect();
    let mut outs = std::collections::HashMap::new();
    while !batch.is_idle() {
        for ev in batch.step().unwrap() {
            assert!(ev.error.is_none(), "{:?}", ev.error);
            if let Some((_, out)) = ev.done {
                outs.insert(ev.id, out);
            }
        }
    }
    let mut n_forced = 0;
    for (id, (prompt, req)) in ids.iter().zip(&cases) {
        let reference = solo.generate(prompt, req).unwrap();
        let out = &outs[id];
        assert_eq!(out.tokens, reference.tokens, "request {id}");
        assert_eq!(out.finish_reason, reference.finish_reason, "request {id}");
        n_forced += out.stats.n_drafted_forced;
    }
    assert!(n_forced > 0, "no forced token was proposed in the batch");
}
