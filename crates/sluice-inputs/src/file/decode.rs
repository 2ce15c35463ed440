//! Text encodings of files.
//!
//! Lines are split in the file's own encoding (so offsets stay byte offsets into the file) and
//! each line is then decoded to UTF-8. For UTF-16 the delimiter is searched as 2-byte code
//! units at even distances from the line start, so a byte pair inside a character is never
//! mistaken for it. Every other encoding `encoding_rs` knows is ASCII-compatible, so the
//! delimiter is searched as plain bytes. Bytes that are invalid in the encoding become U+FFFD;
//! nothing is dropped. A byte order mark at the start of a file is skipped.

use encoding_rs::{Encoding, UTF_8, UTF_16BE, UTF_16LE};
use sluice_core::Str;

#[derive(Debug, Clone, Copy)]
pub(crate) struct TextEncoding {
    encoding: &'static Encoding,
}

impl TextEncoding {
    /// By WHATWG label: `utf-8`, `utf-16le`, `utf-16be`, `latin1` (decoded as windows-1252,
    /// its superset), `shift_jis`, ...
    pub(crate) fn for_label(label: &str) -> Option<TextEncoding> {
        let label = match label.to_ascii_lowercase().as_str() {
            "utf16le" | "utf-16" => "utf-16le".to_string(),
            "utf16be" => "utf-16be".to_string(),
            "utf8" => "utf-8".to_string(),
            other => other.to_string(),
        };
        Encoding::for_label(label.as_bytes()).map(|encoding| TextEncoding { encoding })
    }

    pub(crate) fn is_utf8(self) -> bool {
        self.encoding == UTF_8
    }

    /// The width of a code unit: delimiters only match at multiples of it from a line start.
    pub(crate) fn unit(self) -> usize {
        if self.encoding == UTF_16LE || self.encoding == UTF_16BE { 2 } else { 1 }
    }

    /// The delimiter as bytes of this encoding.
    pub(crate) fn encode_delimiter(self, delimiter: &str) -> Vec<u8> {
        if self.encoding == UTF_16LE {
            delimiter.encode_utf16().flat_map(u16::to_le_bytes).collect()
        } else if self.encoding == UTF_16BE {
            delimiter.encode_utf16().flat_map(u16::to_be_bytes).collect()
        } else {
            let (bytes, _, _) = self.encoding.encode(delimiter);
            bytes.into_owned()
        }
    }

    /// The length of a byte order mark at the start of `head`, if it has one of ours.
    pub(crate) fn bom_len(self, head: &[u8]) -> usize {
        match Encoding::for_bom(head) {
            Some((enc, len)) if enc == self.encoding => len,
            _ => 0,
        }
    }

    pub(crate) fn decode(self, bytes: &[u8]) -> Str {
        if self.is_utf8() {
            return crate::codec::text(bytes);
        }
        let (text, _) = self.encoding.decode_without_bom_handling(bytes);
        Str::from(text.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_delimiters() {
        let le = TextEncoding::for_label("UTF-16LE").unwrap();
        assert_eq!((le.unit(), le.encode_delimiter("\n")), (2, vec![b'\n', 0]));
        let be = TextEncoding::for_label("utf-16be").unwrap();
        assert_eq!(be.encode_delimiter("\n"), vec![0, b'\n']);
        let latin = TextEncoding::for_label("latin1").unwrap();
        assert_eq!((latin.unit(), latin.decode(b"caf\xe9").as_str()), (1, "café"));
        assert!(TextEncoding::for_label("klingon").is_none());
        assert_eq!(le.decode(&[b'h', 0, b'i', 0]).as_str(), "hi");
        assert_eq!(le.bom_len(&[0xFF, 0xFE, b'h', 0]), 2);
        assert_eq!(le.bom_len(&[b'h', 0]), 0);
    }
}
