//! A model folder's `tokenizer.json`, through the `tokenizers` crate.
//!
//! [`Tokenizer`] is a cheap-to-clone handle (an `Arc`) shared by the `Decoder`, its text assemblers
//! ([`crate::detok::TextAssembler`]) and the server. Encoding and decoding are the crate's own, the same version as
//! the Python `tokenizers` package's (`tests/text/test_text.py` checks ids and text are identical), so nothing here
//! re-implements tokenization; this module only adds the errors of [`SpecError`] and the facts the detokenizer
//! needs (which ids are special, whether decoding is byte-level).

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use specrt_core::{Result, SpecError};
use tokenizers::DecoderWrapper;

/// The decoder family of a `tokenizer.json` (its `decoder.type`), as far as detokenization cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderKind {
    /// `"ByteLevel"` alone (GPT-2, Qwen, Llama 3, SmolLM2, every folder `specrt convert` writes from GGUF): decoding
    /// is the lossy UTF-8 of the concatenated bytes of the tokens, so it can be done incrementally and exactly.
    ByteLevel,
    /// Any other decoder (Metaspace, WordPiece, a `Sequence`, ...), or none.
    Other,
}

/// A loaded `tokenizer.json`. Clones share the same tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// Added tokens with `special: true`, ascending ids (what `skip_special_tokens` drops).
    special_ids: Arc<[u32]>,
    decoder_kind: DecoderKind,
    /// Where it was read from (for messages), or `"<json>"`.
    origin: Arc<str>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("origin", &self.origin)
            .field("vocab_size", &self.vocab_size())
            .field("decoder_kind", &self.decoder_kind)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Load `path` (a `tokenizer.json`).
    ///
    /// # Errors
    /// Naming the path: [`SpecError::NotFound`] ("tokenizer file not found: ...") when it does not exist (Python's
    /// `ModelFileNotFoundError`), [`SpecError::Io`] when it cannot be read, [`SpecError::ModelFormat`] when
    /// `tokenizers` cannot parse it.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let json = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SpecError::NotFound(format!(
                    "tokenizer file not found: {} (expected the tokenizer.json of a folder written by `specrt convert`)",
                    path.display()
                )))
            }
            Err(e) => {
                return Err(SpecError::io(
                    format_args!("cannot read {}", path.display()),
                    &e,
                ))
            }
        };
        Self::from_json(&json, &path.display().to_string())
    }

    /// Parse the text of a `tokenizer.json`; `origin` names it in errors (a path, or e.g. `"<json>"`).
    ///
    /// # Errors
    /// [`SpecError::ModelFormat`] naming `origin` when `tokenizers` cannot parse it.
    pub fn from_json(json: &str, origin: &str) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_str(json).map_err(|e| {
            SpecError::ModelFormat(format!("{origin}: cannot be loaded by tokenizers: {e}"))
        })?;
        let mut special_ids: Vec<u32> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        special_ids.sort_unstable();
        let decoder_kind = match inner.get_decoder() {
            Some(DecoderWrapper::ByteLevel(_)) => DecoderKind::ByteLevel,
            _ => DecoderKind::Other,
        };
        Ok(Self {
            inner: Arc::new(inner),
            special_ids: special_ids.into(),
            decoder_kind,
            origin: origin.into(),
        })
    }

    /// Token ids of `text` (`add_special_tokens`: let the post-processor add BOS / EOS where the model wants them;
    /// special tokens written in the text are recognised either way).
    ///
    /// # Errors
    /// [`SpecError::Internal`] if `tokenizers` fails (it does not for a tokenizer that loaded).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.inner
            .encode(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| {
                SpecError::Internal(format!(
                    "tokenizers failed to encode {} bytes with {}: {e}",
                    text.len(),
                    self.origin
                ))
            })
    }

    /// Token ids of each of `texts`, as [`Tokenizer::encode`] gives them one by one, encoded on the `tokenizers`
    /// library's thread pool (one thread per core; the `TOKENIZERS_PARALLELISM` environment variable turns it off).
    ///
    /// # Errors
    /// As [`Tokenizer::encode`].
    pub fn encode_batch(&self, texts: &[&str], add_special_tokens: bool) -> Result<Vec<Vec<u32>>> {
        let encodings = self
            .inner
            .encode_batch(texts.to_vec(), add_special_tokens)
            .map_err(|e| {
                SpecError::Internal(format!(
                    "tokenizers failed to encode a batch of {} texts with {}: {e}",
                    texts.len(),
                    self.origin
                ))
            })?;
        Ok(encodings
            .into_iter()
            .map(|e| e.get_ids().to_vec())
            .collect())
    }

    /// The tokenizer serialised back to `tokenizer.json` text (compact), for libraries that read the file format
    /// (llguidance's token bytes).
    ///
    /// # Errors
    /// [`SpecError::Internal`] if `tokenizers` fails to serialise it (it does not for a tokenizer that loaded).
    pub fn to_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(|e| {
            SpecError::Internal(format!(
                "tokenizers failed to serialise {}: {e}",
                self.origin
            ))
        })
    }

    /// The text of `ids` (`skip_special_tokens`: leave out added tokens marked special). Ids outside the vocabulary
    /// are left out, as `tokenizers` does; an incomplete UTF-8 sequence decodes to U+FFFD.
    ///
    /// # Errors
    /// [`SpecError::Internal`] if the decoder fails (the built-in decoders do not).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| {
            SpecError::Internal(format!(
                "tokenizers failed to decode {} ids with {}: {e}",
                ids.len(),
                self.origin
            ))
        })
    }

    /// Number of ids, added tokens included (tokenizers' `get_vocab_size(with_added_tokens=True)`).
    #[must_use]
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Number of ids, with or without the added tokens.
    #[must_use]
    pub fn vocab_size_with(&self, with_added_tokens: bool) -> usize {
        self.inner.get_vocab_size(with_added_tokens)
    }

    /// Token string -> id map, with or without the added tokens.
    #[must_use]
    pub fn vocab(&self, with_added_tokens: bool) -> HashMap<String, u32> {
        self.inner.get_vocab(with_added_tokens)
    }

    /// The token string of `id` (an added token's content, else the model's piece, e.g. `"Ġhello"`), or `None`
    /// outside the vocabulary.
    #[must_use]
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of the token string `token`, or `None`.
    #[must_use]
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Ids of the added tokens marked special (ascending): what `skip_special_tokens` leaves out.
    #[must_use]
    pub fn special_ids(&self) -> &[u32] {
        &self.special_ids
    }

    /// Whether `id` is an added token marked special.
    #[must_use]
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.binary_search(&id).is_ok()
    }

    /// The decoder family (decides how [`crate::detok::TextAssembler`] detokenizes).
    #[must_use]
    pub fn decoder_kind(&self) -> DecoderKind {
        self.decoder_kind
    }

    /// The `decoder.type` of the `tokenizer.json` (`"ByteLevel"`, `"Metaspace"`, `"Sequence"`, ...), or `None`
    /// without a decoder.
    #[must_use]
    pub fn decoder_type(&self) -> Option<&'static str> {
        self.inner.get_decoder().map(|d| match d {
            DecoderWrapper::BPE(_) => "BPEDecoder",
            DecoderWrapper::ByteLevel(_) => "ByteLevel",
            DecoderWrapper::WordPiece(_) => "WordPiece",
            DecoderWrapper::Metaspace(_) => "Metaspace",
            DecoderWrapper::CTC(_) => "CTC",
            DecoderWrapper::Sequence(_) => "Sequence",
            DecoderWrapper::Replace(_) => "Replace",
            DecoderWrapper::Fuse(_) => "Fuse",
            DecoderWrapper::Strip(_) => "Strip",
            DecoderWrapper::ByteFallback(_) => "ByteFallback",
        })
    }

    /// Where the tokenizer was read from.
    #[must_use]
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The bytes `id` contributes to a byte-level decode: its piece's characters mapped back through GPT-2's
    /// byte-to-unicode table, or the piece's own UTF-8 when a character is outside the table (an added token such
    /// as `"<|im end|>"` with a space), exactly as `tokenizers`' `ByteLevel` decoder does; nothing for an id outside
    /// the vocabulary or a special token skipped. Only meaningful for [`DecoderKind::ByteLevel`].
    pub(crate) fn byte_level_bytes(&self, id: u32, skip_special_tokens: bool, out: &mut Vec<u8>) {
        let Some(piece) = self.inner.id_to_token(id) else {
            return;
        };
        // `tokenizers` skips by the token's string (`is_special_token(&token)`), not by id.
        if skip_special_tokens && self.inner.get_added_vocabulary().is_special_token(&piece) {
            return;
        }
        let start = out.len();
        for c in piece.chars() {
            if let Some(b) = unicode_to_byte(c) {
                out.push(b);
            } else {
                out.truncate(start);
                out.extend_from_slice(piece.as_bytes());
                return;
            }
        }
    }
}

