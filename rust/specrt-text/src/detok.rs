//! Streaming detokenization with stop strings: one request's committed token ids in, per round the text to emit.
//!
//! [`TextAssembler::feed`] takes the tokens a round committed and returns a [`TextDelta`]: the new text, and when a
//! stop string has appeared the number of tokens to keep ([`StopHit::n_keep`], what the engine's `stop_at` takes).
//! Until the generation finishes it holds back text that may still change: a trailing U+FFFD (an incomplete UTF-8
//! sequence whose next bytes are in the next token; a genuine trailing U+FFFD waits too) and a trailing partial
//! stop string. At the finishing round everything left is flushed. The deltas concatenate to [`TextAssembler::text`]
//! (for tokenizers whose text of a prefix of the tokens is a prefix of the text of them all, as byte-level ones).
//!
//! # What the text is
//! The text is always the whole generated sequence decoded at once (`tokenizers`' `decode(tokens,
//! skip_special_tokens)`), and the emitted chunks are slices of it, exactly as the Python `_Assembler` this
//! replaces (`python/specrt/generate.py` before the port; `tests/text/test_text.py` keeps that algorithm as its oracle).
//! Python counted code points; here positions are bytes, with the code-point bookkeeping kept where the result
//! depends on it (the stop search starts `max stop length` characters before the text already sent; a chunk is
//! `text[sent..end]` in characters even if a tokenizer rewrote earlier text), so the bytes emitted are identical.
//!
//! # Incremental where exact
//! - [`DecoderKind::ByteLevel`] tokenizers (every folder `specrt convert` writes from GGUF: GPT-2, Qwen, Llama 3,
//!   SmolLM2): `decode` is `String::from_utf8_lossy` of the concatenated token bytes, so the assembler keeps the
//!   decoded text and appends each round's bytes, re-decoding only the trailing incomplete sequence (at most 3
//!   bytes): O(new tokens) per round, and equal to a whole decode by construction (the bytes before the last
//!   incomplete sequence decode the same whatever follows). Tested against `decode` on random byte-splitting token
//!   streams.
//! - Any other decoder (Metaspace strips the first token's space, WordPiece joins with spaces and cleans up, a
//!   `Sequence` may do either): a window decode with prefix offsets (TGI / vLLM) is not exact for all of them, so
//!   the whole sequence is decoded every round (O(sequence) per round; microseconds for thousands of tokens).
//!
//! Finding how many tokens cover a stop string decodes prefixes of the sequence (a binary search, once per
//! request).
//!
//! # Views: vLLM's `skip_special_tokens` and `include_stop_str_in_output` ([`TextOptions`])
//! The one definition of which text a request gets, for the `Decoder` and `specrt serve` (Python) and `Pipeline` /
//! `Driver` (Rust), with vLLM's meaning of its two output options (`vllm/v1/engine/detokenizer.py`):
//! - **Stop strings are matched in the text without special tokens**, whatever `skip_special_tokens` says: that is
//!   where the engine's stop decision ([`StopHit::n_keep`]) is made, so every view of a request stops at the same
//!   token. (vLLM matches in its output text, which has special tokens' text with `skip_special_tokens = false`;
//!   the two differ only for a stop string that spans or contains a special token's text.)
//! - `skip_special_tokens = true` (default): the text leaves out added tokens marked special; a stop string found
//!   cuts it where the stop string begins (`include_stop_str_in_output`: where it ends).
//! - `skip_special_tokens = false`: the text keeps special tokens' text. When a stop string ended the generation it
//!   is cut before the first stop string that occurs in it (earliest start, then the stop given first; after it
//!   with `include_stop_str_in_output`), or not at all if none does (a stop string matched across a special token).
//!   While streaming, text from the first stop string occurring in it on is held back too, so the deltas never
//!   pass where the text may be cut.
//! - The token that ended the generation (EOS or a stop token id: [`RoundEnd::FinishedByToken`]) is left out of the
//!   text unless `include_stop_str_in_output`, when no stop string ended it first. (A special one adds no text
//!   with `skip_special_tokens = true` either way.)
//!
//! Tested against the server's Python `_TextView` these options replace (`tests/test_text_views.py`).
//!
//! # Worked example (defaults)
//! Stop `"\n\n"`; byte-level tokens `["Hi", "\n", "\nBye"]` over two rounds:
//! 1. feed `["Hi", "\n"]`: text `"Hi\n"`, `"\n"` may start the stop: emit `"Hi"`.
//! 2. feed `["\nBye"]`: text `"Hi\n\nBye"`, stop at byte 2, covered by 3 tokens: `n_keep = 3`, text `"Hi"`, emit
//!    `""`, finished (the third token's `"Bye"` is dropped with the stop string).
//!
//! With `skip_special_tokens = false` and tokens `["Hi", "<|im_end|>", "\n", "\nBye"]` the stop is found the same
//! way in `"Hi\n\nBye"` (`n_keep = 4`); the text shown is `"Hi<|im_end|>\n\nBye"` cut before its first `"\n\n"`:
//! `"Hi<|im_end|>"`.

use specrt_core::{Result, SpecError};

use crate::stop::StopStrings;
use crate::tokenizer::{DecoderKind, Tokenizer};

const REPLACEMENT: char = '\u{FFFD}';

/// Which text a [`TextAssembler`] produces: vLLM's two output options (see the module docs, "Views").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextOptions {
    /// vLLM's `skip_special_tokens` (default true): leave out the text of added tokens marked special. Stop strings
    /// are matched in the text without special tokens either way.
    pub skip_special_tokens: bool,
    /// vLLM's `include_stop_str_in_output` (default false): keep the stop string that ended the generation at the
    /// end of the text, or the text of the EOS / stop-token-id token that ended it; without it both are left out.
    pub include_stop_str_in_output: bool,
}

impl Default for TextOptions {
    fn default() -> Self {
        Self {
            skip_special_tokens: true,
            include_stop_str_in_output: false,
        }
    }
}

/// How the engine's round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundEnd {
    /// Generation goes on.
    Continue,
    /// Generation finished without a finishing token (`max_new_tokens`, cancelled, ...).
    Finished,
    /// Generation finished on its last token: EOS or a stop token id (engine finish reasons `"eos"`, `"stop"`).
    FinishedByToken,
}

