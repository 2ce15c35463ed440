//! One syslog message → one event, with `syslog_loose` (Vector's parser) doing the header,
//! after a look for Cisco IOS's own header ([`cisco`]).
//!
//! What it guarantees:
//! - RFC 5424 (`<PRI>1 TIMESTAMP HOST APP PROCID MSGID [SD] MSG`) and RFC 3164/BSD
//!   (`<PRI>Mmm dd hh:mm:ss HOST TAG[PID]: MSG`, with or without the host, with a year or an
//!   RFC 3339 timestamp instead) give the same field names; a field the message does not carry
//!   (or carries as `-`) is left out, never set to null.
//! - A Cisco IOS header (`<PRI>[COUNT: ][HOST: ][SEQ: ][*|.]Mmm dd [yyyy ]hh:mm:ss[.fff][ ZONE]:
//!   %FAC-SEV-MNEMONIC: MSG`) gives `hostname`, `appname` (the tag without its `%`) and an
//!   object `cisco` (facility, severity, mnemonic, sequence, message_count, clock, timezone);
//!   it is tried first, and a message that is not exactly that shape is read as without it.
//! - The text after the header is `/message`, with a leading UTF-8 BOM removed (RFC 5424 §6.4).
//! - `@timestamp` is the message's own time when it has one, else the time it was received.
//!   A time without an offset (or with a Cisco zone name other than UTC/GMT) is read in
//!   `timezone`; a BSD or Cisco time without a year gets the year
//!   that puts it no more than a month in the future (a December message read in January is
//!   last year's, a January message read on 31 December next year's).
//! - A message with a valid `<PRI>` but no header the parsers accept keeps its facility and
//!   severity, and the rest of the text is `/message` (RFC 3164 §4.3.3). Anything else is kept
//!   whole in `/message`, tagged [`TAG_PARSE_FAILURE`] and reported as failed; nothing is
//!   dropped. Invalid UTF-8 is replaced (U+FFFD).

use chrono::{DateTime, Datelike, FixedOffset, LocalResult, NaiveDate, NaiveDateTime, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;
use sluice_core::{Event, Map, Str, Value};
use syslog_loose::{IncompleteDate, Message, ProcId, Protocol, Variant};

use super::cisco;
use crate::codec::{TAG_TRUNCATED, text};

/// The tag of a message that is neither RFC 5424 nor RFC 3164.
pub const TAG_PARSE_FAILURE: &str = "_syslogparsefailure";

/// Field names, as Vector's `syslog` source writes them, plus the numeric codes.
pub(super) const HOSTNAME: &str = "hostname";
pub(super) const APPNAME: &str = "appname";
pub(super) const PROCID: &str = "procid";
pub(super) const MSGID: &str = "msgid";
pub(super) const FACILITY: &str = "facility";
pub(super) const FACILITY_CODE: &str = "facility_code";
pub(super) const SEVERITY: &str = "severity";
pub(super) const SEVERITY_CODE: &str = "severity_code";
pub(super) const VERSION: &str = "version";
pub(super) const STRUCTURED_DATA: &str = "structured_data";
/// A Cisco IOS message's own parts, in an object `cisco`.
pub(super) const CISCO: &str = "cisco";
const CISCO_FACILITY: &str = "facility";
const CISCO_SEVERITY: &str = "severity";
const CISCO_MNEMONIC: &str = "mnemonic";
const CISCO_SEQUENCE: &str = "sequence";
const CISCO_MESSAGE_COUNT: &str = "message_count";
const CISCO_CLOCK: &str = "clock";
const CISCO_TIMEZONE: &str = "timezone";

/// How a message was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Parsed {
    /// RFC 5424 or RFC 3164 (or just a `<PRI>` and text).
    Ok,
    /// Neither: kept whole and tagged.
    Failed,
}

/// Turns messages into events; one per input, shared by its connections.
#[derive(Debug, Clone, Copy)]
pub(super) struct Parser {
    zone: Tz,
}

impl Parser {
    pub(super) fn new(zone: Tz) -> Parser {
        Parser { zone }
    }

    /// The event for one framed message (`truncated` when it was cut to `max_message_bytes`),
    /// received at `received` (ns since the epoch).
    pub(super) fn parse(&self, bytes: &[u8], truncated: bool, received: i64) -> (Event, Parsed) {
        self.parse_with(bytes, truncated, received, None)
    }

    /// As [`Parser::parse`], with the wall-clock time in `timezone` that a year is inferred
    /// from given (for tests).
    #[cfg(test)]
    pub(super) fn parse_at(&self, bytes: &[u8], truncated: bool, received: i64, now: NaiveDateTime) -> (Event, Parsed) {
        self.parse_with(bytes, truncated, received, Some(now))
    }

    fn parse_with(&self, bytes: &[u8], truncated: bool, received: i64, now: Option<NaiveDateTime>) -> (Event, Parsed) {
        let raw = text(bytes);
        let line = raw.trim_start_matches('\u{feff}').trim_end_matches(['\n', '\r', '\0']);
        let (mut event, outcome) = match self.cisco(line, now) {
            Some(event) => (event, Parsed::Ok),
            None => self.loose(&raw, line, received, now),
        };
        if truncated {
            event.add_tag(TAG_TRUNCATED);
        }
        (event, outcome)
    }

