//! Templates: text with `%{/field}` and `%{+date}` parts, parsed once.

use chrono::format::{Item, StrftimeItems};
use sluice_core::event::TIMESTAMP;
use sluice_core::value::{now_nanos, timestamp_to_datetime};
use sluice_core::{Event, FieldPath, Value};

use crate::ExprError;

/// A parsed template such as `/var/log/out-%{/service}-%{+%Y-%m-%d}.log`.
#[derive(Clone, Debug)]
pub struct Template {
    parts: Vec<Part>,
    source: String,
}

#[derive(Clone, Debug)]
enum Part {
    Literal(String),
    Field(FieldPath),
    Date(DateFormat),
}

#[derive(Clone, Debug)]
struct DateFormat {
    /// The strftime items, parsed and validated once.
    items: Vec<Item<'static>>,
    /// The format names the time zone (`%z`, `%Z`, `%+`...). Otherwise rendering goes through
    /// the naive UTC time, which spares chrono's formatting an allocation for the zone name.
    needs_offset: bool,
}

impl Template {
    pub fn parse(src: &str) -> Result<Template, ExprError> {
        let chars: Vec<char> = src.chars().collect();
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut i = 0;
        while i < chars.len() {
            if chars[i] != '%' || chars.get(i + 1) != Some(&'{') {
                lit.push(chars[i]);
                i += 1;
                continue;
            }
            let open = i;
            let body_start = i + 2;
            let Some(len) = chars[body_start..].iter().position(|&c| c == '}') else {
                return Err(ExprError::new("unterminated `%{` (missing `}`)".into(), open, src));
            };
            let body: String = chars[body_start..body_start + len].iter().collect();
            let part = if let Some(fmt) = body.strip_prefix('+') {
                Part::Date(DateFormat::parse(fmt, body_start + 1, src)?)
            } else {
                let text = body.trim();
                if text.is_empty() {
                    return Err(ExprError::new(
                        "empty `%{}`: write a field like %{/host} or a date like %{+%Y-%m-%d}".into(),
                        open,
                        src,
                    ));
                }
                let path = FieldPath::parse(text)
                    .map_err(|e| ExprError::new(format!("invalid path `{text}`: {}", e.reason), body_start, src))?;
                Part::Field(path)
            };
            if !lit.is_empty() {
                parts.push(Part::Literal(std::mem::take(&mut lit)));
            }
            parts.push(part);
            i = body_start + len + 1;
        }
        if !lit.is_empty() {
            parts.push(Part::Literal(lit));
        }
        Ok(Template { parts, source: src.to_string() })
    }

    /// Appends the rendered template to `out`. A missing field renders as nothing.
    pub fn render(&self, event: &Event, out: &mut String) {
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Field(p) => {
                    if let Some(v) = event.get(p) {
                        v.write_text(out);
                    }
                }
                Part::Date(d) => d.render(event, out),
            }
        }
    }

    pub fn render_string(&self, event: &Event) -> String {
        let mut out = String::with_capacity(self.source.len() + 16);
        self.render(event, &mut out);
        out
    }

    /// Renders a template consisting of exactly one field reference as that field's value
    /// (keeps its type; a missing field gives `Value::Null`); otherwise a string Value.
    pub fn render_value(&self, event: &Event) -> Value {
        match self.parts.as_slice() {
            [Part::Field(p)] => event.get(p).cloned().unwrap_or(Value::Null),
            [Part::Literal(s)] => Value::from(s.as_str()),
            [] => Value::from(""),
            _ => Value::from(self.render_string(event)),
        }
    }

    /// True when the template has no `%{...}` parts: it renders the same for every event.
    pub fn is_constant(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Literal(_)))
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The literal text before the first `%{...}` part: the whole template when it is constant,
    /// empty when it begins with a part. What no event can change (the file output confines
    /// rendered paths to the directory this names).
    pub fn literal_prefix(&self) -> &str {
        match self.parts.first() {
            Some(Part::Literal(s)) => s,
            _ => "",
        }
    }

    /// The first field the template names that `event` does not have; it renders as nothing.
    pub fn missing_field(&self, event: &Event) -> Option<&FieldPath> {
        self.parts.iter().find_map(|part| match part {
            Part::Field(p) if event.get(p).is_none() => Some(p),
            _ => None,
        })
    }

    /// True when the template has date parts (%{+...}) — the file output uses this.
    pub fn has_date_parts(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Date(_)))
    }
}

