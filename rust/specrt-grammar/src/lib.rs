//! specrt-grammar: structured output on llguidance.
//!
//! [`OutputConstraint`] is the request's constraint (JSON Schema, any JSON object, regex, Lark grammar, a choice
//! among strings); [`GrammarCompiler`] holds llguidance's parser factory over one model's tokenizer and compiles a
//! constraint into a [`GrammarConstraint`], which implements [`specrt_core::Constraint`] (the trait the engine
//! masks with; see `docs/structured-output.md`).
//!
//! Grammar syntax: regexes in Rust `regex` syntax (llguidance's `regex_to_lark`), Lark grammars in llguidance's
//! Lark variant (<https://github.com/guidance-ai/llguidance/blob/main/docs/syntax.md>), JSON Schemas in llguidance's
//! subset (<https://github.com/guidance-ai/llguidance/blob/main/docs/json_schema.md>). JSON is written compactly
//! as OpenAI's structured output writes it: `", "` between items, `": "` after keys, no other whitespace
//! outside strings (llguidance's `whitespace_flexible: false`), so keys, separators and punctuation are forced.

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use specrt_core::{mask_words, Constraint, Result, SpecError};
use specrt_text::tokenizer::Tokenizer;

/// A constraint on a request's output.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputConstraint {
    /// Output is JSON valid against `schema` (llguidance's subset of JSON Schema). `strict` (OpenAI's): a schema
    /// keyword llguidance does not support is an error; not strict: such keywords are ignored (llguidance's
    /// `lenient`), so the output may not check them.
    JsonSchema {
        /// The schema (a JSON object).
        schema: Value,
        /// Refuse unsupported keywords instead of ignoring them.
        strict: bool,
    },
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// Output matches the regular expression (Rust `regex` syntax, whole output).
    Regex(String),
    /// Output is a sentence of the Lark grammar (llguidance's Lark syntax; the start rule is `start`).
    Lark(String),
    /// Output is exactly one of the strings (at least one, each non-empty).
    Choice(Vec<String>),
}

