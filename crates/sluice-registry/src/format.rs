//! The on-disk format of the registry and its recovery.
//!
//! Two files live in the registry directory, each opening with a 32-byte header that carries a
//! magic, a format version and a **generation**:
//!
//! - `snapshot`: every entry as one record, then an end record holding the entry count;
//! - `log`: records appended since the snapshot of the same generation.
//!
//! A record is `len: u32 LE | crc32c(payload): u32 LE | payload`; the payload is
//! `kind: u8 | updated_ms: u64 | offset: u64 | key_len: u32 | key | meta (JSON, may be empty)`.
//!
//! Compaction writes `snapshot.tmp` with generation g+1 (fsync, rename, fsync dir), then a fresh
//! `log.tmp` with generation g+1 (fsync, rename, fsync dir). Every intermediate state recovers:
//! a leftover `*.tmp` is ignored and removed; a log whose generation is older than the snapshot's
//! is already contained in the snapshot and is ignored. Recovery keeps the records before the first
//! bad one (short, bad checksum, malformed) and says where it stopped.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

pub(crate) const SNAPSHOT: &str = "snapshot";
pub(crate) const SNAPSHOT_TMP: &str = "snapshot.tmp";
pub(crate) const LOG: &str = "log";
pub(crate) const LOG_TMP: &str = "log.tmp";
pub(crate) const LOCK: &str = "lock";

const LOG_MAGIC: &[u8; 8] = b"SLREGLOG";
const SNAPSHOT_MAGIC: &[u8; 8] = b"SLREGSNP";
const VERSION: u32 = 1;
pub(crate) const HEADER_LEN: usize = 32;
const RECORD_HEADER_LEN: usize = 8;
const PAYLOAD_FIXED_LEN: usize = 1 + 8 + 8 + 4;
/// Larger than any record the registry writes (see the limits below); a length above it is
/// corruption.
const MAX_RECORD_LEN: usize = 16 << 20;
/// The longest key the registry writes; longer keys are refused (and logged) by the writer.
pub(crate) const MAX_KEY_LEN: usize = 64 << 10;
/// The largest metadata (as JSON) the registry keeps; larger metadata is refused by `set_meta`.
pub(crate) const MAX_META_LEN: usize = 1 << 20;

/// Sets the offset and replaces the metadata.
pub(crate) const KIND_SET_WITH_META: u8 = 1;
/// Sets the offset and keeps the metadata the key already has.
pub(crate) const KIND_SET_OFFSET: u8 = 2;
pub(crate) const KIND_REMOVE: u8 = 3;
/// Closes a snapshot; its offset field holds the number of entries before it.
pub(crate) const KIND_SNAPSHOT_END: u8 = 4;

/// Metadata of a key, kept both parsed (for readers) and encoded (for the writer).
#[derive(Debug)]
pub(crate) struct Meta {
    pub value: Value,
    pub bytes: Box<[u8]>,
}

impl Meta {
    pub fn new(value: Value) -> Meta {
        let bytes = if value.is_null() {
            Box::default()
        } else {
            // Serialising a `Value` cannot fail: its map keys are strings.
            serde_json::to_vec(&value).unwrap_or_default().into_boxed_slice()
        };
        Meta { value, bytes }
    }

    pub fn null() -> Meta {
        Meta { value: Value::Null, bytes: Box::default() }
    }

    fn decode(bytes: &[u8]) -> Result<Meta, String> {
        if bytes.is_empty() {
            return Ok(Meta::null());
        }
        let value = serde_json::from_slice(bytes).map_err(|e| format!("metadata is not valid JSON: {e}"))?;
        Ok(Meta { value, bytes: bytes.into() })
    }
}

/// What the registry holds for a key on disk (or is about to write).
#[derive(Debug, Clone)]
pub(crate) struct DurableEntry {
    pub offset: u64,
    pub meta: Arc<Meta>,
    pub updated_ms: u64,
}

pub(crate) type State = BTreeMap<String, DurableEntry>;

pub(crate) fn header(magic: &[u8; 8], generation: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(magic);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&generation.to_le_bytes());
    let crc = crc32c::crc32c(&h[..24]);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

pub(crate) fn log_header(generation: u64) -> [u8; HEADER_LEN] {
    header(LOG_MAGIC, generation)
}

