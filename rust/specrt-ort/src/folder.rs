//! What a model folder holds besides the model: the generation defaults ([`FolderDefaults`], from
//! `generation_config.json` and `specrt_config.json`), the tokenizer and chat template, and the checks a draft
//! folder gets against its target's (the same vocabulary) before any session loads.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use specrt_core::{Result, SpecError};
use specrt_text::chat::ChatTemplate;
use specrt_text::tokenizer::Tokenizer;

use crate::cross_vocab::DraftVocabulary;
use crate::model::{resolve_model_file, CONFIG_FILE};

/// Name of the Hugging Face generation defaults file in a model folder.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
/// Name of the chat template file in a model folder.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
/// Name of the tokenizer file in a model folder (compared between draft and target).
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// A target folder read for loading, with its draft (if any) checked against it: what every loader needs before
/// a session loads ([`crate::Driver::load`], [`crate::Driver::load_single`]).
pub(crate) struct TargetFolder {
    /// The target's model file.
    pub model_file: PathBuf,
    /// Its generation defaults.
    pub defaults: FolderDefaults,
    /// Its tokenizer, if the folder has one.
    pub tokenizer: Option<Tokenizer>,
    /// Its chat template, if the folder has one.
    pub chat_template: Option<ChatTemplate>,
    /// With a draft: how its vocabulary relates to the target's ([`check_draft_folder`]).
    pub draft_vocabulary: Option<DraftVocabulary>,
}

impl TargetFolder {
    /// Read `target` (a folder or `.onnx` file) and check `draft` against it.
    ///
    /// Errors: as [`resolve_model_file`], [`FolderDefaults::read`] and [`check_draft_folder`]; a malformed
    /// tokenizer or chat template.
    pub fn open(target: &Path, draft: Option<&Path>) -> Result<Self> {
        let model_file = resolve_model_file(target)?;
        let defaults = FolderDefaults::read(&model_file)?;
        let draft_vocabulary = match draft {
            Some(d) => Some(check_draft_folder(&model_file, d)?),
            None => None,
        };
        Ok(Self {
            tokenizer: folder_tokenizer(&model_file)?,
            chat_template: folder_chat_template(&model_file)?,
            model_file,
            defaults,
            draft_vocabulary,
        })
    }
}

/// Generation defaults a model folder gives: `generation_config.json` (and `specrt_config.json` for the EOS ids).
///
/// Read as Python's `Decoder` reads them: a missing file counts as empty, a key that is absent (or `null`) leaves
/// the field `None`, other keys (`do_sample`, `max_new_tokens`, ...) are ignored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FolderDefaults {
    /// `temperature` (0 = greedy).
    pub temperature: Option<f32>,
    /// `top_k` (0 = off).
    pub top_k: Option<u32>,
    /// `top_p` (1 = off).
    pub top_p: Option<f32>,
    /// `min_p` (0 = off).
    pub min_p: Option<f32>,
    /// `repetition_penalty` (1 = off).
    pub repetition_penalty: Option<f32>,
    /// End-of-sequence ids: `eos_token_id` of `generation_config.json` (one id or a list) when the key is present,
    /// else `eos_token_ids` of `specrt_config.json`, else none.
    pub eos_token_ids: Vec<u32>,
}

impl FolderDefaults {
    /// Read the defaults of a model folder (or of the folder holding a `.onnx` file).
    ///
    /// Errors: [`SpecError::Io`] when a file exists but cannot be read; [`SpecError::ModelFormat`] when it is not a
    /// JSON object or has a field of the wrong type or a negative `top_k` (file and field named).
    pub fn read(model: &Path) -> Result<Self> {
        let folder = if model.is_dir() {
            model
        } else {
            model.parent().unwrap_or(Path::new("."))
        };
        let generation_path = folder.join(GENERATION_CONFIG_FILE);
        let config_path = folder.join(CONFIG_FILE);
        Self::parse(
            read_optional(&generation_path)?.as_deref(),
            read_optional(&config_path)?.as_deref(),
            &generation_path,
            &config_path,
        )
    }

