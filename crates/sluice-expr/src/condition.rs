//! Conditions: parsed once into a tree, evaluated against events without allocating.

use std::cmp::Ordering;

use regex::Regex;
use sluice_core::{Event, FieldPath, Value};

use crate::ExprError;
use crate::lexer::{Tok, Token, tokenize};

/// A parsed condition such as `/status >= 500 and /level == "error"`.
///
/// See the crate documentation for the language. Parsing validates everything (paths,
/// regular expressions, function names); [`Condition::eval`] cannot fail.
#[derive(Clone, Debug)]
pub struct Condition {
    expr: Expr,
    source: String,
}

impl Condition {
    pub fn parse(src: &str) -> Result<Condition, ExprError> {
        let tokens = tokenize(src)?;
        let mut p = Parser { tokens, pos: 0, src, depth: 0 };
        let expr = p.or_expr()?;
        let t = p.peek();
        if t.tok != Tok::Eof {
            let msg = if t.tok == Tok::RParen {
                "unexpected `)` without a matching `(`".to_string()
            } else {
                format!("unexpected `{}` after a complete condition", p.text(t))
            };
            return Err(p.err_at(msg, t.start));
        }
        Ok(Condition { expr, source: src.to_string() })
    }

    /// True when the event matches. Missing fields never raise: see the crate docs.
    pub fn eval(&self, event: &Event) -> bool {
        self.expr.eval(event)
    }

    pub fn source(&self) -> &str {
        &self.source
    }
}

#[derive(Clone, Debug)]
enum Expr {
    Const(bool),
    Truthy(FieldPath),
    Not(Box<Expr>),
    /// Flat lists rather than nested pairs: a long chain never makes a deep tree.
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Call(Func, FieldPath),
    Compare(Operand, CmpOp, Operand),
    Regex {
        left: Operand,
        re: Regex,
        negate: bool,
    },
    In {
        needle: Operand,
        haystack: Haystack,
        negate: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// The function table. A function takes one field path and answers a boolean; add a variant
/// here, a row in [`FUNCTIONS`] and an arm in [`Func::call`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Func {
    Exists,
}

const FUNCTIONS: &[(&str, Func)] = &[("exists", Func::Exists)];

impl Func {
    fn lookup(name: &str) -> Option<Func> {
        FUNCTIONS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }

    fn call(self, event: &Event, path: &FieldPath) -> bool {
        match self {
            Func::Exists => event.get(path).is_some(),
        }
    }
}

#[derive(Clone, Debug)]
enum Operand {
    Path(FieldPath),
    Lit(Literal),
}

#[derive(Clone, Debug)]
struct Literal {
    value: Value,
    /// For a string literal that is an RFC 3339 date: its instant, to compare with timestamps.
    ts: Option<i64>,
}

impl Literal {
    fn new(value: Value) -> Literal {
        let ts = value
            .as_str()
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
            .and_then(|d| d.timestamp_nanos_opt());
        Literal { value, ts }
    }
}

#[derive(Clone, Debug)]
enum Haystack {
    List(Vec<Literal>),
    Operand(Operand),
}

/// A resolved operand: the value, and the timestamp a string literal stands for, if any.
#[derive(Clone, Copy)]
struct View<'a> {
    v: &'a Value,
    ts: Option<i64>,
}

impl Operand {
    fn resolve<'a>(&'a self, event: &'a Event) -> Option<View<'a>> {
        match self {
            Operand::Path(p) => event.get(p).map(|v| View { v, ts: None }),
            Operand::Lit(l) => Some(View { v: &l.value, ts: l.ts }),
        }
    }
}

