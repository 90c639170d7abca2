//! The llguidance constraint: bad constraints are clear errors before any model runs; on a real tokenizer the
//! matcher accepts valid text token by token, refuses invalid tokens without breaking, rolls back, completes, and
//! forces tokens. The tokenizer tests read `SPECRT_TEST_TOKENIZER` (a `tokenizer.json`), else the SmolLM2 folder of
//! the model cache, and return early when neither exists.

use std::path::PathBuf;

use serde_json::json;
use specrt_core::{mask_allows, mask_words, Constraint, SpecError};
use specrt_grammar::{GrammarCompiler, OutputConstraint};
use specrt_text::tokenizer::Tokenizer;

fn tokenizer_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SPECRT_TEST_TOKENIZER") {
        return Some(p.into());
    }
    let home = std::env::var_os("HOME")?;
    let p =
        PathBuf::from(home).join(".cache/specrt/models/smollm2-135m-instruct/fp32/tokenizer.json");
    p.is_file().then_some(p)
}

/// SmolLM2's vocabulary and EOS ids (`<|im_end|>` 2, `<|endoftext|>` 0).
fn compiler() -> Option<(Tokenizer, GrammarCompiler)> {
    let tok = Tokenizer::from_file(tokenizer_path()?).unwrap();
    let vocab = tok.vocab_size();
    let c = GrammarCompiler::new(&tok, vocab, &[2, 0]).unwrap();
    Some((tok, c))
}

/// The message of a refused constraint, after checking it names the constraint's kind as its field.
fn config_message(r: Result<(), SpecError>) -> String {
    match r {
        Err(SpecError::Setting { field, message }) => {
            assert!(
                message.starts_with(&format!("{field} ")),
                "{field}: {message}"
            );
            message
        }
        other => panic!("expected a setting error, got {other:?}"),
    }
}

#[test]
fn invalid_constraints_are_config_errors_naming_the_kind() {
    let m = config_message(OutputConstraint::Regex("a(b".into()).validate());
    assert!(m.starts_with("regex \"a(b\" is invalid"), "{m}");
    let m = config_message(OutputConstraint::Lark("start: foo".into()).validate());
    assert!(m.starts_with("grammar "), "{m}");
    let m = config_message(
        OutputConstraint::JsonSchema {
            schema: json!({"type": "strin"}),
            strict: true,
        }
        .validate(),
    );
    assert!(m.starts_with("json_schema "), "{m}");
    let m = config_message(
        OutputConstraint::JsonSchema {
            schema: json!([1]),
            strict: true,
        }
        .validate(),
    );
    assert!(m.contains("expected a JSON object"), "{m}");
    let m = config_message(OutputConstraint::Choice(vec![]).validate());
    assert!(m.contains("at least one non-empty string"), "{m}");
    for ok in [
        OutputConstraint::JsonObject,
        OutputConstraint::Regex(r"\d{3}-\d{4}".into()),
        OutputConstraint::Lark("start: \"yes\" | \"no\"".into()),
        OutputConstraint::Choice(vec!["a \"quoted\" one".into(), "b".into()]),
        OutputConstraint::JsonSchema {
            schema: json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}},
                           "required": ["a"], "additionalProperties": false}),
            strict: true,
        },
    ] {
        ok.validate().unwrap_or_else(|e| panic!("{ok:?}: {e}"));
    }
}

#[test]
fn a_schema_feature_llguidance_lacks_is_an_error_when_strict_and_ignored_otherwise() {
    // llguidance does not implement `uniqueItems`... if it ever does, this test says so.
    let schema = json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true});
    let strict = OutputConstraint::JsonSchema {
        schema: schema.clone(),
        strict: true,
    };
    let lenient = OutputConstraint::JsonSchema {
        schema,
        strict: false,
    };
    let m = config_message(strict.validate());
    assert!(m.contains("uniqueItems"), "{m}");
    lenient.validate().unwrap();
}