    /// The wall-clock time in `timezone` a year is inferred from.
    fn now(&self, now: Option<NaiveDateTime>) -> NaiveDateTime {
        now.unwrap_or_else(|| Utc::now().with_timezone(&self.zone).naive_local())
    }

    /// `line` read as Cisco IOS writes it, when it is that.
    fn cisco(&self, line: &str, now: Option<NaiveDateTime>) -> Option<Event> {
        let (pri, h) = match pri_prefix(line) {
            Pri::Valid(pri, rest) => (Some(pri), cisco::header(rest).or_else(|| cisco::relayed(rest))?),
            Pri::Absent => (None, cisco::header(line).or_else(|| cisco::relayed(line))?),
            Pri::Invalid => return None,
        };
        // The clock is read only for a time without a year.
        let year = match h.year {
            Some(year) => year,
            None => infer_year((h.month, h.day, h.hour, h.minute, h.second), self.now(now)),
        };
        // A date that does not exist (30 February) is not Cisco's: left to the other parsers.
        let local =
            NaiveDate::from_ymd_opt(year, h.month, h.day)?.and_hms_nano_opt(h.hour, h.minute, h.second, h.nanos)?;
        let utc = h.zone.is_some_and(|z| ["UTC", "GMT", "UCT", "Z"].iter().any(|u| u.eq_ignore_ascii_case(z)));
        // Any other zone name is only a label (`clock timezone` takes any word): its time is
        // read in `timezone`, like a time without a zone.
        let at = if utc { local.and_utc().fixed_offset() } else { self.place(local) };
        let mut fields = Map::with_capacity(10);
        fields.push_unchecked(sluice_core::event::MESSAGE, Value::String(Str::from(h.message)));
        fields.push_unchecked(sluice_core::event::TIMESTAMP, Value::Timestamp(at.timestamp_nanos_opt()?));
        if let Some(host) = h.host {
            fields.push_unchecked(HOSTNAME, Value::from(host));
        }
        fields.push_unchecked(APPNAME, Value::from(h.tag));
        if let Some(pri) = pri {
            push_pri(&mut fields, pri);
        }
        let mut c = Map::with_capacity(7);
        c.push_unchecked(CISCO_FACILITY, Value::from(h.facility));
        c.push_unchecked(CISCO_SEVERITY, Value::Int(i64::from(h.severity)));
        c.push_unchecked(CISCO_MNEMONIC, Value::from(h.mnemonic));
        if let Some(n) = h.sequence {
            c.push_unchecked(CISCO_SEQUENCE, Value::Int(n));
        }
        if let Some(n) = h.message_count {
            c.push_unchecked(CISCO_MESSAGE_COUNT, Value::Int(n));
        }
        if let Some(clock) = h.clock {
            c.push_unchecked(CISCO_CLOCK, Value::from(clock.as_str()));
        }
        if let Some(zone) = h.zone {
            c.push_unchecked(CISCO_TIMEZONE, Value::from(zone));
        }
        fields.push_unchecked(CISCO, Value::Object(c));
        Some(Event::new(fields))
    }

    /// `line` read as RFC 5424 or RFC 3164 by `syslog_loose`, or as a `<PRI>` and text, or
    /// kept whole as a failure.
    fn loose(&self, raw: &Str, line: &str, received: i64, now: Option<NaiveDateTime>) -> (Event, Parsed) {
        // The clock is read only for a BSD time without a year.
        let this = *self;
        let get_year = move |date: IncompleteDate| infer_year(date, this.now(now));
        let parsed = match pri_prefix(line) {
            Pri::Invalid => None,
            // Times without an offset are read as UTC here and placed in `timezone` below:
            // syslog_loose places a BSD time with a year in the zone wrongly, and fails on a
            // time that a daylight saving change skips.
            _ => syslog_loose::parse_message_with_year_exact_tz(line, get_year, Some(Utc), Variant::Either).ok(),
        };
        match parsed {
            Some(mut message) => {
                if message.protocol == Protocol::RFC3164 && has_bsd_time(line) {
                    message.timestamp = message.timestamp.map(|t| self.place(t.naive_utc()));
                }
                (event_from(line, &message, received), Parsed::Ok)
            }
            None => match pri_prefix(line) {
                Pri::Valid(pri, rest) => {
                    let mut fields = Map::with_capacity(6);
                    fields
                        .push_unchecked(sluice_core::event::MESSAGE, Value::String(Str::from(strip_bom(rest.trim()))));
                    fields.push_unchecked(sluice_core::event::TIMESTAMP, Value::Timestamp(received));
                    push_pri(&mut fields, pri);
                    (Event::new(fields), Parsed::Ok)
                }
                Pri::Absent | Pri::Invalid => {
                    let message = if line.len() == raw.len() { raw.clone() } else { Str::from(line) };
                    let mut e = Event::from_message_at(message, received);
                    e.add_tag(TAG_PARSE_FAILURE);
                    (e, Parsed::Failed)
                }
            },
        }
    }
}