impl RoundEnd {
    /// From an engine's `finish_reason`: `None` (going on), `"eos"` or `"stop"` (a finishing token), `"length"` or
    /// `"grammar"` (the constraint is complete: its last token is text).
    ///
    /// # Errors
    /// [`SpecError::Config`] for another name, listing the valid ones.
    pub fn from_finish_reason(reason: Option<&str>) -> Result<Self> {
        // (The engine's typed reason: [`RoundEnd::from_finish`].)
        match reason {
            None => Ok(Self::Continue),
            Some("eos" | "stop") => Ok(Self::FinishedByToken),
            Some("length" | "grammar") => Ok(Self::Finished),
            Some(other) => Err(SpecError::Config(format!(
                "finish_reason {other:?} is invalid (expected one of: None, \"eos\", \"stop\", \"length\", \
                 \"grammar\")"
            ))),
        }
    }
}

impl RoundEnd {
    /// How a round ended, from the engine's finish reason of the round (`None` = generation goes on).
    #[must_use]
    pub fn from_finish(reason: Option<specrt_core::FinishReason>) -> Self {
        match reason {
            None => Self::Continue,
            Some(specrt_core::FinishReason::Length | specrt_core::FinishReason::Grammar) => {
                Self::Finished
            }
            Some(specrt_core::FinishReason::Eos | specrt_core::FinishReason::Stop) => {
                Self::FinishedByToken
            }
        }
    }
}

/// A stop string found in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopHit {
    /// Tokens to keep: the fewest whose decoded text without special tokens (trailing U+FFFD aside) reaches the end
    /// of the stop string, so the token holding the stop string's last character is kept (pass it to the engine's
    /// `stop_at`). The assembler's own tokens are already truncated to it.
    pub n_keep: usize,
    /// Which stop string (index into the stops given).
    pub index: usize,
}

/// What one round adds to the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextDelta {
    /// Text to emit now (UTF-8; never ends in a held-back partial character or partial stop string while the
    /// generation goes on).
    pub text: String,
    /// The stop string found this round, if any (the generation is then finished).
    pub stop: Option<StopHit>,
    /// Whether the text is complete (a stop string, or the engine finished): feed no more.
    pub finished: bool,
}

/// How a [`Decoded`] text is kept up to date.
#[derive(Debug, Clone)]
enum Detok {
    /// Byte-level decoding, appended round by round: `text[..stable]` is final; `pending` holds the bytes of a
    /// trailing invalid or incomplete UTF-8 sequence (shown as one U+FFFD after `stable`).
    ByteLevel { stable: usize, pending: Vec<u8> },
    /// Decode the whole sequence every round.
    Whole,
}

/// One decoding of the tokens (with or without special tokens), kept up to date round by round, and how much of
/// it was emitted.
#[derive(Debug, Clone)]
struct Decoded {
    skip_special_tokens: bool,
    detok: Detok,
    /// The text of the tokens (once finished: the text the request gets).
    text: String,
    /// Characters (code points) of `text` emitted.
    sent_chars: usize,
    /// Byte offset of character `sent_chars` in `text` (`None` when the text is shorter than that).
    sent_bytes: Option<usize>,
}

impl Decoded {
    fn new(skip_special_tokens: bool, incremental: bool) -> Self {
        let detok = if incremental {
            Detok::ByteLevel {
                stable: 0,
                pending: Vec::new(),
            }
        } else {
            Detok::Whole
        };
        Self {
            skip_special_tokens,
            detok,
            text: String::new(),
            sent_chars: 0,
            sent_bytes: Some(0),
        }
    }

    /// Bring `text` up to date with `tokens` (`new_tokens` just appended to them).
    fn update(&mut self, tokenizer: &Tokenizer, tokens: &[u32], new_tokens: &[u32]) -> Result<()> {
        match &mut self.detok {
            Detok::ByteLevel { stable, pending } => {
                for &id in new_tokens {
                    tokenizer.byte_level_bytes(id, self.skip_special_tokens, pending);
                }
                self.text.truncate(*stable);
                let mut rest: &[u8] = pending;
                let mut keep = 0;
                for chunk in pending.utf8_chunks() {
                    self.text.push_str(chunk.valid());
                    rest = &rest[chunk.valid().len()..];
                    if chunk.invalid().is_empty() {
                        continue;
                    }
                    if chunk.invalid().len() == rest.len() {
                        // The last sequence: the next bytes may complete it (or change how much of it is invalid).
                        keep = rest.len();
                        break;
                    }
                    self.text.push(REPLACEMENT);
                    rest = &rest[chunk.invalid().len()..];
                }
                *stable = self.text.len();
                let tail = pending.len() - keep;
                pending.drain(..tail);
                if !pending.is_empty() {
                    self.text.push(REPLACEMENT);
                }
                // `text[..sent_bytes]` lies in the old stable part (a trailing U+FFFD is never sent early), so the
                // bookkeeping of what was sent holds.
            }
            Detok::Whole => {
                let text = tokenizer.decode(tokens, self.skip_special_tokens)?;
                self.set_text(text);
            }
        }
        Ok(())
    }

    /// Replace the text, keeping `sent_bytes` right for `sent_chars` (recounted only if the text changed before it).
    fn set_text(&mut self, text: String) {
        let common = common_prefix(self.text.as_bytes(), text.as_bytes());
        self.text = text;
        if self.sent_bytes.is_none_or(|b| b > common) {
            self.sent_bytes = byte_of_char(&self.text, (0, 0), self.sent_chars);
        }
    }

    /// Cut the text at byte `cut` (a character boundary).
    fn truncate(&mut self, cut: usize) {
        self.text.truncate(cut);
        if self.sent_bytes.is_none_or(|b| b > cut) {
            self.sent_bytes = byte_of_char(&self.text, (0, 0), self.sent_chars);
        }
    }

    /// Byte offset where a search for stop strings that may not have been seen whole yet starts: the longest stop
    /// string's length in characters before the text already emitted (`None` when that is past the end).
    fn search_start(&self, stops: &StopStrings) -> Option<usize> {
        let from_chars = self.sent_chars.saturating_sub(stops.max_chars());
        let known = self.sent_bytes.map_or((0, 0), |b| (self.sent_chars, b));
        byte_of_char(&self.text, known, from_chars)
    }