/// `{"name": string, "age": integer}`, both required, nothing else.
fn name_age() -> OutputConstraint {
    OutputConstraint::JsonSchema {
        schema: json!({"type": "object",
                       "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                       "required": ["name", "age"], "additionalProperties": false}),
        strict: true,
    }
}

/// Walk `text`'s tokens through the constraint: each allowed by the mask and consumed.
fn walk(c: &mut dyn Constraint, ids: &[u32], vocab: usize) {
    let mut mask = vec![0u32; mask_words(vocab)];
    for (i, &t) in ids.iter().enumerate() {
        c.fill_mask(&mut mask).unwrap();
        assert!(mask_allows(&mask, t), "token {t} at {i} not allowed");
        c.advance(t).unwrap();
    }
}

#[test]
fn a_json_schema_matcher_follows_valid_json_refuses_bad_tokens_rolls_back_and_completes() {
    let Some((tok, comp)) = compiler() else {
        return;
    };
    let vocab = comp.vocab_size();
    let schema = name_age();
    let mut c = comp.compile(&schema).unwrap();
    let text = r#"{"name": "Bob", "age": 30}"#;
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(c.validate_tokens(&ids).unwrap(), ids.len());
    assert!(!c.is_accepting().unwrap());
    walk(&mut c, &ids, vocab);
    assert!(c.is_accepting().unwrap());
    assert!(
        c.is_complete().unwrap(),
        "nothing may follow the closing brace"
    );
    // Roll back into the number: not complete, and a refused token leaves the matcher usable.
    c.truncate(ids.len() - 2).unwrap();
    assert!(!c.is_complete().unwrap());
    let bad = tok.encode("x", false).unwrap()[0];
    assert!(c.advance(bad).is_err());
    walk(&mut c, &ids[ids.len() - 2..], vocab);
    assert!(c.is_complete().unwrap());
    c.truncate(0).unwrap();
    assert_eq!(c.len(), 0);
    // Invalid JSON is cut where it goes wrong: `{"nam` then `e"` is fine, `{"x"` is refused at `x`.
    let bad_ids = tok.encode(r#"{"x": 1}"#, false).unwrap();
    assert!(c.validate_tokens(&bad_ids).unwrap() < bad_ids.len());
}

#[test]
fn forced_tokens_spell_the_forced_bytes_on_smollm2() {
    let Some((tok, comp)) = compiler() else {
        return;
    };
    let schema = name_age();
    let mut c = comp.compile(&schema).unwrap();
    let mut forced = Vec::new();
    let ids = tok.encode(r#"{"name": "Bob", "age": 30}"#, false).unwrap();
    let mut seen = Vec::new();
    for &t in &ids {
        let ff_bytes = c.forced_bytes();
        let ff_tokens = c.forced_canonical_tokens();
        c.forced_tokens(&mut forced).unwrap();
        let spelled = c.token_bytes(&forced);
        assert!(
            ff_bytes.starts_with(&spelled),
            "forced tokens {forced:?} spell {spelled:?}, not a prefix of the forced bytes {ff_bytes:?}"
        );
        // What we propose is llguidance's canonical answer when it has one.
        if !ff_tokens.is_empty() {
            assert_eq!(forced, ff_tokens);
        }
        seen.push((
            String::from_utf8_lossy(&ff_bytes).into_owned(),
            ff_tokens.len(),
            forced.len(),
        ));
        c.advance(t).unwrap();
    }
    eprintln!("(forced bytes, canonical ff tokens, proposed forced tokens) per position: {seen:?}");
    // At the start `{"name": "` is forced: something is proposed there.
    assert!(seen[0].0.starts_with("{\"name\": \""), "{seen:?}");
    assert!(seen[0].2 > 0, "{seen:?}");
}

#[test]
fn choice_and_regex_constraints_complete_exactly_at_their_end() {
    let Some((tok, comp)) = compiler() else {
        return;
    };
    let vocab = comp.vocab_size();
    let mut c = comp
        .compile(&OutputConstraint::Choice(vec!["yes".into(), "no".into()]))
        .unwrap();
    let ids = tok.encode("no", false).unwrap();
    walk(&mut c, &ids, vocab);
    assert!(c.is_complete().unwrap());
    let mut r = comp
        .compile(&OutputConstraint::Regex(r"[0-9]{2,3}".into()))
        .unwrap();
    let mut mask = vec![0u32; mask_words(vocab)];
    r.fill_mask(&mut mask).unwrap();
    let one = tok.encode("1", false).unwrap()[0];
    assert!(mask_allows(&mask, one));
    assert!(!mask_allows(&mask, tok.encode("a", false).unwrap()[0]));
    r.advance(one).unwrap();
    r.advance(one).unwrap();
    assert!(r.is_accepting().unwrap() && !r.is_complete().unwrap());
    r.advance(one).unwrap();
    assert!(r.is_complete().unwrap());
}
