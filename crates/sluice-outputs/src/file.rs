//! `file` output: appends events to files whose path is a template, as JSON lines or text.
//!
//! The path is rendered per event (`%{/field}` parts and `%{+date}` parts from `@timestamp`), so
//! one batch may go to several files; each file gets the batch's lines in one append, in event
//! order, and with `fsync: true` its data is synced to disk before `send` returns. A `send`
//! therefore returns only once its lines are in the files (in the OS page cache, or on disk with
//! `fsync`). Files are opened in append mode on first use and kept open, at most
//! `max_open_files` of them; the least recently used is closed to make room. All are closed by
//! `close`.
//!
//! An event whose rendered path is empty, names a directory, or has a `..` component is
//! rejected with a reason: a field value cannot make the output write outside the directories
//! the template names. I/O errors (a full disk, a permission) are retried with backoff as
//! `retry` says; a partly written append is continued where it stopped, not repeated. When the
//! retries run out, the events of that file are rejected with the error.
//!
//! Blocking file system calls run on tokio's blocking pool; no lock is held across an await.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::Event;
use sluice_expr::Template;

use crate::retry::{Backoff, RetryConfig};
use crate::{Aborted, Delivery, Output, OutputContext, Rejected};

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FileCodec {
    /// One JSON object per line.
    #[default]
    Json,
    /// The `message` field (or the event as JSON when it has none), one per line.
    Text,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    path: Template,
    #[serde(default)]
    codec: FileCodec,
    #[serde(default = "yes")]
    create_dirs: bool,
    #[serde(default)]
    fsync: bool,
    #[serde(default = "default_max_open")]
    max_open_files: usize,
    #[serde(default)]
    retry: RetryConfig,
}

fn yes() -> bool {
    true
}
fn default_max_open() -> usize {
    256
}

struct FileOutput {
    path: Template,
    codec: FileCodec,
    retry: RetryConfig,
    files: Arc<Files>,
    ctx: OutputContext,
}

pub(crate) fn build(spec: &ComponentSpec, ctx: OutputContext) -> Result<Arc<dyn Output>, ConfigError> {
    let c: FileConfig = spec.settings()?;
    if c.max_open_files == 0 {
        return Err(spec.key_error("max_open_files", "must be at least 1"));
    }
    // The template's own text (fields rendered empty) must not climb out either.
    let sample = c.path.render_string(&Event::default());
    if Path::new(&sample).components().any(|p| p == Component::ParentDir) {
        return Err(spec.key_error("path", format!("`{}` must not contain `..` components", c.path.source())));
    }
    if c.path.source().trim().is_empty() {
        return Err(spec.key_error("path", "must not be empty"));
    }
    Ok(Arc::new(FileOutput {
        path: c.path,
        codec: c.codec,
        retry: c.retry,
        files: Arc::new(Files {
            open: Mutex::new(OpenFiles { map: HashMap::new(), clock: 0 }),
            max_open: c.max_open_files,
            create_dirs: c.create_dirs,
            fsync: c.fsync,
        }),
        ctx,
    }))
}

/// The lines of one batch bound for one file.
struct Group {
    path: PathBuf,
    data: Vec<u8>,
    /// Bytes of `data` already appended (kept across retries).
    written: usize,
    /// Indexes of the events in `send`'s slice.
    events: Vec<usize>,
    error: Option<String>,
}

/// Open handles, shared by every worker of the pipeline.
struct Files {
    open: Mutex<OpenFiles>,
    max_open: usize,
    create_dirs: bool,
    fsync: bool,
}

struct OpenFiles {
    map: HashMap<PathBuf, (Arc<Mutex<File>>, u64)>,
    /// Counts uses, to find the least recently used handle.
    clock: u64,
}

