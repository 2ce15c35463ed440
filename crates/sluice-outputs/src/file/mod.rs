//! `file` output: appends events to files whose path is a template, as JSON lines or text.
//!
//! The path is rendered per event (`%{/field}` parts and `%{+date}` parts from `@timestamp`), so
//! one batch may go to several files; each file gets the batch's lines in one append, in event
//! order, and with `fsync: true` its data is synced to disk before `send` returns. A `send`
//! therefore returns only once its lines are in the files (in the OS page cache, or on disk with
//! `fsync`). Files are opened in append mode on first use and kept open, at most
//! `max_open_files` of them; the least recently used one not in use is closed to make room. A
//! kept handle whose path no longer leads to its file (the file or its directory was removed or
//! moved away) is dropped and the path opened again, so events never go to a deleted file. All
//! are closed by `close`.
//!
//! Guarantees:
//! - **Confinement.** A rendered path stays under its root: the explicit `root:` or else the
//!   template's literal directory (the text before the first `%{` up to its last `/`; the
//!   working directory when there is none). The check is lexical, after normalisation: `..`
//!   components, absolute paths outside the root and NUL bytes are refused; symbolic links
//!   inside the root are followed (events cannot create them).
//! - **The event's fault is permanent at once.** An event whose rendered path cannot be used —
//!   outside the root, empty, naming a directory, a file name emptied by a missing field, or a
//!   path the file system refuses by its form (ENAMETOOLONG, EISDIR, EINVAL, EILSEQ, a directory
//!   below the literal one that is a file, or that is missing with `create_dirs: false`) — is
//!   rejected as permanent with a reason naming the path, so the worker hands it to the dead
//!   letter queue; the rest of the batch goes on.
//! - **The environment's fault is backpressure.** Every other error (ENOSPC, EDQUOT, EACCES,
//!   EROFS, EIO, the literal directory missing or not a directory, any write or sync error) is
//!   retried with backoff as `retry` says, counted in the output's `retries`, logged at warn at
//!   most once per interval naming the path and the error, and delivery resumes by itself when
//!   the error clears; an info line says so. Only when `retry.max_retries` runs out are that
//!   file's events given up (not permanent).
//! - **No broken lines from a failed append.** The file's length is taken before each append; an
//!   append or sync that fails after writing anything is rolled back (truncated to that length)
//!   before the whole group is written again. If the truncate itself fails, or another handle
//!   appended to the same file meanwhile (so truncating would cut its lines), the fragment
//!   stays: it is logged at error, ended with a newline when the file is next opened, and the
//!   whole group is written again after it. No event is lost; the fragment is one broken line.
//! - **No broken line from a crash.** The first time this process opens a file that ends in a
//!   partial line (an append a crash cut short; both codecs write whole lines), the file is cut
//!   back to its last complete line, and a warn line says how many bytes. The cut line's events
//!   were not acknowledged, so the queue (or the source) delivers them again. Only a tail of at
//!   most [`MAX_TORN_TAIL`] bytes is cut: a longer one cannot be an event of ours and is ended
//!   with a newline instead, as is a partial line found when a file is opened again later in
//!   the run (a failed rollback, whose group is then written again after it).
//!
//! The output's `bytes_out` counts the bytes of appends that succeeded (synced, with `fsync`);
//! a newline added after a fragment found in a file is not counted.
//!
//! Blocking file system calls run on tokio's blocking pool; no lock is held across an await.

mod config;

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::Event;
use sluice_expr::Template;

use crate::retry::{Backoff, RetryConfig, StallLog};
use crate::{Aborted, Delivery, Output, OutputContext, Rejected};
pub use config::FileCodec;
use config::FileConfig;

struct FileOutput {
    path: Template,
    /// The file name part of the template as written (after its last `/`), to tell a dot that
    /// a missing field left at the start of a file name from one the template asked for.
    template_file_name: String,
    root: Root,
    codec: FileCodec,
    retry: RetryConfig,
    files: Arc<Files>,
    stall: StallLog,
    ctx: OutputContext,
}

/// The directory rendered paths must stay under.
#[derive(Debug, Clone)]
struct Root {
    /// As configured or taken from the template, for messages.
    shown: String,
    /// Absolute and normalised, for comparing.
    absolute: PathBuf,
    /// The deepest directory no event chooses (the root, or the template's literal directory
    /// when that is deeper): when it is missing or not a directory, the environment is at fault.
    fixed_dir: PathBuf,
    /// The working directory when the output was built; relative paths are taken from it.
    cwd: PathBuf,
}

