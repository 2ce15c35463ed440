//! The header Cisco IOS (and IOS XE) devices write after `<PRI>`, which neither RFC describes:
//!
//! ```text
//! [COUNT: ][HOST: ][SEQ: ][*|.]Mmm dd [yyyy ]hh:mm:ss[.fff][ ZONE]: %FACILITY-SEVERITY-MNEMONIC: text
//! ```
//!
//! COUNT is the message counter (`logging message-counter syslog`, on by default), HOST the
//! `logging origin-id`, SEQ `service sequence-numbers`, and the time `service timestamps log
//! datetime [msec] [year] [show-timezone]`; a `*` before it says the clock is not authoritative
//! (never set or never synchronised), a `.` that it was synchronised and has lost NTP.
//!
//! What it guarantees: [`header`] accepts only that shape, a datetime and the `%` tag included,
//! and says nothing about anything else (the caller reads it as RFC 5424 or 3164, as before).
//! The tag must be `FACILITY-S-MNEMONIC` with S a digit 0–7 and every part made of ASCII
//! letters, digits and `_` (a facility may have several parts: `LINK-SP-3-UPDOWN`). It never
//! panics, whatever the text.

/// What a `*` or `.` before the time says about the device's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Clock {
    /// `*`: the time is not authoritative (the clock was never set or never synchronised).
    NotAuthoritative,
    /// `.`: the clock was authoritative but is not synchronised to NTP now.
    NotSynchronized,
}

impl Clock {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Clock::NotAuthoritative => "not_authoritative",
            Clock::NotSynchronized => "not_synchronized",
        }
    }
}

/// The parts of a Cisco header, borrowed from the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Header<'a> {
    /// The first of two numbers before the time: the message counter.
    pub message_count: Option<i64>,
    /// The number that orders the device's messages: the last one before the time (the
    /// sequence number when the device sends both, else whichever it sends).
    pub sequence: Option<i64>,
    pub host: Option<&'a str>,
    pub clock: Option<Clock>,
    pub month: u32,
    pub day: u32,
    pub year: Option<i32>,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub nanos: u32,
    pub zone: Option<&'a str>,
    /// `SYS-5-CONFIG_I`, without the `%`.
    pub tag: &'a str,
    pub facility: &'a str,
    pub severity: u8,
    pub mnemonic: &'a str,
    /// The text after the tag.
    pub message: &'a str,
}

const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];

/// The header of `text` (the message after `<PRI>`), when it is Cisco's.
pub(super) fn header(text: &str) -> Option<Header<'_>> {
    let mut rest = text;
    // Up to three `token: ` before the time: numbers and at most one host.
    // On the stack: this runs for every message, Cisco or not.
    let mut tokens = [""; 3];
    let mut n = 0;
    let (stamp, after) = loop {
        if let Some(found) = timestamp(rest) {
            break found;
        }
        if n == tokens.len() {
            return None;
        }
        let len = rest.bytes().take_while(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')).count();
        let after = rest[len..].strip_prefix(':')?;
        if len == 0 || !after.starts_with(' ') {
            return None;
        }
        tokens[n] = &rest[..len];
        n += 1;
        rest = after.trim_start_matches(' ');
    };
    let (message_count, host, sequence) = prefix(&tokens[..n])?;
    let rest = after.strip_prefix(' ')?.trim_start_matches(' ').strip_prefix('%')?;
    let tag_len = rest.bytes().take_while(|&b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-')).count();
    let tag = &rest[..tag_len];
    let message = rest[tag_len..].strip_prefix(':')?.trim_start_matches([' ', '\t']);
    let (facility, severity, mnemonic) = split_tag(tag)?;
    Some(Header {
        message_count,
        sequence,
        host,
        clock: stamp.clock,
        month: stamp.month,
        day: stamp.day,
        year: stamp.year,
        hour: stamp.hour,
        minute: stamp.minute,
        second: stamp.second,
        nanos: stamp.nanos,
        zone: stamp.zone,
        tag,
        facility,
        severity,
        mnemonic,
        message,
    })
}

/// A Cisco message as a syslog relay passes it on, behind an RFC 3164 header of its own
/// (`Mmm dd hh:mm:ss HOST `, HOST being the device as the relay knows it): the device's header,
/// with HOST as its host when the device sent none. Read as plain RFC 3164 instead, the
/// device's counter would be taken for the program name.
pub(super) fn relayed(text: &str) -> Option<Header<'_>> {
    let name = text.get(..3)?;
    MONTHS.iter().position(|m| m.eq_ignore_ascii_case(name))?;
    let s = spaces(&text[3..])?;
    let (_, s) = digits(s, 1, 2)?;
    let (_, s) = digits(spaces(s)?, 2, 2)?;
    let (_, s) = digits(s.strip_prefix(':')?, 2, 2)?;
    let (_, s) = digits(s.strip_prefix(':')?, 2, 2)?;
    let s = s.strip_prefix(' ')?;
    let len = s.bytes().take_while(|&b| b != b' ').count();
    let relay_host = &s[..len];
    if relay_host.is_empty() || relay_host.ends_with(':') {
        return None;
    }
    let mut h = header(s[len..].strip_prefix(' ')?)?;
    h.host = h.host.or(Some(relay_host));
    Some(h)
}

