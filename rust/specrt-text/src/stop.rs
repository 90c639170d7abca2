//! Stop strings: the first match in a text, and the longest partial match at its end.
//!
//! Positions are byte offsets into valid UTF-8 (a match of a valid UTF-8 needle always starts and ends on
//! character boundaries), where the Python implementation this replaces counted code points; the strings found
//! are the same, so the text cut or held back is byte-identical. Lengths "in characters" below are code points,
//! as Python's `len(str)`.
//!
//! Example: stops `["</s>", "\n\n"]`, text `"a\n\nb</"`: [`StopStrings::find`] from 0 gives the match at byte 1
//! (`"\n\n"`, stop 1); [`StopStrings::longest_partial`] of `"ab</"` is 2 (`"</"` may become `"</s>"`).

use specrt_core::{Result, SpecError};

/// Where a stop string was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopMatch {
    /// Byte offset in the text where the stop string begins (the text is cut here).
    pub start: usize,
    /// Which stop string (index into [`StopStrings::stops`]).
    pub index: usize,
}

/// The stop strings of one request (non-empty strings, in the order given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Longest stop string in characters (code points).
    max_chars: usize,
}

/// The one check of a request's stop strings (the request resolver and [`StopStrings::new`]).
///
/// # Errors
/// [`SpecError::Setting`] (`stop`) for an empty stop string (it would match everywhere), naming its index.
pub fn check_stop_strings(stops: &[String]) -> Result<()> {
    match stops.iter().position(String::is_empty) {
        Some(i) => Err(SpecError::setting(
            "stop",
            format!("stop strings must be non-empty (stop string {i} is empty)"),
        )),
        None => Ok(()),
    }
}

impl StopStrings {
    /// Check and keep `stops`.
    ///
    /// # Errors
    /// As [`check_stop_strings`].
    pub fn new(stops: Vec<String>) -> Result<Self> {
        check_stop_strings(&stops)?;
        let max_chars = stops.iter().map(|s| s.chars().count()).max().unwrap_or(0);
        Ok(Self { stops, max_chars })
    }

    /// The stop strings, in the order given.
    #[must_use]
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Length of the longest stop string in characters (0 without stops).
    #[must_use]
    pub fn max_chars(&self) -> usize {
        self.max_chars
    }

    /// The first stop string found in `text[from..]` (`from`: a byte offset on a character boundary): the match
    /// that starts earliest, and of those starting at the same place the stop given first. `None` when none
    /// occurs (or `from` is past the end).
    #[must_use]
    pub fn find(&self, text: &str, from: usize) -> Option<StopMatch> {
        let hay = text.get(from..)?;
        let mut best: Option<StopMatch> = None;
        for (index, s) in self.stops.iter().enumerate() {
            if let Some(i) = hay.find(s.as_str()) {
                if best.is_none_or(|b| from + i < b.start) {
                    best = Some(StopMatch {
                        start: from + i,
                        index,
                    });
                }
            }
        }
        best
    }

    /// Byte length of the longest suffix of `text` that is a proper, non-empty prefix of some stop string (text
    /// that may still become a stop string, held back until it is decided); 0 if none.
    #[must_use]
    pub fn longest_partial(&self, text: &str) -> usize {
        let mut best = 0;
        for s in &self.stops {
            // Proper prefixes of `s` that end on a character boundary, longest first; only longer ones can win.
            for (b, _) in s.char_indices().rev() {
                if b <= best {
                    break;
                }
                if text.ends_with(&s[..b]) {
                    best = b;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn stops(s: &[&str]) -> StopStrings {
        StopStrings::new(s.iter().map(|s| (*s).to_owned()).collect()).unwrap()
    }

    /// Python's `Decoder._find_stop` search, on code-point indices (the obviously correct reference).
    fn find_naive(text: &str, stops: &[String], from_chars: usize) -> Option<(usize, usize)> {
        let chars: Vec<char> = text.chars().collect();
        let mut best: Option<(usize, usize)> = None;
        for (k, s) in stops.iter().enumerate() {
            let needle: Vec<char> = s.chars().collect();
            let hit = (from_chars..=chars.len().saturating_sub(needle.len())).find(|&i| {
                i + needle.len() <= chars.len() && chars[i..i + needle.len()] == needle[..]
            });
            if let Some(i) = hit {
                if best.is_none_or(|(b, _)| i < b) {
                    best = Some((i, k));
                }
            }
        }
        best
    }

    /// Python's `_longest_partial_stop`, on code points.
    fn partial_naive(text: &str, stops: &[String]) -> usize {
        let t: Vec<char> = text.chars().collect();
        let mut best = 0;
        for s in stops {
            let s: Vec<char> = s.chars().collect();
            for n in (best + 1..=(s.len() - 1).min(t.len())).rev() {
                if t[t.len() - n..] == s[..n] {
                    best = n;
                    break;
                }
            }
        }
        best
    }

    #[test]
    fn worked_example() {
        let s = stops(&["</s>", "\n\n"]);
        assert_eq!(
            s.find("a\n\nb</", 0),
            Some(StopMatch { start: 1, index: 1 })
        );
        assert_eq!(s.longest_partial("ab</"), 2);
        assert_eq!(s.longest_partial("ab</s"), 3);
        assert_eq!(s.longest_partial("ab"), 0);
        assert_eq!(s.max_chars(), 4);
    }

    #[test]
    fn ties_go_to_the_stop_given_first_and_earlier_starts_win() {
        let s = stops(&["bc", "b", "abc"]);
        assert_eq!(s.find("xabc", 0), Some(StopMatch { start: 1, index: 2 }));
        assert_eq!(s.find("xbc", 0), Some(StopMatch { start: 1, index: 0 }));
        assert_eq!(s.find("xbc", 2), None);
        assert_eq!(s.find("xbc", 9), None);
    }

    #[test]
    fn multibyte_partials_are_whole_characters() {
        let s = stops(&["日本語"]);
        assert_eq!(s.longest_partial("x日本"), "日本".len());
        assert_eq!(
            s.find("あ日本語", 0),
            Some(StopMatch { start: 3, index: 0 })
        );
    }

    #[test]
    fn empty_stop_is_a_config_error() {
        let err = StopStrings::new(vec!["a".into(), String::new()]).unwrap_err();
        assert!(matches!(err, SpecError::Setting { field, message }
            if field == "stop" && message.contains("stop string 1 is empty")));
    }

    fn text_strategy() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop::sample::select(vec!['a', 'b', 'é', '日', '🙂', '\n', ' ']),
            0..24,
        )
        .prop_map(|v| v.into_iter().collect())
    }

    proptest! {
        #[test]
        fn find_and_partial_equal_the_code_point_reference(
            text in text_strategy(),
            raw in proptest::collection::vec(text_strategy(), 1..4),
            from_chars in 0usize..30,
        ) {
            let raw: Vec<String> = raw.into_iter().filter(|s| !s.is_empty()).collect();
            let s = StopStrings::new(raw.clone()).unwrap();
            let from = text.char_indices().map(|(b, _)| b).chain([text.len()]).nth(from_chars);
            let got = from.and_then(|f| s.find(&text, f)).map(|m| (text[..m.start].chars().count(), m.index));
            let want = if from_chars <= text.chars().count() { find_naive(&text, &raw, from_chars) } else { None };
            prop_assert_eq!(got, want);
            let p = s.longest_partial(&text);
            prop_assert_eq!(text[text.len() - p..].chars().count(), partial_naive(&text, &raw));
        }
    }
}