impl Root {
    /// `path` made absolute from the working directory and normalised lexically (`.` and empty
    /// components dropped). `..` components are refused before this is called.
    fn absolute(&self, path: &Path) -> PathBuf {
        let joined = if path.is_absolute() { path.to_path_buf() } else { self.cwd.join(path) };
        normalise(&joined)
    }

    /// Why `rendered` may not be written to because it leaves the root, if it does.
    fn check(&self, rendered: &Path) -> Option<String> {
        let absolute = self.absolute(rendered);
        if absolute.starts_with(&self.absolute) && absolute != self.absolute {
            None
        } else {
            Some(format!("the rendered path `{}` is outside the root directory `{}`", rendered.display(), self.shown))
        }
    }

    fn fixed_dir_is_usable(&self) -> bool {
        std::fs::metadata(&self.fixed_dir).is_ok_and(|m| m.is_dir())
    }
}

fn normalise(path: &Path) -> PathBuf {
    path.components().filter(|c| !matches!(c, Component::CurDir)).collect()
}

/// The template's literal directory: its text before the first `%{`, up to and including the
/// last `/` in it. Empty when that text has no `/`.
fn literal_dir(template: &Template) -> &str {
    let prefix = template.literal_prefix();
    match prefix.rfind('/') {
        Some(end) => &prefix[..=end],
        None => "",
    }
}

/// The file name part of a template's text: after its last `/` outside `%{...}` parts (which
/// hold field paths with slashes of their own).
fn template_file_name(source: &str) -> String {
    let mut name = String::new();
    let mut rest = source;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("%{")
            && let Some(end) = after.find('}')
        {
            name.push_str(&rest[..end + 3]);
            rest = &after[end + 1..];
            continue;
        }
        let c = rest.chars().next().expect("not empty");
        if c == '/' {
            name.clear();
        } else {
            name.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    name
}

/// A warning for `sluice validate`: a `file` output whose events choose the directory.
pub(crate) fn warnings(spec: &ComponentSpec) -> Vec<ConfigError> {
    let Ok(c) = spec.settings::<FileConfig>() else { return Vec::new() };
    if c.root.is_none() && literal_dir(&c.path).is_empty() && !c.path.is_constant() {
        vec![spec.key_error(
            "path",
            format!(
                "`{}` starts with a `%{{...}}` part, so events choose the directory; they are confined to the \
                 working directory. Start the path with a directory or set `root:`",
                c.path.source()
            ),
        )]
    } else {
        Vec::new()
    }
}

pub(crate) fn build(spec: &ComponentSpec, ctx: OutputContext) -> Result<Arc<dyn Output>, ConfigError> {
    Ok(Arc::new(build_file(spec, ctx)?))
}

fn build_file(spec: &ComponentSpec, ctx: OutputContext) -> Result<FileOutput, ConfigError> {
    let c: FileConfig = spec.settings()?;
    if c.max_open_files == 0 {
        return Err(spec.key_error("max_open_files", "must be at least 1"));
    }
    if c.path.source().trim().is_empty() {
        return Err(spec.key_error("path", "must not be empty"));
    }
    // The template's own text (fields rendered empty) must not climb out either.
    let sample = c.path.render_string(&Event::default());
    if Path::new(&sample).components().any(|p| p == Component::ParentDir) {
        return Err(spec.key_error("path", format!("`{}` must not contain `..` components", c.path.source())));
    }
    let cwd = std::env::current_dir()
        .map_err(|e| spec.error(format!("cannot tell the working directory, which relative paths need: {e}")))?;
    let literal = literal_dir(&c.path);
    let literal_abs = normalise(&cwd.join(if literal.is_empty() { "." } else { literal }));
    let root = match &c.root {
        Some(root) => {
            if root.as_os_str().is_empty() {
                return Err(spec.key_error("root", "must not be empty"));
            }
            if root.components().any(|p| p == Component::ParentDir) {
                return Err(spec.key_error("root", format!("`{}` must not contain `..` components", root.display())));
            }
            let absolute = normalise(&cwd.join(root));
            // A template that starts with a field has no directory of its own: the root alone
            // says where its events may go.
            let literal_abs = if literal.is_empty() { absolute.clone() } else { literal_abs };
            if !absolute.starts_with(&literal_abs) && !literal_abs.starts_with(&absolute) {
                return Err(spec.key_error(
                    "root",
                    format!(
                        "`{}` and the directory `{literal}` the path `{}` starts with are not one inside the \
                         other, so every event would be outside the root",
                        root.display(),
                        c.path.source()
                    ),
                ));
            }
            let fixed_dir = if literal_abs.starts_with(&absolute) { literal_abs } else { absolute.clone() };
            Root { shown: root.display().to_string(), absolute, fixed_dir, cwd }
        }
        None => Root {
            shown: if literal.is_empty() { "the working directory".to_string() } else { literal.to_string() },
            absolute: literal_abs.clone(),
            fixed_dir: literal_abs,
            cwd,
        },
    };
    let template_file_name = template_file_name(c.path.source());
    Ok(FileOutput {
        path: c.path,
        template_file_name,
        root,
        codec: c.codec,
        retry: c.retry,
        files: Arc::new(Files {
            open: Mutex::new(OpenFiles { map: HashMap::new(), clock: 0, opened_before: HashSet::new() }),
            max_open: c.max_open_files,
            create_dirs: c.create_dirs,
            fsync: c.fsync,
            #[cfg(test)]
            injected: Mutex::new(std::collections::VecDeque::new()),
        }),
        stall: StallLog::for_output(&ctx.metrics),
        ctx,
    })
}

/// Whose fault a failed attempt was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The path the event rendered can never be used: reject it for good.
    Event,
    /// Something outside the event: retry (backpressure).
    Environment,
}