/// The counter, host and sequence number among the tokens before the time: `[COUNT] [HOST]
/// [SEQ]` in that order, a lone number being the sequence.
type Prefix<'a> = (Option<i64>, Option<&'a str>, Option<i64>);

fn prefix<'a>(tokens: &[&'a str]) -> Option<Prefix<'a>> {
    #[derive(Clone, Copy)]
    enum Token<'a> {
        Number(i64),
        Host(&'a str),
    }
    let mut kinds = [Token::Host(""); 3];
    for (kind, &t) in kinds.iter_mut().zip(tokens) {
        *kind = if t.bytes().all(|b| b.is_ascii_digit()) { Token::Number(t.parse().ok()?) } else { Token::Host(t) };
    }
    use Token::{Host, Number};
    match kinds[..tokens.len().min(3)] {
        [] => Some((None, None, None)),
        [Number(seq)] => Some((None, None, Some(seq))),
        [Host(host)] => Some((None, Some(host), None)),
        [Number(count), Number(seq)] => Some((Some(count), None, Some(seq))),
        // The counter is the one number IOS always puts first; without `service
        // sequence-numbers` it is what orders the messages.
        [Number(seq), Host(host)] => Some((None, Some(host), Some(seq))),
        [Host(host), Number(seq)] => Some((None, Some(host), Some(seq))),
        [Number(count), Host(host), Number(seq)] => Some((Some(count), Some(host), Some(seq))),
        _ => None,
    }
}

/// A Cisco datetime up to and including its closing `:`, with the text after it.
#[derive(Debug)]
struct Stamp<'a> {
    clock: Option<Clock>,
    month: u32,
    day: u32,
    year: Option<i32>,
    hour: u32,
    minute: u32,
    second: u32,
    nanos: u32,
    zone: Option<&'a str>,
}