    /// Parse the texts of `generation_config.json` and `specrt_config.json` (`None` = file absent); the paths only
    /// name the files in errors.
    ///
    /// Errors: as [`FolderDefaults::read`].
    pub fn parse(
        generation_config: Option<&str>,
        specrt_config: Option<&str>,
        generation_path: &Path,
        config_path: &Path,
    ) -> Result<Self> {
        let generation = json_object(generation_config, generation_path)?;
        let config = json_object(specrt_config, config_path)?;
        let float = |key: &str| -> Result<Option<f32>> {
            match generation.get(key) {
                None | Some(Value::Null) => Ok(None),
                #[allow(clippy::cast_possible_truncation)]
                Some(v) => v
                    .as_f64()
                    .map(|x| Some(x as f32))
                    .ok_or_else(|| field_error(generation_path, key, v, "a number")),
            }
        };
        let top_k = match generation.get("top_k") {
            None | Some(Value::Null) => None,
            Some(v) => Some(parse_top_k(v, generation_path)?),
        };
        let eos_token_ids = match generation.get("eos_token_id") {
            Some(v) => parse_ids(v, generation_path, "eos_token_id")?,
            None => match config.get("eos_token_ids") {
                Some(v) => parse_ids(v, config_path, "eos_token_ids")?,
                None => Vec::new(),
            },
        };
        Ok(FolderDefaults {
            temperature: float("temperature")?,
            top_k,
            top_p: float("top_p")?,
            min_p: float("min_p")?,
            repetition_penalty: float("repetition_penalty")?,
            eos_token_ids,
        })
    }
}

/// The text of `path`, or `None` when it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(SpecError::io(path.display(), &e)),
    }
}

/// The top-level object of a JSON text (`None` = empty object).
fn json_object(text: Option<&str>, path: &Path) -> Result<Map<String, Value>> {
    let Some(text) = text else {
        return Ok(Map::new());
    };
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(SpecError::ModelFormat(format!(
            "{}: is not a JSON object",
            path.display()
        ))),
        Err(e) => Err(SpecError::ModelFormat(format!(
            "{}: is not valid JSON: {e}",
            path.display()
        ))),
    }
}

fn field_error(path: &Path, key: &str, value: &Value, expected: &str) -> SpecError {
    SpecError::ModelFormat(format!(
        "{}: {key} = {value} is invalid (expected {expected})",
        path.display()
    ))
}

/// `top_k` as Python's `int(...)` reads it: an integer (or an integral float); negative is a config error.
fn parse_top_k(v: &Value, path: &Path) -> Result<u32> {
    let n = v
        .as_i64()
        .or_else(|| {
            #[allow(clippy::cast_possible_truncation)]
            v.as_f64().filter(|x| x.fract() == 0.0).map(|x| x as i64)
        })
        .ok_or_else(|| field_error(path, "top_k", v, "an integer"))?;
    u32::try_from(n).map_err(|_| {
        SpecError::ModelFormat(format!(
            "{}: top_k {n} is invalid (expected an integer >= 0; 0 = off)",
            path.display()
        ))
    })
}

/// One token id or a list of them (`null` = none).
fn parse_ids(v: &Value, path: &Path, key: &str) -> Result<Vec<u32>> {
    let one = |x: &Value| {
        x.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| field_error(path, key, v, "a token id or a list of token ids"))
    };
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items.iter().map(one).collect(),
        _ => one(v).map(|id| vec![id]),
    }
}

/// The checks a draft folder (or `.onnx` file) gets against its target's before any session loads (files of the
/// models): its vocabulary compared with the target's (`tokenizer.json`), and its own `generation_config.json` well
/// formed (not used: the target's defaults apply; a malformed file is an error, as in Python). Every engine that
/// loads a draft from a folder calls it ([`crate::Driver::load`], [`crate::Driver::load_single`]).
///
/// Returns [`DraftVocabulary::Same`] with the tokenizer's size (largest id + 1 of the target's `tokenizer.json`;
/// `None` without one: what the engines' width rule [`specrt_core::check_draft_width`] compares logits widths that
/// differ with) when the vocabularies are equal or the target has no tokenizer to compare, else
/// [`DraftVocabulary::Other`] with both tokenizers (the pair drafts through token-level intersection).
///
/// Errors: [`SpecError::NotFound`] (a missing model file, a draft without the `tokenizer.json` its target has),
/// [`SpecError::Io`] / [`SpecError::ModelFormat`] (an unreadable or malformed file).
pub fn check_draft_folder(target: &Path, draft: &Path) -> Result<DraftVocabulary> {
    let target_file = resolve_model_file(target)?;
    let draft_file = resolve_model_file(draft)?;
    let same = same_vocabulary(&target_file, &draft_file)?;
    FolderDefaults::read(&draft_file)?;
    let path = |f: &Path| f.with_file_name(TOKENIZER_FILE);
    if same {
        Ok(DraftVocabulary::Same {
            tokenizer_vocab: tokenizer_size(&path(&target_file))?,
        })
    } else {
        Ok(DraftVocabulary::Other {
            target: Box::new(Tokenizer::from_file(path(&target_file))?),
            draft: Box::new(Tokenizer::from_file(path(&draft_file))?),
        })
    }
}