impl Expr {
    fn eval(&self, event: &Event) -> bool {
        match self {
            Expr::Const(b) => *b,
            Expr::Truthy(p) => event.get(p).is_some_and(Value::is_truthy),
            Expr::Not(e) => !e.eval(event),
            Expr::And(all) => all.iter().all(|e| e.eval(event)),
            Expr::Or(any) => any.iter().any(|e| e.eval(event)),
            Expr::Call(f, p) => f.call(event, p),
            Expr::Compare(l, op, r) => {
                let (l, r) = (l.resolve(event), r.resolve(event));
                match op {
                    CmpOp::Eq => matches!((l, r), (Some(l), Some(r)) if equal(l, r)),
                    CmpOp::Ne => !matches!((l, r), (Some(l), Some(r)) if equal(l, r)),
                    _ => {
                        let (Some(l), Some(r)) = (l, r) else { return false };
                        let Some(ord) = order(l, r) else { return false };
                        match op {
                            CmpOp::Lt => ord == Ordering::Less,
                            CmpOp::Le => ord != Ordering::Greater,
                            CmpOp::Gt => ord == Ordering::Greater,
                            _ => ord != Ordering::Less,
                        }
                    }
                }
            }
            Expr::Regex { left, re, negate } => match left.resolve(event).and_then(|v| v.v.as_str()) {
                Some(s) => re.is_match(s) != *negate,
                None => *negate,
            },
            Expr::In { needle, haystack, negate } => {
                let found = needle.resolve(event).is_some_and(|n| match haystack {
                    Haystack::List(items) => items.iter().any(|l| equal(n, View { v: &l.value, ts: l.ts })),
                    Haystack::Operand(op) => op.resolve(event).is_some_and(|h| member(n, h)),
                });
                found != *negate
            }
        }
    }
}

/// `==`: numbers across Int and Float, timestamps with RFC 3339 string literals, otherwise
/// same type and same value.
fn equal(a: View, b: View) -> bool {
    match (a.v, b.v) {
        (Value::Int(x), Value::Int(y)) => x == y,
        (Value::Int(_) | Value::Float(_), Value::Int(_) | Value::Float(_)) => a.v.as_f64() == b.v.as_f64(),
        (Value::Timestamp(t), Value::String(_)) => b.ts == Some(*t),
        (Value::String(_), Value::Timestamp(t)) => a.ts == Some(*t),
        (x, y) => x == y,
    }
}

/// Ordering for `<`, `<=`, `>`, `>=`: numbers, strings (bytewise) and timestamps. `None` for
/// anything else, which makes the comparison false.
fn order(a: View, b: View) -> Option<Ordering> {
    match (a.v, b.v) {
        (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
        (Value::Int(_) | Value::Float(_), Value::Int(_) | Value::Float(_)) => a.v.as_f64()?.partial_cmp(&b.v.as_f64()?),
        (Value::String(x), Value::String(y)) => Some(x.as_str().cmp(y.as_str())),
        (Value::Timestamp(x), Value::Timestamp(y)) => Some(x.cmp(y)),
        (Value::Timestamp(x), Value::String(_)) => Some(x.cmp(&b.ts?)),
        (Value::String(_), Value::Timestamp(y)) => Some(a.ts?.cmp(y)),
        _ => None,
    }
}

/// `needle in haystack`: an equal element of an array, or a substring of a string.
fn member(needle: View, haystack: View) -> bool {
    match (needle.v, haystack.v) {
        (_, Value::Array(items)) => items.iter().any(|v| equal(needle, View { v, ts: None })),
        (Value::String(n), Value::String(h)) => h.contains(n.as_str()),
        _ => false,
    }
}

/// Nesting deeper than this is refused, so that hostile input cannot overflow the stack.
const MAX_DEPTH: usize = 64;

struct Parser<'s> {
    tokens: Vec<Token>,
    pos: usize,
    src: &'s str,
    depth: usize,
}

impl<'s> Parser<'s> {
    fn peek(&self) -> &Token {
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }

    fn peek_at(&self, n: usize) -> &Token {
        &self.tokens[(self.pos + n).min(self.tokens.len() - 1)]
    }