impl DateFormat {
    /// `fmt` starts at char index `at` of `src` (for error columns).
    fn parse(fmt: &str, at: usize, src: &str) -> Result<DateFormat, ExprError> {
        if fmt.is_empty() {
            return Err(ExprError::new(
                "empty date format after `%{+`, like %{+%Y-%m-%d} or %{+YYYY.MM.dd}".into(),
                at,
                src,
            ));
        }
        let strftime = if fmt.contains('%') {
            fmt.to_string()
        } else {
            crate::joda::joda_to_strftime(fmt).map_err(|e| ExprError::new(e.message, at + e.at, src))?
        };
        let items = StrftimeItems::new(&strftime)
            .parse_to_owned()
            .map_err(|_| ExprError::new(format!("invalid strftime date format `{fmt}`"), at, src))?;
        // Find out now, not at render time, whether the format can be written, and whether it
        // needs the offset (formatting a naive time fails on zone items).
        let epoch = timestamp_to_datetime(0);
        let mut probe = String::new();
        let needs_offset = epoch.naive_utc().format_with_items(items.iter()).write_to(&mut probe).is_err();
        if needs_offset && epoch.format_with_items(items.iter()).write_to(&mut probe).is_err() {
            return Err(ExprError::new(format!("date format `{fmt}` cannot be rendered"), at, src));
        }
        Ok(DateFormat { items, needs_offset })
    }