impl Parser {
    /// A wall-clock time in `timezone`. A time that happens twice (the hour repeated when
    /// daylight saving ends) is the first; one that does not happen (skipped when it starts) is
    /// read with the offset in force before the change.
    fn place(&self, local: NaiveDateTime) -> DateTime<FixedOffset> {
        let fixed = |t: DateTime<Tz>| t.fixed_offset();
        match self.zone.from_local_datetime(&local) {
            LocalResult::Single(t) => fixed(t),
            LocalResult::Ambiguous(a, b) => fixed(a.min(b)),
            LocalResult::None => {
                // An hour later on the wall clock, after the change, is the same instant as
                // `local` read with the offset before it (the gap being the usual hour).
                match self.zone.from_local_datetime(&(local + TimeDelta::hours(1))).earliest() {
                    Some(t) => fixed(t),
                    None => self.zone.from_utc_datetime(&local).fixed_offset(),
                }
            }
        }
    }
}

/// Whether the message's time is a BSD one (`Mmm dd ...`, no offset), not RFC 3339.
fn has_bsd_time(line: &str) -> bool {
    let rest = match pri_prefix(line) {
        Pri::Valid(_, rest) => rest,
        _ => line,
    };
    rest.trim_start().starts_with(|c: char| c.is_ascii_alphabetic())
}

/// A `<PRI>` at the start of a message.
enum Pri<'a> {
    Absent,
    /// `<` followed by anything but 1 to 3 digits and `>`, or a number over 191.
    Invalid,
    /// The number and the text after it.
    Valid(u8, &'a str),
}

fn pri_prefix(line: &str) -> Pri<'_> {
    let Some(rest) = line.strip_prefix('<') else { return Pri::Absent };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if !(1..=3).contains(&digits) || rest.as_bytes().get(digits) != Some(&b'>') {
        return Pri::Invalid;
    }
    match rest[..digits].parse::<u16>() {
        Ok(pri) if pri <= 191 => Pri::Valid(pri as u8, &rest[digits + 1..]),
        _ => Pri::Invalid,
    }
}

fn strip_bom(s: &str) -> &str {
    s.strip_prefix('\u{feff}').unwrap_or(s)
}

fn push_pri(fields: &mut Map, pri: u8) {
    let (facility, severity) = syslog_loose::decompose_pri(pri);
    if let Some(f) = facility {
        fields.push_unchecked(FACILITY, Value::from(f.as_str()));
        fields.push_unchecked(FACILITY_CODE, Value::Int(i64::from(pri >> 3)));
    }
    if let Some(s) = severity {
        fields.push_unchecked(SEVERITY, Value::from(s.as_str()));
        fields.push_unchecked(SEVERITY_CODE, Value::Int(i64::from(pri & 7)));
    }
}

fn event_from(line: &str, m: &Message<&str>, received: i64) -> Event {
    let mut fields = Map::with_capacity(12);
    fields.push_unchecked(sluice_core::event::MESSAGE, Value::String(Str::from(strip_bom(m.msg))));
    let at = m.timestamp.and_then(|t: DateTime<FixedOffset>| t.timestamp_nanos_opt()).unwrap_or(received);
    fields.push_unchecked(sluice_core::event::TIMESTAMP, Value::Timestamp(at));
    let (mut hostname, mut appname) = (m.hostname, m.appname);
    // `<PRI>Mmm dd hh:mm:ss app: text`: syslog_loose takes a lone word for the host, but a word
    // ended by the colon is the tag of a message that has no host.
    if let (Some(host), None, None, Protocol::RFC3164) = (hostname, appname, &m.procid, &m.protocol)
        && followed_by_colon(line, host)
    {
        (hostname, appname) = (None, Some(host));
    }
    if let Some(h) = hostname {
        fields.push_unchecked(HOSTNAME, Value::from(h));
    }
    if let Some(a) = appname {
        fields.push_unchecked(APPNAME, Value::from(a));
    }
    match &m.procid {
        Some(ProcId::PID(pid)) => fields.push_unchecked(PROCID, Value::Int(i64::from(*pid))),
        Some(ProcId::Name(name)) => fields.push_unchecked(PROCID, Value::from(*name)),
        None => {}
    }
    if let Some(id) = m.msgid {
        fields.push_unchecked(MSGID, Value::from(id));
    }
    if let (Some(f), Some(s)) = (m.facility, m.severity) {
        push_pri(&mut fields, ((f as u8) << 3) | s as u8);
    }
    if let Protocol::RFC5424(version) = m.protocol {
        fields.push_unchecked(VERSION, Value::Int(i64::from(version)));
    }
    if !m.structured_data.is_empty() {
        // An SD-ID that comes more than once (RFC 5424 forbids it, senders do it anyway) and
        // an SD-PARAM repeated within its element (allowed) keep every value, as an array.
        let mut sd = Map::with_capacity(m.structured_data.len());
        for element in &m.structured_data {
            let mut params = Map::with_capacity(element.params.len());
            for (name, value) in element.params() {
                params.insert_gathering(Str::from(*name), Value::from(value));
            }
            sd.insert_gathering(Str::from(element.id), Value::Object(params));
        }
        fields.push_unchecked(STRUCTURED_DATA, Value::Object(sd));
    }
    Event::new(fields)
}