fn parse_header(buf: &[u8], magic: &[u8; 8]) -> Result<u64, String> {
    if buf.len() < HEADER_LEN {
        return Err(format!("too short for a header ({} bytes)", buf.len()));
    }
    let h = &buf[..HEADER_LEN];
    if &h[..8] != magic {
        return Err("bad magic".into());
    }
    let crc = u32::from_le_bytes(h[24..28].try_into().unwrap_or_default());
    if crc != crc32c::crc32c(&h[..24]) {
        return Err("header checksum mismatch".into());
    }
    let version = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default());
    if version != VERSION {
        return Err(format!("unsupported format version {version}"));
    }
    Ok(u64::from_le_bytes(h[16..24].try_into().unwrap_or_default()))
}

/// Appends one record to `out`.
pub(crate) fn encode_record(out: &mut Vec<u8>, kind: u8, updated_ms: u64, offset: u64, key: &str, meta: &[u8]) {
    let payload_len = PAYLOAD_FIXED_LEN + key.len() + meta.len();
    let start = out.len();
    out.extend_from_slice(&(payload_len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(kind);
    out.extend_from_slice(&updated_ms.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(meta);
    let crc = crc32c::crc32c(&out[start + RECORD_HEADER_LEN..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

#[derive(Debug)]
pub(crate) struct Record<'a> {
    pub kind: u8,
    pub updated_ms: u64,
    pub offset: u64,
    pub key: &'a str,
    pub meta: &'a [u8],
}

/// Decodes the record at `pos`: `Ok(Some((record, next_pos)))`, `Ok(None)` at the clean end of
/// the buffer, `Err(reason)` for a short or damaged record.
fn decode_record(buf: &[u8], pos: usize) -> Result<Option<(Record<'_>, usize)>, String> {
    let rest = &buf[pos..];
    if rest.is_empty() {
        return Ok(None);
    }
    if rest.len() < RECORD_HEADER_LEN {
        return Err(format!("torn record header ({} bytes left)", rest.len()));
    }
    let len = u32::from_le_bytes(rest[..4].try_into().unwrap_or_default()) as usize;
    let crc = u32::from_le_bytes(rest[4..8].try_into().unwrap_or_default());
    if !(PAYLOAD_FIXED_LEN..=MAX_RECORD_LEN).contains(&len) {
        return Err(format!("implausible record length {len}"));
    }
    if rest.len() < RECORD_HEADER_LEN + len {
        return Err(format!("torn record ({len} bytes announced, {} present)", rest.len() - RECORD_HEADER_LEN));
    }
    let payload = &rest[RECORD_HEADER_LEN..RECORD_HEADER_LEN + len];
    if crc32c::crc32c(payload) != crc {
        return Err("record checksum mismatch".into());
    }
    let kind = payload[0];
    let updated_ms = u64::from_le_bytes(payload[1..9].try_into().unwrap_or_default());
    let offset = u64::from_le_bytes(payload[9..17].try_into().unwrap_or_default());
    let key_len = u32::from_le_bytes(payload[17..21].try_into().unwrap_or_default()) as usize;
    if key_len > len - PAYLOAD_FIXED_LEN {
        return Err(format!("key length {key_len} exceeds the record"));
    }
    let key = std::str::from_utf8(&payload[21..21 + key_len]).map_err(|_| "key is not UTF-8".to_string())?;
    let meta = &payload[21 + key_len..];
    if !matches!(kind, KIND_SET_WITH_META | KIND_SET_OFFSET | KIND_REMOVE | KIND_SNAPSHOT_END) {
        return Err(format!("unknown record kind {kind}"));
    }
    Ok(Some((Record { kind, updated_ms, offset, key, meta }, pos + RECORD_HEADER_LEN + len)))
}

/// Applies one set/remove record to `state`.
fn apply(state: &mut State, r: &Record<'_>) -> Result<(), String> {
    match r.kind {
        KIND_SET_WITH_META => {
            let meta = Arc::new(Meta::decode(r.meta)?);
            state.insert(r.key.to_string(), DurableEntry { offset: r.offset, meta, updated_ms: r.updated_ms });
        }
        KIND_SET_OFFSET => match state.get_mut(r.key) {
            Some(e) => {
                e.offset = r.offset;
                e.updated_ms = r.updated_ms;
            }
            None => {
                state.insert(
                    r.key.to_string(),
                    DurableEntry { offset: r.offset, meta: Arc::new(Meta::null()), updated_ms: r.updated_ms },
                );
            }
        },
        KIND_REMOVE => {
            state.remove(r.key);
        }
        _ => return Err(format!("record kind {} does not belong here", r.kind)),
    }
    Ok(())
}

/// What recovery found on disk.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    pub state: State,
    /// The generation a rewritten pair of files must exceed.
    pub max_generation: u64,
    /// The log's generation when it is usable as is (append to it).
    pub log_generation: Option<u64>,
    /// Length of the log's valid prefix (header and whole good records).
    pub log_good_len: u64,
    pub log_len: u64,
    pub snapshot_len: u64,
    /// Something other than a torn log tail was wrong: write a fresh snapshot and log at once.
    pub needs_rewrite: bool,
    /// Human-readable notes about damage, already logged.
    pub warnings: Vec<String>,
}

fn read_optional(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads snapshot and op log from `dir` without changing anything.
pub(crate) fn recover(dir: &Path) -> io::Result<Recovered> {
    let mut rec = Recovered::default();
    let snapshot_path = dir.join(SNAPSHOT);
    let log_path = dir.join(LOG);
    let warn = |rec: &mut Recovered, msg: String| {
        tracing::warn!("{msg}");
        rec.warnings.push(msg);
    };

    // The snapshot: its generation, or None when it is missing or its header is unusable.
    let mut snapshot_generation = None;
    if let Some(buf) = read_optional(&snapshot_path)? {
        rec.snapshot_len = buf.len() as u64;
        match parse_header(&buf, SNAPSHOT_MAGIC) {
            Err(why) => {
                rec.needs_rewrite = true;
                warn(
                    &mut rec,
                    format!(
                        "registry snapshot {} is corrupt ({why}) at offset 0; recovering only what the op log holds",
                        snapshot_path.display()
                    ),
                );
            }
            Ok(generation) => {
                snapshot_generation = Some(generation);
                rec.max_generation = generation;
                let mut pos = HEADER_LEN;
                let mut count = 0u64;
                let mut ended = false;
                loop {
                    // A record that does not decode or apply ends the snapshot's good part.
                    let why = match decode_record(&buf, pos) {
                        Ok(None) => break,
                        Ok(Some((r, next))) if r.kind == KIND_SNAPSHOT_END => {
                            if r.offset != count {
                                warn(
                                    &mut rec,
                                    format!(
                                        "registry snapshot {} ends with a count of {} but holds {count} entries",
                                        snapshot_path.display(),
                                        r.offset
                                    ),
                                );
                                rec.needs_rewrite = true;
                            }
                            ended = true;
                            pos = next;
                            break;
                        }
                        Ok(Some((r, next))) => match apply(&mut rec.state, &r) {
                            Ok(()) => {
                                count += 1;
                                pos = next;
                                continue;
                            }
                            Err(why) => why,
                        },
                        Err(why) => why,
                    };
                    warn(
                        &mut rec,
                        format!(
                            "registry snapshot {} has a bad record at offset {pos} ({why}); keeping the {count} entries before it and the op log",
                            snapshot_path.display()
                        ),
                    );
                    rec.needs_rewrite = true;
                    break;
                }
                if !ended && !rec.needs_rewrite {
                    warn(
                        &mut rec,
                        format!(
                            "registry snapshot {} is incomplete (no end record after offset {pos}); keeping its {count} entries and the op log",
                            snapshot_path.display()
                        ),
                    );
                    rec.needs_rewrite = true;
                }
            }
        }
    }

    let Some(buf) = read_optional(&log_path)? else {
        // No log: a fresh registry, or one whose log vanished. Start a log of the snapshot's generation.
        if snapshot_generation.is_none() && rec.snapshot_len > 0 {
            rec.needs_rewrite = true;
        }
        return Ok(rec);
    };
    rec.log_len = buf.len() as u64;
    let log_generation = match parse_header(&buf, LOG_MAGIC) {
        Ok(g) => g,
        Err(why) => {
            warn(
                &mut rec,
                format!(
                    "registry op log {} is unusable ({why}) at offset 0; its updates since the last snapshot are lost",
                    log_path.display()
                ),
            );
            rec.needs_rewrite = true;
            return Ok(rec);
        }
    };
    rec.max_generation = rec.max_generation.max(log_generation);
    match snapshot_generation {
        Some(s) if log_generation < s => {
            // Compaction was interrupted after the new snapshot was in place: the log is contained in it.
            tracing::info!(log = %log_path.display(), log_generation, snapshot_generation = s,
                "registry op log predates the snapshot (an interrupted compaction); ignoring it");
            rec.needs_rewrite = true;
            return Ok(rec);
        }
        Some(s) if log_generation > s => {
            warn(
                &mut rec,
                format!(
                    "registry op log {} (generation {log_generation}) is newer than the snapshot (generation {s}); applying it, entries in between may be missing",
                    log_path.display()
                ),
            );
            rec.needs_rewrite = true;
        }
        None if log_generation > 0 && !rec.needs_rewrite => {
            warn(
                &mut rec,
                format!(
                    "registry snapshot {} is missing but the op log is of generation {log_generation}; recovering only what the op log holds",
                    snapshot_path.display()
                ),
            );
            rec.needs_rewrite = true;
        }
        _ => {}
    }
    let mut pos = HEADER_LEN;
    loop {
        match decode_record(&buf, pos) {
            Ok(None) => break,
            Ok(Some((r, next))) => {
                if let Err(why) = apply(&mut rec.state, &r) {
                    warn(
                        &mut rec,
                        format!(
                            "registry op log {} has a bad record at offset {pos} ({why}); ignoring it and everything after it",
                            log_path.display()
                        ),
                    );
                    break;
                }
                pos = next;
            }
            Err(why) => {
                warn(
                    &mut rec,
                    format!(
                        "registry op log {} has a bad record at offset {pos} ({why}); ignoring it and everything after it ({} bytes)",
                        log_path.display(),
                        buf.len() - pos
                    ),
                );
                break;
            }
        }
    }
    rec.log_good_len = pos as u64;
    if !rec.needs_rewrite {
        rec.log_generation = Some(log_generation);
    }
    Ok(rec)
}

pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes `contents` to `dir/tmp_name`, fsyncs it, renames it to `dir/name` and fsyncs the directory.
pub(crate) fn replace_file(dir: &Path, tmp_name: &str, name: &str, contents: &[u8]) -> io::Result<()> {
    let tmp = dir.join(tmp_name);
    let mut f = File::create(&tmp)?;
    f.write_all(contents)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// Reserves blocks for `len` bytes of `file` without changing its size (`FALLOC_FL_KEEP_SIZE`),
/// so that appends up to there need no new space. `Ok(false)` where the filesystem cannot
/// reserve (the appends then take space as they go).
pub(crate) fn reserve(file: &File, len: u64) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on a file descriptor we own; no memory is involved.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, len as libc::off_t) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Ok(false),
        _ => Err(e),
    }
}

/// Makes `dir/LOG_TMP`: a log header of `generation`, with `reserve` bytes reserved (see
/// [`reserve`]), fsynced. With `need_reserve`, a reservation the disk cannot make fails it.
pub(crate) fn prepare_log(dir: &Path, generation: u64, reserve_len: u64, need_reserve: bool) -> io::Result<File> {
    let tmp = dir.join(LOG_TMP);
    let mut f = File::options().read(true).write(true).create(true).truncate(true).open(&tmp)?;
    f.write_all(&log_header(generation))?;
    match reserve(&f, reserve_len) {
        Ok(_) => {}
        Err(e) if need_reserve => return Err(e),
        Err(e) => {
            tracing::warn!(file = %tmp.display(), error = %e, "cannot reserve space for the registry op log");
        }
    }
    f.sync_all()?;
    Ok(f)
}

/// Encodes a whole snapshot of `state` with `generation`.
pub(crate) fn encode_snapshot(state: &State, generation: u64) -> Vec<u8> {
    let mut buf = Vec::with_capacity(HEADER_LEN + state.len() * 64);
    buf.extend_from_slice(&header(SNAPSHOT_MAGIC, generation));
    for (key, e) in state {
        encode_record(&mut buf, KIND_SET_WITH_META, e.updated_ms, e.offset, key, &e.meta.bytes);
    }
    encode_record(&mut buf, KIND_SNAPSHOT_END, 0, state.len() as u64, "", &[]);
    buf
}
