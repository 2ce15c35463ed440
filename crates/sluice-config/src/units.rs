//! Sizes (`64MiB`, `1.5GB`, `4096`) and durations (`500ms`, `5s`, `1m 30s`) in human form.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// A size in bytes. `KB`/`MB`/`GB`/`TB` are powers of 1000; `KiB`/`MiB`/`GiB`/`TiB` and the bare
/// `K`/`M`/`G`/`T` are powers of 1024; a plain number is bytes. Case does not matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn parse(text: &str) -> Result<ByteSize, String> {
        let t = text.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let value: f64 = num.parse().map_err(|_| format!("`{text}` is not a size (like 512KiB, 64MiB, 1GB)"))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "kb" => 1000,
            "k" | "kib" => 1 << 10,
            "mb" => 1000 * 1000,
            "m" | "mib" => 1 << 20,
            "gb" => 1000 * 1000 * 1000,
            "g" | "gib" => 1 << 30,
            "tb" => 1000u64.pow(4),
            "t" | "tib" => 1 << 40,
            other => return Err(format!("unknown size unit `{other}` in `{text}` (use B, KiB, MiB, GiB, KB, MB, GB)")),
        };
        let bytes = value * mult as f64;
        if !bytes.is_finite() || bytes > u64::MAX as f64 {
            return Err(format!("`{text}` is too large"));
        }
        Ok(ByteSize(bytes.round() as u64))
    }

    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
        for (name, size) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{}", self.0 / size, name);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size like 64MiB or a number of bytes")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v).map(ByteSize).map_err(|_| E::custom("a size cannot be negative"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration: `500ms`, `5s`, `2m`, `1h 30m`, `0`. Plain numbers other than 0 are refused, since
/// "is 5 seconds or milliseconds?" should not be a guess.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub fn parse(text: &str) -> Result<HumanDuration, String> {
        let t = text.trim();
        if t == "0" {
            return Ok(HumanDuration(Duration::ZERO));
        }
        humantime::parse_duration(t)
            .map(HumanDuration)
            .map_err(|e| format!("`{text}` is not a duration (like 500ms, 5s, 2m): {e}"))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration like 500ms or 5s")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<HumanDuration, E> {
                if v == 0 {
                    Ok(HumanDuration(Duration::ZERO))
                } else {
                    Err(E::custom(format!("`{v}` has no unit: write {v}ms or {v}s")))
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<HumanDuration, E> {
                self.visit_u64(u64::try_from(v).map_err(|_| E::custom("a duration cannot be negative"))?)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                HumanDuration::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(ByteSize::parse("64MiB").unwrap().0, 64 << 20);
        assert_eq!(ByteSize::parse("1GB").unwrap().0, 1_000_000_000);
        assert_eq!(ByteSize::parse("1.5k").unwrap().0, 1536);
        assert_eq!(ByteSize::parse("42").unwrap().0, 42);
        assert!(ByteSize::parse("12 parsecs").is_err());
        assert!(ByteSize::parse("MiB").is_err());
        assert_eq!(ByteSize(64 << 20).to_string(), "64MiB");
    }

    #[test]
    fn durations() {
        assert_eq!(HumanDuration::parse("500ms").unwrap().0, Duration::from_millis(500));
        assert_eq!(HumanDuration::parse("1m 30s").unwrap().0, Duration::from_secs(90));
        assert_eq!(HumanDuration::parse("0").unwrap().0, Duration::ZERO);
        assert!(HumanDuration::parse("soon").is_err());
    }
}
