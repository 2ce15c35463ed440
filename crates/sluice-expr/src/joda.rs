//! Joda-Time date patterns (what Logstash configs use: `yyyy-MM-dd HH:mm:ss,SSS`,
//! `dd/MMM/yyyy:HH:mm:ss Z`) translated once to chrono strftime formats. Used by `%{+...}`
//! template parts and by the `date` processor, so both read the same letters the same way.

/// A pattern that cannot be translated: why, and at which char of the pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JodaError {
    pub message: String,
    /// 0-based char index in the pattern.
    pub at: usize,
}

/// Translates a Joda pattern to strftime. Letters: `y`/`Y`/`u` (year; `yy` two digits), `M`
/// (`M`/`MM` number, `MMM` short name, `MMMM` name), `d`, `D` (day of year), `H`, `h`, `m`, `s`,
/// `S` (`SSS`, `SSSSSS`, `SSSSSSSSS` fractions), `Z` (+0200), `ZZ` (+02:00), `a` (AM/PM), `E`
/// (`EEE` short day name, `EEEE` name); `'quoted text'` is literal and `''` is a quote.
pub fn joda_to_strftime(pattern: &str) -> Result<String, JodaError> {
    fn literal(out: &mut String, c: char) {
        if c == '%' {
            out.push_str("%%");
        } else {
            out.push(c);
        }
    }
    let err = |message: String, at: usize| JodaError { message, at };
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len() * 2);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' {
            if chars.get(i + 1) == Some(&'\'') {
                out.push('\'');
                i += 2;
                continue;
            }
            let open = i;
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err(err("unterminated quoted text in date format".to_string(), open)),
                    Some('\'') if chars.get(i + 1) == Some(&'\'') => {
                        out.push('\'');
                        i += 2;
                    }
                    Some('\'') => {
                        i += 1;
                        break;
                    }
                    Some(&ch) => {
                        literal(&mut out, ch);
                        i += 1;
                    }
                }
            }
            continue;
        }
        if !c.is_ascii_alphabetic() {
            literal(&mut out, c);
            i += 1;
            continue;
        }
        let mut n = 1;
        while chars.get(i + n) == Some(&c) {
            n += 1;
        }
        let spec = match (c, n) {
            ('y' | 'Y' | 'u', 2) => "%y",
            ('y' | 'Y' | 'u', _) => "%Y",
            ('M', 1 | 2) => "%m",
            ('M', 3) => "%b",
            ('M', _) => "%B",
            ('d', 1 | 2) => "%d",
            ('D', 1..=3) => "%j",
            ('H', 1 | 2) => "%H",
            ('h', 1 | 2) => "%I",
            ('m', 1 | 2) => "%M",
            ('s', 1 | 2) => "%S",
            ('S', 3) => "%3f",
            ('S', 6) => "%6f",
            ('S', 9) => "%9f",
            ('S', _) => return Err(err("fractions of a second are written SSS, SSSSSS or SSSSSSSSS".to_string(), i)),
            ('Z', 1) => "%z",
            ('Z', 2) => "%:z",
            ('Z' | 'z', _) => {
                return Err(err("time zone names are not supported; use Z (+0200) or ZZ (+02:00)".to_string(), i));
            }
            ('a', 1) => "%p",
            ('E', 1..=3) => "%a",
            ('E', _) => "%A",
            _ => {
                let run: String = chars[i..i + n].iter().collect();
                return Err(err(format!("unsupported date pattern `{run}`"), i));
            }
        };
        out.push_str(spec);
        i += n;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translates_logstash_patterns() {
        assert_eq!(joda_to_strftime("dd/MMM/yyyy:HH:mm:ss Z").unwrap(), "%d/%b/%Y:%H:%M:%S %z");
        assert_eq!(joda_to_strftime("yyyy-MM-dd HH:mm:ss,SSS").unwrap(), "%Y-%m-%d %H:%M:%S,%3f");
        assert_eq!(joda_to_strftime("yyyy-MM-dd'T'HH:mm:ssZZ").unwrap(), "%Y-%m-%dT%H:%M:%S%:z");
        assert_eq!(joda_to_strftime("EEE MMM dd HH:mm:ss yyyy").unwrap(), "%a %b %d %H:%M:%S %Y");
        assert_eq!(joda_to_strftime("yy MMMM d h a 'o''clock' 100%").unwrap(), "%y %B %d %I %p o'clock 100%%");
        assert_eq!(joda_to_strftime("YYYY.MM.dd").unwrap(), "%Y.%m.%d");
    }

    #[test]
    fn errors_say_where() {
        assert_eq!(joda_to_strftime("yyyy 'open").unwrap_err().at, 5);
        let e = joda_to_strftime("yyyy Q").unwrap_err();
        assert_eq!((e.at, e.message.as_str()), (5, "unsupported date pattern `Q`"));
        assert!(joda_to_strftime("HH zzz").unwrap_err().message.contains("zone names"));
    }
}