/// Whether `word`, a slice of `line`, is followed by a colon in it.
fn followed_by_colon(line: &str, word: &str) -> bool {
    let start = (word.as_ptr() as usize).wrapping_sub(line.as_ptr() as usize);
    start <= line.len() && line.get(start + word.len()..).is_some_and(|rest| rest.starts_with(':'))
}

/// The year of a BSD timestamp without one, as seen at `now` (wall clock in `timezone`): the
/// latest year, from next year back, that puts it at most 31 days after `now`. That is next
/// year, this year or last year, except for 29 February, which goes to the last leap year.
pub(super) fn infer_year((month, day, hour, minute, second): IncompleteDate, now: NaiveDateTime) -> i32 {
    let year = now.year();
    let horizon = now + TimeDelta::days(31);
    (year - 4..=year + 1)
        .rev()
        .find(|&y| {
            NaiveDate::from_ymd_opt(y, month, day)
                .and_then(|d| d.and_hms_opt(hour, minute, second))
                .is_some_and(|t| t <= horizon)
        })
        .unwrap_or(year)
}

/// The timezone named by `name` (IANA, such as `Europe/Paris`, or `UTC`).
pub(super) fn zone(name: &str) -> Result<Tz, String> {
    name.parse::<Tz>().map_err(|_| {
        format!(
            "unknown timezone `{name}`: write an IANA zone name like `Europe/Paris` or `America/New_York`, or `UTC`"
        )
    })
}