/// Where an append failed: only opening looks at the path's form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Open,
    Write,
}

#[derive(Debug)]
struct AppendError {
    stage: Stage,
    error: std::io::Error,
}

impl AppendError {
    fn open(error: std::io::Error) -> AppendError {
        AppendError { stage: Stage::Open, error }
    }
    fn write(error: std::io::Error) -> AppendError {
        AppendError { stage: Stage::Write, error }
    }
}

/// The lines of one batch bound for one file.
struct Group {
    path: PathBuf,
    data: Vec<u8>,
    /// Indexes of the events in `send`'s slice.
    events: Vec<usize>,
    error: Option<AppendError>,
}

/// Open handles, shared by every worker of the pipeline.
struct Files {
    open: Mutex<OpenFiles>,
    max_open: usize,
    create_dirs: bool,
    fsync: bool,
    /// Failures a test asked for, taken one per operation that can fail; never outside tests.
    #[cfg(test)]
    injected: Mutex<std::collections::VecDeque<Injected>>,
}

/// A failure for a test to inject.
#[cfg(test)]
#[derive(Debug, Clone, Copy)]
enum Injected {
    /// Opening the file fails with this errno.
    Open(i32),
    /// The append writes this many bytes, then fails with the errno.
    Write { after: usize, errno: i32 },
    /// The truncate that rolls a failed append back fails with this errno (after a `Write`).
    Truncate(i32),
}

struct OpenFile {
    file: Arc<Mutex<File>>,
    /// Device and inode when opened: when the path leads elsewhere, the handle is stale.
    identity: (u64, u64),
    used: u64,
}

struct OpenFiles {
    map: HashMap<PathBuf, OpenFile>,
    /// Counts uses, to find the least recently used handle.
    clock: u64,
    /// Paths this process has opened, kept after their handle is closed: a partial line found
    /// at a later open may be this run's own (a failed rollback, or a handle still writing),
    /// which must not be cut, while at the first open it can only be a crashed run's.
    opened_before: HashSet<PathBuf>,
}

fn identity(m: &std::fs::Metadata) -> (u64, u64) {
    (m.dev(), m.ino())
}

