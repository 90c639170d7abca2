//! Streaming detokenization with stop strings: one request's committed token ids in, per round the text to emit.
//!
//! [`TextAssembler::feed`] takes the tokens a round committed and returns a [`TextDelta`]: the new text, and when a
//! stop string has appeared the number of tokens to keep ([`StopHit::n_keep`], what the engine's `stop_at` takes).
//! Until the generation finishes it holds back text that may still change: a trailing U+FFFD (an incomplete UTF-8
//! sequence whose next bytes are in the next token; a genuine trailing U+FFFD waits too) and a trailing partial
//! stop string. At the finishing round everything left is flushed.
//!
//! # What the text is
//! The text is always the whole generated sequence decoded at once (`tokenizers`' `decode(tokens,
//! skip_special_tokens)`), and the emitted chunks are slices of it, exactly as the Python `_Assembler` this
//! replaces (`python/specrt/generate.py` before the port; `tests/test_text.py` keeps that algorithm as its oracle).
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
//! # Views ([`TextOptions`])
//! The defaults are the `Decoder`'s text (special tokens skipped, the stop string cut off, the finishing token's
//! text kept). The server's vLLM options: `skip_special_tokens = false` (the text and the stop search include
//! special tokens' text, as vLLM matches stops in its detokenized output), `include_stop_str` (the text ends after
//! the stop string instead of before it), `hide_finishing_token` (vLLM's treatment of the EOS / stop-token-id token
//! that ended the generation: its text is left out; the server sets it to `!include_stop_str_in_output`).
//!
//! # Worked example (defaults)
//! Stop `"\n\n"`; byte-level tokens `["Hi", "\n", "\nBye"]` over two rounds:
//! 1. feed `["Hi", "\n"]`: text `"Hi\n"`, `"\n"` may start the stop: emit `"Hi"`.
//! 2. feed `["\nBye"]`: text `"Hi\n\nBye"`, stop at byte 2, covered by 3 tokens: `n_keep = 3`, text `"Hi"`, emit
//!    `""`, finished (the third token's `"Bye"` is dropped with the stop string).

use specrt_core::{Result, SpecError};

use crate::stop::StopStrings;
use crate::tokenizer::{DecoderKind, Tokenizer};

const REPLACEMENT: char = '\u{FFFD}';

/// Which text a [`TextAssembler`] produces (defaults: the `Decoder`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextOptions {
    /// Leave out added tokens marked special (default true). Stop strings are matched in the text so produced.
    pub skip_special_tokens: bool,
    /// Keep the stop string at the end of the text (vLLM's `include_stop_str_in_output`; default false: the text
    /// ends where the stop string begins).
    pub include_stop_str: bool,
    /// When the generation ends on a token (EOS or a stop token id, [`RoundEnd::FinishedByToken`]) and no stop
    /// string was found, leave that token's text out (vLLM without `include_stop_str_in_output`; default false:
    /// the `Decoder` keeps it, which matters only for a token that is not special or with
    /// `skip_special_tokens = false`).
    pub hide_finishing_token: bool,
}