/// GPT-2's `bytes_to_unicode` inverted: the byte a character of a byte-level piece stands for. Printable Latin-1
/// (`'!'..='~'`, `'¡'..='¬'`, `'®'..='ÿ'`) stands for itself; the other 68 bytes were moved, in order, to U+0100..
pub(crate) fn unicode_to_byte(c: char) -> Option<u8> {
    let cp = u32::from(c);
    let printable =
        (0x21..=0x7E).contains(&cp) || (0xA1..=0xAC).contains(&cp) || (0xAE..=0xFF).contains(&cp);
    let byte = if printable {
        cp
    } else {
        // The k-th byte (ascending) that is not printable: 0x00..=0x20 (33), 0x7F..=0xA0 (34), 0xAD (1).
        match cp.checked_sub(0x100)? {
            k @ 0..=32 => k,
            k @ 33..=66 => 0x7F + (k - 33),
            67 => 0xAD,
            _ => return None,
        }
    };
    u8::try_from(byte).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unicode_to_byte_matches_gpt2_table() {
        assert_eq!(unicode_to_byte('A'), Some(b'A'));
        assert_eq!(unicode_to_byte('Ġ'), Some(b' ')); // U+0120
        assert_eq!(unicode_to_byte('Ċ'), Some(b'\n')); // U+010A
        assert_eq!(unicode_to_byte('\u{100}'), Some(0));
        assert_eq!(unicode_to_byte('ÿ'), Some(0xFF));
        assert_eq!(unicode_to_byte('\u{143}'), Some(0xAD)); // the last moved byte
        assert_eq!(unicode_to_byte('\u{144}'), None);
        assert_eq!(unicode_to_byte(' '), None);
        assert_eq!(unicode_to_byte('中'), None);
        // A bijection onto 0..=255.
        let mut seen = [false; 256];
        for cp in 0..0x200u32 {
            if let Some(b) = char::from_u32(cp).and_then(unicode_to_byte) {
                assert!(!seen[usize::from(b)]);
                seen[usize::from(b)] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn missing_and_garbage_files_are_io_errors_naming_the_path() {
        let dir = std::env::temp_dir().join(format!("specrt-text-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("nope.json");
        let err = Tokenizer::from_file(&missing).unwrap_err();
        assert!(
            matches!(&err, SpecError::NotFound(m) if m.contains("not found") && m.contains("nope.json")),
            "{err}"
        );
        let bad = dir.join("bad.json");
        std::fs::write(&bad, "{not json").unwrap();
        let err = Tokenizer::from_file(&bad).unwrap_err();
        assert!(
            matches!(&err, SpecError::ModelFormat(m) if m.contains("bad.json") && m.contains("tokenizers")),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