impl Files {
    /// The handle for `path`, opened (and its directory created) when needed.
    fn handle(&self, path: &Path) -> Result<Arc<Mutex<File>>, AppendError> {
        let mut open = self.open.lock();
        open.clock += 1;
        let now = open.clock;
        if let Some(kept) = open.map.get_mut(path) {
            // One stat per file per batch: a file removed or moved away (its directory deleted,
            // log rotation) would otherwise swallow the events without an error.
            match std::fs::metadata(path) {
                Ok(m) if identity(&m) == kept.identity => {
                    kept.used = now;
                    return Ok(kept.file.clone());
                }
                _ => {
                    tracing::info!(path = %path.display(), "file output: the file was removed or replaced; opening the path again");
                    open.map.remove(path);
                }
            }
        }
        let file = self.open_file(path)?;
        let identity = identity(&file.metadata().map_err(AppendError::write)?);
        if open.opened_before.contains(path) {
            end_with_newline(&file).map_err(AppendError::write)?;
        } else {
            match cut_torn_tail(&file).map_err(AppendError::write)? {
                Tail::Whole => {}
                Tail::Cut(bytes) => {
                    if self.fsync {
                        file.sync_data().map_err(AppendError::write)?;
                    }
                    tracing::warn!(path = %path.display(), bytes_cut = bytes,
                        "file output: the file ended in a partial line (an append cut short by a crash); cut back to \
                         its last complete line (its events were not acknowledged and are delivered again)");
                }
                Tail::TooLong => {
                    end_with_newline(&file).map_err(AppendError::write)?;
                    tracing::warn!(path = %path.display(), max_cut = MAX_TORN_TAIL,
                        "file output: the file ends in a partial line longer than any torn append; it is left \
                         as it is and ended with a newline");
                }
            }
            open.opened_before.insert(path.to_path_buf());
        }
        if open.map.len() >= self.max_open
            && let Some(oldest) = open
                .map
                .iter()
                // A handle a writer holds stays: closing it would let a second handle to the same
                // file write beside it, and a rollback could then cut the other's lines.
                .filter(|(_, f)| Arc::strong_count(&f.file) == 1)
                .min_by_key(|(_, f)| f.used)
                .map(|(p, _)| p.clone())
        {
            open.map.remove(&oldest);
        }
        let file = Arc::new(Mutex::new(file));
        open.map.insert(path.to_path_buf(), OpenFile { file: file.clone(), identity, used: now });
        Ok(file)
    }

    fn open_file(&self, path: &Path) -> Result<File, AppendError> {
        #[cfg(test)]
        if let Some(errno) = self.take_injected(|i| matches!(i, Injected::Open(_))).map(|i| match i {
            Injected::Open(errno) => errno,
            _ => unreachable!(),
        }) {
            return Err(AppendError::open(std::io::Error::from_raw_os_error(errno)));
        }
        let options = || {
            let mut o = OpenOptions::new();
            o.create(true).read(true).append(true);
            o
        };
        match options().open(path) {
            Err(e) if e.kind() == ErrorKind::NotFound && self.create_dirs => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(AppendError::open)?;
                }
                options().open(path).map_err(AppendError::open)
            }
            other => other.map_err(AppendError::open),
        }
    }

    /// Forgets a handle after an error, so the next attempt opens the file again; only the
    /// handle this writer used, not one another writer opened since.
    fn forget(&self, path: &Path, used: &Arc<Mutex<File>>) {
        let mut open = self.open.lock();
        if open.map.get(path).is_some_and(|kept| Arc::ptr_eq(&kept.file, used)) {
            open.map.remove(path);
        }
    }

    /// Appends each group's data; records errors in the groups.
    fn write_groups(&self, groups: &mut [Group]) {
        for g in groups.iter_mut() {
            g.error = self.append(g).err();
        }
    }

    /// Appends the whole group, or nothing: a failure after some bytes is rolled back.
    fn append(&self, g: &Group) -> Result<(), AppendError> {
        let handle = self.handle(&g.path)?;
        let result = {
            let file = handle.lock();
            self.append_locked(&file, g)
        };
        if result.is_err() {
            self.forget(&g.path, &handle);
        }
        result
    }

    fn append_locked(&self, mut file: &File, g: &Group) -> Result<(), AppendError> {
        let before = file.metadata().map_err(AppendError::write)?.len();
        #[cfg(test)]
        let injected = self.take_injected(|i| matches!(i, Injected::Write { .. }));
        let mut written = 0;
        let mut outcome: std::io::Result<()> = Ok(());
        while written < g.data.len() {
            #[cfg(test)]
            if let Some(Injected::Write { after, errno }) = injected
                && written >= after
            {
                outcome = Err(std::io::Error::from_raw_os_error(errno));
                break;
            }
            #[allow(unused_mut)]
            let mut end = g.data.len();
            #[cfg(test)]
            if let Some(Injected::Write { after, .. }) = injected {
                end = end.min(after);
            }
            match file.write(&g.data[written..end]) {
                Ok(0) => {
                    outcome = Err(ErrorKind::WriteZero.into());
                    break;
                }
                Ok(n) => written += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        if outcome.is_ok() && self.fsync {
            outcome = file.sync_data();
        }
        let Err(error) = outcome else { return Ok(()) };
        if written > 0 {
            self.roll_back(file, &g.path, before, written as u64);
        }
        Err(AppendError::write(error))
    }

    /// Cuts a failed append's bytes off again, so its retry does not follow a broken line.
    fn roll_back(&self, file: &File, path: &Path, before: u64, written: u64) {
        let now = match file.metadata() {
            Ok(m) => m.len(),
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e,
                    "file output: cannot roll back a failed append (cannot read the file's length); a broken line stays");
                return;
            }
        };
        if now != before + written {
            tracing::error!(path = %path.display(), expected = before + written, found = now,
                "file output: another writer appended to the file during a failed append; it is not rolled back and a broken line stays");
            return;
        }
        #[cfg(test)]
        if let Some(Injected::Truncate(errno)) = self.take_injected(|i| matches!(i, Injected::Truncate(_))) {
            let e = std::io::Error::from_raw_os_error(errno);
            tracing::error!(path = %path.display(), error = %e,
                "file output: cannot roll back a failed append; a broken line stays and the events are written again after it");
            return;
        }
        if let Err(e) = file.set_len(before) {
            tracing::error!(path = %path.display(), error = %e,
                "file output: cannot roll back a failed append; a broken line stays and the events are written again after it");
        }
    }

    #[cfg(test)]
    fn take_injected(&self, wanted: impl Fn(&Injected) -> bool) -> Option<Injected> {
        let mut queue = self.injected.lock();
        let at = queue.iter().position(wanted)?;
        queue.remove(at)
    }
}

