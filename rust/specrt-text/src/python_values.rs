//! Values written as Python writes them, for chat templates rendered as jinja2 renders them
//! ([`crate::chat::ChatTemplate`]): `json.dumps` ([`python_json`], and the `tojson` filter's options), `str()`
//! ([`python_str`]) and `repr()` ([`python_repr`]) of minijinja values, Python's float formatting included.

use std::fmt::Write as _;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Python `json.dumps` options.
pub(crate) struct JsonOptions {
    pub(crate) ensure_ascii: bool,
    pub(crate) indent: Option<String>,
    pub(crate) item_sep: String,
    pub(crate) key_sep: String,
    pub(crate) sort_keys: bool,
}

/// `value` as Python's `json.dumps(value, ensure_ascii=False)` writes it (`", "` / `": "`, key order kept).
///
/// # Errors
/// A value JSON cannot hold (undefined, a macro, a namespace), as Python's `TypeError`.
pub fn python_json(value: &Value) -> std::result::Result<String, Error> {
    let opts = JsonOptions {
        ensure_ascii: false,
        indent: None,
        item_sep: ", ".into(),
        key_sep: ": ".into(),
        sort_keys: false,
    };
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(out)
}

pub(crate) fn write_json(
    out: &mut String,
    value: &Value,
    opts: &JsonOptions,
    depth: usize,
) -> std::result::Result<(), Error> {
    if depth > 500 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: nesting too deep (RecursionError)",
        ));
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = &opts.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if value.is_integer() {
                let _ = write!(out, "{value}");
            } else {
                let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
                out.push_str(&json_float(f));
            }
        }
        ValueKind::String => {
            json_string(out, value.as_str().unwrap_or_default(), opts.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(out, depth + 1);
                write_json(out, item, opts, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut pairs = Vec::new();
            for key in value.try_iter()? {
                let k = match key.kind() {
                    ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
                    ValueKind::Number if key.is_integer() => key.to_string(),
                    ValueKind::Number => json_float(f64::try_from(key.clone()).unwrap_or(f64::NAN)),
                    ValueKind::Bool => if key.is_true() { "true" } else { "false" }.to_owned(),
                    ValueKind::None => "null".to_owned(),
                    _ => {
                        return Err(Error::new(
                            ErrorKind::InvalidOperation,
                            format!(
                                "tojson: keys must be str, int, float, bool or None, not {}",
                                key.kind()
                            ),
                        ))
                    }
                };
                let v = value.get_item(&key)?;
                pairs.push((k, v));
            }
            if opts.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, v)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(out, depth + 1);
                json_string(out, k, opts.ensure_ascii);
                out.push_str(&opts.key_sep);
                write_json(out, v, opts, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: Object of type {kind} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// A float as Python's `json` writes it: `repr(x)`, `NaN`, `Infinity`, `-Infinity`.
fn json_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        python_float(f)
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, exponent form below 1e-4 and from 1e16
/// (`1e-05`, `1e+16`), else positional with at least one decimal (`100.0`).
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    let sci = format!("{f:e}"); // e.g. "1.5e-7", "1e16", "-2.5e3"
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{f}");
        if s.contains('.') {
            s
        } else {
            s + ".0"
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
    }
}

/// A JSON string literal as Python's `json` writes it (`ensure_ascii`: non-ASCII as `\uXXXX`).
fn json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `value` as Python's `str()` writes it: strings as they are, `True` / `False` / `None`, numbers as Python's,
/// lists and dicts as their `repr` (`['a', 1]`, `{'k': None}`); undefined is empty (jinja2's `Undefined`).
#[must_use]
pub fn python_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => value.as_str().unwrap_or_default().to_owned(),
        _ => python_repr(value),
    }
}

/// `value` as Python's `repr()` writes it.
#[must_use]
pub fn python_repr(value: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, value, 0);
    out
}

fn write_repr(out: &mut String, value: &Value, depth: usize) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => {
            if value.is_integer() {
                let _ = write!(out, "{value}");
            } else {
                out.push_str(&python_float(
                    f64::try_from(value.clone()).unwrap_or(f64::NAN),
                ));
            }
        }
        ValueKind::String => python_string_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq if depth < 100 => {
            out.push('[');
            if let Ok(iter) = value.try_iter() {
                for (i, item) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &item, depth + 1);
                }
            }
            out.push(']');
        }
        ValueKind::Map if depth < 100 => {
            out.push('{');
            if let Ok(iter) = value.try_iter() {
                for (i, key) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &key, depth + 1);
                    out.push_str(": ");
                    let v = value.get_item(&key).unwrap_or_default();
                    write_repr(out, &v, depth + 1);
                }
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`; backslash escapes for `\\`, the
/// quote, `\n`, `\r`, `\t` and other control characters.
fn python_string_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa1).contains(&(c as u32)) || c == '\u{ad}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_strings_are_quoted_as_repr() {
        let v = Value::from_serialize(json!(["it's", "say \"hi\"", "both ' \"", "a\nb\\"]));
        assert_eq!(
            python_repr(&v),
            r#"["it's", 'say "hi"', 'both \' "', 'a\nb\\']"#
        );
    }

    #[test]
    fn python_floats_are_formatted_as_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (0.0001, "0.0001"),
            (123_456.789, "123456.789"),
            (-2.5e100, "-2.5e+100"),
        ] {
            assert_eq!(python_float(f), want);
        }
    }
}