impl OutputConstraint {
    /// The constraint's kind as request fields name it: `"json_schema"`, `"json_object"`, `"regex"`, `"grammar"`,
    /// `"choice"`.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::JsonSchema { .. } => "json_schema",
            Self::JsonObject => "json_object",
            Self::Regex(_) => "regex",
            Self::Lark(_) => "grammar",
            Self::Choice(_) => "choice",
        }
    }

    /// llguidance's grammar for the constraint.
    ///
    /// Errors: [`SpecError::Setting`] for a schema that is not a JSON object or an empty choice list / string.
    fn grammar(&self) -> Result<TopLevelGrammar> {
        let json_options = |lenient: bool| {
            json!({
                "item_separator": ", ",
                "key_separator": ": ",
                "whitespace_flexible": false,
                "lenient": lenient,
            })
        };
        Ok(match self {
            Self::JsonSchema { schema, strict } => {
                let Value::Object(obj) = schema else {
                    return Err(SpecError::setting(
                        "json_schema",
                        format!(
                            "json_schema {} is invalid (expected a JSON object)",
                            short(&schema.to_string())
                        ),
                    ));
                };
                let mut obj = obj.clone();
                obj.insert("x-guidance".to_owned(), json_options(!strict));
                TopLevelGrammar::from_json_schema(Value::Object(obj))
            }
            Self::JsonObject => TopLevelGrammar::from_json_schema(
                json!({"type": "object", "x-guidance": json_options(false)}),
            ),
            Self::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Self::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Self::Choice(choices) => {
                if choices.is_empty() || choices.iter().any(String::is_empty) {
                    return Err(SpecError::setting(
                        "choice",
                        format!("choice {choices:?} is invalid (expected at least one non-empty string)"),
                    ));
                }
                // Lark string literals take JSON's escapes.
                let alts: Vec<String> = choices
                    .iter()
                    .map(|c| serde_json::to_string(c).expect("a string serialises"))
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
        })
    }

    /// Check the constraint compiles (schema, regex or grammar syntax, supported schema features), without a model:
    /// over a byte-level vocabulary. [`specrt_ort::resolve_request`] calls it, so a bad constraint is refused before
    /// the request queues.
    ///
    /// Errors: [`SpecError::Setting`] naming the kind (the field: `json_schema`, `json_object`, `regex`, `grammar`,
    /// `choice`) and llguidance's message.
    pub fn validate(&self) -> Result<()> {
        static FACTORY: OnceLock<std::result::Result<ParserFactory, String>> = OnceLock::new();
        let factory = FACTORY
            .get_or_init(|| {
                let env: TokEnv = Arc::new(ApproximateTokEnv::single_byte());
                new_factory(&env).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| SpecError::Internal(format!("llguidance byte-level factory: {e}")))?;
        factory
            .create_parser(self.grammar()?)
            .map(|_| ())
            .map_err(|e| self.error(&e.to_string()))
    }

    fn error(&self, message: &str) -> SpecError {
        let what = match self {
            Self::JsonSchema { schema, .. } => short(&schema.to_string()),
            Self::JsonObject => String::new(),
            Self::Regex(s) | Self::Lark(s) => short(s),
            Self::Choice(c) => short(&format!("{c:?}")),
        };
        SpecError::setting(
            self.kind(),
            format!("{} {what} is invalid: {message}", self.kind()),
        )
    }
}

/// The first 200 characters of `s` (for messages).
fn short(s: &str) -> String {
    if s.chars().count() <= 200 {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(200).collect();
        format!("{head:?}...")
    }
}

/// The bytes each id of `tokenizer` stands for (`[tokenizer ids]`, by id), as llguidance reads them from
/// `tokenizer.json`: byte-level pieces mapped back through GPT-2's byte table, SentencePiece's `▁` as a space and its
/// `<0xNN>` pieces as the byte; an added token marked special as its content after the marker byte
/// `0xFF` (`TokTrie::SPECIAL_TOKEN_MARKER`), so that it never equals plain text.
///
/// Errors: [`SpecError::ModelFormat`] for a tokenizer that is neither byte-level nor byte-fallback (llguidance's
/// message), [`SpecError::Internal`] if the tokenizer cannot be written back as JSON.
pub fn token_bytes(tokenizer: &Tokenizer) -> Result<Vec<Vec<u8>>> {
    let json: Value = serde_json::from_str(&tokenizer.to_json()?)
        .map_err(|e| SpecError::Internal(format!("tokenizer.json round trip: {e}")))?;
    llguidance::token_bytes_from_tokenizer_json(&json)
        .map_err(|e| SpecError::ModelFormat(format!("{}: token bytes: {e}", tokenizer.origin())))
}

/// The marker byte that begins the bytes of a special added token in [`token_bytes`].
pub const SPECIAL_TOKEN_MARKER: u8 = TokTrie::SPECIAL_TOKEN_MARKER;

fn new_factory(env: &TokEnv) -> anyhow::Result<ParserFactory> {
    let mut f = ParserFactory::new_simple(env)?;
    // Warnings go nowhere (errors come back as results).
    f.quiet();
    Ok(f)
}

/// llguidance's view of a tokenizer: the token trie from `tokenizer.json`'s token bytes (padded with placeholder
/// special tokens to the model's vocabulary size) and `tokenizers`' encoder for byte strings.
struct SpecrtTokEnv {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for SpecrtTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer.encode(text, false).unwrap_or_default()
        })
    }
}

/// llguidance's parser factory over one model's tokenizer (build once per model; compiling a constraint is then
/// cheap).
pub struct GrammarCompiler {
    factory: ParserFactory,
    env: TokEnv,
    vocab: usize,
}

