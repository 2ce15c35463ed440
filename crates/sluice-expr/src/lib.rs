//! Sluice's small expression languages: [`Condition`]s that decide whether an event matches,
//! and [`Template`]s that build strings (or values) from an event.
//!
//! Both are parsed once, at config load, into a tree of parts: field paths are resolved to
//! [`FieldPath`](sluice_core::FieldPath)s, regular expressions compiled, date formats
//! translated and validated. Every mistake is reported then, as an [`ExprError`] that points
//! at the column. After that, evaluation cannot fail and does not re-parse anything;
//! [`Condition::eval`] does not allocate. Neither parser panics on any input.
//!
//! # Conditions
//!
//! ```text
//! condition  := and ( ("or" | "||") and )*
//! and        := not ( ("and" | "&&") not )*
//! not        := ("not" | "!") not | comparison
//! comparison := "(" condition ")" | function "(" path ")"
//!             | operand [ ("==" | "!=" | "<" | "<=" | ">" | ">=") operand
//!                       | ("=~" | "!~") string
//!                       | ["not"] "in" ( "[" literal ("," literal)* [","] "]" | operand ) ]
//! operand    := path | literal
//! literal    := string | integer | float | "true" | "false" | "null"
//! ```
//!
//! - Paths are JSON pointers (`/user/id`, `~0` for `~`, `~1` for `/`) running up to whitespace
//!   or one of `()[],=!<>`. A path alone tests truthiness (missing, null, false, 0, "" and
//!   empty containers are false).
//! - Strings take double or single quotes and the escapes `\" \' \\ \n \t \r`; any other
//!   backslash stays as written, so a regular expression reads `"^\d+$"`.
//! - `not` binds tighter than `and`, which binds tighter than `or`; `not` negates the whole
//!   comparison after it (`not /a == 1` is `not (/a == 1)`).
//! - Int and Float compare numerically; strings compare bytewise; timestamps compare with
//!   timestamps and with RFC 3339 string literals. `==` across other types is false and `!=` is
//!   its negation; ordering across incompatible types, or with a missing field, is false.
//!   A missing field equals nothing (not even `null`).
//! - `=~`/`!~` take a string literal compiled as a [`regex`] at parse time; a non-string (or
//!   missing) field never matches, so `!~` is true for it.
//! - `x in [..]` is true when `x` equals an element; `x in /f` when `/f` is an array with an
//!   element equal to `x`, or a string containing the string `x`.
//! - Functions: `exists(/path)`.
//!
//! # Templates
//!
//! `%{/path}` (or `%{path}`) inserts a field as text (strings unquoted, missing fields empty);
//! `%{+FORMAT}` inserts `@timestamp` (UTC; now when missing) formatted with a strftime format
//! when FORMAT contains `%` (`%{+%Y-%m-%d}`), or else a Logstash/Joda pattern
//! (`%{+YYYY.MM.dd}`, `%{+yyyy-MM-dd'T'HH}`: `yyyy`/`YYYY`, `yy`, `MM`, `dd`, `HH`, `mm`, `ss`,
//! `SSS` and `'quoted text'`). Any other `%` is literal.
//!
//! ```
//! use sluice_core::{Event, Map, Value};
//! use sluice_expr::{Condition, Template};
//!
//! let mut fields = Map::new();
//! fields.insert("status", Value::Int(503));
//! fields.insert("level", Value::from("error"));
//! fields.insert("service", Value::from("api"));
//! let mut event = Event::new(fields);
//! event.set_timestamp_nanos(1_700_000_000_000_000_000);
//!
//! let cond = Condition::parse(r#"/status >= 500 and /level in ["warn", "error"]"#).unwrap();
//! assert!(cond.eval(&event));
//!
//! let path = Template::parse("/var/log/%{/service}-%{+YYYY.MM.dd}.log").unwrap();
//! assert_eq!(path.render_string(&event), "/var/log/api-2023.11.14.log");
//!
//! let err = Condition::parse("/status >= and x").unwrap_err();
//! assert_eq!(err.column, 12);
//! ```

mod condition;
pub mod joda;
mod lexer;
mod template;

use std::fmt;

pub use condition::Condition;
pub use joda::joda_to_strftime;
pub use template::Template;

/// A condition or template that does not parse. `column` is 1-based and counted in chars.
#[derive(Debug, Clone, PartialEq)]
pub struct ExprError {
    pub message: String,
    pub column: usize,
    pub source: String,
}

impl ExprError {
    /// `at` is the 0-based char index of the offending spot.
    pub(crate) fn new(message: String, at: usize, source: &str) -> ExprError {
        ExprError { message, column: at + 1, source: source.to_string() }
    }
}

impl fmt::Display for ExprError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at column {} in `{}`", self.message, self.column, self.source)
    }
}

// Implemented by hand rather than with thiserror: its derive treats a field named `source` as
// the underlying error, and here `source` is the text that failed to parse.
impl std::error::Error for ExprError {}

impl<'de> serde::Deserialize<'de> for Condition {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Condition::parse(&s).map_err(|err| serde::de::Error::custom(err.to_string()))
    }
}

impl<'de> serde::Deserialize<'de> for Template {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Template::parse(&s).map_err(|err| serde::de::Error::custom(err.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deserialize_parses_and_reports() {
        let c: Condition = serde_json::from_str(r#""/a == 1""#).unwrap();
        assert_eq!(c.source(), "/a == 1");
        let t: Template = serde_json::from_str(r#""x-%{/a}""#).unwrap();
        assert_eq!(t.source(), "x-%{/a}");
        let e = serde_json::from_str::<Condition>(r#""/a ==""#).unwrap_err().to_string();
        assert!(e.contains("at column 6 in `/a ==`"), "{e}");
        let e = serde_json::from_str::<Template>(r#""%{/a""#).unwrap_err().to_string();
        assert!(e.contains("unterminated"), "{e}");
        assert!(serde_json::from_str::<Condition>("5").is_err());
    }

    #[test]
    fn error_is_std_error() {
        fn takes(_: &dyn std::error::Error) {}
        takes(&Condition::parse("(").unwrap_err());
    }
}
