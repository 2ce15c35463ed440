//! Splits a condition into tokens, each remembering the column it starts at.

use crate::ExprError;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// The raw pointer text, validated by the parser with `FieldPath::parse`.
    Path(String),
    Str(String),
    Int(i64),
    Float(f64),
    /// A word: keyword, `true`/`false`/`null` or a function name.
    Ident(String),
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Match,
    NotMatch,
    Bang,
    AndAnd,
    OrOr,
    Eof,
}

#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub tok: Tok,
    /// Index of the first char (0-based, in chars).
    pub start: usize,
    /// The token's text as a byte range of the source.
    pub bytes: std::ops::Range<usize>,
}

/// Characters that end a path (besides whitespace). `~` is not among them: it starts the
/// pointer escapes `~0` and `~1`, and no operator begins with it.
fn ends_path(c: char) -> bool {
    c.is_whitespace() || matches!(c, '(' | ')' | '[' | ']' | ',' | '=' | '!' | '<' | '>')
}

pub(crate) fn tokenize(src: &str) -> Result<Vec<Token>, ExprError> {
    let chars: Vec<char> = src.chars().collect();
    let offsets: Vec<usize> = src.char_indices().map(|(b, _)| b).chain([src.len()]).collect();
    let err = |message: String, at: usize| ExprError::new(message, at, src);
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        let next = chars.get(i + 1).copied();
        let (tok, len) = match c {
            '(' => (Tok::LParen, 1),
            ')' => (Tok::RParen, 1),
            '[' => (Tok::LBracket, 1),
            ']' => (Tok::RBracket, 1),
            ',' => (Tok::Comma, 1),
            '=' => match next {
                Some('=') => (Tok::Eq, 2),
                Some('~') => (Tok::Match, 2),
                _ => return Err(err("unexpected `=`; equality is `==`".into(), start)),
            },
            '!' => match next {
                Some('=') => (Tok::Ne, 2),
                Some('~') => (Tok::NotMatch, 2),
                _ => (Tok::Bang, 1),
            },
            '<' => match next {
                Some('=') => (Tok::Le, 2),
                _ => (Tok::Lt, 1),
            },
            '>' => match next {
                Some('=') => (Tok::Ge, 2),
                _ => (Tok::Gt, 1),
            },
            '&' => match next {
                Some('&') => (Tok::AndAnd, 2),
                _ => return Err(err("unexpected `&`; logical and is `&&` or `and`".into(), start)),
            },
            '|' => match next {
                Some('|') => (Tok::OrOr, 2),
                _ => return Err(err("unexpected `|`; logical or is `||` or `or`".into(), start)),
            },
            '/' => {
                let mut j = i + 1;
                while j < chars.len() && !ends_path(chars[j]) {
                    j += 1;
                }
                (Tok::Path(chars[i..j].iter().collect()), j - i)
            }
            '"' | '\'' => {
                let (s, j) = lex_string(&chars, i, src)?;
                (Tok::Str(s), j - i)
            }
            c if c.is_ascii_digit() || (c == '-' && next.is_some_and(|d| d.is_ascii_digit())) => {
                let (t, j) = lex_number(&chars, i, src)?;
                (t, j - i)
            }
            c if c.is_alphabetic() || c == '_' => {
                let mut j = i + 1;
                while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
                    j += 1;
                }
                (Tok::Ident(chars[i..j].iter().collect()), j - i)
            }
            c => {
                return Err(err(format!("unexpected character `{c}`"), start));
            }
        };
        i += len;
        out.push(Token { tok, start, bytes: offsets[start]..offsets[i] });
    }
    let n = chars.len();
    out.push(Token { tok: Tok::Eof, start: n, bytes: src.len()..src.len() });
    Ok(out)
}

fn lex_string(chars: &[char], start: usize, src: &str) -> Result<(String, usize), ExprError> {
    let quote = chars[start];
    let mut s = String::new();
    let mut j = start + 1;
    loop {
        match chars.get(j) {
            None => return Err(ExprError::new("unterminated string".into(), start, src)),
            Some(&c) if c == quote => return Ok((s, j + 1)),
            Some('\\') => {
                let escaped = match chars.get(j + 1) {
                    Some('"') => '"',
                    Some('\'') => '\'',
                    Some('\\') => '\\',
                    Some('n') => '\n',
                    Some('t') => '\t',
                    Some('r') => '\r',
                    // Any other escape stays as written, so that regular expressions
                    // like "\d+" need no doubled backslashes.
                    Some(&other) => {
                        s.push('\\');
                        other
                    }
                    None => return Err(ExprError::new("unterminated string".into(), start, src)),
                };
                s.push(escaped);
                j += 2;
            }
            Some(&c) => {
                s.push(c);
                j += 1;
            }
        }
    }
}

fn lex_number(chars: &[char], start: usize, src: &str) -> Result<(Tok, usize), ExprError> {
    let mut j = start;
    if chars[j] == '-' {
        j += 1;
    }
    let digits = |mut k: usize| {
        while k < chars.len() && chars[k].is_ascii_digit() {
            k += 1;
        }
        k
    };
    j = digits(j);
    let mut float = false;
    if chars.get(j) == Some(&'.') && chars.get(j + 1).is_some_and(|c| c.is_ascii_digit()) {
        float = true;
        j = digits(j + 1);
    }
    if matches!(chars.get(j), Some('e' | 'E')) {
        let mut k = j + 1;
        if matches!(chars.get(k), Some('+' | '-')) {
            k += 1;
        }
        if chars.get(k).is_some_and(|c| c.is_ascii_digit()) {
            float = true;
            j = digits(k);
        }
    }
    if chars.get(j).is_some_and(|c| c.is_alphanumeric() || *c == '_' || *c == '.') {
        return Err(ExprError::new("invalid number".into(), start, src));
    }
    let text: String = chars[start..j].iter().collect();
    let tok = if float {
        match text.parse::<f64>() {
            Ok(f) if f.is_finite() => Tok::Float(f),
            _ => return Err(ExprError::new("number out of range".into(), start, src)),
        }
    } else {
        match text.parse::<i64>() {
            Ok(i) => Tok::Int(i),
            Err(_) => {
                return Err(ExprError::new("integer out of range (64-bit signed)".into(), start, src));
            }
        }
    };
    Ok((tok, j))
}