    /// End (byte offset) of the text that can be emitted while the generation goes on: an incomplete UTF-8
    /// sequence and a possible partial stop string are held back.
    fn settled_end(&self, stops: &StopStrings) -> usize {
        let trimmed = self.text.trim_end_matches(REPLACEMENT);
        trimmed.len() - stops.longest_partial(trimmed)
    }

    /// Mark `text[sent..end]` emitted (`end` a byte offset on a character boundary) and return it; empty when `end`
    /// is not past what was emitted.
    fn emit_until(&mut self, end: usize) -> &str {
        let Some(sent) = self.sent_bytes else {
            return ""; // the text is shorter than what was sent: nothing new
        };
        if end <= sent {
            return "";
        }
        self.sent_chars += self.text[sent..end].chars().count();
        self.sent_bytes = Some(end);
        &self.text[sent..end]
    }
}

/// One request's streaming text (see the module docs).
#[derive(Debug, Clone)]
pub struct TextAssembler {
    tokenizer: Tokenizer,
    stops: StopStrings,
    options: TextOptions,
    /// The committed tokens (truncated to `n_keep` at a stop string).
    tokens: Vec<u32>,
    /// The text without special tokens, where stop strings are found. Its emitted part is what the default view
    /// emits (with `skip_special_tokens = false` only tracked, for the stop search's window).
    plain: Decoded,
    /// With `skip_special_tokens = false`: the text with special tokens, the one emitted.
    special: Option<Decoded>,
    finished: bool,
}

impl TextAssembler {
    /// An assembler for one request's generated text.
    ///
    /// # Errors
    /// [`SpecError::Setting`] (`stop`) for an empty stop string.
    pub fn new(tokenizer: Tokenizer, stops: Vec<String>, options: TextOptions) -> Result<Self> {
        let incremental = tokenizer.decoder_kind() == DecoderKind::ByteLevel;
        Self::with_mode(tokenizer, stops, options, incremental)
    }

    /// [`Self::new`] choosing the detokenization: `incremental` = false decodes the whole sequence every round
    /// whatever the tokenizer (for tests comparing the two); true is honoured only for byte-level tokenizers.
    ///
    /// # Errors
    /// [`SpecError::Config`] for an empty stop string.
    pub fn with_mode(
        tokenizer: Tokenizer,
        stops: Vec<String>,
        options: TextOptions,
        incremental: bool,
    ) -> Result<Self> {
        let incremental = incremental && tokenizer.decoder_kind() == DecoderKind::ByteLevel;
        Ok(Self {
            tokenizer,
            stops: StopStrings::new(stops)?,
            options,
            tokens: Vec::new(),
            plain: Decoded::new(true, incremental),
            special: (!options.skip_special_tokens).then(|| Decoded::new(false, incremental)),
            finished: false,
        })
    }

    /// Add one round's committed tokens; `end` says whether the engine finished with this round.
    ///
    /// # Errors
    /// [`SpecError::Config`] when called after the text finished; [`SpecError::Internal`] if the tokenizer fails.
    pub fn feed(&mut self, new_tokens: &[u32], end: RoundEnd) -> Result<TextDelta> {
        if self.finished {
            return Err(SpecError::Config(
                "the text is already finished (a stop string or the end of generation); start a new TextAssembler"
                    .into(),
            ));
        }
        self.tokens.extend_from_slice(new_tokens);
        self.plain
            .update(&self.tokenizer, &self.tokens, new_tokens)?;
        if let Some(special) = &mut self.special {
            special.update(&self.tokenizer, &self.tokens, new_tokens)?;
        }
        let mut stop = None;
        if !self.stops.is_empty() {
            stop = self.find_stop()?;
        }
        if stop.is_some() {
            self.finished = true;
        } else if end != RoundEnd::Continue {
            self.finished = true;
            if end == RoundEnd::FinishedByToken
                && !self.options.include_stop_str_in_output
                && !new_tokens.is_empty()
            {
                // vLLM leaves the finishing EOS / stop token's text out (it is this round's last token; a round
                // without tokens has none, and text already emitted is never taken back).
                let n = self.tokens.len() - 1;
                let text = self
                    .tokenizer
                    .decode(&self.tokens[..n], self.options.skip_special_tokens)?;
                self.shown_mut().set_text(text);
            }
        }
        let end = if self.finished {
            self.shown().text.len()
        } else if let Some(special) = &self.special {
            // The default view's progress (the stop search's window) moves on as if it were emitted.
            let plain_end = self.plain.settled_end(&self.stops);
            self.plain.emit_until(plain_end);
            // Also hold back from a stop string in the text with special tokens: it is cut there if a stop ends it.
            let mut end = special.settled_end(&self.stops);
            if let Some(m) = special
                .search_start(&self.stops)
                .and_then(|from| self.stops.find(&special.text[..end], from))
            {
                end = m.start;
            }
            end
        } else {
            self.plain.settled_end(&self.stops)
        };
        let text = self.shown_mut().emit_until(end).to_owned();
        Ok(TextDelta {
            text,
            stop,
            finished: self.finished,
        })
    }

    /// The text so far (once finished: the whole text the request gets, cut at the stop string).
    #[must_use]
    pub fn text(&self) -> &str {
        &self.shown().text
    }

    /// The tokens fed so far (truncated to [`StopHit::n_keep`] after a stop string).
    #[must_use]
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Whether the text is complete.
    #[must_use]
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The options in use.
    #[must_use]
    pub fn options(&self) -> TextOptions {
        self.options
    }

    /// Whether the text is kept incrementally (byte-level) rather than decoded whole every round.
    #[must_use]
    pub fn is_incremental(&self) -> bool {
        matches!(self.plain.detok, Detok::ByteLevel { .. })
    }

    /// The text emitted.
    fn shown(&self) -> &Decoded {
        self.special.as_ref().unwrap_or(&self.plain)
    }

    fn shown_mut(&mut self) -> &mut Decoded {
        self.special.as_mut().unwrap_or(&mut self.plain)
    }