    fn bump(&mut self) -> Token {
        let t = self.peek().clone();
        if t.tok != Tok::Eof {
            self.pos += 1;
        }
        t
    }

    fn text(&self, t: &Token) -> String {
        if t.tok == Tok::Eof {
            return "end of input".to_string();
        }
        self.src[t.bytes.clone()].to_string()
    }

    fn err_at(&self, message: String, at: usize) -> ExprError {
        ExprError::new(message, at, self.src)
    }

    fn is_word(&self, t: &Token, word: &str) -> bool {
        matches!(&t.tok, Tok::Ident(w) if w == word)
    }

    fn or_expr(&mut self) -> Result<Expr, ExprError> {
        let first = self.and_expr()?;
        let mut any = Vec::new();
        loop {
            let t = self.peek();
            if t.tok != Tok::OrOr && !self.is_word(t, "or") {
                break;
            }
            self.bump();
            any.push(self.and_expr()?);
        }
        if any.is_empty() {
            return Ok(first);
        }
        any.insert(0, first);
        Ok(Expr::Or(any))
    }

    fn and_expr(&mut self) -> Result<Expr, ExprError> {
        let first = self.not_expr()?;
        let mut all = Vec::new();
        loop {
            let t = self.peek();
            if t.tok != Tok::AndAnd && !self.is_word(t, "and") {
                break;
            }
            self.bump();
            all.push(self.not_expr()?);
        }
        if all.is_empty() {
            return Ok(first);
        }
        all.insert(0, first);
        Ok(Expr::And(all))
    }

