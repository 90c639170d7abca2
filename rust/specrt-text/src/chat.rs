//! Chat templates rendered with `minijinja` exactly as Hugging Face transformers' `apply_chat_template(...,
//! tokenize=False)` renders them with jinja2 (transformers 5: `utils/chat_template_utils.py`,
//! `_compile_jinja_template` and `render_jinja_template`).
//!
//! The environment transformers builds, and what stands for each part here:
//!
//! | transformers (jinja2) | here |
//! |---|---|
//! | `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` | the same two flags; no auto-escaping |
//! | `jinja2.ext.loopcontrols` | minijinja's `loop_controls` (`{% break %}`, `{% continue %}`) |
//! | `AssistantTracker` (`{% generation %}...{% endgeneration %}`) | the tags become `{% if true %}` / `{% endif %}`: the block renders its body |
//! | `raise_exception(message)` | an error whose message is the template's ([`SpecError::Config`]) |
//! | `strftime_now(format)` (`datetime.now().strftime`) | the same C-locale directives over [`ChatTime`] ([`ChatTemplate::with_now`], default: now, UTC) |
//! | `tojson` = `json.dumps(x, ensure_ascii=False, indent=, separators=, sort_keys=)` | [`python_json`]: `", "` / `": "`, no HTML escaping, key order kept |
//! | `str(value)` of `{{ value }}` (`True`, `None`, `{'a': 1}`) | the formatter and the `string`, `join`, `trim`, `upper`, `lower`, `replace` filters ([`python_str`]); `length` and `items` of undefined (0, empty) |
//! | Python `str` / `dict` / `list` methods | minijinja-contrib's `pycompat` |
//! | jinja2's tests (`string`, `mapping`, `sequence`, `iterable`, `number`, ...) | minijinja's, with `sequence`, `iterable`, `number` and `integer` as jinja2 has them |
//! | messages: `None`-valued keys dropped, reasoning aliased (`_normalize_chat_messages`, `_alias_reasoning_fields`) | the same in [`ChatTemplate::render`] |
//! | context: `messages`, `tools`, `documents`, `add_generation_prompt`, the special-token strings, then `**kwargs` | the same |
//!
//! Not the same: `~` (string concatenation) and string formatting of non-strings inside other filters use
//! minijinja's formatting (`true`, `none`, `{"a": 1}`) where Python would write `True`, `None`, `{'a': 1}`;
//! `'...'|safe + x` does not HTML-escape `x` (jinja2's `Markup.__add__` does, even without auto-escaping: llama.cpp's
//! functionary-medium-v3.1 template is the one case seen); unknown filters and tests are reported when reached rather
//! than when the template is compiled. `tests/text/test_chat_template.py` compares both on the registry's templates and
//! llama.cpp's `models/templates` collection.

use std::fmt::Write as _;
use std::path::Path;

use minijinja::value::{from_args, Kwargs, Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, UndefinedBehavior};
use serde_json::{Map, Value as Json};
use specrt_core::{Result, SpecError};

pub use crate::chat_time::ChatTime;
pub use crate::python_values::{python_json, python_repr, python_str};
use crate::python_values::{write_json, JsonOptions};

/// The template's name in minijinja (errors name it).
const TEMPLATE_NAME: &str = "chat_template.jinja";