fn timestamp(s: &str) -> Option<(Stamp<'_>, &str)> {
    let (clock, s) = match s.as_bytes().first()? {
        b'*' => (Some(Clock::NotAuthoritative), &s[1..]),
        b'.' => (Some(Clock::NotSynchronized), &s[1..]),
        _ => (None, s),
    };
    let name = s.get(..3)?;
    let month = MONTHS.iter().position(|m| m.eq_ignore_ascii_case(name))? as u32 + 1;
    let s = spaces(&s[3..])?;
    let (day, s) = digits(s, 1, 2)?;
    let s = spaces(s)?;
    // A year is four digits and a space; a time starts with two digits and a colon.
    let (year, s) = match digits(s, 4, 4) {
        Some((year, rest)) => (Some(year as i32), spaces(rest)?),
        None => (None, s),
    };
    let (hour, s) = digits(s, 2, 2)?;
    let (minute, s) = digits(s.strip_prefix(':')?, 2, 2)?;
    let (second, mut s) = digits(s.strip_prefix(':')?, 2, 2)?;
    let mut nanos = 0;
    if let Some(fraction) = s.strip_prefix('.') {
        let len = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if !(1..=9).contains(&len) {
            return None;
        }
        nanos = fraction[..len].parse::<u32>().ok()? * 10u32.pow(9 - len as u32);
        s = &fraction[len..];
    }
    let mut zone = None;
    if let Some(z) = s.strip_prefix(' ') {
        // A zone name as `clock timezone` sets it: a word of up to 10 characters, like `UTC`,
        // `CEST` or `GMT+1`.
        let len = z.bytes().take_while(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-')).count();
        if !(1..=10).contains(&len) || !z.as_bytes()[0].is_ascii_alphabetic() {
            return None;
        }
        zone = Some(&z[..len]);
        s = &z[len..];
    }
    if !(1..=31).contains(&day) || !(1..=12).contains(&month) || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let s = s.strip_prefix(':')?;
    Some((Stamp { clock, month, day, year, hour, minute, second, nanos, zone }, s))
}

/// The text after one or more spaces at the start of `s`.
fn spaces(s: &str) -> Option<&str> {
    let rest = s.trim_start_matches(' ');
    (rest.len() < s.len()).then_some(rest)
}

/// A number of `min` to `max` ASCII digits at the start of `s`, not followed by another digit.
fn digits(s: &str, min: usize, max: usize) -> Option<(u32, &str)> {
    let len = s.bytes().take_while(u8::is_ascii_digit).count();
    if !(min..=max).contains(&len) {
        return None;
    }
    Some((s[..len].parse().ok()?, &s[len..]))
}

/// `FACILITY-S-MNEMONIC` → its parts; the facility may itself hold dashes.
fn split_tag(tag: &str) -> Option<(&str, u8, &str)> {
    let (head, mnemonic) = tag.rsplit_once('-')?;
    let (facility, severity) = head.rsplit_once('-')?;
    let severity = match severity.as_bytes() {
        [d @ b'0'..=b'7'] => d - b'0',
        _ => return None,
    };
    let word = |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    (facility.split('-').all(word) && word(mnemonic)).then_some((facility, severity, mnemonic))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_prefix_and_time_form() {
        let h = header("123: *Mar  1 18:46:11.123: %SYS-5-CONFIG_I: Configured from console by vty0").unwrap();
        assert_eq!((h.message_count, h.host, h.sequence), (None, None, Some(123)));
        assert_eq!(h.clock, Some(Clock::NotAuthoritative));
        assert_eq!(
            (h.month, h.day, h.year, h.hour, h.minute, h.second, h.nanos),
            (3, 1, None, 18, 46, 11, 123_000_000)
        );
        assert_eq!((h.tag, h.facility, h.severity, h.mnemonic), ("SYS-5-CONFIG_I", "SYS", 5, "CONFIG_I"));
        assert_eq!(h.message, "Configured from console by vty0");

        let h = header("52: R1: *Mar 1 18:46:11: %LINK-3-UPDOWN: Interface Gi0/1, changed state to up").unwrap();
        assert_eq!((h.message_count, h.host, h.sequence), (None, Some("R1"), Some(52)));
        assert_eq!((h.nanos, h.zone), (0, None));

        let h = header("52: r1.example.com: 000123: .Mar 1 18:46:11.5 CEST: %LINK-SP-3-UPDOWN: x").unwrap();
        assert_eq!((h.message_count, h.host, h.sequence), (Some(52), Some("r1.example.com"), Some(123)));
        assert_eq!((h.clock, h.nanos, h.zone), (Some(Clock::NotSynchronized), 500_000_000, Some("CEST")));
        assert_eq!((h.facility, h.severity, h.mnemonic), ("LINK-SP", 3, "UPDOWN"));

        let h = header("000123: Mar  1 2024 18:46:11.123 UTC: %SYS-5-CONFIG_I: text").unwrap();
        assert_eq!((h.year, h.zone, h.clock, h.sequence), (Some(2024), Some("UTC"), None, Some(123)));

        let h = header("10.0.0.1: 7: Dec 31 23:59:59: %SYS-5-CONFIG_I:").unwrap();
        assert_eq!((h.host, h.sequence, h.message), (Some("10.0.0.1"), Some(7), ""));
        let h = header("7: 8: Mar 1 00:00:00: %A-0-B: t").unwrap();
        assert_eq!((h.message_count, h.sequence), (Some(7), Some(8)));
    }

    #[test]
    fn a_relayed_message_keeps_the_device_header_and_the_relay_host() {
        let h = relayed("Mar  1 18:46:12 10.0.0.9 123: *Mar  1 18:46:11.123: %SYS-5-CONFIG_I: text").unwrap();
        assert_eq!((h.host, h.sequence, h.tag, h.message), (Some("10.0.0.9"), Some(123), "SYS-5-CONFIG_I", "text"));
        assert_eq!((h.second, h.nanos, h.clock), (11, 123_000_000, Some(Clock::NotAuthoritative)));
        // The device's own origin-id wins over what the relay calls it.
        let h = relayed("Mar 1 18:46:12 relay 52: R1: Mar 1 18:46:11: %LINK-3-UPDOWN: up").unwrap();
        assert_eq!((h.host, h.sequence), (Some("R1"), Some(52)));
        for not_relayed in [
            "Mar 1 18:46:12 relay sshd[7]: Accepted password",
            "Mar 1 18:46:12 relay 123: text without a Cisco header",
            "Mar 1 18:46:12 123: *Mar 1 18:46:11: %SYS-5-CONFIG_I: no relay host",
            "Mar 1 18:46:12  relay 123: *Mar 1 18:46:11: %SYS-5-CONFIG_I: two spaces",
            "Mar 1 18:46 relay 123: *Mar 1 18:46:11: %SYS-5-CONFIG_I: no seconds",
            "Mar 1 18:46:12 relay",
            "Mar",
            "",
        ] {
            assert!(relayed(not_relayed).is_none(), "{not_relayed}");
        }
    }

    #[test]
    fn anything_else_is_not_cisco() {
        for text in [
            "123 *Mar  1 18:46:11: %SYS-5-CONFIG_I: no colon after the number",
            "123: *Mar  1 18:46:11: %SYS-5: no mnemonic",
            "123: *Mar  1 18:46:11: %SYS-9-X: severity out of range",
            "123: *Mar  1 18:46:11: %SYS-5-: empty mnemonic",
            "123: *Mar  1 18:46:11: %-5-X: empty facility",
            "123: *Mar  1 18:46:11: SYS-5-CONFIG_I: no percent sign",
            "123: *Mar  1 18:46:11: %SYS-5-CONFIG_I no colon after the tag",
            "123: %SYS-5-CONFIG_I: no time",
            "123: *Mar  1 18:46:11 %SYS-5-CONFIG_I: no colon after the time",
            "123: *Mar 32 18:46:11: %SYS-5-CONFIG_I: day 32",
            "123: *Mar  1 24:46:11: %SYS-5-CONFIG_I: hour 24",
            "123: *Mar  1 18:46:11.: %SYS-5-CONFIG_I: empty fraction",
            "123: *Mar  1 18:46:11.1234567890: %SYS-5-CONFIG_I: ten digits",
            "123: *Mar  1 18:46:11 NOTAZONENAME: %SYS-5-CONFIG_I: zone too long",
            "123: *Mar  1 18:46: %SYS-5-CONFIG_I: no seconds",
            "123: *Foo  1 18:46:11: %SYS-5-CONFIG_I: no month",
            "1: 2: 3: 4: Mar 1 00:00:00: %A-0-B: four numbers",
            "a: b: Mar 1 00:00:00: %A-0-B: two hosts",
            "99999999999999999999: Mar 1 00:00:00: %A-0-B: number too large",
            "Mar  1 18:46:11 host app: %SYS-5-CONFIG_I: BSD host and tag",
            "Nov 26 07:16:16 sshd: session opened",
            "1 2003-10-11T22:14:15.003Z host app - - - rfc 5424",
            "2024-03-01T18:46:11.123Z host 123: text",
            "",
            "*",
            ".Ma",
            "12:",
            "é: Mar 1 00:00:00: %A-0-B: x",
            "Mar 1 00:00:00: %A-0-Bé: x",
        ] {
            assert_eq!(header(text), None, "{text}");
        }
    }
}