impl GrammarCompiler {
    /// A compiler for a model with `vocab_size` logits (>= the tokenizer's ids; the rest are placeholders no
    /// constraint allows) whose end of sequence is any of `eos_token_ids` (at least one).
    ///
    /// Errors: [`SpecError::Config`] for no EOS id, an EOS id `>= vocab_size`, a vocabulary smaller than the
    /// tokenizer's, or a tokenizer llguidance cannot read (neither byte-level nor byte-fallback).
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize, eos_token_ids: &[u32]) -> Result<Self> {
        let Some(&first_eos) = eos_token_ids.first() else {
            return Err(SpecError::Config(
                "structured output needs the model's EOS ids (the folder gives none)".to_owned(),
            ));
        };
        if let Some(&bad) = eos_token_ids.iter().find(|&&e| e as usize >= vocab_size) {
            return Err(SpecError::Config(format!(
                "EOS id {bad} is out of range (expected < vocab size {vocab_size})"
            )));
        }
        let mut bytes = token_bytes(tokenizer).map_err(|e| {
            SpecError::Config(format!("structured output cannot use this tokenizer: {e}"))
        })?;
        if bytes.len() > vocab_size {
            return Err(SpecError::Config(format!(
                "the tokenizer has {} ids, more than the model's vocab size {vocab_size}",
                bytes.len()
            )));
        }
        while bytes.len() < vocab_size {
            let mut name = format!(".<[{}]>", bytes.len()).into_bytes();
            name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            bytes.push(name);
        }
        let vocab_u32 = u32::try_from(vocab_size)
            .map_err(|_| SpecError::Config(format!("vocab size {vocab_size} is too large")))?;
        let info = TokRxInfo::new(vocab_u32, first_eos);
        let trie = TokTrie::from(&info, &bytes).with_eos_tokens(eos_token_ids);
        let env: TokEnv = Arc::new(SpecrtTokEnv {
            trie,
            tokenizer: tokenizer.clone(),
        });
        let factory = new_factory(&env)
            .map_err(|e| SpecError::Internal(format!("llguidance parser factory: {e}")))?;
        Ok(Self {
            factory,
            env,
            vocab: vocab_size,
        })
    }

    /// Vocabulary size of the masks.
    #[must_use]
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// A fresh matcher of `constraint` for one request.
    ///
    /// Errors: [`SpecError::Setting`] naming the constraint's kind (its request field) when it does not compile.
    pub fn compile(&self, constraint: &OutputConstraint) -> Result<GrammarConstraint> {
        let parser = self
            .factory
            .create_parser(constraint.grammar()?)
            .map_err(|e| constraint.error(&e.to_string()))?;
        Ok(GrammarConstraint {
            matcher: Matcher::new(Ok(parser)),
            env: self.env.clone(),
            n_consumed: 0,
            words: mask_words(self.vocab),
            kind: constraint.kind(),
        })
    }
}

/// One request's llguidance matcher as a [`specrt_core::Constraint`].
pub struct GrammarConstraint {
    matcher: Matcher,
    env: TokEnv,
    n_consumed: usize,
    words: usize,
    kind: &'static str,
}

impl GrammarConstraint {
    fn err(&self, e: &anyhow::Error) -> SpecError {
        SpecError::Config(format!("{} constraint: {e}", self.kind))
    }

    /// The bytes the grammar forces next (llguidance's `compute_ff_bytes`; works for every tokenizer).
    pub fn forced_bytes(&mut self) -> Vec<u8> {
        self.matcher.compute_ff_bytes()
    }

    /// The tokens the grammar forces next in the tokenizer's canonical spelling (llguidance's
    /// `compute_ff_tokens`; empty for tokenizers llguidance does not consider canonical).
    pub fn forced_canonical_tokens(&mut self) -> Vec<u32> {
        self.matcher.compute_ff_tokens()
    }