/// The special-token attributes transformers passes to every template (`SPECIAL_TOKENS_ATTRIBUTES`, those not
/// None), as strings.
pub const SPECIAL_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// The context names [`ChatTemplate::render`] sets itself; `extra` may not use them.
const RESERVED_NAMES: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// Names a message's reasoning is passed under; the first is the one templates read (transformers'
/// `_REASONING_FIELDS`).
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// A chat template and the special-token strings it is rendered with.
///
/// Compiled once ([`ChatTemplate::new`]); [`ChatTemplate::render`] is `&self` and thread-safe.
pub struct ChatTemplate {
    source: String,
    special_tokens: Map<String, Json>,
    now: Option<ChatTime>,
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("special_tokens", &self.special_tokens)
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compile `source` (a Jinja chat template) with `special_tokens` (name -> string, e.g.
    /// `{"bos_token": "<s>", "eos_token": "</s>"}`) passed to every rendering as transformers passes its
    /// `special_tokens_map`.
    ///
    /// # Errors
    /// [`SpecError::Config`] when minijinja cannot compile the template (the message names the construct and the
    /// line, e.g. `syntax error: unknown statement do`), or a special token is not a string.
    pub fn new(source: impl Into<String>, special_tokens: Map<String, Json>) -> Result<Self> {
        let source = source.into();
        for (k, v) in &special_tokens {
            if !v.is_string() {
                return Err(SpecError::Config(format!(
                    "special token {k:?} is {v}, expected a string"
                )));
            }
        }
        let env = build_env(&source, None)?;
        Ok(Self {
            source,
            special_tokens,
            now: None,
            env,
        })
    }

    /// The template of a folder written by `specrt convert`: `chat_template.jinja` (else `tokenizer_config.json`'s
    /// `chat_template`), the special tokens of `tokenizer_config.json` (strings or `{"content": ...}`), and
    /// where that file or a token is missing, `specrt_config.json`'s `bos_token_id` / `eos_token_ids[0]` /
    /// `pad_token_id` named through `tokenizer.json`.
    ///
    /// # Errors
    /// [`SpecError::NotFound`] when the folder has no template, [`SpecError::Io`] / [`SpecError::ModelFormat`] when a
    /// file is unreadable / malformed; the errors of [`ChatTemplate::new`].
    pub fn from_folder(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let config = read_json_object(&path.join("tokenizer_config.json"))?;
        let template_path = path.join("chat_template.jinja");
        let source = if template_path.is_file() {
            std::fs::read_to_string(&template_path)
                .map_err(|e| SpecError::io(template_path.display(), &e))?
        } else if let Some(Json::String(s)) = config.as_ref().and_then(|c| c.get("chat_template")) {
            s.clone()
        } else {
            return Err(SpecError::NotFound(format!(
                "{} not found (and tokenizer_config.json has no chat_template string): {} has no chat template",
                template_path.display(),
                path.display()
            )));
        };
        let mut special = Map::new();
        if let Some(config) = &config {
            for name in SPECIAL_TOKEN_NAMES {
                match config.get(name) {
                    Some(Json::String(s)) => {
                        special.insert(name.to_owned(), Json::String(s.clone()));
                    }
                    Some(Json::Object(o)) => {
                        if let Some(Json::String(s)) = o.get("content") {
                            special.insert(name.to_owned(), Json::String(s.clone()));
                        }
                    }
                    _ => {}
                }
            }
        }
        let ids = [
            ("bos_token", "bos_token_id"),
            ("eos_token", "eos_token_ids"),
            ("pad_token", "pad_token_id"),
        ];
        if ids.iter().any(|(name, _)| !special.contains_key(*name)) {
            if let Some(spec) = read_json_object(&path.join("specrt_config.json"))? {
                let mut names = None;
                for (name, key) in ids {
                    if special.contains_key(name) {
                        continue;
                    }
                    let id = match spec.get(key) {
                        Some(Json::Array(a)) => a.first().and_then(Json::as_u64),
                        Some(v) => v.as_u64(),
                        None => None,
                    };
                    let Some(id) = id else { continue };
                    if names.is_none() {
                        names = Some(token_names(&path.join("tokenizer.json"))?);
                    }
                    if let Some(s) = names.as_ref().and_then(|n| n.get(&id)) {
                        special.insert(name.to_owned(), Json::String(s.clone()));
                    }
                }
            }
        }
        Self::new(source, special)
    }

    /// The same template with `strftime_now` formatting `now` (None: the current time at each rendering).
    ///
    /// # Errors
    /// None in practice (the template already compiled); kept a `Result` for the recompilation it does.
    pub fn with_now(mut self, now: Option<ChatTime>) -> Result<Self> {
        if now == self.now {
            return Ok(self);
        }
        self.env = build_env(&self.source, now)?;
        self.now = now;
        Ok(self)
    }

    /// The template's source text.
    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The special-token strings passed to every rendering (name -> string).
    #[must_use]
    pub fn special_tokens(&self) -> &Map<String, Json> {
        &self.special_tokens
    }

    /// The fixed time of `strftime_now`, or None (the current time).
    #[must_use]
    pub fn now(&self) -> Option<ChatTime> {
        self.now
    }

    /// Render `messages` as transformers' `apply_chat_template(messages, tools=tools, documents=documents,
    /// add_generation_prompt=add_generation_prompt, tokenize=False, **extra)` does: each message's `None`-valued
    /// keys dropped and its reasoning aliased (`thinking` / `reasoning_content`), then the template rendered with
    /// `messages`, `tools`, `documents`, `add_generation_prompt`, the special tokens and `extra` (which overrides
    /// a special token of the same name).
    ///
    /// # Errors
    /// [`SpecError::Setting`] naming `messages` for a message that is not an object, `kwargs` for an `extra` of a
    /// reserved name; [`SpecError::Config`]: the template calls
    /// `raise_exception(message)` (`chat template failed: <message>`), or rendering fails (the message names the
    /// construct and the line, e.g. `unknown filter: filter from_json is unknown (line 3)`).
    pub fn render(
        &self,
        messages: &[Json],
        add_generation_prompt: bool,
        tools: Option<&[Json]>,
        documents: Option<&[Json]>,
        extra: &Map<String, Json>,
    ) -> Result<String> {
        let mut normalized = Vec::with_capacity(messages.len());
        for (i, m) in messages.iter().enumerate() {
            let Json::Object(m) = m else {
                return Err(SpecError::setting(
                    "messages",
                    format!(
                        "chat messages[{i}] is {}, expected an object (a dict with role and content)",
                        json_kind(m)
                    ),
                ));
            };
            normalized.push(Json::Object(alias_reasoning(normalize_message(m))));
        }
        if let Some(key) = extra.keys().find(|k| RESERVED_NAMES.contains(&k.as_str())) {
            return Err(SpecError::setting(
                "kwargs",
                format!(
                    "chat template argument {key:?} is reserved (the renderer sets messages, tools, documents and \
                     add_generation_prompt itself)"
                ),
            ));
        }
        let mut ctx = Map::new();
        ctx.insert("messages".into(), Json::Array(normalized));
        ctx.insert(
            "tools".into(),
            tools.map_or(Json::Null, |t| Json::Array(t.to_vec())),
        );
        ctx.insert(
            "documents".into(),
            documents.map_or(Json::Null, |d| Json::Array(d.to_vec())),
        );
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(add_generation_prompt),
        );
        for (k, v) in self.special_tokens.iter().chain(extra) {
            ctx.insert(k.clone(), v.clone());
        }
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| to_spec_error(&e, "chat template cannot be compiled by minijinja"))?;
        template
            .render(Value::from_serialize(&ctx))
            .map_err(|e| to_spec_error(&e, "chat template failed"))
    }
}

