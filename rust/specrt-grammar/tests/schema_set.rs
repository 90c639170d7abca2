//! The JSON-schema set of the validity tests and the structured-output bench (`tests/data/json_schemas.json`: 50+
//! schemas with nested objects, bounded arrays, enums, patterns and formats, ranges, nullable and optional fields,
//! anyOf, additionalProperties false) compiles under `strict`, so no keyword of it is silently ignored.

use std::path::PathBuf;

use serde_json::Value;
use specrt_grammar::OutputConstraint;

fn schema_set() -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/json_schemas.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match serde_json::from_str(&text).unwrap() {
        Value::Array(v) => v,
        other => panic!("expected a JSON array, got {other}"),
    }
}

#[test]
fn every_schema_of_the_set_compiles_strictly() {
    let set = schema_set();
    assert!(set.len() >= 50, "{} schemas", set.len());
    let mut refused = Vec::new();
    for entry in &set {
        let c = OutputConstraint::JsonSchema {
            schema: entry["schema"].clone(),
            strict: true,
        };
        if let Err(e) = c.validate() {
            refused.push(format!("{}: {e}", entry["name"]));
        }
    }
    assert!(refused.is_empty(), "{refused:#?}");
}

#[test]
fn a_keyword_llguidance_lacks_is_refused_under_strict_and_ignored_otherwise() {
    // `uniqueItems` is not implemented by llguidance: strict must say so rather than emit arrays that may repeat.
    let schema =
        serde_json::json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true});
    let strict = OutputConstraint::JsonSchema {
        schema: schema.clone(),
        strict: true,
    };
    assert!(strict.validate().is_err());
    let lenient = OutputConstraint::JsonSchema {
        schema,
        strict: false,
    };
    lenient.validate().unwrap();
}

/// The cached folders whose tokenizers the forced-token test reads (skipped when absent): name, EOS ids.
const TOKENIZERS: [(&str, &[u32]); 2] = [
    ("smollm2-135m-instruct/fp32", &[2, 0]),
    ("qwen2.5-coder-1.5b-instruct/fp32", &[151_645, 151_643]),
];

#[test]
fn forced_tokens_spell_the_forced_bytes_on_the_smollm2_and_qwen_tokenizers() {
    use specrt_core::Constraint;
    use specrt_grammar::GrammarCompiler;
    use specrt_text::tokenizer::Tokenizer;

    let Some(home) = std::env::var_os("HOME") else {
        return;
    };
    for (folder, eos) in TOKENIZERS {
        let path = PathBuf::from(&home)
            .join(".cache/specrt/models")
            .join(folder)
            .join("tokenizer.json");
        if !path.is_file() {
            eprintln!("skipped {folder}: not in the model cache");
            continue;
        }
        let tok = Tokenizer::from_file(&path).unwrap();
        let vocab = tok.vocab_size();
        let compiler = GrammarCompiler::new(&tok, vocab, eos).unwrap();
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"], "additionalProperties": false
        });
        let mut c = compiler
            .compile(&OutputConstraint::JsonSchema {
                schema,
                strict: true,
            })
            .unwrap();
        let bytes = c.forced_bytes();
        assert_eq!(String::from_utf8_lossy(&bytes), "{\"name\": \"", "{folder}");
        let canonical = c.forced_canonical_tokens();
        let mut forced = Vec::new();
        c.forced_tokens(&mut forced).unwrap();
        eprintln!(
            "{folder}: forced bytes {:?}, compute_ff_tokens {canonical:?}, forced_tokens {forced:?} = {:?}",
            String::from_utf8_lossy(&bytes),
            String::from_utf8_lossy(&c.token_bytes(&forced))
        );
        // Whichever path gave them, the forced tokens are a non-empty prefix of the forced bytes the grammar accepts.
        assert!(!forced.is_empty(), "{folder}: no forced tokens");
        let spelled = c.token_bytes(&forced);
        assert!(
            bytes.starts_with(&spelled),
            "{folder}: {spelled:?} is not a prefix of {bytes:?}"
        );
        assert_eq!(
            c.validate_tokens(&forced).unwrap(),
            forced.len(),
            "{folder}"
        );
    }
}