    /// The bytes of `tokens` (special tokens marked with 0xff).
    #[must_use]
    pub fn token_bytes(&self, tokens: &[u32]) -> Vec<u8> {
        self.env.tok_trie().decode(tokens)
    }
}

impl Constraint for GrammarConstraint {
    fn len(&self) -> usize {
        self.n_consumed
    }

    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<()> {
        if mask.len() != self.words {
            return Err(SpecError::Shape(format!(
                "mask has {} words, expected {}",
                mask.len(),
                self.words
            )));
        }
        let m = self.matcher.compute_mask().map_err(|e| self.err(&e))?;
        let src = m.as_slice();
        let n = src.len().min(mask.len());
        mask[..n].copy_from_slice(&src[..n]);
        mask[n..].fill(0);
        Ok(())
    }

    fn advance(&mut self, token: u32) -> Result<()> {
        // Validated first: a refused token must leave the matcher usable (consuming it would poison it).
        let n = self
            .matcher
            .try_consume_tokens(&[token])
            .map_err(|e| self.err(&e))?;
        if n != 1 {
            return Err(SpecError::Config(format!(
                "{} constraint refuses token {token} after {} tokens",
                self.kind, self.n_consumed
            )));
        }
        self.n_consumed += 1;
        Ok(())
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.n_consumed {
            return Err(SpecError::Config(format!(
                "truncate({len}) is invalid (expected <= {} consumed tokens)",
                self.n_consumed
            )));
        }
        if len < self.n_consumed {
            self.matcher
                .rollback(self.n_consumed - len)
                .map_err(|e| self.err(&e))?;
            self.n_consumed = len;
        }
        Ok(())
    }

    fn is_accepting(&mut self) -> Result<bool> {
        self.matcher.is_accepting().map_err(|e| self.err(&e))
    }

    fn is_complete(&mut self) -> Result<bool> {
        if let Some(e) = self.matcher.get_error() {
            return Err(SpecError::Config(format!("{} constraint: {e}", self.kind)));
        }
        Ok(self.matcher.is_stopped())
    }

    fn forced_tokens(&mut self, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        out.extend(self.matcher.compute_ff_tokens());
        if out.is_empty() {
            // Not canonical (or nothing canonical to say): spell the forced bytes with the tokenizer, drop the last
            // token (the free text after it may merge with it), keep what the grammar accepts.
            let bytes = self.matcher.compute_ff_bytes();
            if bytes.is_empty() {
                return Ok(());
            }
            let mut toks = self.env.tokenize_bytes(&bytes);
            toks.pop();
            let n = self
                .matcher
                .validate_tokens(&toks)
                .map_err(|e| self.err(&e))?;
            toks.truncate(n);
            *out = toks;
        }
        if let Some(e) = self.matcher.get_error() {
            return Err(SpecError::Config(format!("{} constraint: {e}", self.kind)));
        }
        Ok(())
    }

    fn validate_tokens(&mut self, tokens: &[u32]) -> Result<usize> {
        self.matcher
            .validate_tokens(tokens)
            .map_err(|e| self.err(&e))
    }
}

/// The request fields that carry a constraint, by name, as the binding, `specrt serve` and the CLI take them: OpenAI's
/// `response_format`, then `json_schema`, `regex`, `grammar`, `choice`.
pub const CONSTRAINT_FIELDS: [&str; 5] = [
    "response_format",
    "json_schema",
    "regex",
    "grammar",
    "choice",
];