/// Why a rendered path may not be written to, judged by its text alone, if it may not.
fn check_path(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        Some("the path rendered empty")
    } else if path.contains('\0') {
        Some("the rendered path contains a NUL byte")
    } else if path.ends_with('/') || path.ends_with(std::path::MAIN_SEPARATOR) {
        Some("the rendered path names a directory")
    } else if Path::new(path).components().any(|c| c == Component::ParentDir) {
        Some("the rendered path contains a `..` component")
    } else {
        None
    }
}

/// The errno's name when it is one this output tells apart, for reasons and logs.
fn errno_name(e: &std::io::Error) -> Option<&'static str> {
    Some(match e.raw_os_error()? {
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::EISDIR => "EISDIR",
        libc::ENOTDIR => "ENOTDIR",
        libc::EINVAL => "EINVAL",
        libc::EILSEQ => "EILSEQ",
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::ENOSPC => "ENOSPC",
        libc::EDQUOT => "EDQUOT",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::EROFS => "EROFS",
        libc::EIO => "EIO",
        libc::EFBIG => "EFBIG",
        libc::ELOOP => "ELOOP",
        libc::EMFILE => "EMFILE",
        libc::ENFILE => "ENFILE",
        _ => return None,
    })
}

fn describe(e: &std::io::Error) -> String {
    match errno_name(e) {
        Some(name) => format!("{name}: {e}"),
        None => e.to_string(),
    }
}

impl FileOutput {
    fn encode(&self, event: &Event, out: &mut Vec<u8>) {
        match self.codec {
            FileCodec::Json => event.write_json(out),
            FileCodec::Text => match event.message() {
                Some(m) => out.extend_from_slice(m.as_bytes()),
                None => event.write_json(out),
            },
        }
        out.push(b'\n');
    }

    /// Why no event may be written to `rendered`, judged by its text and its root, if none may.
    fn path_refusal(&self, rendered: &str) -> Option<String> {
        if let Some(reason) = check_path(rendered) {
            return Some(format!("{reason}: `{rendered}`"));
        }
        self.root.check(Path::new(rendered))
    }

