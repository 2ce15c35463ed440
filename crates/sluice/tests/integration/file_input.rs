//! The `file` input through the real binary: tailing, rotation (rename and copytruncate),
//! truncation, deletion, a file rewritten under the same inode, tiny and huge lines, multiline
//! stack traces, many files at once, `read_from: end`, resuming after a restart, gzip, UTF-16,
//! registry positions and their cleanup (`clean_removed_after`), config errors for bad globs
//! and regular expressions, and patterns written with `./`, `..`, repeated separators and
//! symbolic links to directories matching the files they name.

use crate::common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;

/// A pipeline from a file input (its YAML flow mapping, `{dir}` expanded) to `out.log`.
fn config(input: &str) -> String {
    format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
pipelines:
  f:
    workers: 2
    batch: {{size: 500, delay: 5ms}}
    inputs: [{input}]
    outputs: [{{type: file, path: '{{dir}}/out.log'}}]
"
    )
}

fn events(s: &Sluice) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(s.path("out.log")).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn messages(s: &Sluice) -> Vec<String> {
    events(s).iter().map(|e| e["message"].as_str().unwrap_or("").to_string()).collect()
}

/// Waits until `n` events are in the output.
fn wait_events(s: &mut Sluice, n: usize) -> Vec<serde_json::Value> {
    let started = std::time::Instant::now();
    loop {
        let e = events(s);
        if e.len() >= n {
            return e;
        }
        if let Ok(Some(status)) = s.child.try_wait() {
            panic!("sluice exited ({status}):\n{}", s.log());
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{} of {n} events arrived:\n{}", e.len(), s.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Counts of each message.
fn counts(s: &Sluice) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for msg in messages(s) {
        *m.entry(msg).or_insert(0) += 1;
    }
    m
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

fn numbered(prefix: &str, range: std::ops::Range<usize>) -> String {
    range.map(|i| format!("{prefix} {i}\n")).collect()
}

fn logs(s: &Sluice) -> PathBuf {
    let d = s.path("logs");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A started sluice reading `{dir}/logs/<include>`, with the directory created first.
fn start(input_extra: &str, include: &str) -> Sluice {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let cfg =
        config(&format!("{{type: file, include: ['{{dir}}/logs/{include}'], scan_interval: 200ms{input_extra}}}"));
    let mut s = Sluice::start_in(dir, &cfg, Stdio::null());
    s.wait_log("file input watching", Duration::from_secs(20));
    s
}

#[test]
fn tails_small_and_empty_files_with_metadata_and_resumes_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(logs.join("sub")).unwrap();
    std::fs::write(logs.join("one.log"), "x").unwrap(); // 1 byte, no newline yet
    std::fs::write(logs.join("empty.log"), "").unwrap();
    std::fs::write(logs.join("sub/deep.log"), "deep 1\n").unwrap();
    std::fs::write(logs.join("skip.txt"), "not matched\n").unwrap();
    let cfg = config(
        "{type: file, include: ['{dir}/logs/**/*.log'], exclude: ['**/ignored*'], scan_interval: 200ms, \
         offset_field: /at, host_field: null}",
    );
    let mut s = Sluice::start_in(dir, &cfg, Stdio::null());
    let e = wait_events(&mut s, 1);
    assert_eq!(e[0]["message"], "deep 1");
    assert!(e[0]["log"]["file"]["path"].as_str().unwrap().ends_with("logs/sub/deep.log"), "{}", e[0]);
    assert_eq!(e[0]["at"], 0);
    assert!(e[0].get("host").is_none());
    // The 1-byte file's line is finished; the empty file gets its first line.
    append(&s.path("logs/one.log"), "\n");
    append(&s.path("logs/empty.log"), "e1\ne2\n");
    append(&s.path("logs/ignored.log"), "never\n");
    wait_events(&mut s, 4);
    let e = events(&s);
    let e2 = e.iter().find(|e| e["message"] == "e2").unwrap();
    assert_eq!(e2["at"], 3, "offset of the second line");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    // Written while stopped: exactly these lines are read after the restart.
    let dir = s.into_dir();
    append(&dir.path().join("logs/empty.log"), "e3\n");
    append(&dir.path().join("logs/new.log"), "n1\n");
    let mut s = Sluice::start_in(dir, &cfg, Stdio::null());
    wait_events(&mut s, 6);
    std::thread::sleep(Duration::from_millis(500));
    let mut got = messages(&s);
    got.sort();
    assert_eq!(got, ["deep 1", "e1", "e2", "e3", "n1", "x"]);
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn rotation_by_rename_while_writing_loses_and_repeats_nothing() {
    let mut s = start("", "app.log");
    let path = s.path("logs/app.log");
    let total = 20_000;
    for i in 0..total {
        append(&path, &format!("line {i}\n"));
        if i % 4000 == 2000 {
            // A file renamed away before the input ever saw it at a matching path cannot be
            // found (the docs say so): let each generation be seen before it is rotated.
            let seen = format!("line {}", i - 1000);
            wait_until("a line of this generation", Duration::from_secs(30), || messages(&s).contains(&seen));
        }
        if i % 4000 == 3999 {
            std::fs::rename(&path, s.path(&format!("logs/app.log.{}", i / 4000))).unwrap();
        }
        if i % 500 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // Not asserted here: the assertion below names what is missing.
    eventually(Duration::from_secs(30), || counts(&s).len() >= total);
    std::thread::sleep(Duration::from_millis(300));
    let c = counts(&s);
    let missing: Vec<usize> = (0..total).filter(|i| !c.contains_key(&format!("line {i}"))).collect();
    assert!(
        missing.is_empty(),
        "{} missing, from {:?} to {:?}:\n{}",
        missing.len(),
        missing.first(),
        missing.last(),
        s.log()
    );
    assert!(c.values().all(|&n| n == 1), "no line twice");
    s.stop();
}

#[test]
fn copytruncate_and_truncation_read_again_from_the_start() {
    let mut s = start("", "*.log");
    let path = s.path("logs/app.log");
    append(&path, &numbered("before", 0..100));
    wait_events(&mut s, 100);
    // copytruncate: copy away (not matched), truncate in place, the writer goes on.
    std::fs::copy(&path, s.path("logs/app.log.1")).unwrap();
    std::fs::OpenOptions::new().write(true).truncate(true).open(&path).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    append(&path, &numbered("after", 0..10));
    wait_events(&mut s, 110);
    s.wait_log("reading it again from the start", Duration::from_secs(10));
    // Truncated to a size that is still smaller than where we were.
    std::fs::write(&path, "short\n").unwrap();
    wait_events(&mut s, 111);
    let c = counts(&s);
    assert_eq!(c.len(), 111, "{c:?}");
    assert!(c.values().all(|&n| n == 1));
    assert!(s.log().contains("app.log"), "the warning names the file");
    s.stop();
}

#[test]
fn a_file_rewritten_under_the_same_inode_is_read_from_its_start() {
    let mut s = start("", "*.log");
    let path = s.path("logs/app.log");
    append(&path, &numbered("old", 0..5));
    wait_events(&mut s, 5);
    // Rewritten in place with more bytes than were read: the size alone cannot tell.
    let text = numbered("new", 0..50);
    let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(&path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    drop(f);
    wait_events(&mut s, 55);
    let c = counts(&s);
    assert!((0..50).all(|i| c.get(&format!("new {i}")) == Some(&1)), "{c:?}");
    // Seen as rewritten, or as truncated if the reader looked between the truncation and the write.
    s.wait_log("reading it again from the start", Duration::from_secs(5));
    s.stop();
}

#[test]
fn a_deleted_file_is_read_to_its_end_and_closed() {
    let mut s = start("", "*.log");
    let path = s.path("logs/app.log");
    append(&path, &numbered("d", 0..1000));
    wait_events(&mut s, 1000);
    std::fs::remove_file(&path).unwrap();
    let fd_dir = format!("/proc/{}/fd", s.child.id());
    let open_deleted = || {
        std::fs::read_dir(&fd_dir)
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .any(|t| t.to_string_lossy().contains("app.log"))
    };
    wait_until("the deleted file to be closed", Duration::from_secs(15), || !open_deleted());
    assert_eq!(counts(&s).len(), 1000);
    s.stop();
}

#[test]
fn a_ten_mib_line_is_cut_and_tagged_and_the_file_flows_on() {
    let mut s = start("", "*.log");
    let path = s.path("logs/big.log");
    let mut text = "a".repeat(10 << 20);
    text.push('\n');
    text.push_str("after\n");
    append(&path, &text);
    let e = wait_events(&mut s, 2);
    assert_eq!(e[0]["message"].as_str().unwrap().len(), 1 << 20);
    assert_eq!(e[0]["tags"], serde_json::json!(["_line_truncated"]));
    assert_eq!(e[1]["message"], "after");
    assert_eq!(e[1]["log"]["offset"], (10 << 20) + 1);
    s.stop();
}

#[test]
fn java_stack_traces_become_one_event_each() {
    let mut s = start(r#", multiline: {start_pattern: '^\d{4}-\d{2}-\d{2} ', timeout: 300ms}"#, "*.log");
    let trace = "2024-05-01 10:00:00 ERROR request failed
java.lang.IllegalStateException: bad state
\tat com.example.Service.handle(Service.java:42)
\tat com.example.Server.run(Server.java:7)
Caused by: java.io.IOException: disk full
\tat com.example.Store.write(Store.java:99)
\t... 2 more
2024-05-01 10:00:01 INFO recovered
";
    append(&s.path("logs/app.log"), trace);
    // The last event is handed out by the timeout, since no next line starts.
    let e = wait_events(&mut s, 2);
    let first = e[0]["message"].as_str().unwrap();
    assert!(first.starts_with("2024-05-01 10:00:00 ERROR request failed\njava.lang.IllegalStateException"), "{first}");
    assert!(first.ends_with("\t... 2 more"), "{first}");
    assert_eq!(first.lines().count(), 7);
    assert_eq!(e[1]["message"], "2024-05-01 10:00:01 INFO recovered");
    assert_eq!(e[1]["log"]["offset"], trace.find("2024-05-01 10:00:01").unwrap());
    s.stop();
}

/// Far more files than may be open, written to round after round: every round arrives. (Files
/// closed to make room used to be opened again at once whether they had grown or not, ahead
/// of files that had, which then waited for ever.)
#[test]
fn files_beyond_max_open_files_all_get_their_turn() {
    let mut s = start(", max_open_files: 3", "*.log");
    let logs = logs(&s);
    for round in 0..5 {
        for f in 0..20 {
            append(&logs.join(format!("f{f}.log")), &format!("f{f} {round}\n"));
        }
        wait_events(&mut s, 20 * (round + 1));
    }
    let c = counts(&s);
    assert_eq!(c.len(), 100);
    assert!(c.values().all(|&n| n == 1), "{c:?}");
    s.stop();
}

#[test]
fn a_thousand_files_at_once() {
    let mut s = start(", max_open_files: 200", "**/*.log");
    let logs = logs(&s);
    for d in 0..10 {
        std::fs::create_dir_all(logs.join(format!("d{d}"))).unwrap();
        for f in 0..100 {
            std::fs::write(logs.join(format!("d{d}/f{f}.log")), numbered(&format!("d{d}f{f}"), 0..3)).unwrap();
        }
    }
    wait_events(&mut s, 3000);
    // A second round to files that may have been closed to stay under max_open_files.
    for d in 0..10 {
        for f in 0..100 {
            append(&logs.join(format!("d{d}/f{f}.log")), &format!("d{d}f{f} 3\n"));
        }
    }
    wait_events(&mut s, 4000);
    std::thread::sleep(Duration::from_millis(300));
    let c = counts(&s);
    assert_eq!(c.len(), 4000);
    assert!(c.values().all(|&n| n == 1));
    s.stop();
}

#[test]
fn read_from_end_skips_what_was_there_at_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    std::fs::write(dir.path().join("logs/old.log"), numbered("old", 0..100)).unwrap();
    let cfg = config("{type: file, include: ['{dir}/logs/*.log'], read_from: end, scan_interval: 200ms}");
    let mut s = Sluice::start_in(dir, &cfg, Stdio::null());
    s.wait_log("file input watching", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    append(&s.path("logs/old.log"), "appended\n");
    // A file that appears later is new: read from its start.
    append(&s.path("logs/later.log"), "later 1\nlater 2\n");
    wait_events(&mut s, 3);
    std::thread::sleep(Duration::from_millis(300));
    let mut m = messages(&s);
    m.sort();
    assert_eq!(m, ["appended", "later 1", "later 2"]);
    let stats = get_json(&s.api(), "/stats");
    let read = "appended\n".len() + "later 1\nlater 2\n".len();
    assert_eq!(
        stats["pipelines"]["f"]["components"][0]["bytes_in"], read,
        "the bytes read, not what was skipped: {stats}"
    );
    s.stop();
}

#[test]
fn gzip_files_are_read_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let gz = std::fs::File::create(dir.path().join("logs/old.log.gz")).unwrap();
    let mut enc = flate2::write::GzEncoder::new(gz, flate2::Compression::fast());
    enc.write_all(numbered("gz", 0..5000).as_bytes()).unwrap();
    enc.finish().unwrap();
    let cfg = config("{type: file, include: ['{dir}/logs/*.gz'], scan_interval: 200ms}");
    let compressed = std::fs::metadata(dir.path().join("logs/old.log.gz")).unwrap().len();
    let mut s = Sluice::start_in(dir, &cfg, Stdio::null());
    wait_events(&mut s, 5000);
    s.wait_log("gzip file read to its end", Duration::from_secs(10));
    let bytes_in =
        |s: &mut Sluice| get_json(&s.api(), "/stats")["pipelines"]["f"]["components"][0]["bytes_in"].as_u64();
    assert_eq!(bytes_in(&mut s), Some(compressed), "what the disk gave: the compressed file, once");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    let mut s = Sluice::start_in(s.into_dir(), &cfg, Stdio::null());
    s.wait_log("file input watching", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(800));
    let c = counts(&s);
    assert_eq!(c.len(), 5000);
    assert!(c.values().all(|&n| n == 1), "read once, not again after a restart");
    assert_eq!(bytes_in(&mut s), Some(0), "a gzip file read to its end is not read again");
    s.stop();
}

#[test]
fn utf16_and_latin1_are_decoded() {
    let mut s = start(", encoding: utf-16le", "*.u16");
    let mut bytes = vec![0xFF, 0xFE];
    bytes.extend("héllo wörld\r\nzweite Zeile ✓\n".encode_utf16().flat_map(u16::to_le_bytes));
    std::fs::write(s.path("logs/a.u16"), &bytes).unwrap();
    wait_events(&mut s, 2);
    assert_eq!(messages(&s), ["héllo wörld", "zweite Zeile ✓"]);
    s.stop();
    let mut s = start(", encoding: latin1", "*.txt");
    std::fs::write(s.path("logs/a.txt"), b"caf\xe9\n").unwrap();
    wait_events(&mut s, 1);
    assert_eq!(messages(&s), ["café"]);
    s.stop();
}

#[test]
fn bad_globs_and_regular_expressions_are_config_errors() {
    let (ok, text) = validate(&config("{type: file, include: ['/var/log/[a.log']}"));
    assert!(!ok);
    assert!(text.contains("pipelines.f.inputs[0].include: bad glob pattern `/var/log/[a.log`"), "{text}");
    let (ok, text) = validate(&config("{type: file, include: ['/x/*.log'], multiline: {start_pattern: '(unclosed'}}"));
    assert!(!ok);
    assert!(text.contains("pipelines.f.inputs[0].multiline.start_pattern: bad regular expression"), "{text}");
    let (ok, text) = validate(&config("{type: file, include: ['/x/*.log'], encoding: klingon}"));
    assert!(!ok && text.contains("unknown encoding `klingon`"), "{text}");
    let (ok, text) = validate(&config("{type: file, include: []}"));
    assert!(!ok && text.contains("include: needs at least one glob pattern"), "{text}");
}

#[test]
fn an_unreadable_file_is_reported_and_the_rest_flows() {
    let mut s = if is_root() {
        // Root reads every file whatever its mode: the node runs as `nobody` instead (util-linux's
        // `setpriv` execs it, so signals still reach it), in directories anyone may write.
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        for d in [dir.path(), logs.as_path()] {
            std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        }
        let cfg = config("{type: file, include: ['{dir}/logs/*.log'], scan_interval: 200ms}");
        let nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"];
        let mut s = Sluice::start_wrapped(dir, &cfg, &nobody);
        s.wait_log("file input watching", Duration::from_secs(20));
        s
    } else {
        start("", "*.log")
    };
    let locked = s.path("logs/locked.log");
    std::fs::write(&locked, "secret\n").unwrap();
    let mut perms = std::fs::metadata(&locked).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o000);
    std::fs::set_permissions(&locked, perms).unwrap();
    append(&s.path("logs/open.log"), "fine\n");
    wait_events(&mut s, 1);
    s.wait_log("cannot open this file", Duration::from_secs(10));
    assert!(s.log().contains("locked.log"));
    assert_eq!(messages(&s), ["fine"]);
    s.stop();
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// The file input's keys in the registry, as `sluice registry show --json` sees them.
fn registry_keys(s: &Sluice) -> Vec<(String, u64, String)> {
    let out = std::process::Command::new(BIN)
        .args(["registry", "show", "--json", "--data-dir", s.path("data").to_str().unwrap()])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    v["entries"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|e| e["key"].as_str().is_some_and(|k| k.starts_with("file:")))
                .map(|e| {
                    let path = e["meta"]["path"].as_str().unwrap_or("").to_string();
                    (e["key"].as_str().unwrap().to_string(), e["offset"].as_u64().unwrap_or(0), path)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn positions_are_in_the_registry_and_gone_files_are_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let cfg = config("{type: file, include: ['{dir}/logs/*.log'], scan_interval: 200ms, clean_removed_after: 1s}")
        .replace("api:", "registry: {flush_interval: 50ms}\napi:");
    let mut s = Sluice::start_in(dir, &cfg, Stdio::null());
    s.wait_log("file input watching", Duration::from_secs(20));
    append(&s.path("logs/a.log"), "one\ntwo\n");
    wait_events(&mut s, 2);
    wait_until("the position in the registry", Duration::from_secs(10), || {
        registry_keys(&s).iter().any(|(k, off, path)| k.starts_with("file:f/") && *off == 8 && path.ends_with("a.log"))
    });
    std::fs::remove_file(s.path("logs/a.log")).unwrap();
    wait_until("the gone file's position to be removed", Duration::from_secs(15), || registry_keys(&s).is_empty());
    s.wait_log("gone longer than clean_removed_after", Duration::from_secs(5));
    s.stop();
}

/// The lines of one busy file are made into events on several threads; with one worker they
/// must still come out in file order, each with its own offset and the file's path.
#[test]
fn a_big_file_comes_out_in_file_order_with_one_worker() {
    const LINES: usize = 120_000;
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs/a-directory-name-long-enough");
    std::fs::create_dir_all(&logs).unwrap();
    let text = numbered("line", 0..LINES);
    std::fs::write(logs.join("big.log"), &text).unwrap();
    let cfg = "data_dir: '{dir}/data'
api: {address: '127.0.0.1:0'}
pipelines:
  f:
    workers: 1
    inputs: [{type: file, include: ['{dir}/logs/**/*.log'], read_buffer: 4KiB}]
    outputs: [{type: file, path: '{dir}/out.log'}]
";
    let mut s = Sluice::start_in(dir, cfg, Stdio::null());
    let e = wait_events(&mut s, LINES);
    assert_eq!(e.len(), LINES);
    let mut offset = 0u64;
    for (i, event) in e.iter().enumerate() {
        let expected = format!("line {i}");
        assert_eq!(event["message"], expected.as_str(), "event {i} out of order: {event}");
        assert_eq!(event["log"]["offset"], offset, "{event}");
        assert!(
            event["log"]["file"]["path"].as_str().unwrap().ends_with("logs/a-directory-name-long-enough/big.log"),
            "{event}"
        );
        offset += expected.len() as u64 + 1;
    }
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
}

/// An `include` that matches nothing (here: a directory that is not there yet) is said once,
/// and the input picks the file up when it appears.
#[test]
fn an_include_that_matches_nothing_is_warned_about_once() {
    let mut s = Sluice::start(&config("{type: file, include: ['{dir}/not-yet/*.log'], scan_interval: 50ms}"));
    s.wait_log("no file matches `include`", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(s.log().matches("no file matches `include`").count(), 1, "{}", s.log());
    std::fs::create_dir_all(s.path("not-yet")).unwrap();
    append(&s.path("not-yet/a.log"), "first\n");
    wait_events(&mut s, 1);
}

/// Runs sluice in `cwd` (a directory under `dir`) with one file input of `include` and
/// `exclude` (`{dir}` expanded) until `n` events are out and a moment passes with no more; each
/// event's message and path, sorted.
fn read_from(dir: tempfile::TempDir, cwd: &str, include: &[&str], exclude: &[&str], n: usize) -> Vec<(String, String)> {
    let list = |l: &[&str]| l.iter().map(|p| format!("'{p}'")).collect::<Vec<_>>().join(", ");
    let cfg = config(&format!(
        "{{type: file, include: [{}], exclude: [{}], scan_interval: 100ms, host_field: null}}",
        list(include),
        list(exclude)
    ));
    let cwd = dir.path().join(cwd);
    let mut s = Sluice::start_wrapped(dir, &cfg, &["env", "-C", cwd.to_str().unwrap()]);
    wait_events(&mut s, n);
    std::thread::sleep(Duration::from_millis(500));
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    assert!(!log.contains("no file matches"), "{log}");
    let mut got: Vec<(String, String)> = events(&s)
        .iter()
        .map(|e| (e["message"].as_str().unwrap().to_string(), e["log"]["file"]["path"].as_str().unwrap().to_string()))
        .collect();
    got.sort();
    got
}

/// A directory with `logs/a.log` and `logs/b.log` (two lines each) and an `app` directory.
fn two_logs() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    std::fs::create_dir_all(dir.path().join("app")).unwrap();
    for f in ["a", "b"] {
        std::fs::write(dir.path().join(format!("logs/{f}.log")), format!("{f} 1\n{f} 2\n")).unwrap();
    }
    (dir, d)
}

fn both(d: &str) -> Vec<(String, String)> {
    ["a 1", "a 2", "b 1", "b 2"].iter().map(|m| (m.to_string(), format!("{d}/logs/{}.log", &m[..1]))).collect()
}

/// `./logs/*.log`, the style the examples teach, reads the files from the working directory.
#[test]
fn an_include_starting_with_dot_slash_reads_its_files() {
    let (dir, d) = two_logs();
    assert_eq!(read_from(dir, ".", &["./logs/*.log"], &[], 4), both(&d));
}

#[test]
fn an_include_with_repeated_separators_reads_its_files() {
    let (dir, d) = two_logs();
    assert_eq!(read_from(dir, ".", &["logs//*.log"], &[], 4), both(&d));
    let (dir, d) = two_logs();
    assert_eq!(read_from(dir, "app", &[&format!("{d}//logs///*.log")], &[], 4), both(&d));
}

/// `..` leaves the directory before it; the paths events carry hold no `..`, and an `exclude`
/// spelled another way still leaves its file out.
#[test]
fn an_include_with_dot_dot_reads_its_files_and_its_excludes_apply() {
    let (dir, d) = two_logs();
    let got = read_from(dir, "app", &["../logs/*.log", "{dir}/app/../logs/./*.log"], &[&format!("{d}/logs/b.log")], 2);
    assert_eq!(got, both(&d)[..2]);
    let (dir, d) = two_logs();
    assert_eq!(read_from(dir, "app", &["{dir}/logs/../logs/*.log"], &["./../logs/a.log"], 2), both(&d)[2..]);
}

/// A symbolic link to a directory is followed where the pattern names it; `..` after one leaves
/// the link's target, as the file system does.
#[test]
fn an_include_through_a_symlinked_directory_reads_its_files() {
    let (dir, _) = two_logs();
    let d = dir.path().canonicalize().unwrap().to_str().unwrap().to_string();
    std::fs::create_dir_all(dir.path().join("real/deep")).unwrap();
    std::fs::create_dir_all(dir.path().join("real/other")).unwrap();
    std::fs::write(dir.path().join("real/other/o.log"), "o 1\n").unwrap();
    std::os::unix::fs::symlink("logs", dir.path().join("current")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("real/deep"), dir.path().join("app/link")).unwrap();
    let got = read_from(dir, "app", &["../current/*.log", "./link/../other/*.log"], &["{dir}/current/b.log"], 3);
    assert_eq!(
        got,
        [
            ("a 1".to_string(), format!("{d}/current/a.log")),
            ("a 2".to_string(), format!("{d}/current/a.log")),
            ("o 1".to_string(), format!("{d}/real/other/o.log")),
        ]
    );
}
