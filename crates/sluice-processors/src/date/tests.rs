//! Unit tests of the `date` processor.

use super::*;
use crate::common::{build_err, build_yaml, get, loghub, tags};
use chrono::{NaiveDate, TimeZone};
use sluice_core::Map;

fn ts(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32, nanos: u32) -> i64 {
    NaiveDate::from_ymd_opt(y, mo, d)
        .unwrap()
        .and_hms_nano_opt(h, mi, s, nanos)
        .unwrap()
        .and_utc()
        .timestamp_nanos_opt()
        .unwrap()
}

fn event_with(field: &str, v: Value) -> Event {
    let mut m = Map::new();
    m.insert(field, v);
    Event::new(m)
}

#[test]
fn iso8601_variants() {
    let base = ts(2026, 11, 21, 7, 0, 0, 0);
    assert_eq!(parse_iso8601("2026-11-21T07:00:00Z", 0), Some(base));
    assert_eq!(parse_iso8601("2026-11-21t07:00:00z", 0), Some(base));
    assert_eq!(parse_iso8601("2026-11-21T07:00Z", 0), Some(base));
    assert_eq!(parse_iso8601("2026-11-21T07:00:00", 0), Some(base));
    assert_eq!(parse_iso8601("2026-11-21 07:00:00,123", 0), Some(base + 123_000_000));
    assert_eq!(parse_iso8601("2026-11-21T07:00:00.123456789Z", 0), Some(base + 123_456_789));
    assert_eq!(parse_iso8601("2026-11-21T07:00:00.1234567891Z", 0), Some(base + 123_456_789));
    assert_eq!(parse_iso8601("2026-11-21T09:00:00+02:00", 0), Some(base));
    assert_eq!(parse_iso8601("2026-11-21T09:00:00+0200", 0), Some(base));
    assert_eq!(parse_iso8601("2026-11-21T09:00:00+02", 0), Some(base));
    assert_eq!(parse_iso8601("2026-11-21T02:00:00 -0500", 0), Some(base));
    assert_eq!(parse_iso8601("2026-11-21T09:00:00", 7200), Some(base));
    assert_eq!(parse_iso8601("2026-11-21", 0), Some(ts(2026, 11, 21, 0, 0, 0, 0)));
    assert_eq!(parse_iso8601("2024-02-29T00:00:00Z", 0), Some(ts(2024, 2, 29, 0, 0, 0, 0)));
    assert_eq!(parse_iso8601("1969-12-31T23:59:59.5Z", 0), Some(-500_000_000));
    for bad in [
        "",
        "2026",
        "2026-13-01",
        "2026-02-29",
        "2026-11-31",
        "2026-11-21T24:00:00Z",
        "2026-11-21T07:60",
        "2026-11-21T07:00:00.Z",
        "2026-11-21T07:00:00+2400",
        "2026-11-21T07:00:00Q",
        "2026-11-21X07:00",
        "2026-11-21T07:00:00Zjunk",
        "9999-12-31T23:59:59Z",
        "21-11-2026",
        "２０２６-11-21",
    ] {
        assert_eq!(parse_iso8601(bad, 0), None, "{bad}");
    }
}

#[test]
fn offsets_and_decimals() {
    assert_eq!(parse_offset("UTC"), Some(0));
    assert_eq!(parse_offset("+02:00"), Some(7200));
    assert_eq!(parse_offset("-0530"), Some(-(5 * 3600 + 30 * 60)));
    assert_eq!(parse_offset("+01"), Some(3600));
    assert_eq!(parse_offset("Europe/Paris"), None);
    assert_eq!(parse_offset("+24:00"), None);
    assert_eq!(parse_offset("+1"), None);
    assert_eq!(parse_scaled_decimal("1700000000", 9), Some(1_700_000_000 * NANOS_PER_SEC));
    assert_eq!(parse_scaled_decimal("1700000000.123456789123", 9), Some(1_700_000_000_123_456_789));
    assert_eq!(parse_scaled_decimal("-1.5", 9), Some(-1_500_000_000));
    assert_eq!(parse_scaled_decimal("1.7e9", 9), Some(1_700_000_000 * NANOS_PER_SEC));
    assert_eq!(parse_scaled_decimal("1700000000123.5", 6), Some(1_700_000_000_123_500_000));
    assert_eq!(parse_scaled_decimal("99999999999999999999", 9), None);
    assert_eq!(parse_scaled_decimal("1.", 9), Some(NANOS_PER_SEC));
    assert_eq!(parse_scaled_decimal("abc", 9), None);
    assert_eq!(parse_scaled_decimal("", 9), None);
}