    fn enter(&mut self, at: usize) -> Result<(), ExprError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err_at(format!("nested more than {MAX_DEPTH} levels deep"), at));
        }
        Ok(())
    }

    /// `not`/`!` negates the comparison (or parenthesized condition) that follows it.
    fn not_expr(&mut self) -> Result<Expr, ExprError> {
        let t = self.peek().clone();
        if t.tok == Tok::Bang || self.is_word(&t, "not") {
            self.bump();
            self.enter(t.start)?;
            let inner = self.not_expr()?;
            self.depth -= 1;
            return Ok(Expr::Not(Box::new(inner)));
        }
        self.comparison()
    }

    fn comparison(&mut self) -> Result<Expr, ExprError> {
        let t = self.peek().clone();
        match &t.tok {
            Tok::LParen => {
                self.bump();
                self.enter(t.start)?;
                let inner = self.or_expr()?;
                self.depth -= 1;
                let close = self.peek().clone();
                if close.tok != Tok::RParen {
                    let msg = if close.tok == Tok::Eof {
                        "unclosed `(`".to_string()
                    } else {
                        format!(
                            "expected `)` to close the `(` at column {}, found `{}`",
                            t.start + 1,
                            self.text(&close)
                        )
                    };
                    let at = if close.tok == Tok::Eof { t.start } else { close.start };
                    return Err(self.err_at(msg, at));
                }
                self.bump();
                return Ok(inner);
            }
            Tok::Ident(name) if self.peek_at(1).tok == Tok::LParen && !is_keyword(name) => {
                return self.call(&t, name);
            }
            _ => {}
        }
        let left = self.operand("expected a condition", &t)?;
        let op_tok = self.peek().clone();
        let op = match &op_tok.tok {
            Tok::Eq => Some(CmpOp::Eq),
            Tok::Ne => Some(CmpOp::Ne),
            Tok::Lt => Some(CmpOp::Lt),
            Tok::Le => Some(CmpOp::Le),
            Tok::Gt => Some(CmpOp::Gt),
            Tok::Ge => Some(CmpOp::Ge),
            _ => None,
        };
        if let Some(op) = op {
            self.bump();
            let right = self.operand_after(&op_tok)?;
            return Ok(Expr::Compare(left, op, right));
        }
        match &op_tok.tok {
            Tok::Match | Tok::NotMatch => {
                self.bump();
                let negate = op_tok.tok == Tok::NotMatch;
                let r = self.peek().clone();
                let Tok::Str(pattern) = &r.tok else {
                    let msg = format!(
                        "expected a quoted regular expression after `{}`, found {}",
                        self.text(&op_tok),
                        self.describe(&r)
                    );
                    return Err(self.err_at(msg, r.start));
                };
                let re = Regex::new(pattern).map_err(|e| {
                    let detail = match e {
                        regex::Error::Syntax(s) => s.lines().last().unwrap_or("").trim().to_string(),
                        regex::Error::CompiledTooBig(n) => format!("compiled regex exceeds {n} bytes"),
                        other => other.to_string(),
                    };
                    self.err_at(format!("invalid regular expression: {detail}"), r.start)
                })?;
                self.bump();
                Ok(Expr::Regex { left, re, negate })
            }
            Tok::Ident(w) if w == "in" => {
                self.bump();
                let haystack = self.haystack(&op_tok)?;
                Ok(Expr::In { needle: left, haystack, negate: false })
            }
            Tok::Ident(w) if w == "not" && self.is_word(self.peek_at(1), "in") => {
                self.bump();
                let in_tok = self.bump();
                let haystack = self.haystack(&in_tok)?;
                Ok(Expr::In { needle: left, haystack, negate: true })
            }
            _ => match left {
                Operand::Path(p) => Ok(Expr::Truthy(p)),
                Operand::Lit(l) => Ok(Expr::Const(l.value.is_truthy())),
            },
        }
    }

    fn describe(&self, t: &Token) -> String {
        if t.tok == Tok::Eof { "end of input".to_string() } else { format!("`{}`", self.text(t)) }
    }

    fn call(&mut self, name_tok: &Token, name: &str) -> Result<Expr, ExprError> {
        let Some(func) = Func::lookup(name) else {
            let known: Vec<&str> = FUNCTIONS.iter().map(|(n, _)| *n).collect();
            let msg = format!("unknown function `{name}` (known: {})", known.join(", "));
            return Err(self.err_at(msg, name_tok.start));
        };
        self.bump();
        let open = self.bump();
        let arg = self.peek().clone();
        let Tok::Path(p) = &arg.tok else {
            let msg = format!("`{name}` takes a field path like /user/id, found {}", self.describe(&arg));
            return Err(self.err_at(msg, arg.start));
        };
        let path = self.path(p, arg.start)?;
        self.bump();
        let close = self.peek().clone();
        if close.tok != Tok::RParen {
            let msg = if close.tok == Tok::Eof {
                "unclosed `(`".to_string()
            } else {
                format!("`{name}` takes one argument; expected `)`, found {}", self.describe(&close))
            };
            let at = if close.tok == Tok::Eof { open.start } else { close.start };
            return Err(self.err_at(msg, at));
        }
        self.bump();
        Ok(Expr::Call(func, path))
    }

    fn path(&self, text: &str, at: usize) -> Result<FieldPath, ExprError> {
        FieldPath::parse(text).map_err(|e| self.err_at(format!("invalid path `{text}`: {}", e.reason), at))
    }

    /// A path or a scalar literal. `what` is the message when there is none.
    fn operand(&mut self, what: &str, t: &Token) -> Result<Operand, ExprError> {
        let lit = match &t.tok {
            Tok::Path(p) => {
                let path = self.path(p, t.start)?;
                self.bump();
                return Ok(Operand::Path(path));
            }
            Tok::Str(s) => Value::from(s.as_str()),
            Tok::Int(i) => Value::Int(*i),
            Tok::Float(f) => Value::Float(*f),
            Tok::Ident(w) if w == "true" => Value::Bool(true),
            Tok::Ident(w) if w == "false" => Value::Bool(false),
            Tok::Ident(w) if w == "null" => Value::Null,
            Tok::LBracket => {
                let msg = "array literals are only allowed after `in`".to_string();
                return Err(self.err_at(msg, t.start));
            }
            Tok::Ident(w) if !is_keyword(w) => {
                let msg = format!(
                    "unexpected `{w}`: field paths start with `/` and strings are quoted \
                     (or, if this is a function, it needs parentheses)"
                );
                return Err(self.err_at(msg, t.start));
            }
            _ => {
                let msg = format!("{what}, found {}", self.describe(t));
                return Err(self.err_at(msg, t.start));
            }
        };
        self.bump();
        Ok(Operand::Lit(Literal::new(lit)))
    }

    fn operand_after(&mut self, op: &Token) -> Result<Operand, ExprError> {
        let t = self.peek().clone();
        let what = format!("expected a value after `{}`", self.text(op));
        self.operand(&what, &t)
    }

    fn haystack(&mut self, in_tok: &Token) -> Result<Haystack, ExprError> {
        let t = self.peek().clone();
        if t.tok != Tok::LBracket {
            return Ok(Haystack::Operand(self.operand_after(in_tok)?));
        }
        self.bump();
        let mut items = Vec::new();
        loop {
            let t = self.peek().clone();
            if t.tok == Tok::RBracket {
                self.bump();
                return Ok(Haystack::List(items));
            }
            match self.operand("expected a literal or `]` in the list", &t)? {
                Operand::Lit(l) => items.push(l),
                Operand::Path(_) => {
                    return Err(self.err_at("lists hold literals, not field paths".into(), t.start));
                }
            }
            let sep = self.peek().clone();
            match sep.tok {
                Tok::Comma => {
                    self.bump();
                }
                Tok::RBracket => {}
                _ => {
                    let msg = format!("expected `,` or `]` in the list, found {}", self.describe(&sep));
                    return Err(self.err_at(msg, sep.start));
                }
            }
        }
    }
}