/// The size of a `tokenizer.json`'s vocabulary: its largest id + 1 over `model.vocab` (a token -> id map, or a
/// list whose index is the id, as Unigram's) and `added_tokens`; `None` without the file or any id.
///
/// Errors: [`SpecError::Io`] for an unreadable file, [`SpecError::ModelFormat`] for a malformed one.
fn tokenizer_size(path: &Path) -> Result<Option<usize>> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    let root = json_object(Some(&text), path)?;
    let mut bound: Option<u64> = None;
    let mut see = |id: u64| bound = Some(bound.map_or(id, |b| b.max(id)));
    match root.get("model").and_then(|m| m.get("vocab")) {
        Some(Value::Object(map)) => map.values().filter_map(Value::as_u64).for_each(&mut see),
        Some(Value::Array(list)) if !list.is_empty() => see(list.len() as u64 - 1),
        _ => {}
    }
    if let Some(Value::Array(added)) = root.get("added_tokens") {
        added
            .iter()
            .filter_map(|e| e.get("id").and_then(Value::as_u64))
            .for_each(&mut see);
    }
    Ok(bound.and_then(|b| usize::try_from(b).ok()).map(|b| b + 1))
}

/// The `tokenizer.json` beside a model file, if there is one.
///
/// Errors: [`SpecError::ModelFormat`] for a file that `tokenizers` cannot load.
/// The chat template of a model file's folder (`None` without `chat_template.jinja`).
pub(crate) fn folder_chat_template(model_file: &Path) -> Result<Option<ChatTemplate>> {
    let folder = model_file.parent().unwrap_or(Path::new("."));
    if folder.join(CHAT_TEMPLATE_FILE).is_file() {
        ChatTemplate::from_folder(folder).map(Some)
    } else {
        Ok(None)
    }
}

/// Chat `messages` rendered with `template` (as transformers' `apply_chat_template(..., add_generation_prompt=True)`)
/// and encoded without added special tokens (the template places them): [`Pipeline::chat_prompt_ids`] and
/// [`crate::Driver::chat_prompt_ids`].
pub(crate) fn chat_ids(
    template: Option<&ChatTemplate>,
    tokenizer: &Tokenizer,
    messages: &[serde_json::Value],
) -> Result<Vec<u32>> {
    let template = template.ok_or_else(|| {
        SpecError::setting(
            "messages",
            format!(
            "this pipeline has no chat template (the target folder has no {CHAT_TEMPLATE_FILE}); pass a plain \
             prompt"
        ),
        )
    })?;
    let text = template.render(messages, true, None, None, &Map::new())?;
    tokenizer.encode(&text, false)
}

pub(crate) fn folder_tokenizer(model_file: &Path) -> Result<Option<Tokenizer>> {
    let path = model_file
        .parent()
        .unwrap_or(Path::new("."))
        .join(TOKENIZER_FILE);
    if path.is_file() {
        Tokenizer::from_file(&path).map(Some)
    } else {
        Ok(None)
    }
}

/// The token -> id map of a `tokenizer.json`: `model.vocab` plus `added_tokens` (what `Tokenizer.get_vocab()`
/// returns in Python).
fn tokenizer_vocabulary(path: &Path) -> Result<Option<std::collections::HashMap<String, u64>>> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    let root = json_object(Some(&text), path)?;
    let mut vocab = std::collections::HashMap::new();
    if let Some(Value::Object(model)) = root.get("model").and_then(|m| m.get("vocab")) {
        for (token, id) in model {
            vocab.insert(token.clone(), id.as_u64().unwrap_or(u64::MAX));
        }
    }
    if let Some(Value::Array(added)) = root.get("added_tokens") {
        for entry in added {
            if let (Some(content), Some(id)) = (
                entry.get("content").and_then(Value::as_str),
                entry.get("id").and_then(Value::as_u64),
            ) {
                vocab.insert(content.to_owned(), id);
            }
        }
    }
    Ok(Some(vocab))
}