    /// Why this event may not be written to `rendered` although the path is fine: a field it
    /// lacks left the file name empty or starting with a dot the template did not ask for.
    fn emptied_by_missing_field(&self, event: &Event, rendered: &str) -> Option<String> {
        let file_name = Path::new(rendered).file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
        let emptied = file_name.is_empty() || (file_name.starts_with('.') && !self.template_file_name.starts_with('.'));
        if !emptied {
            return None;
        }
        let field = self.path.missing_field(event)?;
        Some(format!("the event has no field `{field}`, so the file name rendered as `{file_name}`: `{rendered}`"))
    }

    /// Whose fault a failed append was; see the module comment.
    fn fault(&self, e: &AppendError) -> Fault {
        if e.stage == Stage::Write {
            return Fault::Environment;
        }
        match e.error.kind() {
            ErrorKind::InvalidFilename | ErrorKind::IsADirectory | ErrorKind::InvalidInput => Fault::Event,
            _ if e.error.raw_os_error() == Some(libc::EILSEQ) => Fault::Event,
            // Below a usable literal directory, the missing or non-directory part is one the
            // event's fields named. A missing one is created when `create_dirs` is on, so then
            // it vanished in between: retry.
            ErrorKind::NotFound if self.files.create_dirs => Fault::Environment,
            ErrorKind::NotFound | ErrorKind::NotADirectory | ErrorKind::AlreadyExists
                if self.root.fixed_dir_is_usable() =>
            {
                Fault::Event
            }
            _ => Fault::Environment,
        }
    }

    /// Sorts the events into one group per file; events with unusable paths are rejected.
    fn group(&self, events: &[&Event], rejected: &mut Vec<Rejected>) -> Vec<Group> {
        let mut groups: Vec<Group> = Vec::new();
        // Rendered path -> its group once it has one, or why the path itself is refused.
        let mut known: HashMap<String, Result<Option<usize>, String>> = HashMap::new();
        let constant = self.path.is_constant();
        let mut rendered = String::new();
        for (i, event) in events.iter().enumerate() {
            if !constant || i == 0 {
                rendered.clear();
                self.path.render(event, &mut rendered);
            }
            let verdict = match known.get(rendered.as_str()) {
                Some(v) => v.clone(),
                None => {
                    let v = self.path_refusal(&rendered).map_or(Ok(None), Err);
                    known.insert(rendered.clone(), v.clone());
                    v
                }
            };
            let slot = match verdict {
                Ok(slot) => slot,
                Err(reason) => {
                    rejected.push(Rejected::refused(i, reason, 1));
                    continue;
                }
            };
            if let Some(reason) = self.emptied_by_missing_field(event, &rendered) {
                rejected.push(Rejected::refused(i, reason, 1));
                continue;
            }
            let g = match slot {
                Some(g) => g,
                None => {
                    known.insert(rendered.clone(), Ok(Some(groups.len())));
                    groups.push(Group {
                        path: PathBuf::from(&rendered),
                        data: Vec::with_capacity(if constant { events.len() * 256 } else { 4096 }),
                        events: Vec::new(),
                        error: None,
                    });
                    groups.len() - 1
                }
            };
            self.encode(event, &mut groups[g].data);
            groups[g].events.push(i);
        }
        groups
    }
}