/// A request's structured-output fields as JSON values (`None` = not given; JSON `null` counts as not given), before
/// [`ConstraintFields::resolve`] turns them into at most one [`OutputConstraint`]. Every caller (Rust users, the
/// Python binding's keyword arguments, the server's request body) goes through this one translation.
///
/// - `response_format`: OpenAI's shape, `{"type": "text"}` (no constraint), `{"type": "json_object"}`, or
///   `{"type": "json_schema", "json_schema": {"name": str, "schema": {...}, "strict": bool}}` (`name` optional
///   here; `strict` default false, as OpenAI's).
/// - `json_schema`: a schema (a JSON object), or a string holding one; not strict (unsupported keywords ignored).
/// - `regex`: a string (Rust `regex` syntax, the whole output).
/// - `grammar`: a string (llguidance's Lark syntax, start rule `start`).
/// - `choice`: a list of non-empty strings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConstraintFields {
    /// OpenAI's `response_format`.
    pub response_format: Option<Value>,
    /// A JSON Schema (object) or its JSON text.
    pub json_schema: Option<Value>,
    /// A regular expression (string).
    pub regex: Option<Value>,
    /// A Lark grammar (string).
    pub grammar: Option<Value>,
    /// Strings to choose among (list of strings).
    pub choice: Option<Value>,
}

impl ConstraintFields {
    /// Set field `name` (one of [`CONSTRAINT_FIELDS`]) to `value`; returns false for another name (the field set
    /// is unchanged).
    pub fn set(&mut self, name: &str, value: Value) -> bool {
        let slot = match name {
            "response_format" => &mut self.response_format,
            "json_schema" => &mut self.json_schema,
            "regex" => &mut self.regex,
            "grammar" => &mut self.grammar,
            "choice" => &mut self.choice,
            _ => return false,
        };
        *slot = (!value.is_null()).then_some(value);
        true
    }

    /// The constraint the fields ask for (`None`: none, or `response_format` `{"type": "text"}`). The syntax of the
    /// schema, regex or grammar is not compiled here: [`OutputConstraint::validate`] does that.
    ///
    /// Errors: [`SpecError::Setting`] naming the field, its value and what is allowed, for a value of the wrong type,
    /// a `response_format` of unknown `type` or without its `json_schema.schema`, a `json_schema` string that is not
    /// JSON, an empty `choice`, or more than one constraint at once.
    pub fn resolve(&self) -> Result<Option<OutputConstraint>> {
        let mut found: Vec<(&'static str, OutputConstraint)> = Vec::new();
        if let Some(rf) = &self.response_format {
            if let Some(c) = response_format(rf)? {
                found.push(("response_format", c));
            }
        }
        if let Some(s) = &self.json_schema {
            let schema = match s {
                Value::String(text) => serde_json::from_str(text).map_err(|e| {
                    SpecError::setting(
                        "json_schema",
                        format!(
                            "json_schema {} is invalid (expected a JSON Schema object, or a string of JSON): {e}",
                            short(text)
                        ),
                    )
                })?,
                other => other.clone(),
            };
            if !schema.is_object() {
                return Err(field_error(
                    "json_schema",
                    s,
                    "a JSON Schema object, or a string of JSON",
                ));
            }
            found.push((
                "json_schema",
                OutputConstraint::JsonSchema {
                    schema,
                    strict: false,
                },
            ));
        }
        if let Some(r) = &self.regex {
            let Value::String(rx) = r else {
                return Err(field_error("regex", r, "a string (a regular expression)"));
            };
            found.push(("regex", OutputConstraint::Regex(rx.clone())));
        }
        if let Some(g) = &self.grammar {
            let Value::String(lark) = g else {
                return Err(field_error("grammar", g, "a string (a Lark grammar)"));
            };
            found.push(("grammar", OutputConstraint::Lark(lark.clone())));
        }
        if let Some(c) = &self.choice {
            let expected = "a non-empty list of non-empty strings";
            let Value::Array(items) = c else {
                return Err(field_error("choice", c, expected));
            };
            let choices: Option<Vec<String>> = items
                .iter()
                .map(|v| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned))
                .collect();
            match choices {
                Some(choices) if !choices.is_empty() => {
                    found.push(("choice", OutputConstraint::Choice(choices)))
                }
                _ => return Err(field_error("choice", c, expected)),
            }
        }
        if found.len() > 1 {
            let names: Vec<&str> = found.iter().map(|(n, _)| *n).collect();
            // The field named is the second one: the first alone would have been accepted.
            return Err(SpecError::setting(
                names[1],
                format!(
                    "structured output takes at most one of {} (got {})",
                    CONSTRAINT_FIELDS.join(", "),
                    names.join(" and ")
                ),
            ));
        }
        Ok(found.pop().map(|(_, c)| c))
    }
}

