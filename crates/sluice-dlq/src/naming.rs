//! Segment file names. A sealed segment's name carries its summary, so one `read_dir` at
//! start-up rebuilds the index without opening a sealed file.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The file a writer holds an exclusive `flock` on.
pub(crate) const LOCK_FILE: &str = "lock";
const OPEN_SUFFIX: &str = ".open";
/// An empty file whose name records the highest segment id ever used, so ids are never reused
/// after every segment has been deleted (positions kept elsewhere would otherwise point past
/// new entries).
pub(crate) const LAST_ID_PREFIX: &str = "last-segment-";
const SEALED_SUFFIX: &str = ".dlq";

/// What a sealed segment's name records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Summary {
    pub entries: u64,
    pub bytes: u64,
    pub oldest: i64,
    pub newest: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Name {
    Open(u64),
    Sealed(u64, Summary),
}

pub(crate) fn open_name(id: u64) -> String {
    format!("{id:010}{OPEN_SUFFIX}")
}

pub(crate) fn sealed_name(id: u64, s: &Summary) -> String {
    format!("{id:010}_{}_{}_{}_{}{SEALED_SUFFIX}", s.entries, s.bytes, s.oldest, s.newest)
}

pub(crate) fn last_id_name(id: u64) -> String {
    format!("{LAST_ID_PREFIX}{id:010}")
}

fn parse_last_id(name: &str) -> Option<u64> {
    name.strip_prefix(LAST_ID_PREFIX).and_then(parse_id)
}

pub(crate) fn path_of(dir: &Path, id: u64, sealed: Option<&Summary>) -> PathBuf {
    match sealed {
        Some(s) => dir.join(sealed_name(id, s)),
        None => dir.join(open_name(id)),
    }
}

/// Parses a segment file name; anything else is `None`.
pub(crate) fn parse(name: &str) -> Option<Name> {
    if let Some(id) = name.strip_suffix(OPEN_SUFFIX) {
        return parse_id(id).map(Name::Open);
    }
    let mut parts = name.strip_suffix(SEALED_SUFFIX)?.split('_');
    let id = parse_id(parts.next()?)?;
    let entries = parts.next()?.parse().ok()?;
    let bytes = parts.next()?.parse().ok()?;
    let oldest = parts.next()?.parse().ok()?;
    let newest = parts.next()?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some(Name::Sealed(id, Summary { entries, bytes, oldest, newest }))
}

fn parse_id(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The segments of a directory, by id. One `read_dir`; no file is opened or stat-ed.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// `(id, summary or None for an open segment)`, ascending by id, one per id (a sealed name
    /// wins over an open name with the same id, which can only be left by hand).
    pub segments: Vec<(u64, Option<Summary>)>,
    /// Open-named files shadowed by a sealed segment of the same id.
    pub shadowed: Vec<u64>,
    /// Ids recorded by high-water mark files (normally one).
    pub last_ids: Vec<u64>,
}

impl Listing {
    /// The highest segment id this directory has used, as far as its files tell.
    pub fn highest_id(&self) -> u64 {
        let segments = self.segments.last().map_or(0, |(id, _)| *id);
        self.last_ids.iter().copied().max().unwrap_or(0).max(segments)
    }
}

pub(crate) fn list(dir: &Path) -> io::Result<Listing> {
    let mut segments = Vec::new();
    let mut last_ids = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        match parse(name) {
            Some(Name::Open(id)) => segments.push((id, None)),
            Some(Name::Sealed(id, s)) => segments.push((id, Some(s))),
            None => last_ids.extend(parse_last_id(name)),
        }
    }
    // Sealed before open for the same id, so dedup keeps the sealed one.
    segments.sort_unstable_by_key(|(id, s)| (*id, s.is_none()));
    let mut shadowed = Vec::new();
    segments.dedup_by(|later, earlier| {
        let dup = later.0 == earlier.0;
        if dup && later.1.is_none() {
            shadowed.push(later.0);
        }
        dup
    });
    Ok(Listing { segments, shadowed, last_ids })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_reject_strangers() {
        let s = Summary { entries: 12, bytes: 4096, oldest: -7, newest: 1_700_000_000_000_000_000 };
        assert_eq!(sealed_name(42, &s), "0000000042_12_4096_-7_1700000000000000000.dlq");
        assert_eq!(parse(&sealed_name(42, &s)), Some(Name::Sealed(42, s)));
        assert_eq!(parse(&open_name(7)), Some(Name::Open(7)));
        for bad in [
            "lock",
            ".open",
            "x.open",
            "+1.open",
            "0000000042_12_4096_-7.dlq",
            "0000000042_12_4096_-7_1_2.dlq",
            "0000000042_a_4096_-7_1.dlq",
            "0000000042_12_4096_-7_1.dlq.tmp",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