    /// Look for a stop string in the text without special tokens, from `max_chars` characters before the text
    /// already emitted (by the default view); on a match cut the tokens, and the text as the options say.
    fn find_stop(&mut self) -> Result<Option<StopHit>> {
        let Some(from) = self.plain.search_start(&self.stops) else {
            return Ok(None);
        };
        let Some(m) = self.stops.find(&self.plain.text, from) else {
            return Ok(None);
        };
        let stop_end = m.start + self.stops.stops()[m.index].len();
        let n_chars = self.plain.text[..stop_end].chars().count();
        let n_keep = self.tokens_covering(n_chars)?;
        self.tokens.truncate(n_keep);
        let include = self.options.include_stop_str_in_output;
        let cut_of = |start: usize, stop: &str| if include { start + stop.len() } else { start };
        if let Some(special) = &mut self.special {
            // Cut the text with special tokens before the first stop string in it (none: whole).
            let mut text = self.tokenizer.decode(&self.tokens, false)?;
            if let Some(v) = self.stops.find(&text, 0) {
                text.truncate(cut_of(v.start, &self.stops.stops()[v.index]));
            }
            special.set_text(text);
        } else {
            self.plain
                .truncate(cut_of(m.start, &self.stops.stops()[m.index]));
        }
        Ok(Some(StopHit {
            n_keep,
            index: m.index,
        }))
    }