#[test]
fn config_errors() {
    assert!(build_err("type: date").contains("missing field `formats`"));
    assert!(build_err("type: date\nformats: []").contains("formats: give at least one format"));
    let e = build_err("type: date\nformats: ['%Y-%m-%Q']");
    assert!(e.contains("formats: invalid date format `%Y-%m-%Q`"), "{e}");
    assert!(build_err("type: date\nformats: [TAI64N]").contains("TAI64N"));
    assert!(build_err("type: date\nformats: ['yyyy zzz']").contains("zone names"));
    let e = build_err("type: date\nformats: [ISO8601]\ntimezone: Europe/Pariss");
    assert!(e.contains("timezone: unknown timezone `Europe/Pariss`"), "{e}");
    assert!(e.contains("did you mean `Europe/Paris`?"), "{e}");
    let e = build_err("type: date\nformats: [ISO8601]\nlocale: en");
    assert!(e.contains("unknown field `locale`"), "{e}");
}

#[test]
fn iso8601_into_timestamp_and_defaults() {
    let p = build_yaml("type: date\nformats: ISO8601");
    let mut e = event_with("timestamp", Value::from("2026-11-21T07:00:00.250Z"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.timestamp_nanos(), Some(ts(2026, 11, 21, 7, 0, 0, 250_000_000)));
    assert_eq!(get(&e, "/timestamp"), Some(&Value::from("2026-11-21T07:00:00.250Z")));
}

#[test]
fn formats_are_tried_in_order_with_target_and_timezone() {
    let p = build_yaml(
        "type: date\nsource: /when\ntarget: /meta/at\ntimezone: '+02:00'\n\
         formats: [UNIX, 'yyyy-MM-dd HH:mm:ss,SSS', ISO8601]",
    );
    let mut e = event_with("when", Value::from("2026-11-21 09:00:00,123"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(get(&e, "/meta/at"), Some(&Value::Timestamp(ts(2026, 11, 21, 7, 0, 0, 123_000_000))));
    let mut e = event_with("when", Value::from("2026-11-21T09:00:00"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(get(&e, "/meta/at"), Some(&Value::Timestamp(ts(2026, 11, 21, 7, 0, 0, 0))));
    let mut e = event_with("when", Value::from("1700000000"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(get(&e, "/meta/at"), Some(&Value::Timestamp(1_700_000_000 * NANOS_PER_SEC)));
}

#[test]
fn unix_numbers() {
    let p = build_yaml("type: date\nformats: [UNIX]");
    for (v, want) in [
        (Value::Int(1_700_000_000), 1_700_000_000 * NANOS_PER_SEC),
        (Value::Float(1_700_000_000.5), 1_700_000_000_500_000_000),
        (Value::from(" 1700000000.25 "), 1_700_000_000_250_000_000),
    ] {
        let mut e = event_with("timestamp", v);
        assert_eq!(p.process(&mut e), Verdict::Keep);
        assert_eq!(e.timestamp_nanos(), Some(want));
    }
    let p = build_yaml("type: date\nformats: [UNIX_MS]");
    let mut e = event_with("timestamp", Value::Int(1_700_000_000_123));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.timestamp_nanos(), Some(1_700_000_000_123_000_000));
    let mut e = event_with("timestamp", Value::from("1700000000123"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.timestamp_nanos(), Some(1_700_000_000_123_000_000));
    // Out of the nanosecond range.
    let mut e = event_with("timestamp", Value::Int(i64::MAX / 10));
    assert_eq!(p.process(&mut e), Verdict::Failed);
    assert_eq!(tags(&e), ["_dateparsefailure"]);
    let mut e = event_with("timestamp", Value::Float(f64::INFINITY));
    assert_eq!(p.process(&mut e), Verdict::Failed);
}

#[test]
fn numbers_need_unix_formats() {
    let p = build_yaml("type: date\nformats: [ISO8601, '%Y']");
    let mut e = event_with("timestamp", Value::Int(2026));
    assert_eq!(p.process(&mut e), Verdict::Failed);
}

#[test]
fn failures_tags_and_missing_source() {
    let p = build_yaml("type: date\nformats: [ISO8601]\ntag_on_failure: [bad_date, x]");
    let mut e = event_with("timestamp", Value::from("yesterday"));
    assert_eq!(p.process(&mut e), Verdict::Failed);
    assert_eq!(tags(&e), ["bad_date", "x"]);
    assert_eq!(e.timestamp_nanos(), None);
    for v in [Value::Bool(true), Value::Null, Value::Object(Map::new())] {
        let mut e = event_with("timestamp", v);
        assert_eq!(p.process(&mut e), Verdict::Failed);
    }
    // No source field: nothing to do, like Logstash.
    let mut e = event_with("other", Value::from("2026-11-21"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert!(tags(&e).is_empty());
    let mut e = event_with("timestamp", Value::Array(vec![]));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    // Arrays: the first element; timestamps are copied.
    let mut e = event_with("timestamp", Value::Array(vec![Value::from("2026-11-21"), Value::from("x")]));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.timestamp_nanos(), Some(ts(2026, 11, 21, 0, 0, 0, 0)));
    let mut e = event_with("timestamp", Value::Timestamp(42));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.timestamp_nanos(), Some(42));
    // A target under a scalar cannot be written.
    let p = build_yaml("type: date\nformats: [ISO8601]\ntarget: /timestamp/at");
    let mut e = event_with("timestamp", Value::from("2026-11-21"));
    assert_eq!(p.process(&mut e), Verdict::Failed);
    assert_eq!(tags(&e), ["_dateparsefailure"]);
}

#[test]
fn apache_access_format_with_offset() {
    let p = build_yaml("type: date\nformats: ['%d/%b/%Y:%H:%M:%S %z']");
    let mut e = event_with("timestamp", Value::from("10/Oct/2000:13:55:36 -0700"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.timestamp_nanos(), Some(ts(2000, 10, 10, 20, 55, 36, 0)));
    let p = build_yaml("type: date\nformats: ['dd/MMM/yyyy:HH:mm:ss Z']\ntimezone: '+05:00'");
    let mut e = event_with("timestamp", Value::from("10/Oct/2000:13:55:36 -0700"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.timestamp_nanos(), Some(ts(2000, 10, 10, 20, 55, 36, 0)), "the text's offset wins");
}

#[test]
fn date_only_and_twelve_hour_patterns() {
    let p = build_yaml("type: date\nformats: ['yyyy-MM-dd', 'MM/dd/yy hh:mm a']");
    let mut e = event_with("timestamp", Value::from("2026-01-02"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.timestamp_nanos(), Some(ts(2026, 1, 2, 0, 0, 0, 0)));
    let mut e = event_with("timestamp", Value::from("01/02/26 03:04 PM"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.timestamp_nanos(), Some(ts(2026, 1, 2, 15, 4, 0, 0)));
}

/// Every timestamp of Apache_2k.log (`[Sun Dec 04 04:47:44 2005]`), checked against chrono.
#[test]
fn apache_error_log_timestamps() {
    let p = build_yaml("type: date\nformats: ['EEE MMM dd HH:mm:ss yyyy']");
    let text = loghub("Apache_2k.log");
    let mut n = 0;
    for line in text.lines() {
        let stamp = &line[1..line.find(']').unwrap()];
        let mut e = event_with("timestamp", Value::from(stamp));
        assert_eq!(p.process(&mut e), Verdict::Keep, "{line}");
        let want = chrono::NaiveDateTime::parse_from_str(stamp, "%a %b %d %H:%M:%S %Y").unwrap();
        assert_eq!(e.timestamp_nanos(), want.and_utc().timestamp_nanos_opt(), "{line}");
        n += 1;
    }
    assert_eq!(n, 2000);
    let mut e = event_with("timestamp", Value::from("Sun Dec 04 04:47:44 2005"));
    p.process(&mut e);
    assert_eq!(e.timestamp_nanos(), Some(ts(2005, 12, 4, 4, 47, 44, 0)));
}

/// HDFS_2k.log starts `081109 203615 148 INFO ...`: date `yyMMdd HHmmss`.
#[test]
fn hdfs_timestamps() {
    let p = build_yaml("type: date\nformats: ['yyMMdd HHmmss']");
    let text = loghub("HDFS_2k.log");
    for line in text.lines() {
        let mut e = event_with("timestamp", Value::from(&line[..13]));
        assert_eq!(p.process(&mut e), Verdict::Keep, "{line}");
    }
    let first = text.lines().next().unwrap();
    assert!(first.starts_with("081109 203615 "), "{first}");
    let mut e = event_with("timestamp", Value::from(&first[..13]));
    p.process(&mut e);
    assert_eq!(e.timestamp_nanos(), Some(ts(2008, 11, 9, 20, 36, 15, 0)));
}

/// Syslog stamps have no year: the current one is used, or the previous one when the date
/// would be more than a month ahead.
#[test]
fn syslog_timestamps_without_year() {
    let p = build_yaml("type: date\nformats: ['MMM dd HH:mm:ss', 'MMM  d HH:mm:ss']");
    let text = loghub("OpenSSH_2k.log");
    let now = Utc::now();
    for line in text.lines() {
        let mut e = event_with("timestamp", Value::from(&line[..15]));
        assert_eq!(p.process(&mut e), Verdict::Keep, "{line}");
        let got = chrono::Utc.timestamp_nanos(e.timestamp_nanos().unwrap());
        assert!(got.year() == now.year() || got.year() == now.year() - 1, "{line}");
        assert!(got <= now + chrono::Duration::days(31), "{line}");
    }
    let mut e = event_with("timestamp", Value::from("Dec 10 06:55:46"));
    p.process(&mut e);
    let got = chrono::Utc.timestamp_nanos(e.timestamp_nanos().unwrap());
    assert_eq!((got.month(), got.day(), got.hour(), got.minute(), got.second()), (12, 10, 6, 55, 46));
    let p = build_yaml("type: date\nformats: ['MMM d HH:mm:ss']");
    let mut e = event_with("timestamp", Value::from("Jun  9 06:06:20"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    let got = chrono::Utc.timestamp_nanos(e.timestamp_nanos().unwrap());
    assert_eq!((got.month(), got.day()), (6, 9));
}

#[test]
fn strftime_with_fraction_and_epoch_seconds() {
    let p = build_yaml("type: date\nformats: ['%Y-%m-%dT%H:%M:%S%.f%:z', '%s']");
    let mut e = event_with("timestamp", Value::from("2026-11-21T09:00:00.5+02:00"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.timestamp_nanos(), Some(ts(2026, 11, 21, 7, 0, 0, 500_000_000)));
    let mut e = event_with("timestamp", Value::from("1700000000"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.timestamp_nanos(), Some(1_700_000_000 * NANOS_PER_SEC));
}

#[test]
fn on_failure_dlq_gives_the_reason() {
    let p = build_yaml("type: date\nformats: [ISO8601]\non_failure: dlq");
    let mut e = Event::from_message("x");
    e.fields.insert("timestamp", Value::from("yesterday"));
    match p.process(&mut e) {
        Verdict::DeadLetter(reason) => {
            assert_eq!(reason, "date: /timestamp `yesterday` matches none of the formats")
        }
        v => panic!("{v:?}"),
    }
    assert_eq!(tags(&e), ["_dateparsefailure"]);
}

/// The instant each wall-clock reading gives in `timezone`, through ISO8601 and a Joda
/// pattern alike.
fn check_local_times(timezone: &str, cases: &[(&str, i64)]) {
    let iso = build_yaml(&format!("type: date\nformats: [ISO8601]\ntimezone: {timezone}"));
    let joda = build_yaml(&format!("type: date\nformats: ['yyyy-MM-dd HH:mm:ss']\ntimezone: {timezone}"));
    for &(text, want) in cases {
        for (p, text) in [(&iso, text.to_string()), (&joda, text.replace('T', " "))] {
            let mut e = event_with("timestamp", Value::from(text.as_str()));
            assert_eq!(p.process(&mut e), Verdict::Keep, "{text}");
            let got = e.timestamp_nanos().unwrap();
            assert_eq!(chrono::Utc.timestamp_nanos(got), chrono::Utc.timestamp_nanos(want), "{text} in {timezone}");
        }
    }
}

/// Europe/Paris, 2026: clocks go from 02:00 CET (+01:00) to 03:00 CEST (+02:00) on March 29
/// and from 03:00 CEST back to 02:00 CET on October 25, both at 01:00 UTC.
#[test]
fn paris_daylight_saving_changes() {
    check_local_times(
        "Europe/Paris",
        &[
            // Winter and summer.
            ("2026-01-15T12:00:00", ts(2026, 1, 15, 11, 0, 0, 0)),
            ("2026-07-01T12:00:00", ts(2026, 7, 1, 10, 0, 0, 0)),
            // Spring: the last second of CET, then the skipped hour, read at +01:00 (so
            // 02:30 is 03:30 CEST), then the first second of CEST.
            ("2026-03-29T01:59:59", ts(2026, 3, 29, 0, 59, 59, 0)),
            ("2026-03-29T02:00:00", ts(2026, 3, 29, 1, 0, 0, 0)),
            ("2026-03-29T02:30:00", ts(2026, 3, 29, 1, 30, 0, 0)),
            ("2026-03-29T02:59:59", ts(2026, 3, 29, 1, 59, 59, 0)),
            ("2026-03-29T03:00:00", ts(2026, 3, 29, 1, 0, 0, 0)),
            ("2026-03-29T03:30:00", ts(2026, 3, 29, 1, 30, 0, 0)),
            // Autumn: the last second before the repeated hour (CEST), the repeated hour
            // read as its first pass (+02:00), then the first second that is CET only.
            ("2026-10-25T01:59:59", ts(2026, 10, 24, 23, 59, 59, 0)),
            ("2026-10-25T02:00:00", ts(2026, 10, 25, 0, 0, 0, 0)),
            ("2026-10-25T02:30:00", ts(2026, 10, 25, 0, 30, 0, 0)),
            ("2026-10-25T02:59:59", ts(2026, 10, 25, 0, 59, 59, 0)),
            ("2026-10-25T03:00:00", ts(2026, 10, 25, 2, 0, 0, 0)),
        ],
    );
}

/// America/New_York, 2026: 02:00 EST (-05:00) becomes 03:00 EDT (-04:00) on March 8, and
/// 02:00 EDT becomes 01:00 EST on November 1.
#[test]
fn new_york_daylight_saving_changes() {
    check_local_times(
        "America/New_York",
        &[
            ("2026-03-08T01:59:59", ts(2026, 3, 8, 6, 59, 59, 0)),
            ("2026-03-08T02:30:00", ts(2026, 3, 8, 7, 30, 0, 0)),
            ("2026-03-08T03:00:00", ts(2026, 3, 8, 7, 0, 0, 0)),
            ("2026-11-01T00:59:59", ts(2026, 11, 1, 4, 59, 59, 0)),
            ("2026-11-01T01:30:00", ts(2026, 11, 1, 5, 30, 0, 0)),
            ("2026-11-01T02:00:00", ts(2026, 11, 1, 7, 0, 0, 0)),
        ],
    );
}

/// An offset in the text wins over `timezone`, including one that picks the second pass of
/// the repeated hour; an epoch timestamp is UTC whatever the zone.
#[test]
fn written_offsets_ignore_the_zone() {
    let p = build_yaml("type: date\ntimezone: Europe/Paris\nformats: [ISO8601, 'dd/MMM/yyyy:HH:mm:ss Z', '%s']");
    for (text, want) in [
        ("2026-10-25T02:30:00+01:00", ts(2026, 10, 25, 1, 30, 0, 0)),
        ("2026-10-25T02:30:00+02:00", ts(2026, 10, 25, 0, 30, 0, 0)),
        ("2026-03-29T02:30:00+01:00", ts(2026, 3, 29, 1, 30, 0, 0)),
        ("2026-07-01T12:00:00Z", ts(2026, 7, 1, 12, 0, 0, 0)),
        ("2026-07-01T12:00:00-05:00", ts(2026, 7, 1, 17, 0, 0, 0)),
        ("01/Jul/2026:12:00:00 -0700", ts(2026, 7, 1, 19, 0, 0, 0)),
        ("1700000000", 1_700_000_000 * NANOS_PER_SEC),
    ] {
        let mut e = event_with("timestamp", Value::from(text));
        assert_eq!(p.process(&mut e), Verdict::Keep, "{text}");
        assert_eq!(e.timestamp_nanos(), Some(want), "{text}");
    }
}