    fn render(&self, event: &Event, out: &mut String) {
        let ns = match event.fields.get(TIMESTAMP) {
            Some(Value::Timestamp(ns)) => *ns,
            Some(Value::String(s)) => chrono::DateTime::parse_from_rfc3339(s)
                .ok()
                .and_then(|d| d.timestamp_nanos_opt())
                .unwrap_or_else(now_nanos),
            _ => now_nanos(),
        };
        // Formats were checked at parse time; a failure here could only truncate the part.
        let dt = timestamp_to_datetime(ns);
        let _ = if self.needs_offset {
            dt.format_with_items(self.items.iter()).write_to(out)
        } else {
            dt.naive_utc().format_with_items(self.items.iter()).write_to(out)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev() -> Event {
        let mut e = match Value::from_json_slice(
            br#"{"host":"web-1","service":"api","status":503,"ratio":1.5,"ok":true,
                "user":{"name":"ann","roles":["a","b"]},"nothing":null}"#,
        )
        .unwrap()
        {
            Value::Object(m) => Event::new(m),
            _ => unreachable!(),
        };
        // 2023-11-14T22:13:20.123Z
        e.set_timestamp_nanos(1_700_000_000_123_000_000);
        e
    }

    fn render(src: &str) -> String {
        Template::parse(src).unwrap_or_else(|e| panic!("{e}")).render_string(&ev())
    }

    fn err(src: &str) -> ExprError {
        match Template::parse(src) {
            Ok(t) => panic!("`{src}` parsed: {t:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn fields() {
        assert_eq!(render("hello %{/user/name}"), "hello ann");
        assert_eq!(render("%{/host}-%{/service}"), "web-1-api");
        assert_eq!(render("%{host}"), "web-1");
        assert_eq!(render("%{user/name}!"), "ann!");
        assert_eq!(render("%{ /host }"), "web-1");
        assert_eq!(render("%{/user/roles/1}"), "b");
    }

    #[test]
    fn value_types_render_as_text() {
        assert_eq!(render("s=%{/status} r=%{/ratio} ok=%{/ok} n=%{/nothing}"), "s=503 r=1.5 ok=true n=");
        assert_eq!(render("%{/user/roles}"), r#"["a","b"]"#);
        assert_eq!(render("%{/user}"), r#"{"name":"ann","roles":["a","b"]}"#);
        assert_eq!(render("%{/@timestamp}"), "2023-11-14T22:13:20.123Z");
    }

    #[test]
    fn missing_fields_render_empty() {
        assert_eq!(render("a%{/missing}b"), "ab");
        assert_eq!(render("%{/user/missing/x}"), "");
    }

    #[test]
    fn literal_prefix_and_missing_field() {
        let t = |src: &str| Template::parse(src).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t("/var/log/%{/host}/x.log").literal_prefix(), "/var/log/");
        assert_eq!(t("out/app.log").literal_prefix(), "out/app.log");
        assert_eq!(t("%{/dir}/x.log").literal_prefix(), "");
        assert_eq!(t("%{+%Y}/x.log").literal_prefix(), "");
        let e = ev();
        assert_eq!(t("out/%{/host}-%{/service}.log").missing_field(&e), None);
        assert_eq!(
            t("out/%{/host}-%{/nope}-%{/gone}.log").missing_field(&e).map(|p| p.to_string()),
            Some("/nope".into())
        );
        // A field that is present but null renders as nothing too, yet it is not missing.
        assert_eq!(t("%{/nothing}").missing_field(&e), None);
        assert_eq!(t("plain").missing_field(&e), None);
    }

    #[test]
    fn literal_percent_and_braces() {
        assert_eq!(render("100% sure"), "100% sure");
        assert_eq!(render("%"), "%");
        assert_eq!(render("{x} %d }"), "{x} %d }");
        // `%%{` is not an escape: the second `%` still opens a reference.
        assert_eq!(render("%%{/host}"), "%web-1");
    }

    #[test]
    fn strftime_dates() {
        assert_eq!(render("%{+%Y-%m-%d}"), "2023-11-14");
        assert_eq!(render("x-%{+%Y.%m.%dT%H:%M:%S%.3f}"), "x-2023.11.14T22:13:20.123");
        assert_eq!(render("%{+%s}"), "1700000000");
        assert_eq!(render("%{+%Y %Z %z %:z}"), "2023 UTC +0000 +00:00");
        assert_eq!(render("%{+%+}"), "2023-11-14T22:13:20.123+00:00");
    }

    #[test]
    fn joda_dates() {
        assert_eq!(render("%{+YYYY.MM.dd}"), "2023.11.14");
        assert_eq!(render("%{+yyyy-MM-dd'T'HH}"), "2023-11-14T22");
        assert_eq!(render("%{+yy/MM/dd HH:mm:ss.SSS}"), "23/11/14 22:13:20.123");
        assert_eq!(render("%{+'it''s' yyyy}"), "it's 2023");
        assert_eq!(render("%{+HH''mm}"), "22'13");
    }

    #[test]
    fn date_sources() {
        let t = Template::parse("%{+YYYY}").unwrap();
        let mut e = Event::default();
        let year = chrono::Utc::now().format("%Y").to_string();
        assert_eq!(t.render_string(&e), year, "missing @timestamp means now");
        e.fields.insert(TIMESTAMP, Value::from("2001-02-03T04:05:06Z"));
        assert_eq!(t.render_string(&e), "2001");
    }

    #[test]
    fn file_output_path() {
        let t = Template::parse("/var/log/out-%{/service}-%{+%Y-%m-%d}.log").unwrap();
        assert!(t.has_date_parts());
        assert!(!t.is_constant());
        assert_eq!(t.render_string(&ev()), "/var/log/out-api-2023-11-14.log");
        let mut out = String::from(">");
        t.render(&ev(), &mut out);
        assert_eq!(out, ">/var/log/out-api-2023-11-14.log");
    }

    #[test]
    fn constant_and_flags() {
        let t = Template::parse("plain text").unwrap();
        assert!(t.is_constant());
        assert!(!t.has_date_parts());
        assert_eq!(t.source(), "plain text");
        assert_eq!(t.render_value(&ev()), Value::from("plain text"));
        assert!(Template::parse("").unwrap().is_constant());
        assert_eq!(Template::parse("").unwrap().render_value(&ev()), Value::from(""));
        let f = Template::parse("%{/host}").unwrap();
        assert!(!f.is_constant() && !f.has_date_parts());
    }

    #[test]
    fn render_value_keeps_types() {
        let v = |s: &str| Template::parse(s).unwrap().render_value(&ev());
        assert_eq!(v("%{/status}"), Value::Int(503));
        assert_eq!(v("%{/ratio}"), Value::Float(1.5));
        assert_eq!(v("%{/user/roles}"), Value::Array(vec![Value::from("a"), Value::from("b")]));
        assert_eq!(v("%{/missing}"), Value::Null);
        assert_eq!(v("%{/status}!"), Value::from("503!"));
        assert_eq!(v("%{+YYYY}"), Value::from("2023"));
    }

    fn assert_err(src: &str, column: usize, needle: &str) {
        let e = err(src);
        assert_eq!(e.column, column, "{src}: {e}");
        assert!(e.message.contains(needle), "{src}: {e}");
    }

    #[test]
    fn error_columns() {
        assert_err("abc %{/host", 5, "unterminated `%{`");
        assert_err("%{", 1, "unterminated");
        assert_err("ab%{}", 3, "empty");
        assert_err("ab%{  }", 3, "empty");
        assert_err("x%{/a//b}", 4, "invalid path");
        assert_err("x%{/a~2}", 4, "invalid path");
        assert_err("%{+}", 4, "empty date format");
        assert_err("%{+YYYY.MM.dd Q}", 15, "unsupported date pattern `Q`");
        assert_err("%{+YYYY zzz}", 9, "time zone names are not supported");
        assert_err("ab%{+yyyy'T}", 10, "unterminated quoted text");
        assert_err("é%{+%Y-%}", 5, "invalid strftime");
        assert_err("%{+%Q}", 4, "invalid strftime");
        assert_eq!(err("abc %{/host").to_string(), "unterminated `%{` (missing `}`) at column 5 in `abc %{/host`");
    }

    #[test]
    fn template_is_send_sync_clone() {
        fn assert_traits<T: Clone + std::fmt::Debug + Send + Sync>() {}
        assert_traits::<Template>();
    }

    #[test]
    fn garbled_input_never_panics() {
        const PIECES: &[&str] = &[
            "%", "{", "}", "%{", "%{/", "%{+", "/", "a", "~", "~1", "+", "%Y", "%", "YYYY", "MM", "'", "''", "S",
            "SSS", "é", "💥", " ", "\\", "%.3f", "%:z", "%-", "Q",
        ];
        let mut rng = sluice_testkit::Rng::from_env();
        let mut next = move || rng.next_u64();
        let e = ev();
        for _ in 0..3000 {
            let n = (next() % 10) as usize;
            let mut s = String::new();
            for _ in 0..n {
                s.push_str(PIECES[(next() % PIECES.len() as u64) as usize]);
            }
            match Template::parse(&s) {
                Ok(t) => {
                    t.render_string(&e);
                    t.render_value(&e);
                }
                Err(err) => {
                    assert!(err.column >= 1 && err.column <= s.chars().count() + 1, "{s:?}: {err}");
                }
            }
        }
    }
}