/// What one parsed event costs, for the memory estimate before decoding.
pub(super) fn typical_event_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        let sample = b"<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog - ID47 \
            [exampleSDID@32473 iut=\"3\" eventSource=\"Application\"] An application event log entry";
        let (e, _) = Parser::new(Tz::UTC).parse(sample, false, 0);
        e.memory_size()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::FieldPath;

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> NaiveDateTime {
        NaiveDate::from_ymd_opt(y, mo, d).unwrap().and_hms_opt(h, mi, s).unwrap()
    }

    fn ns(rfc3339: &str) -> i64 {
        DateTime::parse_from_rfc3339(rfc3339).unwrap().timestamp_nanos_opt().unwrap()
    }

    fn parse_in(zone_name: &str, line: &str, now: NaiveDateTime) -> (Event, Parsed) {
        Parser::new(zone(zone_name).unwrap()).parse_at(line.as_bytes(), false, 42, now)
    }

    fn parse(line: &str) -> Event {
        let (e, p) = parse_in("UTC", line, at(2026, 11, 26, 12, 0, 0));
        assert_eq!(p, Parsed::Ok, "{line}: {e:?}");
        e
    }

    fn get<'a>(e: &'a Event, path: &str) -> Option<&'a Value> {
        e.get(&FieldPath::parse(path).unwrap())
    }

    fn s<'a>(e: &'a Event, path: &str) -> Option<&'a str> {
        get(e, path).and_then(Value::as_str)
    }

    fn int(e: &Event, path: &str) -> Option<i64> {
        match get(e, path) {
            Some(Value::Int(i)) => Some(*i),
            _ => None,
        }
    }

    #[test]
    fn rfc5424_with_structured_data_and_bom() {
        let line = "<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog 8710 ID47 \
            [exampleSDID@32473 iut=\"3\" eventSource=\"Application\" eventID=\"1011\"][examplePriority@32473 class=\"high\"] \
            \u{feff}An application event log entry";
        let e = parse(line);
        assert_eq!(e.message(), Some("An application event log entry"));
        assert_eq!(e.timestamp_nanos(), Some(ns("2003-10-11T22:14:15.003Z")));
        assert_eq!(s(&e, "/hostname"), Some("mymachine.example.com"));
        assert_eq!(s(&e, "/appname"), Some("evntslog"));
        assert_eq!(int(&e, "/procid"), Some(8710));
        assert_eq!(s(&e, "/msgid"), Some("ID47"));
        assert_eq!((s(&e, "/facility"), int(&e, "/facility_code")), (Some("local4"), Some(20)));
        assert_eq!((s(&e, "/severity"), int(&e, "/severity_code")), (Some("notice"), Some(5)));
        assert_eq!(int(&e, "/version"), Some(1));
        assert_eq!(s(&e, "/structured_data/exampleSDID@32473/iut"), Some("3"));
        assert_eq!(s(&e, "/structured_data/exampleSDID@32473/eventSource"), Some("Application"));
        assert_eq!(s(&e, "/structured_data/exampleSDID@32473/eventID"), Some("1011"));
        assert_eq!(s(&e, "/structured_data/examplePriority@32473/class"), Some("high"));
        assert!(e.fields.get("tags").is_none());
    }

    #[test]
    fn a_repeated_sd_id_and_a_repeated_param_keep_every_value() {
        let e = parse(
            "<165>1 2003-10-11T22:14:15.003Z host app - - \
             [origin ip=\"10.0.0.1\" ip=\"10.0.0.2\"][meta seq=\"1\"][meta seq=\"2\"] text",
        );
        assert_eq!(e.message(), Some("text"));
        let ips = get(&e, "/structured_data/origin/ip").cloned();
        assert_eq!(
            ips,
            Some(Value::Array(vec![Value::from("10.0.0.1"), Value::from("10.0.0.2")])),
            "{}",
            e.to_json_string()
        );
        assert_eq!(s(&e, "/structured_data/meta/0/seq"), Some("1"), "{}", e.to_json_string());
        assert_eq!(s(&e, "/structured_data/meta/1/seq"), Some("2"), "{}", e.to_json_string());
    }

    #[test]
    fn rfc5424_nil_values_are_left_out_and_escapes_are_undone() {
        let e =
            parse("<34>1 2003-10-11T22:14:15.003+02:00 - su - - [a@1 q=\"say \\\"hi\\\" \\] ok\"] 'su root' failed");
        assert_eq!(e.message(), Some("'su root' failed"));
        assert_eq!(e.timestamp_nanos(), Some(ns("2003-10-11T20:14:15.003Z")));
        assert!(get(&e, "/hostname").is_none() && get(&e, "/procid").is_none() && get(&e, "/msgid").is_none());
        assert_eq!(s(&e, "/appname"), Some("su"));
        assert_eq!(s(&e, "/structured_data/a@1/q"), Some("say \"hi\" ] ok"));
        // No structured data and no message at all.
        let e = parse("<13>1 2026-01-02T03:04:05Z host app proc-a - -");
        assert_eq!(e.message(), Some(""));
        assert_eq!(s(&e, "/procid"), Some("proc-a"));
        assert!(get(&e, "/structured_data").is_none());
    }

    #[test]
    fn rfc3164_with_host_and_pid_takes_the_year_from_now() {
        let e = parse("<34>Oct 11 22:14:15 mymachine su[230]: 'su root' failed for lonvick on /dev/pts/8");
        assert_eq!(e.message(), Some("'su root' failed for lonvick on /dev/pts/8"));
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-10-11T22:14:15Z")));
        assert_eq!(s(&e, "/hostname"), Some("mymachine"));
        assert_eq!(s(&e, "/appname"), Some("su"));
        assert_eq!(int(&e, "/procid"), Some(230));
        assert_eq!((s(&e, "/facility"), int(&e, "/facility_code")), (Some("auth"), Some(4)));
        assert_eq!((s(&e, "/severity"), int(&e, "/severity_code")), (Some("crit"), Some(2)));
        assert!(get(&e, "/version").is_none() && get(&e, "/msgid").is_none());
    }

    #[test]
    fn rfc3164_without_a_hostname() {
        let e = parse("<13>Nov 26 07:16:16 cron[99]: job done");
        assert_eq!((s(&e, "/appname"), int(&e, "/procid")), (Some("cron"), Some(99)));
        assert!(get(&e, "/hostname").is_none());
        assert_eq!(e.message(), Some("job done"));
        // A tag without a pid, straight after the time: the word before the colon is the tag.
        let e = parse("<13>Nov 26 07:16:16 sshd: session opened");
        assert_eq!(s(&e, "/appname"), Some("sshd"));
        assert!(get(&e, "/hostname").is_none());
        assert_eq!(e.message(), Some("session opened"));
        // Host and a tag without a pid.
        let e = parse("<13>Nov 26 07:16:16 web-1 sshd: session opened");
        assert_eq!((s(&e, "/hostname"), s(&e, "/appname")), (Some("web-1"), Some("sshd")));
        assert!(get(&e, "/procid").is_none());
    }

    #[test]
    fn rfc3164_timestamps_without_offset_are_read_in_timezone() {
        let now = at(2026, 7, 1, 0, 0, 0);
        let (e, _) = parse_in("Europe/Paris", "<13>Jun 30 14:00:00 host app: summer", now);
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-06-30T12:00:00Z")));
        let (e, _) = parse_in("Europe/Paris", "<13>Jan 15 14:00:00 host app: winter", now);
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-01-15T13:00:00Z")));
        let (e, _) = parse_in("America/New_York", "<13>Jan 15 2024 14:00:00 host app: with a year", now);
        assert_eq!(e.timestamp_nanos(), Some(ns("2024-01-15T19:00:00Z")));
        assert_eq!(e.message(), Some("with a year"));
        // Daylight saving: a skipped time takes the offset before the change, a repeated one
        // is the first of the two.
        let (e, p) = parse_in("Europe/Paris", "<13>Mar 29 02:30:00 host app: in the gap", now);
        assert_eq!(p, Parsed::Ok);
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-03-29T01:30:00Z")));
        let (e, _) = parse_in("Europe/Paris", "<13>Oct 25 02:30:00 host app: twice", at(2026, 10, 25, 12, 0, 0));
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-10-25T00:30:00Z")));
        // An offset in the message wins over the timezone.
        let (e, _) = parse_in("Europe/Paris", "<13>2026-06-30T14:00:00+00:00 host app: rsyslog style", now);
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-06-30T14:00:00Z")));
        assert_eq!((s(&e, "/hostname"), s(&e, "/appname")), (Some("host"), Some("app")));
    }

    #[test]
    fn the_year_is_inferred_around_new_year() {
        // December messages read in early January are last year's.
        assert_eq!(infer_year((12, 31, 23, 59, 59), at(2027, 1, 1, 0, 0, 5)), 2026);
        // A January message read on 31 December (a sender's clock a little ahead) is next year's.
        assert_eq!(infer_year((1, 1, 0, 0, 1), at(2026, 12, 31, 23, 59, 0)), 2027);
        // An old message from later in the year than now is last year's.
        assert_eq!(infer_year((8, 1, 0, 0, 0), at(2026, 3, 15, 0, 0, 0)), 2025);
        assert_eq!(infer_year((3, 20, 0, 0, 0), at(2026, 3, 15, 0, 0, 0)), 2026);
        // 29 February goes to the leap year before.
        assert_eq!(infer_year((2, 29, 12, 0, 0), at(2026, 3, 1, 0, 0, 0)), 2024);
        let (e, _) = parse_in("UTC", "<13>Dec 31 23:59:58 host app: late", at(2027, 1, 1, 0, 0, 3));
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-12-31T23:59:58Z")));
    }

    #[test]
    fn garbage_is_kept_whole_and_tagged() {
        for line in ["hello world", "", "<>oops", "<999>Oct 11 22:14:15 h a: m", "<12x>x", "{\"json\": 1}"] {
            let (e, p) = parse_in("UTC", line, at(2026, 1, 1, 0, 0, 0));
            assert_eq!(p, Parsed::Failed, "{line}");
            assert!(e.has_tag(TAG_PARSE_FAILURE), "{line}");
            assert_eq!(e.message(), Some(line));
            assert_eq!(e.timestamp_nanos(), Some(42));
            assert!(get(&e, "/facility").is_none());
        }
        let (e, p) = Parser::new(Tz::UTC).parse_at(b"bad \xff utf8", false, 0, at(2026, 1, 1, 0, 0, 0));
        assert_eq!(p, Parsed::Failed);
        assert_eq!(e.message(), Some("bad \u{fffd} utf8"));
    }

    #[test]
    fn a_header_without_a_pri_is_accepted() {
        let e = parse("Nov 26 07:16:16 web-1 nginx[7]: GET /");
        assert_eq!(
            (s(&e, "/hostname"), s(&e, "/appname"), int(&e, "/procid")),
            (Some("web-1"), Some("nginx"), Some(7))
        );
        assert_eq!(e.message(), Some("GET /"));
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-11-26T07:16:16Z")));
        assert!(get(&e, "/facility").is_none() && get(&e, "/severity").is_none());
    }

    #[test]
    fn a_pri_without_a_header_keeps_facility_and_severity() {
        let e = parse("<190>just some text");
        assert_eq!(e.message(), Some("just some text"));
        assert_eq!((s(&e, "/facility"), s(&e, "/severity")), (Some("local7"), Some("info")));
        assert_eq!(e.timestamp_nanos(), Some(42));
        assert!(!e.has_tag(TAG_PARSE_FAILURE));
    }

    #[test]
    fn trailing_newlines_and_nuls_are_trimmed_and_truncation_is_tagged() {
        let (e, _) =
            Parser::new(Tz::UTC).parse_at(b"<13>Nov 26 07:16:16 h a: text\r\n\0", true, 0, at(2026, 11, 26, 8, 0, 0));
        assert_eq!(e.message(), Some("text"));
        assert!(e.has_tag(TAG_TRUNCATED));
        assert!(!e.has_tag(TAG_PARSE_FAILURE));
    }

    /// The Cisco object of `e`, as JSON, for comparing whole.
    fn cisco_of(e: &Event) -> String {
        get(e, "/cisco")
            .map(|c| Event::new(Map::from_iter([("cisco".into(), c.clone())])).to_json_string())
            .unwrap_or_default()
    }

    #[test]
    fn cisco_ios_headers_are_read() {
        // A sequence number and a time the device itself says is not authoritative (`*`).
        let e = parse("<189>123: *Mar  1 18:46:11.123: %SYS-5-CONFIG_I: Configured from console by vty0");
        assert_eq!(e.message(), Some("Configured from console by vty0"));
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-03-01T18:46:11.123Z")));
        assert_eq!(s(&e, "/appname"), Some("SYS-5-CONFIG_I"));
        assert!(get(&e, "/hostname").is_none());
        assert_eq!((s(&e, "/facility"), int(&e, "/facility_code")), (Some("local7"), Some(23)));
        assert_eq!((s(&e, "/severity"), int(&e, "/severity_code")), (Some("notice"), Some(5)));
        assert_eq!(
            cisco_of(&e),
            r#"{"cisco":{"facility":"SYS","severity":5,"mnemonic":"CONFIG_I","sequence":123,"clock":"not_authoritative"}}"#
        );
        assert!(e.fields.get("tags").is_none());
        // The message counter and the origin-id host.
        let e = parse("<189>52: R1: *Mar 1 18:46:11: %LINK-3-UPDOWN: Interface Gi0/1, changed state to up");
        assert_eq!(e.message(), Some("Interface Gi0/1, changed state to up"));
        assert_eq!((s(&e, "/hostname"), s(&e, "/appname")), (Some("R1"), Some("LINK-3-UPDOWN")));
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-03-01T18:46:11Z")));
        assert_eq!(int(&e, "/cisco/sequence"), Some(52));
        assert_eq!(s(&e, "/cisco/clock"), Some("not_authoritative"));
        // Counter, host and sequence number all sent.
        let e = parse("<189>52: R1: 000123: Mar 1 18:46:11: %LINK-3-UPDOWN: up");
        assert_eq!((int(&e, "/cisco/message_count"), int(&e, "/cisco/sequence")), (Some(52), Some(123)));
        assert_eq!(s(&e, "/hostname"), Some("R1"));
        assert!(get(&e, "/cisco/clock").is_none(), "an authoritative time has no `clock`");
        // Passed on by a relay that put its own RFC 3164 header first: the counter is not
        // taken for the program name.
        let e = parse("<189>Mar  1 18:46:12 10.0.0.9 123: *Mar  1 18:46:11.123: %SYS-5-CONFIG_I: text");
        assert_eq!((s(&e, "/hostname"), s(&e, "/appname")), (Some("10.0.0.9"), Some("SYS-5-CONFIG_I")));
        assert_eq!((e.message(), int(&e, "/cisco/sequence")), (Some("text"), Some(123)));
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-03-01T18:46:11.123Z")));
        // No number; `*` and `.` kept apart.
        let e = parse("<189>*Mar 1 18:46:11.123: %SYS-5-CONFIG_I: text");
        assert_eq!((e.message(), s(&e, "/appname")), (Some("text"), Some("SYS-5-CONFIG_I")));
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-03-01T18:46:11.123Z")));
        assert!(get(&e, "/cisco/sequence").is_none());
        assert_eq!(s(&e, "/cisco/clock"), Some("not_authoritative"));
        let e = parse("<189>.Mar 1 18:46:11.123: %SYS-5-CONFIG_I: text");
        assert_eq!(s(&e, "/cisco/clock"), Some("not_synchronized"));
        // Synchronised and nothing before the time: before, the tag with its `%` was the appname.
        let e = parse("<189>Mar  1 18:46:11: %SYS-5-CONFIG_I: text");
        assert_eq!((e.message(), s(&e, "/appname")), (Some("text"), Some("SYS-5-CONFIG_I")));
        assert_eq!(cisco_of(&e), r#"{"cisco":{"facility":"SYS","severity":5,"mnemonic":"CONFIG_I"}}"#);
        // A facility with several parts (a Catalyst 6500's supervisor).
        let e = parse("<187>Mar  1 18:46:11: %LINK-SP-3-UPDOWN: x");
        assert_eq!((s(&e, "/cisco/facility"), int(&e, "/cisco/severity")), (Some("LINK-SP"), Some(3)));
        // No `<PRI>` (a line from a file): no facility nor severity, the rest as with one.
        let e = parse("123: *Mar  1 18:46:11: %SYS-5-CONFIG_I: from a file");
        assert_eq!((e.message(), int(&e, "/cisco/sequence")), (Some("from a file"), Some(123)));
        assert!(get(&e, "/facility").is_none() && get(&e, "/severity").is_none());
    }

    #[test]
    fn cisco_times_take_a_year_and_a_zone_like_bsd_ones() {
        let now = at(2026, 7, 1, 0, 0, 0);
        // `service timestamps log datetime year show-timezone msec`: UTC is UTC, whatever
        // `timezone` says.
        let line = "<189>000123: Mar  1 2024 18:46:11.123 UTC: %SYS-5-CONFIG_I: text";
        let (e, p) = parse_in("Europe/Paris", line, now);
        assert_eq!(p, Parsed::Ok);
        assert_eq!(e.timestamp_nanos(), Some(ns("2024-03-01T18:46:11.123Z")));
        assert_eq!((int(&e, "/cisco/sequence"), s(&e, "/cisco/timezone")), (Some(123), Some("UTC")));
        assert_eq!(e.message(), Some("text"));
        // Another zone name is a label (`clock timezone` takes any word): read in `timezone`.
        let (e, _) = parse_in("Europe/Paris", "<189>Mar  1 2024 18:46:11 CET: %SYS-5-CONFIG_I: text", now);
        assert_eq!(e.timestamp_nanos(), Some(ns("2024-03-01T17:46:11Z")));
        assert_eq!(s(&e, "/cisco/timezone"), Some("CET"));
        // No zone: `timezone`, with the daylight saving rules of the BSD path.
        let (e, _) = parse_in("Europe/Paris", "<189>*Jun 30 14:00:00: %SYS-5-CONFIG_I: summer", now);
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-06-30T12:00:00Z")));
        assert!(get(&e, "/cisco/timezone").is_none());
        let (e, _) = parse_in("Europe/Paris", "<189>Mar 29 02:30:00: %SYS-5-CONFIG_I: in the gap", now);
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-03-29T01:30:00Z")));
        // No year: the one the BSD path would give.
        let (e, _) = parse_in("UTC", "<189>1: *Dec 31 23:59:58: %SYS-5-CONFIG_I: late", at(2027, 1, 1, 0, 0, 3));
        assert_eq!(e.timestamp_nanos(), Some(ns("2026-12-31T23:59:58Z")));
        let (e, _) = parse_in("UTC", "<189>1: *Aug  1 00:00:00.5: %SYS-5-CONFIG_I: old", at(2026, 3, 15, 0, 0, 0));
        assert_eq!(e.timestamp_nanos(), Some(ns("2025-08-01T00:00:00.5Z")));
    }

    #[test]
    fn lines_that_are_not_cisco_parse_as_without_it() {
        let parser = Parser::new(zone("Europe/Paris").unwrap());
        let now = at(2026, 11, 26, 12, 0, 0);
        let not_cisco = [
            // Malformed Cisco: each is what it was before Cisco headers were read.
            "<189>123 *Mar  1 18:46:11: %SYS-5-CONFIG_I: no colon after the number",
            "<189>123: *Mar  1 18:46:11: %SYS-5: no mnemonic",
            "<189>123: %SYS-5-CONFIG_I: a sequence number and no time",
            "<189>123: *Mar  1 18:46:11 %SYS-5-CONFIG_I: no colon after the time",
            "<189>123: *Feb 30 18:46:11: %SYS-5-CONFIG_I: a date that does not exist",
            "<189>123: *Mar  1 18:46:11: %SYS-5-CONFIG_I",
            "<189>123: *Mar",
            "<189>Mar  1 18:46:11: SYS-5-CONFIG_I: no percent sign",
            "<999>123: *Mar  1 18:46:11: %SYS-5-CONFIG_I: PRI over 191",
            // Not Cisco at all: RFC 5424, RFC 3164 and its variants, garbage.
            "<166>2024-03-01T18:46:11.123Z host 123: text",
            "<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog 8710 ID47 [a@1 b=\"c\"] text",
            "<34>Oct 11 22:14:15 mymachine su[230]: 'su root' failed for lonvick on /dev/pts/8",
            "<13>Nov 26 07:16:16 sshd: session opened",
            "<13>Nov 26 07:16:16 web-1 sshd: %SYS-5-CONFIG_I: a tag-like text after a BSD tag",
            "<13>Jan 15 2024 14:00:00 host app: with a year",
            "<13>2026-06-30T14:00:00+00:00 host app: rsyslog style",
            "Nov 26 07:16:16 web-1 nginx[7]: GET /",
            "<190>just some text",
            "hello world",
            "",
            "<12x>x",
        ];
        for line in not_cisco {
            let (e, p) = parser.parse_at(line.as_bytes(), false, 42, now);
            assert!(get(&e, "/cisco").is_none(), "{line}: {}", e.to_json_string());
            let (before, p_before) = parser.loose(&text(line.as_bytes()), line, 42, Some(now));
            assert_eq!((&e, p), (&before, p_before), "{line}");
        }
        // What that is for the malformed ones: a `<PRI>` and the rest of the text, as the probe
        // of the issue found.
        let (e, _) = parser.parse_at(b"<189>123: %SYS-5-CONFIG_I: text", false, 42, now);
        assert_eq!(e.message(), Some("123: %SYS-5-CONFIG_I: text"));
        assert_eq!((e.timestamp_nanos(), s(&e, "/severity")), (Some(42), Some("notice")));
        assert!(get(&e, "/appname").is_none() && !e.has_tag(TAG_PARSE_FAILURE));
        // And RFC 3339 with a number for a tag stays RFC 3164's reading.
        let (e, _) = parser.parse_at(b"<166>2024-03-01T18:46:11.123Z host 123: text", false, 42, now);
        assert_eq!((s(&e, "/hostname"), s(&e, "/appname"), e.message()), (Some("host"), Some("123"), Some("text")));
    }

    #[test]
    fn cisco_lines_cut_anywhere_do_not_panic() {
        let parser = Parser::new(Tz::UTC);
        let line = "<189>52: r1: 000123: .Mar  1 2024 18:46:11.123 UTC: %LINK-SP-3-UPDOWN: Interface \u{e9}t\u{e9}";
        for (end, _) in line.char_indices() {
            let (e, p) = parser.parse_at(&line.as_bytes()[..end], true, 42, at(2026, 1, 1, 0, 0, 0));
            assert!(e.has_tag(TAG_TRUNCATED));
            // Only a cut inside `<189>` leaves no valid PRI.
            assert_eq!(p == Parsed::Failed, !line[..end].contains('>'), "{}", &line[..end]);
        }
        // Cut in a multi-byte character too.
        let bytes = line.as_bytes();
        let (e, _) = parser.parse_at(&bytes[..bytes.len() - 1], false, 42, at(2026, 1, 1, 0, 0, 0));
        assert_eq!(e.message(), Some("Interface \u{e9}t\u{fffd}"));
    }

    #[test]
    fn unknown_timezones_are_refused() {
        assert!(zone("Europe/Paris").is_ok() && zone("UTC").is_ok());
        assert!(zone("Europe/Pariss").unwrap_err().contains("unknown timezone `Europe/Pariss`"));
    }
}