/// transformers' `_normalize_chat_messages`: a message without its `None`-valued keys.
fn normalize_message(m: &Map<String, Json>) -> Map<String, Json> {
    m.iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// transformers' `_alias_reasoning_fields`: a message with reasoning under any of [`REASONING_FIELDS`] becomes
/// `{"thinking": r, **message, "reasoning_content": r}` (`r` the first one not None).
fn alias_reasoning(m: Map<String, Json>) -> Map<String, Json> {
    let Some(r) = REASONING_FIELDS
        .iter()
        .find_map(|k| m.get(*k).filter(|v| !v.is_null()).cloned())
    else {
        return m;
    };
    let mut out = Map::new();
    out.insert("thinking".into(), r.clone());
    for (k, v) in m {
        out.insert(k, v);
    }
    out.insert("reasoning_content".into(), r);
    out
}

fn json_kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}

/// A JSON object file, None when it does not exist.
fn read_json_object(path: &Path) -> Result<Option<Map<String, Json>>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| SpecError::io(path.display(), &e))?;
    match serde_json::from_str::<Json>(&text) {
        Ok(Json::Object(o)) => Ok(Some(o)),
        Ok(other) => Err(SpecError::ModelFormat(format!(
            "{}: expected a JSON object, found {}",
            path.display(),
            json_kind(&other)
        ))),
        Err(e) => Err(SpecError::ModelFormat(format!(
            "{}: not valid JSON: {e}",
            path.display()
        ))),
    }
}