/// A [`SpecError::Setting`] "`{name} {value} is invalid (expected {expected})`" whose field is `name` (words joined
/// by dots: `response_format type` is the field `response_format.type`).
fn field_error(name: &str, value: &Value, expected: &str) -> SpecError {
    let text = value.to_string();
    let shown = if text.chars().count() <= 200 {
        text
    } else {
        format!("{}...", text.chars().take(200).collect::<String>())
    };
    SpecError::setting(
        name.replace(' ', "."),
        format!("{name} {shown} is invalid (expected {expected})"),
    )
}

/// OpenAI's `response_format` as a constraint (`None` for `{"type": "text"}`).
fn response_format(rf: &Value) -> Result<Option<OutputConstraint>> {
    const TYPES: &str = "'text', 'json_object', 'json_schema'";
    let Some(obj) = rf.as_object() else {
        return Err(field_error(
            "response_format",
            rf,
            &format!("an object {{\"type\": ...}} with type one of: {TYPES}"),
        ));
    };
    match obj.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(OutputConstraint::JsonObject)),
        Some("json_schema") => {
            let expected = "{\"name\": str, \"schema\": {...}, \"strict\": bool}";
            let js = obj.get("json_schema").unwrap_or(&Value::Null);
            let Some(js_obj) = js.as_object() else {
                return Err(field_error("response_format.json_schema", js, expected));
            };
            // OpenAI's rule for the name (required; vLLM requires it too).
            let name = js_obj.get("name").unwrap_or(&Value::Null);
            let valid = name.as_str().is_some_and(|n| {
                (1..=64).contains(&n.len())
                    && n.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            });
            if !valid {
                return Err(field_error(
                    "response_format.json_schema.name",
                    name,
                    "a string of 1 to 64 letters, digits, underscores or dashes",
                ));
            }
            let strict = match js_obj.get("strict") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => {
                    return Err(field_error(
                        "response_format.json_schema.strict",
                        other,
                        "true or false",
                    ))
                }
            };
            let schema = js_obj.get("schema").unwrap_or(&Value::Null);
            if !schema.is_object() {
                return Err(field_error(
                    "response_format.json_schema.schema",
                    schema,
                    "a JSON Schema object",
                ));
            }
            Ok(Some(OutputConstraint::JsonSchema {
                schema: schema.clone(),
                strict,
            }))
        }
        _ => Err(field_error(
            "response_format type",
            obj.get("type").unwrap_or(&Value::Null),
            &format!("one of: {TYPES}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, Value)]) -> ConstraintFields {
        let mut f = ConstraintFields::default();
        for (k, v) in pairs {
            assert!(f.set(k, v.clone()), "{k}");
        }
        f
    }

    /// The message of a refusal, after checking its field is the one the message names (a conflict of two
    /// constraints names the second).
    fn err(pairs: &[(&str, Value)]) -> String {
        match fields(pairs).resolve() {
            Err(SpecError::Setting { field, message }) => {
                assert!(
                    message.starts_with(&format!("{field} "))
                        || message.starts_with(&format!("{} ", field.replace('.', " ")))
                        || message.ends_with(&format!(" and {field})")),
                    "{field}: {message}"
                );
                message
            }
            other => panic!("expected a setting error, got {other:?}"),
        }
    }

    #[test]
    fn each_field_gives_its_constraint() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(fields(&[]).resolve().unwrap(), None);
        assert_eq!(
            fields(&[("response_format", json!({"type": "text"}))])
                .resolve()
                .unwrap(),
            None
        );
        assert_eq!(
            fields(&[("response_format", json!({"type": "json_object"}))])
                .resolve()
                .unwrap(),
            Some(OutputConstraint::JsonObject)
        );
        assert_eq!(
            fields(&[(
                "response_format",
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}})
            )])
            .resolve()
            .unwrap(),
            Some(OutputConstraint::JsonSchema { schema: schema.clone(), strict: true })
        );
        assert_eq!(
            fields(&[("json_schema", Value::String(schema.to_string()))])
                .resolve()
                .unwrap(),
            Some(OutputConstraint::JsonSchema {
                schema: schema.clone(),
                strict: false
            })
        );
        assert_eq!(
            fields(&[("regex", json!("[0-9]+"))]).resolve().unwrap(),
            Some(OutputConstraint::Regex("[0-9]+".into()))
        );
        assert_eq!(
            fields(&[("grammar", json!("start: \"a\""))])
                .resolve()
                .unwrap(),
            Some(OutputConstraint::Lark("start: \"a\"".into()))
        );
        assert_eq!(
            fields(&[("choice", json!(["a", "b"]))]).resolve().unwrap(),
            Some(OutputConstraint::Choice(vec!["a".into(), "b".into()]))
        );
        // null is "not given"; response_format text does not count as a constraint.
        assert_eq!(
            fields(&[
                ("regex", Value::Null),
                ("response_format", json!({"type": "text"})),
                ("choice", json!(["a"]))
            ])
            .resolve()
            .unwrap(),
            Some(OutputConstraint::Choice(vec!["a".into()]))
        );
        assert!(!ConstraintFields::default().set("guided_json", json!({})));
    }

    #[test]
    fn bad_fields_are_refused_by_name() {
        let m = err(&[("regex", json!("a")), ("choice", json!(["a"]))]);
        assert!(
            m.contains("at most one of") && m.contains("regex and choice"),
            "{m}"
        );
        let m = err(&[("response_format", json!({"type": "xml"}))]);
        assert!(
            m.contains("response_format type \"xml\" is invalid") && m.contains("'json_schema'"),
            "{m}"
        );
        let m = err(&[("response_format", json!({"type": "json_schema"}))]);
        assert!(
            m.starts_with("response_format.json_schema null is invalid"),
            "{m}"
        );
        let m = err(&[(
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x"}}),
        )]);
        assert!(
            m.starts_with("response_format.json_schema.schema null"),
            "{m}"
        );
        for name in [
            json!(null),
            json!(""),
            json!("has space"),
            json!(5),
            json!("x".repeat(65)),
        ] {
            let mut js = json!({"schema": {"type": "object"}});
            if !name.is_null() {
                js["name"] = name.clone();
            }
            let m = err(&[(
                "response_format",
                json!({"type": "json_schema", "json_schema": js}),
            )]);
            assert!(
                m.starts_with(&format!(
                    "response_format.json_schema.name {name} is invalid"
                )) && m.contains("1 to 64 letters"),
                "{m}"
            );
        }
        let m = err(&[("json_schema", json!("{not json"))]);
        assert!(m.starts_with("json_schema \"{not json\" is invalid"), "{m}");
        let m = err(&[("json_schema", json!([1]))]);
        assert!(m.starts_with("json_schema [1] is invalid"), "{m}");
        let m = err(&[("regex", json!(3))]);
        assert!(
            m.starts_with("regex 3 is invalid") && m.contains("a string"),
            "{m}"
        );
        let m = err(&[("grammar", json!(["x"]))]);
        assert!(m.starts_with("grammar"), "{m}");
        for bad in [json!([]), json!(["a", ""]), json!("a"), json!([1])] {
            let m = err(&[("choice", bad)]);
            assert!(
                m.starts_with("choice") && m.contains("non-empty list"),
                "{m}"
            );
        }
    }
}