impl Default for TextOptions {
    fn default() -> Self {
        Self {
            skip_special_tokens: true,
            include_stop_str: false,
            hide_finishing_token: false,
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
    /// Tokens to keep: the fewest whose decoded text (trailing U+FFFD aside) reaches the end of the stop string, so
    /// the token holding the stop string's last character is kept (pass it to the engine's `stop_at`). The
    /// assembler's own tokens are already truncated to it.
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

/// How the text is kept up to date.
#[derive(Debug, Clone)]
enum Detok {
    /// Byte-level decoding, appended round by round: `text[..stable]` is final; `pending` holds the bytes of a
    /// trailing invalid or incomplete UTF-8 sequence (shown as one U+FFFD after `stable`).
    ByteLevel { stable: usize, pending: Vec<u8> },
    /// Decode the whole sequence every round.
    Whole,
}

/// One request's streaming text (see the module docs).
#[derive(Debug, Clone)]
pub struct TextAssembler {
    tokenizer: Tokenizer,
    stops: StopStrings,
    options: TextOptions,
    detok: Detok,
    /// The committed tokens (truncated to `n_keep` at a stop string).
    tokens: Vec<u32>,
    /// The text of `tokens` (cut at a stop string).
    text: String,
    /// Characters (code points) of `text` already emitted.
    sent_chars: usize,
    /// Byte offset of character `sent_chars` in `text` (`None` when the text is shorter than that).
    sent_bytes: Option<usize>,
    finished: bool,
}

impl TextAssembler {
    /// An assembler for one request's generated text.
    ///
    /// # Errors
    /// [`SpecError::Config`] for an empty stop string.
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
        let detok = if incremental && tokenizer.decoder_kind() == DecoderKind::ByteLevel {
            Detok::ByteLevel {
                stable: 0,
                pending: Vec::new(),
            }
        } else {
            Detok::Whole
        };
        Ok(Self {
            tokenizer,
            stops: StopStrings::new(stops)?,
            options,
            detok,
            tokens: Vec::new(),
            text: String::new(),
            sent_chars: 0,
            sent_bytes: Some(0),
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
        self.update_text(new_tokens)?;
        let mut stop = None;
        if !self.stops.is_empty() {
            stop = self.find_stop()?;
        }
        if stop.is_some() {
            self.finished = true;
        } else if end != RoundEnd::Continue {
            self.finished = true;
            if end == RoundEnd::FinishedByToken
                && self.options.hide_finishing_token
                && !self.tokens.is_empty()
            {
                let n = self.tokens.len() - 1;
                let text = self
                    .tokenizer
                    .decode(&self.tokens[..n], self.options.skip_special_tokens)?;
                self.set_text(text);
            }
        }
        let end = if self.finished {
            self.text.len()
        } else {
            // Hold back an incomplete UTF-8 sequence and a possible partial stop string.
            let trimmed = self.text.trim_end_matches(REPLACEMENT);
            trimmed.len() - self.stops.longest_partial(trimmed)
        };
        let text = self.emit_until(end);
        Ok(TextDelta {
            text,
            stop,
            finished: self.finished,
        })
    }

    /// The text so far (once finished: the whole text, cut at the stop string).
    #[must_use]
    pub fn text(&self) -> &str {
        &self.text
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
        matches!(self.detok, Detok::ByteLevel { .. })
    }

    /// Bring `text` up to date with `tokens` (`new_tokens` just appended).
    fn update_text(&mut self, new_tokens: &[u32]) -> Result<()> {
        match &mut self.detok {
            Detok::ByteLevel { stable, pending } => {
                for &id in new_tokens {
                    self.tokenizer
                        .byte_level_bytes(id, self.options.skip_special_tokens, pending);
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
                let text = self
                    .tokenizer
                    .decode(&self.tokens, self.options.skip_special_tokens)?;
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

    /// Look for a stop string from `max_chars` characters before the text already sent; on a match cut the text
    /// and the tokens.
    fn find_stop(&mut self) -> Result<Option<StopHit>> {
        let from_chars = self.sent_chars.saturating_sub(self.stops.max_chars());
        let known = self.sent_bytes.map_or((0, 0), |b| (self.sent_chars, b));
        let Some(from) = byte_of_char(&self.text, known, from_chars) else {
            return Ok(None);
        };
        let Some(m) = self.stops.find(&self.text, from) else {
            return Ok(None);
        };
        let stop = &self.stops.stops()[m.index];
        let stop_end = m.start + stop.len();
        let n_chars = self.text[..stop_end].chars().count();
        let n_keep = self.tokens_covering(n_chars)?;
        self.tokens.truncate(n_keep);
        let cut = if self.options.include_stop_str {
            stop_end
        } else {
            m.start
        };
        let mut text = std::mem::take(&mut self.text);
        text.truncate(cut);
        self.text = text;
        if self.sent_bytes.is_none_or(|b| b > cut) {
            self.sent_bytes = byte_of_char(&self.text, (0, 0), self.sent_chars);
        }
        Ok(Some(StopHit {
            n_keep,
            index: m.index,
        }))
    }

    /// Fewest tokens whose decoded text, trailing U+FFFD removed, has at least `n_chars` characters (a binary
    /// search over `1..=len`, the same probes as the Python it replaces, so the answer is the same even where the
    /// length of a prefix's text is not monotone in the prefix).
    fn tokens_covering(&self, n_chars: usize) -> Result<usize> {
        let (mut lo, mut hi) = (1, self.tokens.len());
        while lo < hi {
            let mid = usize::midpoint(lo, hi);
            let text = self
                .tokenizer
                .decode(&self.tokens[..mid], self.options.skip_special_tokens)?;
            if text.trim_end_matches(REPLACEMENT).chars().count() >= n_chars {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Ok(lo)
    }

    /// Emit `text[sent..end]` (`end` a byte offset on a character boundary) when `end` is past what was sent.
    fn emit_until(&mut self, end: usize) -> String {
        let Some(sent) = self.sent_bytes else {
            return String::new(); // the text is shorter than what was sent: nothing new
        };
        if end <= sent {
            return String::new();
        }
        let out = self.text[sent..end].to_owned();
        self.sent_chars += out.chars().count();
        self.sent_bytes = Some(end);
        out
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

    #[test]
    fn options_keep_the_stop_string_show_special_tokens_and_hide_the_finishing_token() {
        let (tok, end, tool) = byte_level(&[&b"ab"[..], &b"c"[..]]);
        let a = u32::from(b'a');
        let keep = TextOptions {
            include_stop_str: true,
            ..TextOptions::default()
        };
        let mut asm = TextAssembler::new(tok.clone(), vec!["bc".into()], keep).unwrap();
        let (out, stop) = run(
            &mut asm,
            &[vec![a, u32::from(b'b')], vec![u32::from(b'c'), a]],
            RoundEnd::Continue,
        );
        assert_eq!(
            (out.concat().as_str(), stop.map(|s| s.n_keep)),
            ("abc", Some(3))
        );

        let special = TextOptions {
            skip_special_tokens: false,
            ..TextOptions::default()
        };
        let mut asm = TextAssembler::new(tok.clone(), vec![], special).unwrap();
        let (out, _) = run(
            &mut asm,
            &[vec![a, end], vec![tool, end]],
            RoundEnd::FinishedByToken,
        );
        assert_eq!(out.concat(), "a<|end|><tool><|end|>");
        let mut asm = TextAssembler::new(tok.clone(), vec![], TextOptions::default()).unwrap();
        let (out, _) = run(
            &mut asm,
            &[vec![a, end], vec![tool, end]],
            RoundEnd::FinishedByToken,
        );
        assert_eq!(out.concat(), "a<tool>");

        let hide = TextOptions {
            hide_finishing_token: true,
            ..TextOptions::default()
        };
        let mut asm = TextAssembler::new(tok, vec![], hide).unwrap();
        let (out, _) = run(&mut asm, &[vec![a], vec![tool]], RoundEnd::FinishedByToken);
        assert_eq!((out.concat().as_str(), asm.tokens().len()), ("a", 2));
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

    /// The Python `_Assembler.feed` algorithm, on code points, with whole decodes (the reference).
    fn reference(
        tok: &Tokenizer,
        stops: &[String],
        rounds: &[Vec<u32>],
        opts: TextOptions,
    ) -> (Vec<String>, Option<usize>, String) {
        let s = StopStrings::new(stops.to_vec()).unwrap();
        let chars = |t: &str| t.chars().count();
        let slice = |t: &str, a: usize, b: usize| {
            t.chars()
                .skip(a)
                .take(b.saturating_sub(a))
                .collect::<String>()
        };
        let mut tokens: Vec<u32> = Vec::new();
        let mut sent = 0;
        let mut out = Vec::new();
        for (i, r) in rounds.iter().enumerate() {
            let finish = i + 1 == rounds.len();
            tokens.extend(r);
            let mut text = tok.decode(&tokens, opts.skip_special_tokens).unwrap();
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
                    let t = tok
                        .decode(&tokens[..mid], opts.skip_special_tokens)
                        .unwrap();
                    if chars(t.trim_end_matches(REPLACEMENT)) >= n_chars {
                        hi = mid
                    } else {
                        lo = mid + 1
                    }
                }
                tokens.truncate(lo);
                let cut = if opts.include_stop_str {
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
            out.push(slice(&text, sent, end));
            sent = sent.max(end);
            if stopped.is_some() || finish {
                return (out, stopped, text);
            }
        }
        (out, None, String::new())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Random token streams over bytes, partial characters and added tokens, with stops that end mid-token
        /// and span tokens: the incremental assembler and the whole-decode one both equal the reference.
        #[test]
        fn assembler_equals_the_python_reference(
            picks in proptest::collection::vec((0usize..12, 0usize..3), 0..40),
            stop_picks in proptest::collection::vec((0usize..8, 1usize..4), 0..3),
            skip in any::<bool>(),
            include in any::<bool>(),
        ) {
            let alphabet: Vec<&[u8]> = vec![&b"a"[..], &b"b"[..], &b" "[..], &b"\n"[..], "日".as_bytes(), &"日".as_bytes()[..1],
                &"日".as_bytes()[1..], "🙂".as_bytes(), &"🙂".as_bytes()[..2], &"🙂".as_bytes()[2..], &b"\xFF"[..], &b"ab"[..]];
            let (tok, end, tool) = byte_level(&alphabet);
            let piece_id = |k: usize| tok.token_to_id(&alphabet[k].iter().map(|&b| byte_char(b)).collect::<String>()).unwrap();
            let mut rounds: Vec<Vec<u32>> = vec![Vec::new()];
            for &(k, split) in &picks {
                let id = match k { 10 => end, 11 => tool, k => piece_id(k) };
                rounds.last_mut().unwrap().push(id);
                if split == 0 { rounds.push(Vec::new()); }
            }
            let texts = ["a", "b", "日", "🙂", " b", "\n\n", "a日", "<tool>"];
            let stops: Vec<String> = stop_picks.iter().map(|&(k, r)| texts[k].repeat(r)).collect();
            let opts = TextOptions { skip_special_tokens: skip, include_stop_str: include, hide_finishing_token: false };
            let (want, want_keep, want_text) = reference(&tok, &stops, &rounds, opts);
            for incremental in [true, false] {
                let mut asm = TextAssembler::with_mode(tok.clone(), stops.clone(), opts, incremental).unwrap();
                prop_assert_eq!(asm.is_incremental(), incremental);
                let (got, stop) = run(&mut asm, &rounds, RoundEnd::Finished);
                prop_assert_eq!(&got, &want);
                prop_assert_eq!(stop.map(|s| s.n_keep), want_keep);
                prop_assert_eq!(asm.text(), want_text.as_str());
                prop_assert_eq!(got.concat(), want_text.clone());
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