fn is_keyword(w: &str) -> bool {
    matches!(w, "and" | "or" | "not" | "in" | "true" | "false" | "null")
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Map;

    fn event(json: &str) -> Event {
        match Value::from_json_slice(json.as_bytes()).unwrap() {
            Value::Object(m) => Event::new(m),
            _ => panic!("not an object"),
        }
    }

    fn ev() -> Event {
        let mut e = event(
            r#"{"status":503,"level":"error","path":"/api/v1/users","ratio":0.5,"zero":0,
                "empty":"","tags":["a","web","x"],"user":{"id":7,"name":"ann"},
                "a":1,"b":3,"c":3,"ok":true,"nothing":null,"k/e~y":"v"}"#,
        );
        e.set_timestamp_nanos(1_700_000_000_000_000_000); // 2023-11-14T22:13:20Z
        e
    }

    fn check(src: &str) -> bool {
        Condition::parse(src).unwrap_or_else(|e| panic!("{e}")).eval(&ev())
    }

    fn err(src: &str) -> ExprError {
        match Condition::parse(src) {
            Ok(c) => panic!("`{src}` parsed: {c:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn examples_from_the_design() {
        assert!(check(r#"/status >= 500 and /level == "error""#));
        assert!(check("exists(/user/id)"));
        assert!(check(r#"/path =~ "^/api""#));
        assert!(check("not exists(/x)"));
        assert!(check(r#"/level in ["warn", "error"]"#));
        assert!(check("(/a == 1 or /b == 2) and !(/c != 3)"));
        assert!(check(r#""x" in /tags"#));
    }

    #[test]
    fn equality_operators() {
        assert!(check("/status == 503"));
        assert!(!check("/status == 500"));
        assert!(check("/status != 500"));
        assert!(!check("/status != 503"));
        assert!(check("/level == 'error'"));
        assert!(check("/ok == true"));
        assert!(check("/nothing == null"));
        assert!(check("503 == /status"));
        assert!(check("/b == /c"));
        assert!(!check("/a == /b"));
    }

    #[test]
    fn ordering_operators() {
        assert!(check("/status > 500"));
        assert!(!check("/status > 503"));
        assert!(check("/status >= 503"));
        assert!(check("/status < 600"));
        assert!(!check("/status < 503"));
        assert!(check("/status <= 503"));
        assert!(check("/level > 'aaa'"));
        assert!(check("/level < 'f'"));
        assert!(check("'a' < 'b'"));
        assert!(check("/a < /b"));
    }

    #[test]
    fn int_and_float_compare_numerically() {
        assert!(check("/status == 503.0"));
        assert!(check("/ratio < 1"));
        assert!(check("/ratio > 0"));
        assert!(check("/ratio == 0.5"));
        assert!(check("/ratio >= 5e-1"));
        assert!(check("/a <= 1.0"));
        assert!(check("-1 < /zero"));
        assert!(check("/zero > -0.5"));
    }

    #[test]
    fn cross_type_comparisons() {
        assert!(!check("/status == '503'"));
        assert!(check("/status != '503'"));
        assert!(!check("/status > 'a'"));
        assert!(!check("/status < 'a'"));
        assert!(!check("/ok > false"));
        assert!(!check("/nothing == 0"));
        assert!(!check("/tags < 1"));
    }

    #[test]
    fn missing_fields() {
        assert!(!check("/missing == 1"));
        assert!(check("/missing != 1"));
        assert!(!check("/missing == null"));
        assert!(!check("/missing < 1"));
        assert!(!check("/missing >= 1"));
        assert!(!check("/missing"));
        assert!(!check("/missing =~ '.*'"));
        assert!(check("/missing !~ 'x'"));
        assert!(!check("/missing in [1, 2]"));
        assert!(check("/missing not in [1, 2]"));
        assert!(!check("'x' in /missing"));
        assert!(!check("/user/missing/deeper == 1"));
    }

    #[test]
    fn truthiness() {
        assert!(check("/status"));
        assert!(check("/ok"));
        assert!(!check("/zero"));
        assert!(!check("/empty"));
        assert!(!check("/nothing"));
        assert!(check("/tags"));
        assert!(check("!/zero"));
        assert!(check("true"));
        assert!(!check("false"));
        assert!(check("/ok and /status"));
    }

    #[test]
    fn regex_operators() {
        assert!(check(r#"/path =~ "^/api""#));
        assert!(!check(r#"/path =~ "^/web""#));
        assert!(check(r#"/path !~ "^/web""#));
        assert!(!check(r#"/path !~ "users$""#));
        assert!(check(r#"/level =~ "(?i)ERROR""#));
        assert!(check(r#"/path =~ "v\\d""#));
        assert!(check(r#"/path =~ "^/\w+/v\d/""#));
        assert!(check(r#"/path =~ '\.*'"#));
        // Non-strings never match.
        assert!(!check("/status =~ '5'"));
        assert!(check("/status !~ '5'"));
    }

    #[test]
    fn in_both_ways() {
        assert!(check("/level in ['warn', 'error']"));
        assert!(!check("/level in ['warn', 'info']"));
        assert!(check("/level not in ['warn', 'info']"));
        assert!(check("/status in [500, 503]"));
        assert!(check("/status in [503.0]"));
        assert!(!check("/status in []"));
        assert!(check("/a in [true, null, 1,]"));
        assert!(check("'web' in /tags"));
        assert!(!check("'db' in /tags"));
        assert!(check("'db' not in /tags"));
        assert!(check("'api' in /path"));
        assert!(!check("'API' in /path"));
        assert!(!check("1 in /status"));
        assert!(check("/level in 'an error occurred'"));
        assert!(check("not 'db' in /tags"));
    }

    #[test]
    fn nested_and_escaped_paths() {
        assert!(check("/user/id == 7"));
        assert!(check("/user/name == 'ann'"));
        assert!(check("/tags/1 == 'web'"));
        assert!(check("/k~1e~0y == 'v'"));
        assert!(check("exists(/k~1e~0y)"));
        assert!(check("/user/id==7&&/user/name=='ann'"));
    }

    #[test]
    fn boolean_operators_and_precedence() {
        assert!(check("/a == 1 and /b == 3"));
        assert!(!check("/a == 1 and /b == 2"));
        assert!(check("/a == 2 or /b == 3"));
        assert!(!check("/a == 2 || /b == 2"));
        assert!(check("/a == 1 && /b == 3"));
        // and binds tighter than or.
        assert!(check("/a == 1 or /a == 2 and /a == 3"));
        assert!(!check("(/a == 1 or /a == 2) and /a == 3"));
        assert!(check("/a == 3 and /a == 2 or /a == 1"));
        // not binds tighter than and/or, and negates the comparison after it.
        assert!(check("not /a == 2"));
        assert!(!check("! /a == 1"));
        assert!(check("not /a == 2 and /b == 3"));
        assert!(check("not /a == 1 or /b == 3"));
        assert!(!check("not (/a == 1 or /b == 3)"));
        assert!(check("not not /a == 1"));
        assert!(check("!!/a"));
        assert!(check("((((/a == 1))))"));
    }

    #[test]
    fn timestamps() {
        assert!(check("/@timestamp > '2023-01-01T00:00:00Z'"));
        assert!(check("/@timestamp == '2023-11-14T22:13:20Z'"));
        assert!(check("/@timestamp == '2023-11-14T23:13:20+01:00'"));
        assert!(!check("/@timestamp < '2023-01-01T00:00:00Z'"));
        assert!(!check("/@timestamp > 'not a date'"));
        assert!(check("/@timestamp == /@timestamp"));
        assert!(check("'2020-01-01T00:00:00Z' < /@timestamp"));
    }

    #[test]
    fn string_escapes() {
        let mut m = Map::new();
        m.insert("s", Value::from("a\"b'c\\d\ne\tf"));
        let e = Event::new(m);
        assert!(Condition::parse(r#"/s == "a\"b'c\\d\ne\tf""#).unwrap().eval(&e));
        assert!(Condition::parse(r#"/s == 'a"b\'c\\d\ne\tf'"#).unwrap().eval(&e));
        // Other escapes are kept as written (handy for regular expressions).
        let mut m = Map::new();
        m.insert("s", Value::from("a\\qb"));
        assert!(Condition::parse(r"/s == 'a\qb'").unwrap().eval(&Event::new(m)));
    }

    #[test]
    fn source_is_kept() {
        let c = Condition::parse(" /a == 1 ").unwrap();
        assert_eq!(c.source(), " /a == 1 ");
    }

    fn assert_err(src: &str, column: usize, needle: &str) {
        let e = err(src);
        assert_eq!(e.column, column, "{src}: {e}");
        assert!(e.message.contains(needle), "{src}: {e}");
        assert_eq!(e.source, src);
    }

    #[test]
    fn error_columns() {
        assert_err("/status >= and x", 12, "expected a value after `>=`");
        assert_err("/status >=", 11, "expected a value after `>=`");
        assert_err("/a == 'abc", 7, "unterminated string");
        assert_err("/a == \"abc\\", 7, "unterminated string");
        assert_err("exist(/a)", 1, "unknown function `exist`");
        assert_err("/a == 1 and nope(/b)", 13, "unknown function");
        assert_err("exists('a')", 8, "takes a field path");
        assert_err("exists(/a, /b)", 10, "one argument");
        assert_err("exists(/a", 7, "unclosed `(`");
        assert_err("(/a == 1", 1, "unclosed `(`");
        assert_err("(/a == 1 /b", 10, "expected `)`");
        assert_err("/a == 1)", 8, "without a matching `(`");
        assert_err("/a == 1 /b", 9, "unexpected `/b`");
        assert_err("/a == 1 'x'", 9, "after a complete condition");
        assert_err("/a//b == 1", 1, "invalid path");
        assert_err("/a == 1 or / == 2", 12, "invalid path");
        assert_err("/a~2 == 1", 1, "invalid path");
        assert_err(r#"/a =~ "(unclosed""#, 7, "invalid regular expression");
        assert_err("/a =~ 5", 7, "quoted regular expression");
        assert_err("/a =~", 6, "quoted regular expression");
        assert_err("", 1, "expected a condition");
        assert_err("   ", 4, "expected a condition");
        assert_err("and /a", 1, "expected a condition");
        assert_err("/a and", 7, "expected a condition");
        assert_err("/a or or /b", 7, "expected a condition");
        assert_err("not", 4, "expected a condition");
        assert_err("/a = 1", 4, "`==`");
        assert_err("/a & /b", 4, "`&&`");
        assert_err("/a | /b", 4, "`||`");
        assert_err("/a == #", 7, "unexpected character");
        assert_err("/a == level", 7, "field paths start with `/`");
        assert_err("/a == [1]", 7, "only allowed after `in`");
        assert_err("/a in [1, /b]", 11, "not field paths");
        assert_err("/a in [1 2]", 10, "expected `,` or `]`");
        assert_err("/a in [1,", 10, "expected a literal");
        assert_err("/a in", 6, "expected a value after `in`");
        assert_err("/a == 99999999999999999999", 7, "out of range");
        assert_err("/a == 5xx", 7, "invalid number");
        assert_err("/ä == 1 and ü", 13, "unexpected `ü`");
    }

    #[test]
    fn error_display_points_at_column() {
        assert_eq!(
            err("/status >= and x").to_string(),
            "expected a value after `>=`, found `and` at column 12 in `/status >= and x`"
        );
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let deep = format!("{}/a{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(err(&deep).message.contains("nested"));
        let nots = format!("{}/a", "!".repeat(10_000));
        assert!(err(&nots).message.contains("nested"));
        let ok = format!("{}/a == 1{}", "(".repeat(50), ")".repeat(50));
        assert!(check(&ok));
        let long = vec!["/a == 1"; 100_000].join(" and ");
        assert!(check(&long));
    }

    #[test]
    fn condition_is_send_sync_clone() {
        fn assert_traits<T: Clone + std::fmt::Debug + Send + Sync>() {}
        assert_traits::<Condition>();
    }

    /// Feeds garbled input built from the language's own pieces; parsing must never panic, and
    /// whatever parses must evaluate without panicking.
    #[test]
    fn garbled_input_never_panics() {
        const PIECES: &[&str] = &[
            "/", "/a", "/a/b", "~", "~0", "~1", " ", "(", ")", "[", "]", ",", "=", "==", "!=", "!", "<", "<=", ">",
            ">=", "=~", "!~", "&", "&&", "|", "||", "and", "or", "not", "in", "\"", "'", "\\", "\"x\"", "'^a'", "1",
            "-", "-2", "1.5", "1e3", "e", ".", "true", "null", "exists", "exists(", "é", "💥", "\n", "\t", "%{", "}",
            "[1,2]", "(?", "*", "+",
        ];
        let mut rng = sluice_testkit::Rng::from_env();
        let mut next = move || rng.next_u64();
        let e = ev();
        for _ in 0..3000 {
            let n = (next() % 12) as usize;
            let mut s = String::new();
            for _ in 0..n {
                s.push_str(PIECES[(next() % PIECES.len() as u64) as usize]);
            }
            match Condition::parse(&s) {
                Ok(c) => {
                    c.eval(&e);
                }
                Err(err) => {
                    assert!(err.column >= 1 && err.column <= s.chars().count() + 1, "{s:?}: {err}");
                    let _ = err.to_string();
                }
            }
            // Random bytes too, as lossy UTF-8.
            let bytes: Vec<u8> = (0..n * 2).map(|_| (next() % 128) as u8).collect();
            let s = String::from_utf8_lossy(&bytes);
            if let Ok(c) = Condition::parse(&s) {
                c.eval(&e);
            }
        }
    }
}
