//! The `timezone` of the `date` processor: a fixed offset or an IANA zone (chrono-tz's built-in
//! database), and how a wall-clock time is placed in it across daylight saving changes.

use chrono::{LocalResult, NaiveDateTime, Offset, TimeDelta, TimeZone};
use chrono_tz::{TZ_VARIANTS, Tz};

use super::parse_offset;

/// Where a date written without an offset is placed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Zone {
    /// Seconds east of UTC.
    Fixed(i32),
    /// An IANA zone, with its daylight saving rules.
    Named(Tz),
}

impl Zone {
    /// A fixed offset (`+02:00`, `UTC`) or an IANA zone name (`Europe/Paris`).
    pub(super) fn parse(s: &str) -> Result<Zone, String> {
        if let Some(secs) = parse_offset(s) {
            return Ok(Zone::Fixed(secs));
        }
        s.parse::<Tz>().map(Zone::Named).map_err(|_| {
            let mut message = format!(
                "unknown timezone `{s}`: write an IANA zone name like `Europe/Paris`, or a fixed offset like \
                 `+02:00` or `UTC`"
            );
            if let Some(name) = suggest_zone(s) {
                message.push_str(&format!(" (did you mean `{name}`?)"));
            }
            message
        })
    }

    /// Seconds east of UTC for the wall-clock time `local` in this zone. When a daylight saving
    /// change makes `local` happen twice (autumn) or not at all (spring), the offset in force
    /// before the change: the first of the two instants, or the skipped time moved later by the
    /// gap. That is java.time's rule (Logstash agrees on the repeated hour and fails on the
    /// skipped one).
    pub(super) fn offset_at(self, local: &NaiveDateTime) -> i32 {
        let tz = match self {
            Zone::Fixed(secs) => return secs,
            Zone::Named(tz) => tz,
        };
        match tz.offset_from_local_datetime(local) {
            LocalResult::Single(o) => o.fix().local_minus_utc(),
            // The earlier instant has the larger offset.
            LocalResult::Ambiguous(a, b) => a.fix().local_minus_utc().max(b.fix().local_minus_utc()),
            LocalResult::None => offset_before_gap(tz, local),
        }
    }
}

/// The offset in force just before the gap that holds `local`: the offset of the first wall-clock
/// time before it that exists (gaps last an hour or less, a day at most; zone changes are months
/// apart).
fn offset_before_gap(tz: Tz, local: &NaiveDateTime) -> i32 {
    let mut t = *local;
    for _ in 0..48 {
        let Some(earlier) = t.checked_sub_signed(TimeDelta::hours(1)) else { break };
        t = earlier;
        match tz.offset_from_local_datetime(&t) {
            LocalResult::Single(o) => return o.fix().local_minus_utc(),
            LocalResult::Ambiguous(a, b) => return a.fix().local_minus_utc().min(b.fix().local_minus_utc()),
            LocalResult::None => {}
        }
    }
    tz.offset_from_utc_datetime(local).fix().local_minus_utc()
}

/// A zone name close to the unknown `s`: the same name in other case, a city without its region
/// (`paris`), or the nearest name within a few typos.
fn suggest_zone(s: &str) -> Option<&'static str> {
    let wanted = s.trim().replace(' ', "_").to_ascii_lowercase();
    if wanted.is_empty() {
        return None;
    }
    let names = || TZ_VARIANTS.iter().map(|tz| tz.name());
    if let Some(name) = names().find(|n| n.eq_ignore_ascii_case(&wanted)) {
        return Some(name);
    }
    if let Some(name) = names().find(|n| n.rsplit('/').next().is_some_and(|city| city.eq_ignore_ascii_case(&wanted))) {
        return Some(name);
    }
    let limit = (wanted.len() / 4).clamp(1, 3);
    names()
        .map(|n| (edit_distance(&wanted, &n.to_ascii_lowercase()), n))
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, n)| n)
}

/// Levenshtein distance, by bytes.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != cb)).min(above + 1).min(row[j] + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::build_err;
    use crate::date::local_to_nanos;
    use chrono::NaiveDate;

    #[test]
    fn zone_names_and_offsets() {
        assert_eq!(Zone::parse("UTC"), Ok(Zone::Fixed(0)));
        assert_eq!(Zone::parse("+02:00"), Ok(Zone::Fixed(7200)));
        assert_eq!(Zone::parse("Europe/Paris"), Ok(Zone::Named(Tz::Europe__Paris)));
        assert_eq!(Zone::parse("America/New_York"), Ok(Zone::Named(Tz::America__New_York)));
        assert_eq!(Zone::parse("Etc/GMT-3"), Ok(Zone::Named(Tz::Etc__GMTMinus3)));
        for (typo, want) in [
            ("europe/paris", "Europe/Paris"),
            ("Paris", "Europe/Paris"),
            ("new york", "America/New_York"),
            ("America/NewYork", "America/New_York"),
            ("Europe/Berln", "Europe/Berlin"),
        ] {
            let e = Zone::parse(typo).unwrap_err();
            assert!(e.starts_with(&format!("unknown timezone `{typo}`: ")), "{e}");
            assert!(e.ends_with(&format!("(did you mean `{want}`?)")), "{typo}: {e}");
        }
        for far in ["Mars/Olympus_Mons", "Moon", "", "+25:00"] {
            let e = Zone::parse(far).unwrap_err();
            assert!(!e.contains("did you mean"), "{far}: {e}");
        }
        let e = build_err("type: date\nformats: [ISO8601]\ntimezone: Nowhere/Special");
        assert!(e.contains("timezone: unknown timezone `Nowhere/Special`: write an IANA zone name"), "{e}");
    }

    /// Every hour of 2026 in a few zones, read back: the wall clock is kept except in a skipped
    /// hour, which moves later by the gap.
    #[test]
    fn every_local_hour_round_trips() {
        for tz in [Tz::Europe__Paris, Tz::America__New_York, Tz::Australia__Lord_Howe, Tz::Asia__Kolkata] {
            let zone = Zone::Named(tz);
            let start = NaiveDate::from_ymd_opt(2026, 1, 1).unwrap().and_hms_opt(0, 15, 0).unwrap();
            for h in 0..365 * 24 {
                let local = start + TimeDelta::hours(h);
                let ns = local_to_nanos(&local, zone.offset_at(&local)).unwrap();
                let back = tz.timestamp_nanos(ns).naive_local();
                let exists = !matches!(tz.from_local_datetime(&local), LocalResult::None);
                if exists {
                    assert_eq!(back, local, "{tz}");
                } else {
                    assert!(back > local && back - local <= TimeDelta::hours(1), "{tz} {local} {back}");
                }
            }
        }
    }
}