impl Files {
    /// The handle for `path`, opened (and its directory created) when needed.
    fn handle(&self, path: &Path) -> std::io::Result<Arc<Mutex<File>>> {
        let mut open = self.open.lock();
        open.clock += 1;
        let now = open.clock;
        if let Some((file, used)) = open.map.get_mut(path) {
            *used = now;
            return Ok(file.clone());
        }
        let file = match OpenOptions::new().create(true).read(true).append(true).open(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && self.create_dirs => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)?;
                }
                OpenOptions::new().create(true).read(true).append(true).open(path)?
            }
            other => other?,
        };
        end_with_newline(&file)?;
        if open.map.len() >= self.max_open
            && let Some(oldest) = open.map.iter().min_by_key(|(_, (_, used))| *used).map(|(p, _)| p.clone())
        {
            // A writer still holding the handle finishes with it; the file closes after that.
            open.map.remove(&oldest);
        }
        let file = Arc::new(Mutex::new(file));
        open.map.insert(path.to_path_buf(), (file.clone(), now));
        Ok(file)
    }

    /// Forgets a handle after an error, so the next attempt opens the file again.
    fn forget(&self, path: &Path) {
        self.open.lock().map.remove(path);
    }

    /// Appends what is left of each group's data; records errors in the groups.
    fn write_groups(&self, groups: &mut [Group]) {
        for g in groups.iter_mut() {
            g.error = self.append(g).err().map(|e| e.to_string());
            if g.error.is_some() {
                self.forget(&g.path);
            }
        }
    }

    fn append(&self, g: &mut Group) -> std::io::Result<()> {
        let file = self.handle(&g.path)?;
        let mut file = file.lock();
        while g.written < g.data.len() {
            match file.write(&g.data[g.written..]) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => g.written += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.fsync {
            file.sync_data()?;
        }
        Ok(())
    }
}

/// Why a rendered path may not be written to, if it may not.
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

    /// Sorts the events into one group per file; events with unusable paths are rejected.
    fn group(&self, events: &[&Event], rejected: &mut Vec<Rejected>) -> Vec<Group> {
        let mut groups: Vec<Group> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let constant = self.path.is_constant();
        let mut rendered = String::new();
        for (i, event) in events.iter().enumerate() {
            if !constant || i == 0 {
                rendered.clear();
                self.path.render(event, &mut rendered);
            }
            if let Some(reason) = check_path(&rendered) {
                rejected.push(Rejected::refused(i, format!("{reason}: `{rendered}`"), 1));
                continue;
            }
            let g = match index.get(rendered.as_str()) {
                Some(&g) => g,
                None => {
                    index.insert(rendered.clone(), groups.len());
                    groups.push(Group {
                        path: PathBuf::from(&rendered),
                        data: Vec::with_capacity(if constant { events.len() * 256 } else { 4096 }),
                        written: 0,
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
            pending = groups.into_iter().filter(|g| g.error.is_some()).collect();
            if pending.is_empty() {
                break;
            }
            for g in &pending {
                tracing::warn!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, path = %g.path.display(),
                    error = g.error.as_deref().unwrap_or_default(), attempt = backoff.failures() + 1,
                    "cannot write to file; retrying");
            }
            if !backoff.retry(&self.ctx.abort).await? {
                for g in pending.drain(..) {
                    let reason = format!("cannot write {}: {}", g.path.display(), g.error.unwrap_or_default());
                    tracing::error!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, events = g.events.len(),
                        reason = %reason, "file output gave up after retries");
                    let attempts = backoff.failures();
                    rejected.extend(g.events.into_iter().map(|index| Rejected::gave_up(index, &reason, attempts)));
                }
            }
        }
        rejected.sort_by_key(|r| r.index);
        Ok(Delivery { rejected })
    }

    async fn close(&self) {
        let files = self.files.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let handles: Vec<_> = files.open.lock().map.drain().collect();
            for (path, (file, _)) in handles {
                if files.fsync
                    && let Err(e) = file.lock().sync_all()
                {
                    tracing::warn!(path = %path.display(), error = %e, "cannot sync file at close");
                }
            }
        })
        .await;
    }
}
/// A file left with a partial last line (a crash mid-write) gets a newline first, so the next
/// event starts on a line of its own instead of being glued to the fragment.
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