/// id -> token string of a `tokenizer.json` (added tokens, then the model's vocabulary).
fn token_names(path: &Path) -> Result<std::collections::HashMap<u64, String>> {
    let mut names = std::collections::HashMap::new();
    let Some(tok) = read_json_object(path)? else {
        return Ok(names);
    };
    if let Some(Json::Array(added)) = tok.get("added_tokens") {
        for t in added {
            if let (Some(id), Some(Json::String(s))) =
                (t.get("id").and_then(Json::as_u64), t.get("content"))
            {
                names.insert(id, s.clone());
            }
        }
    }
    if let Some(Json::Object(vocab)) = tok.get("model").and_then(|m| m.get("vocab")) {
        for (s, id) in vocab {
            if let Some(id) = id.as_u64() {
                names.entry(id).or_insert_with(|| s.clone());
            }
        }
    }
    Ok(names)
}

/// The message of a `raise_exception` call, carried as the error's source.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// A minijinja error as [`SpecError::Config`]: `raise_exception`'s message as it is, anything else its kind,
/// detail (the construct: filter, test, method, statement) and line.
fn to_spec_error(err: &Error, what: &str) -> SpecError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(s) = source {
        if let Some(Raised(msg)) = s.downcast_ref::<Raised>() {
            return SpecError::Config(format!("{what}: {msg}"));
        }
        source = s.source();
    }
    let mut msg = format!("{what}: {}", err.kind());
    if let Some(detail) = err.detail() {
        let _ = write!(msg, ": {detail}");
    }
    if let Some(line) = err.line() {
        let _ = write!(msg, " (line {line})");
    }
    SpecError::Config(msg)
}