#[async_trait]
impl Output for FileOutput {
    async fn send(&self, events: &[&Event]) -> Result<Delivery, Aborted> {
        let mut rejected = Vec::new();
        let mut pending = self.group(events, &mut rejected);
        let mut backoff = Backoff::new(self.retry);
        while !pending.is_empty() {
            let files = self.files.clone();
            let mut groups = std::mem::take(&mut pending);
            let joined = tokio::task::spawn_blocking(move || {
                files.write_groups(&mut groups);
                groups
            })
            .await;
            let groups = match joined {
                Ok(g) => g,
                Err(e) => {
                    // Only a panic in the blocking task gets here; nothing can be said about
                    // what was written, so the events are given up rather than duplicated.
                    tracing::error!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, error = %e, "file output writer failed");
                    return Ok(Delivery::all_gave_up(events.len(), &format!("file output writer failed: {e}"), 1));
                }
            };
            // Only whole appends count: a failed one was rolled back (or its fragment is
            // logged), and its group counts when it is written again.
            let written: usize = groups.iter().filter(|g| g.error.is_none()).map(|g| g.data.len()).sum();
            if written > 0 {
                self.ctx.metrics.bytes_out.add(written as u64);
            }
            for g in groups {
                let Some(e) = &g.error else { continue };
                if self.fault(e) == Fault::Event {
                    let reason = format!("cannot open `{}`: {}", g.path.display(), describe(&e.error));
                    tracing::warn!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, events = g.events.len(),
                        reason = %reason, "file output: the events' path cannot be used; they are rejected");
                    let attempts = backoff.failures() + 1;
                    rejected.extend(g.events.iter().map(|&index| Rejected::refused(index, &reason, attempts)));
                } else {
                    pending.push(g);
                }
            }
            if pending.is_empty() {
                break;
            }
            if !backoff.exhausted_after_this() {
                self.ctx.metrics.retries.add(1);
            }
            let first = &pending[0];
            let error = first.error.as_ref().map(|e| describe(&e.error)).unwrap_or_default();
            let status = format!("cannot write `{}`: {error}", first.path.display());
            if let Some(held_back) = self.stall.retrying(&status) {
                for g in &pending {
                    let e = g.error.as_ref().expect("only failed groups are pending");
                    tracing::warn!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, path = %g.path.display(),
                        error = %describe(&e.error), attempt = backoff.failures() + 1, also_failed_since_last_log = held_back,
                        "file output cannot write; retrying (the pipeline waits)");
                }
            }
            if !backoff.retry(&self.ctx.abort).await? {
                self.stall.gave_up(&status);
                for g in pending.drain(..) {
                    let error = g.error.as_ref().map(|e| describe(&e.error)).unwrap_or_default();
                    let reason = format!("cannot write `{}`: {error}", g.path.display());
                    tracing::error!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, events = g.events.len(),
                        reason = %reason, "file output gave up after max_retries");
                    let attempts = backoff.failures();
                    rejected.extend(g.events.into_iter().map(|index| Rejected::gave_up(index, &reason, attempts)));
                }
            }
        }
        if rejected.iter().all(|r| r.permanent)
            && let Some(failures) = self.stall.succeeded()
        {
            tracing::info!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, failed_attempts = failures,
                "file output writes again");
        }
        rejected.sort_by_key(|r| r.index);
        Ok(Delivery { rejected })
    }

    async fn close(&self) {
        let files = self.files.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let handles: Vec<_> = files.open.lock().map.drain().collect();
            for (path, kept) in handles {
                if files.fsync
                    && let Err(e) = kept.file.lock().sync_all()
                {
                    tracing::warn!(path = %path.display(), error = %e, "cannot sync file at close");
                }
            }
        })
        .await;
    }
}

/// The longest partial last line cut at start: an event's line is at most this long, so a
/// longer one is not the tail of an append of ours (a file some other program wrote) and stays.
const MAX_TORN_TAIL: u64 = 64 << 20;

/// What a file's end was found to be at its first open.
#[derive(Debug, PartialEq, Eq)]
enum Tail {
    /// Empty, or ending with a newline.
    Whole,
    /// Ended in a partial line, these many bytes, now cut off.
    Cut(u64),
    /// Ends in a partial line longer than [`MAX_TORN_TAIL`]: left alone.
    TooLong,
}

/// Cuts a partial last line off (a crash in the middle of an append).
fn cut_torn_tail(file: &File) -> std::io::Result<Tail> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    let floor = len.saturating_sub(MAX_TORN_TAIL);
    let mut buf = vec![0u8; 64 << 10];
    let mut end = len;
    while end > floor {
        let start = end.saturating_sub(buf.len() as u64).max(floor);
        let chunk = &mut buf[..(end - start) as usize];
        file.read_exact_at(chunk, start)?;
        if let Some(at) = chunk.iter().rposition(|&b| b == b'\n') {
            let keep = start + at as u64 + 1;
            if keep == len {
                return Ok(Tail::Whole);
            }
            file.set_len(keep)?;
            return Ok(Tail::Cut(len - keep));
        }
        end = start;
    }
    if len == 0 {
        Ok(Tail::Whole)
    } else if floor == 0 {
        // No newline at all: the file holds only the start of its first append.
        file.set_len(0)?;
        Ok(Tail::Cut(len))
    } else {
        Ok(Tail::TooLong)
    }
}

/// A file found with a partial last line after its first open in this run gets a newline first,
/// so the next event starts on a line of its own instead of being glued to the fragment.
fn end_with_newline(file: &File) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, len - 1)?;
    if last[0] != b'\n' {
        (&*file).write_all(b"\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