    /// Fewest tokens whose decoded text without special tokens, trailing U+FFFD removed, has at least `n_chars`
    /// characters (a binary search over `1..=len`, the same probes as the Python it replaces, so the answer is the
    /// same even where the length of a prefix's text is not monotone in the prefix).
    fn tokens_covering(&self, n_chars: usize) -> Result<usize> {
        let (mut lo, mut hi) = (1, self.tokens.len());
        while lo < hi {
            let mid = usize::midpoint(lo, hi);
            let text = self.tokenizer.decode(&self.tokens[..mid], true)?;
            if text.trim_end_matches(REPLACEMENT).chars().count() >= n_chars {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Ok(lo)
    }
}

/// Length of the longest common prefix of `a` and `b`, in bytes.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Byte offset of character `target` of `text`, walking from a known `(chars, bytes)` position; `None` past the
/// end (`target` = the number of characters gives `text.len()`).
fn byte_of_char(text: &str, known: (usize, usize), target: usize) -> Option<usize> {
    let (c, b) = known;
    if target >= c {
        let rest = &text[b..];
        let k = target - c;
        rest.char_indices()
            .map(|(i, _)| b + i)
            .chain([text.len()])
            .nth(k)
    } else {
        text[..b]
            .char_indices()
            .rev()
            .nth(c - target - 1)
            .map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::tokenizer::unicode_to_byte;

    /// The character GPT-2's table maps byte `b` to.
    fn byte_char(b: u8) -> char {
        (0..0x200u32)
            .filter_map(char::from_u32)
            .find(|&c| unicode_to_byte(c) == Some(b))
            .unwrap()
    }

    /// A byte-level BPE tokenizer: ids 0..256 are the bytes, then `pieces` (byte strings, e.g. parts of multi-byte
    /// characters), then added tokens `<|end|>` (special) and `<tool>` (not special).
    fn byte_level(pieces: &[&[u8]]) -> (Tokenizer, u32, u32) {
        let mut vocab = serde_json::Map::new();
        let piece = |bytes: &[u8]| bytes.iter().map(|&b| byte_char(b)).collect::<String>();
        for b in 0..=255u8 {
            vocab.insert(piece(&[b]), vocab.len().into());
        }
        for p in pieces {
            let n = vocab.len();
            vocab.entry(piece(p)).or_insert(n.into());
        }
        let end = u32::try_from(vocab.len()).unwrap();
        let json = serde_json::json!({
            "version": "1.0",
            "truncation": null, "padding": null,
            "added_tokens": [
                {"id": end, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false,
                 "normalized": false, "special": true},
                {"id": end + 1, "content": "<tool>", "single_word": false, "lstrip": false, "rstrip": false,
                 "normalized": false, "special": false},
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": false, "vocab": vocab, "merges": []},
        });
        (
            Tokenizer::from_json(&json.to_string(), "<test>").unwrap(),
            end,
            end + 1,
        )
    }

    /// A Metaspace (SentencePiece-style) tokenizer: words with and without "▁", decoded whole.
    fn metaspace() -> Tokenizer {
        let words = [
            "▁Hi",
            "▁there",
            "!",
            "\n",
            "▁日本",
            "語",
            "▁",
            "a",
            "b",
            "<unk>",
        ];
        let vocab: Vec<serde_json::Value> =
            words.iter().map(|w| serde_json::json!([w, 0.0])).collect();
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
            "post_processor": null,
            "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
            "model": {"type": "Unigram", "unk_id": 9, "vocab": vocab, "byte_fallback": false},
        });
        Tokenizer::from_json(&json.to_string(), "<metaspace>").unwrap()
    }

    /// `Tokenizer::encode_batch` gives each text what `encode` gives it alone, in order (its batch runs on a thread
    /// pool), on both tokenizer kinds, with texts that hold special tokens, multi-byte characters and nothing.
    #[test]
    fn a_batch_encodes_each_text_as_alone_in_order() {
        let (bpe, _, _) = byte_level(&[&b"Hi"[..], &b"\nBye"[..]]);
        let texts: Vec<String> = (0..300)
            .map(|i| match i % 5 {
                0 => format!("Hi {i}\nBye"),
                1 => format!("<|end|>{i}<tool>"),
                2 => "日本語 ü".repeat(i % 7),
                3 => String::new(),
                _ => format!("{i:x} a b"),
            })
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        for tok in [bpe, metaspace()] {
            let batch = tok.encode_batch(&refs, false).unwrap();
            let alone: Vec<Vec<u32>> = refs.iter().map(|t| tok.encode(t, false).unwrap()).collect();
            assert_eq!(batch, alone, "{}", tok.origin());
            assert!(
                batch.iter().any(|ids| ids.len() > 2),
                "the texts must encode to something"
            );
        }
    }

    fn run(
        asm: &mut TextAssembler,
        rounds: &[Vec<u32>],
        end: RoundEnd,
    ) -> (Vec<String>, Option<StopHit>) {
        let mut out = Vec::new();
        let mut stop = None;
        for (i, r) in rounds.iter().enumerate() {
            let last = if i + 1 == rounds.len() {
                end
            } else {
                RoundEnd::Continue
            };
            let d = asm.feed(r, last).unwrap();
            out.push(d.text);
            if d.stop.is_some() {
                stop = d.stop;
            }
            if d.finished {
                break;
            }
        }
        (out, stop)
    }

    #[test]
    fn worked_example_from_the_module_docs() {
        let (tok, _, _) = byte_level(&[&b"Hi"[..], &b"\nBye"[..]]);
        let id = |s: &str| {
            tok.token_to_id(&s.bytes().map(byte_char).collect::<String>())
                .unwrap()
        };
        let mut asm =
            TextAssembler::new(tok.clone(), vec!["\n\n".into()], TextOptions::default()).unwrap();
        assert!(asm.is_incremental());
        let d = asm.feed(&[id("Hi"), id("\n")], RoundEnd::Continue).unwrap();
        assert_eq!((d.text.as_str(), d.finished), ("Hi", false));
        let d = asm.feed(&[id("\nBye")], RoundEnd::Continue).unwrap();
        assert_eq!(
            d.stop,
            Some(StopHit {
                n_keep: 3,
                index: 0
            })
        );
        assert_eq!((d.text.as_str(), d.finished, asm.text()), ("", true, "Hi"));
        assert!(asm.feed(&[1], RoundEnd::Continue).is_err());
    }

    #[test]
    fn multibyte_characters_split_across_tokens_are_held_back_until_complete() {
        // "日" = E6 97 A5, "🙂" = F0 9F 99 82: each byte its own token.
        let (tok, _, _) = byte_level(&[]);
        let bytes = "a日🙂"
            .as_bytes()
            .iter()
            .map(|&b| u32::from(b))
            .collect::<Vec<_>>();
        let mut asm = TextAssembler::new(tok, vec![], TextOptions::default()).unwrap();
        let mut got = Vec::new();
        for &b in &bytes {
            got.push(asm.feed(&[b], RoundEnd::Continue).unwrap().text);
        }
        assert_eq!(got, ["a", "", "", "日", "", "", "", "🙂"]);
        // An incomplete sequence at the end is flushed as U+FFFD when the generation ends.
        let d = asm.feed(&[0xE6], RoundEnd::Finished).unwrap();
        assert_eq!((d.text.as_str(), d.finished), ("\u{FFFD}", true));
        assert_eq!(asm.text(), "a日🙂\u{FFFD}");
    }

    /// `TextOptions` from vLLM's two options.
    fn opts(skip_special_tokens: bool, include_stop_str_in_output: bool) -> TextOptions {
        TextOptions {
            skip_special_tokens,
            include_stop_str_in_output,
        }
    }

    /// Feed `rounds` and return (the deltas joined, the stop's n_keep, the final text), checking that the deltas
    /// join to the final text.
    fn joined(
        tok: &Tokenizer,
        stops: &[&str],
        options: TextOptions,
        rounds: &[Vec<u32>],
        end: RoundEnd,
    ) -> (String, Option<usize>, String) {
        let stops = stops.iter().map(|s| (*s).to_owned()).collect();
        let mut asm = TextAssembler::new(tok.clone(), stops, options).unwrap();
        let (out, stop) = run(&mut asm, rounds, end);
        assert!(asm.finished());
        assert_eq!(out.concat(), asm.text(), "the deltas join to the text");
        (out.concat(), stop.map(|s| s.n_keep), asm.text().to_owned())
    }

    #[test]
    fn a_stop_string_ending_mid_token_is_cut_or_kept_with_include_stop_str_in_output() {
        // Tokens "ab", "cd"; stop "bc" ends inside "cd": both tokens are kept, the text is cut in "ab".
        let (tok, _, _) = byte_level(&[&b"ab"[..], &b"cd"[..]]);
        let id = |s: &str| {
            tok.token_to_id(&s.bytes().map(byte_char).collect::<String>())
                .unwrap()
        };
        let rounds = [vec![id("ab")], vec![id("cd"), u32::from(b'x')]];
        let mut asm =
            TextAssembler::new(tok.clone(), vec!["bc".into()], TextOptions::default()).unwrap();
        let (out, stop) = run(&mut asm, &rounds, RoundEnd::Continue);
        assert_eq!(out, ["a", ""], "\"b\" may start the stop string: held back");
        assert_eq!(
            (stop.map(|s| s.n_keep), asm.tokens().len(), asm.text()),
            (Some(2), 2, "a")
        );
        for skip in [true, false] {
            let got = joined(&tok, &["bc"], opts(skip, true), &rounds, RoundEnd::Continue);
            assert_eq!(got, ("abc".into(), Some(2), "abc".into()));
        }
    }

    #[test]
    fn special_tokens_are_shown_with_skip_special_tokens_false_except_the_finishing_one() {
        let (tok, end, tool) = byte_level(&[]);
        let a = u32::from(b'a');
        let rounds = [vec![a, end], vec![tool, end]];
        let by_token = RoundEnd::FinishedByToken;
        // The last `<|end|>` ended the generation (an EOS): left out unless include_stop_str_in_output.
        let cases = [
            (opts(false, false), "a<|end|><tool>"),
            (opts(false, true), "a<|end|><tool><|end|>"),
            (opts(true, false), "a<tool>"),
            (opts(true, true), "a<tool>"),
        ];
        for (options, want) in cases {
            assert_eq!(joined(&tok, &[], options, &rounds, by_token).0, want);
        }
        // Ended by length: nothing is left out.
        assert_eq!(
            joined(&tok, &[], opts(false, false), &rounds, RoundEnd::Finished).0,
            "a<|end|><tool><|end|>"
        );
    }

    #[test]
    fn a_finishing_token_that_is_not_special_is_left_out_unless_include_stop_str_in_output() {
        // `<tool>` (not special) or a plain byte as the stop token id that ended the generation.
        let (tok, _, tool) = byte_level(&[]);
        let (a, b) = (u32::from(b'a'), u32::from(b'b'));
        for skip in [true, false] {
            for (last, text) in [(tool, "<tool>"), (b, "b")] {
                let rounds = [vec![a], vec![a, last]];
                let (hidden, _, _) = joined(
                    &tok,
                    &[],
                    opts(skip, false),
                    &rounds,
                    RoundEnd::FinishedByToken,
                );
                let (kept, _, _) = joined(
                    &tok,
                    &[],
                    opts(skip, true),
                    &rounds,
                    RoundEnd::FinishedByToken,
                );
                assert_eq!((hidden, kept), ("aa".to_owned(), format!("aa{text}")));
            }
            // One token alone that ends the generation: no text.
            let (alone, _, _) = joined(
                &tok,
                &[],
                opts(skip, false),
                &[vec![b]],
                RoundEnd::FinishedByToken,
            );
            assert_eq!(alone, "");
        }
    }

    #[test]
    fn stop_strings_are_matched_in_the_text_without_special_tokens() {
        let (tok, end, _) = byte_level(&[]);
        let (a, b, c) = (u32::from(b'a'), u32::from(b'b'), u32::from(b'c'));
        let rounds: Vec<Vec<u32>> = [a, end, b, c].iter().map(|&t| vec![t]).collect();
        // Stop "b": found in "abc" at the third token, whatever skip_special_tokens says.
        let mut asm =
            TextAssembler::new(tok.clone(), vec!["b".into()], opts(false, false)).unwrap();
        let (out, stop) = run(&mut asm, &rounds, RoundEnd::Continue);
        assert_eq!(out, ["a", "<|end|>", ""]);
        assert_eq!((stop.map(|s| s.n_keep), asm.text()), (Some(3), "a<|end|>"));
        assert_eq!(
            joined(&tok, &["b"], opts(false, true), &rounds, RoundEnd::Continue),
            ("a<|end|>b".into(), Some(3), "a<|end|>b".into())
        );
        // Stop "ab" spans the special token: the plain text "ab" stops the generation; the text with special
        // tokens holds no "ab", so it is not cut.
        assert_eq!(
            joined(
                &tok,
                &["ab"],
                opts(false, false),
                &rounds,
                RoundEnd::Continue
            ),
            ("a<|end|>b".into(), Some(3), "a<|end|>b".into())
        );
        assert_eq!(
            joined(
                &tok,
                &["ab"],
                opts(true, false),
                &rounds,
                RoundEnd::Continue
            )
            .2,
            ""
        );
        // A stop string made of a special token's text never matches (the plain text has no special tokens); while
        // streaming, the text from it on is held back, and the end of the generation releases it.
        let mut asm =
            TextAssembler::new(tok.clone(), vec!["<|end|>".into()], opts(false, false)).unwrap();
        let (out, stop) = run(&mut asm, &rounds, RoundEnd::Finished);
        assert_eq!(out, ["a", "", "", "<|end|>bc"]);
        assert_eq!((stop, asm.text()), (None, "a<|end|>bc"));
    }

    #[test]
    fn multibyte_characters_and_a_special_token_between_them_with_skip_special_tokens_false() {
        // "a", <|end|>, the 🙂 bytes F0 9F | 99 82, "x"; stop "🙂".
        let (tok, end, _) = byte_level(&[&"🙂".as_bytes()[..2], &"🙂".as_bytes()[2..]]);
        let piece = |bytes: &[u8]| {
            tok.token_to_id(&bytes.iter().map(|&b| byte_char(b)).collect::<String>())
                .unwrap()
        };
        let (head, tail) = (piece(&"🙂".as_bytes()[..2]), piece(&"🙂".as_bytes()[2..]));
        let x = u32::from(b'x');
        let rounds: Vec<Vec<u32>> = [u32::from(b'a'), end, head, tail, x]
            .iter()
            .map(|&t| vec![t])
            .collect();
        let mut asm =
            TextAssembler::new(tok.clone(), vec!["🙂".into()], opts(false, false)).unwrap();
        let (out, stop) = run(&mut asm, &rounds, RoundEnd::Continue);
        assert_eq!(
            out,
            ["a", "<|end|>", "", ""],
            "the half character is held back"
        );
        assert_eq!((stop.map(|s| s.n_keep), asm.text()), (Some(4), "a<|end|>"));
        assert_eq!(
            joined(
                &tok,
                &["🙂"],
                opts(false, true),
                &rounds,
                RoundEnd::Continue
            )
            .0,
            "a<|end|>🙂"
        );
        // A special token splitting a character's bytes: the plain text has the character, the text with special
        // tokens has U+FFFD on each side (as `decode` gives it).
        let split: Vec<Vec<u32>> = [head, end, tail].iter().map(|&t| vec![t]).collect();
        let (text, _, _) = joined(&tok, &[], opts(false, false), &split, RoundEnd::Finished);
        assert_eq!(text, tok.decode(&[head, end, tail], false).unwrap());
        assert_eq!(
            joined(&tok, &[], opts(true, false), &split, RoundEnd::Finished).0,
            "🙂"
        );
    }

    #[test]
    fn include_stop_str_in_output_keeps_the_eos_that_ended_the_generation() {
        // `<|end|>` as the EOS (special): shown only with skip_special_tokens false and include_stop_str_in_output.
        let (tok, end, _) = byte_level(&[]);
        let rounds = [vec![u32::from(b'h'), u32::from(b'i')], vec![end]];
        let eos = RoundEnd::FinishedByToken;
        let mut asm = TextAssembler::new(tok.clone(), vec![], opts(false, true)).unwrap();
        let (out, _) = run(&mut asm, &rounds, eos);
        assert_eq!(out, ["hi", "<|end|>"]);
        assert_eq!(joined(&tok, &[], opts(false, false), &rounds, eos).0, "hi");
        assert_eq!(joined(&tok, &[], opts(true, true), &rounds, eos).0, "hi");
        // A stop string found in the last round wins over the finishing token: nothing of it is hidden twice.
        let rounds = [vec![u32::from(b'h')], vec![u32::from(b'i'), end]];
        assert_eq!(
            joined(&tok, &["i"], opts(false, true), &rounds, eos),
            ("hi".into(), Some(2), "hi".into())
        );
        assert_eq!(
            joined(&tok, &["i"], opts(false, false), &rounds, eos).0,
            "h"
        );
    }

    #[test]
    fn engine_finish_reasons_map_to_round_ends() {
        assert_eq!(RoundEnd::from_finish_reason(None), Ok(RoundEnd::Continue));
        assert_eq!(
            RoundEnd::from_finish_reason(Some("eos")),
            Ok(RoundEnd::FinishedByToken)
        );
        assert_eq!(
            RoundEnd::from_finish_reason(Some("stop")),
            Ok(RoundEnd::FinishedByToken)
        );
        assert_eq!(
            RoundEnd::from_finish_reason(Some("length")),
            Ok(RoundEnd::Finished)
        );
        let err = RoundEnd::from_finish_reason(Some("done")).unwrap_err();
        assert!(matches!(err, SpecError::Config(m) if m.contains("\"done\" is invalid")));
    }

    #[test]
    fn metaspace_tokenizers_are_decoded_whole() {
        let tok = metaspace();
        let mut asm =
            TextAssembler::new(tok.clone(), vec!["re!".into()], TextOptions::default()).unwrap();
        assert!(!asm.is_incremental());
        // "▁Hi" "▁there" "!": the first token's space is stripped by the decoder.
        let (out, stop) = run(
            &mut asm,
            &[vec![0], vec![1], vec![2, 3]],
            RoundEnd::Continue,
        );
        assert_eq!(out, ["Hi", " the", ""]);
        assert_eq!((asm.text(), stop.map(|s| s.n_keep)), ("Hi the", Some(3)));
    }

    /// What the reference Decoder made of one round.
    struct RefRound {
        /// The text it emitted.
        text: String,
        /// The round's tokens, cut at a stop string.
        tokens: Vec<u32>,
        /// Whether the generation ended with this round.
        finished: bool,
    }

    /// The Python `_Assembler.feed` algorithm (the `Decoder`'s text: special tokens skipped, the finishing token's
    /// text kept), on code points, with whole decodes (the reference). Returns each round's output, the stop's
    /// n_keep and the final text.
    fn reference(
        tok: &Tokenizer,
        stops: &[String],
        rounds: &[Vec<u32>],
        include_stop: bool,
    ) -> (Vec<RefRound>, Option<usize>, String) {
        let s = StopStrings::new(stops.to_vec()).unwrap();
        let chars = |t: &str| t.chars().count();
        let mut tokens: Vec<u32> = Vec::new();
        let mut sent = 0;
        let mut out = Vec::new();
        for (i, r) in rounds.iter().enumerate() {
            let finish = i + 1 == rounds.len();
            let n_before = tokens.len();
            tokens.extend(r);
            let mut text = tok.decode(&tokens, true).unwrap();
            let mut stopped = None;
            let start = sent - sent.min(s.max_chars());
            let from = text
                .char_indices()
                .map(|(b, _)| b)
                .chain([text.len()])
                .nth(start);
            if let Some(m) = from.and_then(|f| s.find(&text, f)) {
                let n_chars = chars(&text[..m.start]) + chars(&stops[m.index]);
                let (mut lo, mut hi) = (1, tokens.len());
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    let t = tok.decode(&tokens[..mid], true).unwrap();
                    if chars(t.trim_end_matches(REPLACEMENT)) >= n_chars {
                        hi = mid
                    } else {
                        lo = mid + 1
                    }
                }
                tokens.truncate(lo);
                let cut = if include_stop {
                    m.start + stops[m.index].len()
                } else {
                    m.start
                };
                text.truncate(cut);
                stopped = Some(lo);
            }
            let end = if stopped.is_some() || finish {
                chars(&text)
            } else {
                let t = text.trim_end_matches(REPLACEMENT);
                chars(t) - chars(&t[t.len() - s.longest_partial(t)..])
            };
            let finished = stopped.is_some() || finish;
            out.push(RefRound {
                text: char_slice(&text, sent, end),
                tokens: tokens[n_before.min(tokens.len())..].to_vec(),
                finished,
            });
            sent = sent.max(end);
            if finished {
                return (out, stopped, text);
            }
        }
        (out, None, String::new())
    }

    /// Characters `a..b` of `t` (empty when `b <= a`), as Python's `t[a:b]`.
    fn char_slice(t: &str, a: usize, b: usize) -> String {
        t.chars().skip(a).take(b.saturating_sub(a)).collect()
    }

    /// The server's Python `_TextView` (with `custom` set: the text decoded from the ids) over the reference
    /// Decoder's rounds: each round's delta, then the rest sent with the result. `end`: how the last round ended.
    fn view_reference(
        tok: &Tokenizer,
        stops: &[String],
        rounds: &[Vec<u32>],
        options: TextOptions,
        end: RoundEnd,
    ) -> (Vec<String>, String) {
        let TextOptions {
            skip_special_tokens: skip,
            include_stop_str_in_output: include,
        } = options;
        let s = StopStrings::new(stops.to_vec()).unwrap();
        let chars = |t: &str| t.chars().count();
        // `_first_stop`: (character index, stop) of the earliest match, ties to the stop given first.
        let first_stop = |t: &str| {
            s.find(t, 0)
                .map(|m| (chars(&t[..m.start]), stops[m.index].clone()))
        };
        let (decoder, n_keep, decoder_text) = reference(tok, stops, rounds, false);
        let mut ids: Vec<u32> = Vec::new();
        let mut sent = String::new();
        let mut deltas = Vec::new();
        for round in &decoder {
            ids.extend(&round.tokens);
            let delta = if round.finished {
                String::new() // the result says whether the last token is a stop token, to be left out
            } else {
                let text = tok.decode(&ids, skip).unwrap();
                let mut end = chars(text.trim_end_matches(REPLACEMENT));
                let head = char_slice(&text, 0, end);
                end -= chars(&head[head.len() - s.longest_partial(&head)..]);
                if let Some((i, _)) = first_stop(&char_slice(&text, 0, end)) {
                    end = i;
                }
                if text.starts_with(&sent) {
                    char_slice(&text, chars(&sent), end)
                } else {
                    String::new()
                }
            };
            sent += &delta;
            deltas.push(delta);
        }
        // `final`: the reference Decoder's finish reason is "stop" for a stop string too.
        let by_token = end == RoundEnd::FinishedByToken;
        let stopped = n_keep.is_some() || by_token;
        let mut hit = None;
        if stopped && !stops.is_empty() {
            let plain = tok.decode(&ids, true).unwrap();
            let cut = chars(&decoder_text);
            let rest = char_slice(&plain, cut, usize::MAX);
            hit = stops
                .iter()
                .find(|st| rest.starts_with(st.as_str()))
                .cloned();
        }
        let whole = if let Some(hit) = hit {
            if skip {
                decoder_text + if include { hit.as_str() } else { "" }
            } else {
                let text = tok.decode(&ids, false).unwrap();
                match first_stop(&text) {
                    Some((i, st)) => char_slice(&text, 0, i + if include { chars(&st) } else { 0 }),
                    None => text,
                }
            }
        } else {
            let hide = n_keep.is_none() && by_token && !ids.is_empty() && !include;
            tok.decode(&ids[..ids.len() - usize::from(hide)], skip)
                .unwrap()
        };
        let rest = if whole.starts_with(&sent) {
            whole[sent.len()..].to_owned()
        } else {
            String::new()
        };
        deltas.push(rest);
        (deltas, whole)
    }

    /// The stream of the proptests: rounds of ids from `alphabet` (ids of `pieces`, `<|end|>`, `<tool>`) and stop
    /// strings from `texts`.
    fn random_stream(
        picks: &[(usize, usize)],
        stop_picks: &[(usize, usize)],
    ) -> (Tokenizer, Vec<Vec<u32>>, Vec<String>) {
        let alphabet: Vec<&[u8]> = vec![
            &b"a"[..],
            &b"b"[..],
            &b" "[..],
            &b"\n"[..],
            "日".as_bytes(),
            &"日".as_bytes()[..1],
            &"日".as_bytes()[1..],
            "🙂".as_bytes(),
            &"🙂".as_bytes()[..2],
            &"🙂".as_bytes()[2..],
            &b"\xFF"[..],
            &b"ab"[..],
        ];
        let (tok, end, tool) = byte_level(&alphabet);
        let piece_id = |k: usize| {
            tok.token_to_id(
                &alphabet[k]
                    .iter()
                    .map(|&b| byte_char(b))
                    .collect::<String>(),
            )
            .unwrap()
        };
        let mut rounds: Vec<Vec<u32>> = vec![Vec::new()];
        for &(k, split) in picks {
            let id = match k {
                12 => end,
                13 => tool,
                k => piece_id(k),
            };
            rounds.last_mut().unwrap().push(id);
            if split == 0 {
                rounds.push(Vec::new());
            }
        }
        let texts = [
            "a", "b", "日", "🙂", " b", "\n\n", "a日", "<tool>", "<|end|>", "a<tool>",
        ];
        let stops: Vec<String> = stop_picks
            .iter()
            .map(|&(k, r)| texts[k].repeat(r))
            .collect();
        (tok, rounds, stops)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Random token streams over bytes, partial characters and added tokens, with stops that end mid-token
        /// and span tokens: the incremental assembler and the whole-decode one both equal the `Decoder`'s
        /// reference with special tokens skipped (the engine ending by length).
        #[test]
        fn assembler_equals_the_python_reference(
            picks in proptest::collection::vec((0usize..14, 0usize..3), 0..40),
            stop_picks in proptest::collection::vec((0usize..10, 1usize..4), 0..3),
            include in any::<bool>(),
        ) {
            let (tok, rounds, stops) = random_stream(&picks, &stop_picks);
            let (want, want_keep, want_text) = reference(&tok, &stops, &rounds, include);
            let want: Vec<String> = want.into_iter().map(|r| r.text).collect();
            for incremental in [true, false] {
                let mut asm = TextAssembler::with_mode(tok.clone(), stops.clone(), opts(true, include), incremental).unwrap();
                prop_assert_eq!(asm.is_incremental(), incremental);
                let (got, stop) = run(&mut asm, &rounds, RoundEnd::Finished);
                prop_assert_eq!(&got, &want);
                prop_assert_eq!(stop.map(|s| s.n_keep), want_keep);
                prop_assert_eq!(asm.text(), want_text.as_str());
                prop_assert_eq!(got.concat(), want_text.clone());
            }
        }

        /// Every view (both options, ended by length or by a finishing token) equals the server's `_TextView` over
        /// the reference Decoder's rounds: the same delta for every round before the last, the same text at the
        /// end; and every view stops at the same token as the `Decoder`'s text.
        #[test]
        fn views_equal_the_python_text_view(
            picks in proptest::collection::vec((0usize..14, 0usize..3), 0..40),
            stop_picks in proptest::collection::vec((0usize..10, 1usize..4), 0..3),
            skip in any::<bool>(),
            include in any::<bool>(),
            by_token in any::<bool>(),
        ) {
            let (tok, mut rounds, stops) = random_stream(&picks, &stop_picks);
            if by_token {
                // The round that ends on a token holds it.
                while rounds.len() > 1 && rounds.last().is_some_and(Vec::is_empty) {
                    rounds.pop();
                }
                prop_assume!(!rounds[rounds.len() - 1].is_empty());
            }
            let end = if by_token { RoundEnd::FinishedByToken } else { RoundEnd::Finished };
            let (decoder, want_keep, _) = reference(&tok, &stops, &rounds, false);
            let (want, want_text) = view_reference(&tok, &stops, &rounds, opts(skip, include), end);
            for incremental in [true, false] {
                let mut asm = TextAssembler::with_mode(tok.clone(), stops.clone(), opts(skip, include), incremental).unwrap();
                // Fed what the Decoder's rounds hold (cut at the stop string), as the server feeds its chunks.
                let fed: Vec<Vec<u32>> = decoder.iter().map(|r| r.tokens.clone()).collect();
                let (got, stop) = run(&mut asm, &fed, end);
                prop_assert_eq!(got.len(), fed.len());
                prop_assert_eq!(&got[..got.len() - 1], &want[..got.len() - 1]);
                prop_assert_eq!(stop.map(|s| s.n_keep), want_keep);
                prop_assert_eq!(asm.text(), want_text.as_str());
                prop_assert_eq!(got.concat(), want_text.clone());
                // Fed the engine's whole rounds instead: the same stop, the same text.
                let mut whole = TextAssembler::with_mode(tok.clone(), stops.clone(), opts(skip, include), incremental).unwrap();
                let (got_whole, stop_whole) = run(&mut whole, &rounds, end);
                prop_assert_eq!(stop_whole.map(|s| s.n_keep), want_keep);
                prop_assert_eq!(got_whole.concat(), want_text.clone());
            }
        }

        /// The incremental text equals `decode` of the whole sequence after every round.
        #[test]
        fn incremental_text_equals_a_whole_decode(bytes in proptest::collection::vec(any::<u8>(), 0..40), skip in any::<bool>()) {
            let (tok, end, _) = byte_level(&[]);
            let mut asm = TextAssembler::new(tok.clone(), vec![], TextOptions { skip_special_tokens: skip, ..TextOptions::default() }).unwrap();
            let mut ids = Vec::new();
            for (i, &b) in bytes.iter().enumerate() {
                let id = if i % 7 == 6 { end } else { u32::from(b) };
                ids.push(id);
                asm.feed(&[id], RoundEnd::Continue).unwrap();
                prop_assert_eq!(asm.text(), tok.decode(&ids, skip).unwrap());
            }
        }
    }
}