/// `{% generation %}` / `{% endgeneration %}` (transformers' `AssistantTracker`, which renders the body as it is)
/// as `{% if true %}` / `{% endif %}`, whitespace control kept.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, close) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        match body.trim() {
            "generation" => {
                let _ = write!(out, "{{%{open} if true {close}%}}");
            }
            "endgeneration" => {
                let _ = write!(out, "{{%{open} endif {close}%}}");
            }
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The environment transformers' `_compile_jinja_template` builds, with `source` added as [`TEMPLATE_NAME`].
fn build_env(source: &str, now: Option<ChatTime>) -> Result<Environment<'static>> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(python_methods);
    env.set_formatter(|out, _state, value| {
        out.write_str(&python_str(value))
            .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
    });
    minijinja_contrib::add_to_environment(&mut env);
    env.remove_filter("pluralize"); // not a jinja2 filter
    env.add_filter("tojson", tojson_filter);
    env.add_filter("string", |v: &Value| Value::from(python_str(v)));
    env.add_filter("join", join_filter);
    // jinja2's `len(Undefined)` is 0 (a dropped `content: None` key reads as undefined).
    let length = |v: &Value| -> std::result::Result<usize, Error> {
        if v.is_undefined() {
            Ok(0)
        } else {
            minijinja::filters::length(v)
        }
    };
    env.add_filter("length", length);
    env.add_filter("count", length);
    env.add_filter("items", |v: &Value| -> std::result::Result<Value, Error> {
        if v.is_undefined() {
            Ok(Value::from(Vec::<Value>::new()))
        } else {
            minijinja::filters::items(v)
        }
    });
    // jinja2's text filters take `str(value)` of any value (a list of content parts prints as its repr).
    env.add_filter("trim", |v: &Value, chars: Option<String>| {
        let s = python_str(v);
        Value::from(match chars {
            Some(c) => s.trim_matches(|x| c.contains(x)).to_owned(),
            None => s.trim().to_owned(),
        })
    });
    env.add_filter("upper", |v: &Value| {
        Value::from(python_str(v).to_uppercase())
    });
    env.add_filter("lower", |v: &Value| {
        Value::from(python_str(v).to_lowercase())
    });
    env.add_filter(
        "replace",
        |v: &Value, old: &Value, new: &Value, count: Option<i64>| {
            let (s, old, new) = (python_str(v), python_str(old), python_str(new));
            Value::from(match count.and_then(|c| usize::try_from(c).ok()) {
                Some(c) => s.replacen(&old, &new, c),
                None => s.replace(&old, &new),
            })
        },
    );
    env.add_test("sequence", |v: &Value| {
        matches!(
            v.kind(),
            ValueKind::Seq | ValueKind::String | ValueKind::Map
        )
    });
    env.add_test("number", |v: &Value| {
        matches!(v.kind(), ValueKind::Number | ValueKind::Bool)
    });
    env.add_test("integer", Value::is_integer);
    // jinja2's `iter(value)` succeeds: not for None or numbers (minijinja iterates none as empty), yes for
    // jinja2's Undefined.
    env.add_test("iterable", |v: &Value| {
        matches!(
            v.kind(),
            ValueKind::Seq
                | ValueKind::Map
                | ValueKind::String
                | ValueKind::Bytes
                | ValueKind::Iterable
                | ValueKind::Undefined
        )
    });
    env.add_function(
        "raise_exception",
        |message: Value| -> std::result::Result<Value, Error> {
            let msg = python_str(&message);
            Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(Raised(msg)))
        },
    );
    env.add_function("strftime_now", move |format: &str| {
        now.unwrap_or_else(ChatTime::now_utc).strftime(format)
    });
    env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source))
        .map_err(|e| to_spec_error(&e, "chat template cannot be compiled by minijinja"))?;
    Ok(env)
}

/// minijinja-contrib's Python methods (`str.strip`, `dict.items`, ...) plus a few it lacks.
fn python_methods(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, Error> {
    match (value.kind(), method) {
        (ValueKind::String, "removeprefix" | "removesuffix") => {
            let s = value.as_str().unwrap_or_default();
            let (affix,): (&str,) = from_args(args)?;
            let out = if method == "removeprefix" {
                s.strip_prefix(affix)
            } else {
                s.strip_suffix(affix)
            };
            Ok(Value::from(out.unwrap_or(s)))
        }
        (ValueKind::Seq, "index") => {
            let (needle,): (Value,) = from_args(args)?;
            let iter = value.try_iter()?;
            for (i, item) in iter.enumerate() {
                if item == needle {
                    return Ok(Value::from(i));
                }
            }
            Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("{} is not in list", python_repr(&needle)),
            ))
        }
        _ => minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args),
    }
}

/// `join(d="", attribute=None)` with each item as Python's `str()` writes it.
fn join_filter(value: &Value, args: Rest<Value>) -> std::result::Result<Value, Error> {
    let (sep, attribute, kwargs): (Option<Value>, Option<Value>, Kwargs) = from_args(&args)?;
    let sep = match sep.or(kwargs.get::<Option<Value>>("d")?) {
        Some(s) => python_str(&s),
        None => String::new(),
    };
    let attribute: Option<Value> = attribute.or(kwargs.get::<Option<Value>>("attribute")?);
    kwargs.assert_all_used()?;
    let mut out = String::new();
    for (i, item) in value.try_iter()?.enumerate() {
        if i > 0 {
            out.push_str(&sep);
        }
        let item = match &attribute {
            Some(a) => get_path(&item, a)?,
            None => item,
        };
        out.push_str(&python_str(&item));
    }
    Ok(Value::from(out))
}