/// Whether a draft's tokenizer vocabulary equals the target's (`true` too when the target has no
/// `tokenizer.json` to compare).
///
/// Errors: [`SpecError::NotFound`] for a draft without the `tokenizer.json` its target has; as
/// [`tokenizer_vocabulary`].
fn same_vocabulary(target_file: &Path, draft_file: &Path) -> Result<bool> {
    let target = target_file.with_file_name(TOKENIZER_FILE);
    let draft = draft_file.with_file_name(TOKENIZER_FILE);
    if !target.is_file() {
        return Ok(true);
    }
    if !draft.is_file() {
        return Err(SpecError::NotFound(format!(
            "{} not found: a draft needs its tokenizer.json to be compared with the target's ({})",
            draft.display(),
            target.display()
        )));
    }
    // Usually byte-identical (a draft cut from the target, or one family's converter): no parsing needed.
    if std::fs::read(&target).ok() == std::fs::read(&draft).ok() {
        return Ok(true);
    }
    Ok(tokenizer_vocabulary(&target)? == tokenizer_vocabulary(&draft)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(generation: &str, specrt: Option<&str>) -> Result<FolderDefaults> {
        FolderDefaults::parse(
            Some(generation),
            specrt,
            Path::new("g.json"),
            Path::new("s.json"),
        )
    }

    #[test]
    fn defaults_read_as_python_reads_them() {
        let d = parse(
            r#"{"temperature": 0.6, "top_k": 50, "top_p": 0.9, "min_p": null, "do_sample": true,
                "repetition_penalty": 1.1, "eos_token_id": 7}"#,
            Some(r#"{"eos_token_ids": [1, 2]}"#),
        )
        .unwrap();
        assert_eq!(d.temperature, Some(0.6));
        assert_eq!(d.top_k, Some(50));
        assert_eq!(d.top_p, Some(0.9));
        assert_eq!(d.min_p, None);
        assert_eq!(d.repetition_penalty, Some(1.1));
        assert_eq!(d.eos_token_ids, vec![7], "generation_config's id wins");
        let d = parse("{}", Some(r#"{"eos_token_ids": [1, 2]}"#)).unwrap();
        assert_eq!(d.eos_token_ids, vec![1, 2], "else specrt_config's list");
        let d = parse(
            r#"{"eos_token_id": null}"#,
            Some(r#"{"eos_token_ids": [1]}"#),
        )
        .unwrap();
        assert!(d.eos_token_ids.is_empty(), "a present null means none");
        assert_eq!(
            FolderDefaults::parse(None, None, Path::new("g"), Path::new("s")).unwrap(),
            FolderDefaults::default()
        );
    }

    #[test]
    fn malformed_defaults_name_the_file_and_field() {
        for (text, needle) in [
            (r#"{"temperature": "hot"}"#, "temperature = \"hot\""),
            (r#"{"eos_token_id": [1, -2]}"#, "eos_token_id = [1,-2]"),
            (r#"{"top_k": 2.5}"#, "top_k = 2.5"),
            ("[1]", "not a JSON object"),
            ("{", "not valid JSON"),
        ] {
            let err = parse(text, None).unwrap_err();
            assert!(
                matches!(&err, SpecError::ModelFormat(m) if m.contains("g.json") && m.contains(needle)),
                "{text}: {err}"
            );
        }
        let err = parse(r#"{"top_k": -1}"#, None).unwrap_err();
        assert!(
            matches!(&err, SpecError::ModelFormat(m) if m.contains("top_k -1")),
            "{err}"
        );
    }

    #[test]
    fn vocabularies_are_compared_and_a_missing_draft_tokenizer_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let write = |dir: &str, vocab: &str| {
            let folder = tmp.path().join(dir);
            std::fs::create_dir_all(&folder).unwrap();
            std::fs::write(
                folder.join(TOKENIZER_FILE),
                format!(r#"{{"model": {{"vocab": {vocab}}}, "added_tokens": [{{"id": 2, "content": "<e>"}}]}}"#),
            )
            .unwrap();
            folder.join("model.onnx")
        };
        let t = write("t", r#"{"a": 0, "b": 1}"#);
        let same = write("same", r#"{"b": 1,  "a": 0}"#);
        let other = write("other", r#"{"a": 0, "c": 1}"#);
        assert!(same_vocabulary(&t, &same).unwrap());
        assert!(!same_vocabulary(&t, &other).unwrap());
        // A draft without the tokenizer its target has cannot be compared: refused, naming the missing file.
        let err = same_vocabulary(&t, &tmp.path().join("none/model.onnx")).unwrap_err();
        assert!(
            matches!(&err, SpecError::NotFound(m) if m.contains("none/tokenizer.json not found")),
            "{err}"
        );
        // Without a target tokenizer there is nothing to compare.
        assert!(same_vocabulary(&tmp.path().join("none/model.onnx"), &t).unwrap());
    }

    #[test]
    fn the_tokenizer_size_is_its_largest_id_plus_one() {
        let tmp = tempfile::tempdir().unwrap();
        let size = |json: &str| {
            let path = tmp.path().join(TOKENIZER_FILE);
            std::fs::write(&path, json).unwrap();
            tokenizer_size(&path).unwrap()
        };
        let added = r#""added_tokens": [{"id": 7, "content": "<e>"}]"#;
        assert_eq!(
            size(&format!(
                r#"{{"model": {{"vocab": {{"a": 0, "b": 3}}}}, {added}}}"#
            )),
            Some(8)
        );
        assert_eq!(
            size(r#"{"model": {"vocab": {"a": 0, "b": 9}}, "added_tokens": []}"#),
            Some(10)
        );
        // Unigram: a list of [piece, score], the index is the id.
        assert_eq!(
            size(r#"{"model": {"vocab": [["a", 0.0], ["b", -1.0]]}}"#),
            Some(2)
        );
        assert_eq!(size(r#"{"model": {}}"#), None);
        assert_eq!(tokenizer_size(&tmp.path().join("none.json")).unwrap(), None);
    }
}
