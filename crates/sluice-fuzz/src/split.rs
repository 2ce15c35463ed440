//! Cuts one fuzz input into several byte strings, for targets that need more than one file or
//! value. Every input cuts somehow, so no input is wasted, and [`join`] builds the input that
//! cuts into given parts (for seeds and regression inputs).
//!
//! Layout: each part but the last is a little-endian `u16` length followed by that many bytes
//! (fewer if the input ends first); the last part is whatever remains.

/// Cuts `data` into exactly `n` parts (`n >= 1`); missing parts are empty.
pub fn split(data: &[u8], n: usize) -> Vec<&[u8]> {
    let mut parts = Vec::with_capacity(n);
    let mut rest = data;
    for _ in 1..n {
        let len = match rest {
            [a, b, tail @ ..] => {
                rest = tail;
                usize::from(u16::from_le_bytes([*a, *b]))
            }
            _ => {
                rest = &[];
                0
            }
        };
        let (part, tail) = rest.split_at(len.min(rest.len()));
        parts.push(part);
        rest = tail;
    }
    parts.push(rest);
    parts
}

/// The input that [`split`] cuts into `parts`. Panics if a part other than the last is longer
/// than `u16::MAX` bytes (seeds are small).
pub fn join(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 < parts.len() {
            let len = u16::try_from(part.len()).expect("a part of at most 65535 bytes");
            out.extend_from_slice(&len.to_le_bytes());
        }
        out.extend_from_slice(part);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_then_split_gives_the_parts_back() {
        let parts: [&[u8]; 3] = [b"abc", b"", b"tail\x00"];
        assert_eq!(split(&join(&parts), 3), parts);
    }

    #[test]
    fn short_inputs_give_empty_parts() {
        assert_eq!(split(b"", 3), [b"" as &[u8], b"", b""]);
        assert_eq!(split(b"\x05", 2), [b"" as &[u8], b""]);
        assert_eq!(split(b"\x05\x00ab", 2), [b"ab" as &[u8], b""]);
    }
}