/// jinja2's attribute path: `"a.b.0"` (dotted, integer parts index sequences) or an integer.
fn get_path(value: &Value, attribute: &Value) -> std::result::Result<Value, Error> {
    if let Some(s) = attribute.as_str() {
        let mut v = value.clone();
        for part in s.split('.') {
            v = match part.parse::<i64>() {
                Ok(i) if v.kind() == ValueKind::Seq => v.get_item(&Value::from(i))?,
                _ => v.get_attr(part)?,
            };
        }
        Ok(v)
    } else {
        value.get_item(attribute)
    }
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson_filter(value: &Value, args: Rest<Value>) -> std::result::Result<Value, Error> {
    let (ensure_ascii, indent, separators, sort_keys, kwargs): (
        Option<Value>,
        Option<Value>,
        Option<Value>,
        Option<Value>,
        Kwargs,
    ) = from_args(&args)?;
    let pick = |pos: Option<Value>, name: &str| -> std::result::Result<Value, Error> {
        Ok(match pos {
            Some(v) => v,
            None => kwargs
                .get::<Option<Value>>(name)?
                .unwrap_or(Value::from(())),
        })
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_true();
    let indent = pick(indent, "indent")?;
    let separators = pick(separators, "separators")?;
    let sort_keys = pick(sort_keys, "sort_keys")?.is_true();
    kwargs.assert_all_used()?;
    let indent = match indent.kind() {
        ValueKind::None | ValueKind::Undefined => None,
        ValueKind::String => Some(indent.as_str().unwrap_or_default().to_owned()),
        ValueKind::Number if indent.is_integer() => {
            let n = indent.as_i64().unwrap_or(0);
            Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "tojson: indent {} is invalid (expected None, an int or a str)",
                    python_repr(&indent)
                ),
            ))
        }
    };
    let (item_sep, key_sep) = match separators.kind() {
        ValueKind::None | ValueKind::Undefined => (
            if indent.is_some() { "," } else { ", " }.to_owned(),
            ": ".to_owned(),
        ),
        _ => {
            let parts: Vec<Value> = separators.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.kind() == ValueKind::String && b.kind() == ValueKind::String => (
                    a.as_str().unwrap_or_default().to_owned(),
                    b.as_str().unwrap_or_default().to_owned(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!(
                            "tojson: separators {} is invalid (expected (item_separator, key_separator))",
                            python_repr(&separators)
                        ),
                    ))
                }
            }
        }
    };
    let opts = JsonOptions {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(Value::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, messages: &Json) -> Result<String> {
        let t = ChatTemplate::new(src, Map::new())?;
        t.render(messages.as_array().unwrap(), true, None, None, &Map::new())
    }

    #[test]
    fn chatml_renders_with_trim_and_lstrip_blocks() {
        let src = "{% for m in messages %}\n  {% if m.role == 'user' %}\n<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n  {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}\n";
        let out = render(src, &json!([{"role": "user", "content": "hi"}])).unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let src = "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}|{{ messages[0].x | tojson(separators=(',', ':')) }}|{{ messages[0] | tojson(sort_keys=true) }}";
        let m = json!([{"b": "<a & 'q'>", "a": [1, 2.5, 1e20, true, null], "x": {"é": "\n"}}]);
        let out = render(src, &m).unwrap();
        let parts: Vec<&str> = out.split('|').collect();
        assert_eq!(
            parts[0],
            r#"{"b": "<a & 'q'>", "a": [1, 2.5, 1e+20, true, null], "x": {"é": "\n"}}"#
        );
        assert_eq!(
            parts[1],
            "{\n  \"b\": \"<a & 'q'>\",\n  \"a\": [\n    1,\n    2.5,\n    1e+20,\n    true,\n    null\n  ],\n  \"x\": {\n    \"é\": \"\\n\"\n  }\n}"
        );
        assert_eq!(parts[2], r#"{"é":"\n"}"#);
        assert!(parts[3].starts_with(r#"{"a": [1"#));
    }

    #[test]
    fn values_print_as_python_str() {
        let src = "{{ messages[0].a }} {{ messages[0].b }} {{ messages[0].c }} {{ messages[0].d }} {{ messages[0].e }} {{ messages[0].missing }}.";
        // None-valued keys are dropped (transformers' normalisation), so `c` is printed through a list.
        let m = json!([{"a": true, "b": [1, "x'", 0.1], "c": [null], "d": {"k": false}, "e": 3.0}]);
        assert_eq!(
            render(src, &m).unwrap(),
            "True [1, \"x'\", 0.1] [None] {'k': False} 3.0 ."
        );
    }

    #[test]
    fn raise_exception_carries_its_message() {
        let err = render(
            "{{ raise_exception('only user and assistant roles') }}",
            &json!([]),
        )
        .unwrap_err();
        assert_eq!(
            err,
            SpecError::Config("chat template failed: only user and assistant roles".into())
        );
    }

    #[test]
    fn unknown_filter_and_method_are_named_with_their_line() {
        let err = render("\n{{ messages | from_json }}", &json!([]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("from_json") && err.contains("line 2"), "{err}");
        let err = render("{{ 'a'.zfill(3) }}", &json!([]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("zfill"), "{err}");
        let err = ChatTemplate::new("\n\n{% trans %}hi{% endtrans %}", Map::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("trans") && err.contains("line 3"), "{err}");
    }

    #[test]
    fn generation_blocks_render_their_body() {
        let src = "{% for m in messages %}{%- generation -%} [{{ m.content }}] {%- endgeneration %}{% endfor %}";
        assert_eq!(
            render(src, &json!([{"role": "assistant", "content": "x"}])).unwrap(),
            "[x]"
        );
    }

    #[test]
    fn strftime_now_formats_the_fixed_time() {
        let now = ChatTime::new(2024, 7, 26, 9, 5, 3).unwrap();
        let t = ChatTemplate::new(
            "{{ strftime_now('%d %b %Y|%A %B %-d|%Y-%m-%d %H:%M:%S|%j %I%p') }}",
            Map::new(),
        )
        .unwrap()
        .with_now(Some(now))
        .unwrap();
        let out = t.render(&[], false, None, None, &Map::new()).unwrap();
        assert_eq!(
            out,
            "26 Jul 2024|Friday July 26|2024-07-26 09:05:03|208 09AM"
        );
    }

    #[test]
    fn messages_are_normalised_as_transformers_does() {
        let src = "{% for m in messages %}{{ m | tojson }}{% endfor %}";
        let m = json!([{"role": "assistant", "content": null, "reasoning": "r"}]);
        assert_eq!(
            render(src, &m).unwrap(),
            r#"{"thinking": "r", "role": "assistant", "reasoning": "r", "reasoning_content": "r"}"#
        );
    }

    #[test]
    fn from_folder_names_bos_and_eos_from_tokenizer_config_or_the_ids() {
        let dir = std::env::temp_dir().join(format!("specrt-chat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("chat_template.jinja"),
            "{{ bos_token }}x{{ eos_token }}",
        )
        .unwrap();
        std::fs::write(
            dir.join("tokenizer.json"),
            r#"{"added_tokens": [{"id": 5, "content": "<|eot|>"}], "model": {"vocab": {"<s>": 1, "a": 2}}}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("specrt_config.json"),
            r#"{"bos_token_id": 1, "eos_token_ids": [5, 2]}"#,
        )
        .unwrap();
        let t = ChatTemplate::from_folder(&dir).unwrap();
        assert_eq!(
            t.render(&[], false, None, None, &Map::new()).unwrap(),
            "<s>x<|eot|>"
        );
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"bos_token": "<B>", "eos_token": {"content": "<E>"}, "pad_token": null}"#,
        )
        .unwrap();
        let t = ChatTemplate::from_folder(&dir).unwrap();
        assert_eq!(
            t.render(&[], false, None, None, &Map::new()).unwrap(),
            "<B>x<E>"
        );
        std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
        assert!(
            matches!(ChatTemplate::from_folder(&dir), Err(SpecError::NotFound(m)) if m.contains("not found"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
