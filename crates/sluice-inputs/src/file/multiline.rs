//! Joining several lines into one event (stack traces, pretty-printed records).
//!
//! Two ways to say where an event starts:
//! - `start_pattern`: a line matching it begins a new event; other lines belong to the one
//!   before (a Java log line starts with a date, its stack trace lines do not);
//! - `continuation_pattern`: a line matching it belongs to the event before; other lines begin
//!   a new one (`^\s+at ` and `^Caused by:` for Java traces).
//!
//! `negate` inverts the match. An event is handed out when the next one starts, when it reaches
//! `max_lines` (the next line then starts a new event: nothing is dropped; the event is tagged
//! `_multiline_max_lines`), or when no line arrived for `timeout`. Lines are joined with `\n`.
//! Each event carries the offsets of its first line's start and its last line's end, so a
//! cursor committed after it never splits an event.

use std::time::{Duration, Instant};

use regex::Regex;

pub(crate) const TAG_MAX_LINES: &str = "_multiline_max_lines";

#[derive(Debug, Clone)]
pub(crate) enum Rule {
    Start(Regex),
    Continuation(Regex),
}

#[derive(Debug, Clone)]
pub(crate) struct Multiline {
    pub rule: Rule,
    pub negate: bool,
    pub max_lines: usize,
    pub timeout: Duration,
    /// Bytes an event may hold; more lines are cut like an over-long line.
    pub max_bytes: usize,
}

/// One finished event.
#[derive(Debug, PartialEq)]
pub(crate) struct Joined {
    pub text: String,
    pub start: u64,
    pub end: u64,
    pub truncated: bool,
    pub max_lines: bool,
}

/// The event being assembled for one file.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    text: String,
    lines: usize,
    start: u64,
    end: u64,
    truncated: bool,
    last_line: Option<Instant>,
}

impl Multiline {
    fn continues(&self, line: &str) -> bool {
        match &self.rule {
            Rule::Start(re) => re.is_match(line) == self.negate,
            Rule::Continuation(re) => re.is_match(line) != self.negate,
        }
    }

    /// Adds a line; a finished event, if this line closed one, goes to `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push(
        &self,
        p: &mut Pending,
        line: &str,
        start: u64,
        end: u64,
        truncated: bool,
        now: Instant,
        out: &mut impl FnMut(Joined),
    ) {
        if p.lines > 0 && (!self.continues(line) || p.lines >= self.max_lines) {
            let hit_max = p.lines >= self.max_lines && self.continues(line);
            out(take(p, hit_max));
        }
        if p.lines == 0 {
            p.start = start;
        } else if p.text.len() < self.max_bytes {
            p.text.push('\n');
        }
        let room = self.max_bytes.saturating_sub(p.text.len());
        if line.len() > room {
            let mut cut = room;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            p.text.push_str(&line[..cut]);
            p.truncated = true;
        } else {
            p.text.push_str(line);
        }
        p.truncated |= truncated;
        p.lines += 1;
        p.end = end;
        p.last_line = Some(now);
    }

    /// Hands out the pending event if no line came for `timeout`.
    pub(crate) fn flush_idle(&self, p: &mut Pending, now: Instant) -> Option<Joined> {
        match p.last_line {
            Some(t) if p.lines > 0 && now.duration_since(t) >= self.timeout => Some(take(p, false)),
            _ => None,
        }
    }

    /// Hands out whatever is pending (end of a file that is being let go).
    pub(crate) fn flush(&self, p: &mut Pending) -> Option<Joined> {
        (p.lines > 0).then(|| take(p, false))
    }
}

impl Pending {
    pub(crate) fn is_empty(&self) -> bool {
        self.lines == 0
    }

    /// Forgets what is pending (the file was truncated under it).
    pub(crate) fn clear(&mut self) {
        *self = Pending::default();
    }
}

fn take(p: &mut Pending, max_lines: bool) -> Joined {
    let joined =
        Joined { text: std::mem::take(&mut p.text), start: p.start, end: p.end, truncated: p.truncated, max_lines };
    p.lines = 0;
    p.truncated = false;
    p.last_line = None;
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(m: &Multiline, lines: &[&str]) -> Vec<String> {
        let mut p = Pending::default();
        let mut out = Vec::new();
        let now = Instant::now();
        let mut off = 0;
        for l in lines {
            let end = off + l.len() as u64 + 1;
            m.push(&mut p, l, off, end, false, now, &mut |j| out.push(j.text));
            off = end;
        }
        if let Some(j) = m.flush(&mut p) {
            out.push(j.text);
        }
        out
    }

    fn java(rule: Rule, negate: bool) -> Multiline {
        Multiline { rule, negate, max_lines: 500, timeout: Duration::from_secs(1), max_bytes: 1 << 20 }
    }

    const TRACE: &[&str] = &[
        "2024-01-01 10:00:00 ERROR boom",
        "java.lang.IllegalStateException: bad",
        "\tat a.b.C.d(C.java:10)",
        "\tat a.b.C.e(C.java:20)",
        "Caused by: java.io.IOException: disk",
        "\t... 3 more",
        "2024-01-01 10:00:01 INFO fine",
    ];

    #[test]
    fn java_stack_trace_by_start_pattern() {
        let m = java(Rule::Start(Regex::new(r"^\d{4}-\d{2}-\d{2} ").unwrap()), false);
        let out = run(&m, TRACE);
        assert_eq!(out.len(), 2);
        assert!(out[0].starts_with("2024-01-01 10:00:00 ERROR boom\njava.lang"));
        assert!(out[0].ends_with("\t... 3 more"));
        assert_eq!(out[1], "2024-01-01 10:00:01 INFO fine");
    }

    #[test]
    fn continuation_pattern_and_negate() {
        let m = java(Rule::Continuation(Regex::new(r"^\d{4}-").unwrap()), true);
        assert_eq!(run(&m, TRACE).len(), 2);
        let m = java(Rule::Continuation(Regex::new(r"^(\s+at |\s+\.\.\. |Caused by:)").unwrap()), false);
        let out = run(&m, TRACE);
        assert_eq!(out.len(), 3, "{out:?}"); // the exception line starts an event of its own
    }

    #[test]
    fn max_lines_starts_a_new_event_and_loses_nothing() {
        let mut m = java(Rule::Continuation(Regex::new(r"^\s").unwrap()), false);
        m.max_lines = 2;
        let out = run(&m, &["a", " 1", " 2", " 3", "b"]);
        assert_eq!(out, ["a\n 1", " 2\n 3", "b"]);
    }

    #[test]
    fn idle_timeout_flushes() {
        let m = java(Rule::Continuation(Regex::new(r"^\s").unwrap()), false);
        let mut p = Pending::default();
        let t0 = Instant::now();
        m.push(&mut p, "a", 0, 2, false, t0, &mut |_| panic!("nothing yet"));
        assert!(m.flush_idle(&mut p, t0).is_none());
        let j = m.flush_idle(&mut p, t0 + Duration::from_secs(2)).unwrap();
        assert_eq!((j.text.as_str(), j.start, j.end), ("a", 0, 2));
        assert!(p.is_empty());
    }
}
