//! Faults the file system would have to be broken to show: a write that fails part-way (ENOSPC,
//! EIO), a rollback that fails, a permission refused on open. Injected through `Files::injected`.

use sluice_core::{Map, Value};

use super::*;

fn output(yaml: &str) -> FileOutput {
    let spec = crate::test_support::spec(yaml);
    let ctx = crate::test_support::context("test", "file");
    build_file(&spec, ctx).unwrap_or_else(|e| panic!("{e}"))
}

fn quick(dir: &Path, retry: &str) -> FileOutput {
    output(&format!("{{type: file, path: '{}/%{{/k}}.log', codec: text, retry: {retry}}}", dir.display()))
}

const FAST: &str = "{initial_backoff: 1ms, max_backoff: 1ms}";

fn events(k: &str, messages: &[&str]) -> Vec<Event> {
    messages
        .iter()
        .map(|m| {
            let mut fields = Map::default();
            fields.insert("k", Value::from(k));
            fields.insert("message", Value::from(*m));
            Event::from_object_at(fields, 1_700_000_000_000_000_000)
        })
        .collect()
}

async fn send_all(out: &FileOutput, events: &[Event]) -> Delivery {
    let refs: Vec<&Event> = events.iter().collect();
    tokio::time::timeout(std::time::Duration::from_secs(20), out.send(&refs)).await.unwrap().unwrap()
}

fn inject(out: &FileOutput, faults: &[Injected]) {
    out.files.injected.lock().extend(faults.iter().copied());
}

async fn a_write_failing_part_way_is_rolled_back_and_written_whole(errno: i32) {
    let dir = tempfile::tempdir().unwrap();
    let out = quick(dir.path(), FAST);
    assert!(send_all(&out, &events("a", &["zero"])).await.rejected.is_empty());
    // The failure comes in the middle of the second line of the append.
    inject(&out, &[Injected::Write { after: 9, errno }]);
    let d = send_all(&out, &events("a", &["one", "two", "three"])).await;
    assert!(d.rejected.is_empty(), "{:?}", d.rejected);
    assert_eq!(std::fs::read_to_string(dir.path().join("a.log")).unwrap(), "zero\none\ntwo\nthree\n");
    assert_eq!(out.ctx.metrics.retries.get(), 1);
    // The rolled-back attempt counts nothing: sent bytes are what the file holds.
    assert_eq!(out.ctx.metrics.bytes_out.get(), "zero\none\ntwo\nthree\n".len() as u64);
    assert!(out.files.injected.lock().is_empty(), "the fault was used");
}

#[tokio::test]
async fn enospc_in_the_middle_of_an_append_leaves_no_broken_line() {
    a_write_failing_part_way_is_rolled_back_and_written_whole(libc::ENOSPC).await;
}

#[tokio::test]
async fn eio_in_the_middle_of_an_append_leaves_no_broken_line() {
    a_write_failing_part_way_is_rolled_back_and_written_whole(libc::EIO).await;
}

#[tokio::test]
async fn a_rollback_that_fails_leaves_one_broken_line_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = quick(dir.path(), FAST);
    assert!(send_all(&out, &events("a", &["zero"])).await.rejected.is_empty());
    inject(&out, &[Injected::Write { after: 6, errno: libc::ENOSPC }, Injected::Truncate(libc::EIO)]);
    let d = send_all(&out, &events("a", &["one", "two"])).await;
    assert!(d.rejected.is_empty(), "{:?}", d.rejected);
    // The fragment `one\ntw` stays; the reopen ends it with a newline; the group follows whole.
    assert_eq!(std::fs::read_to_string(dir.path().join("a.log")).unwrap(), "zero\none\ntw\none\ntwo\n");
    // Only the whole appends count, not the fragment of the failed one nor its newline.
    assert_eq!(out.ctx.metrics.bytes_out.get(), "zero\none\ntwo\n".len() as u64);
}

#[tokio::test]
async fn a_permission_refused_on_open_is_retried_until_it_clears() {
    let dir = tempfile::tempdir().unwrap();
    let out = quick(dir.path(), FAST);
    inject(&out, &[Injected::Open(libc::EACCES), Injected::Open(libc::EACCES), Injected::Open(libc::EROFS)]);
    let d = send_all(&out, &events("a", &["one"])).await;
    assert!(d.rejected.is_empty(), "{:?}", d.rejected);
    assert_eq!(out.ctx.metrics.retries.get(), 3);
    assert_eq!(std::fs::read_to_string(dir.path().join("a.log")).unwrap(), "one\n");
}

#[tokio::test]
async fn environment_faults_give_up_only_at_max_retries_and_not_as_the_events_fault() {
    let dir = tempfile::tempdir().unwrap();
    let out = quick(dir.path(), "{max_retries: 1, initial_backoff: 1ms}");
    inject(&out, &[Injected::Open(libc::EACCES), Injected::Open(libc::EDQUOT)]);
    let d = send_all(&out, &events("a", &["one", "two"])).await;
    assert_eq!(d.rejected.len(), 2);
    assert!(d.rejected.iter().all(|r| !r.permanent && r.attempts == 2), "{:?}", d.rejected);
    assert!(d.rejected[0].reason.contains("EDQUOT"), "{}", d.rejected[0].reason);
    assert_eq!(out.ctx.metrics.retries.get(), 1, "one retry, then it gave up");
}

#[tokio::test]
async fn open_errors_by_the_form_of_the_path_are_the_events_fault() {
    let dir = tempfile::tempdir().unwrap();
    let out = quick(dir.path(), FAST);
    inject(&out, &[Injected::Open(libc::EINVAL), Injected::Open(libc::EILSEQ)]);
    let mut batch = events("bad", &["x"]);
    batch.extend(events("worse", &["y"]));
    batch.extend(events("fine", &["z"]));
    let d = send_all(&out, &batch).await;
    assert_eq!(d.rejected.iter().map(|r| (r.index, r.permanent)).collect::<Vec<_>>(), [(0, true), (1, true)]);
    assert!(d.rejected[0].reason.contains("EINVAL") && d.rejected[1].reason.contains("EILSEQ"), "{:?}", d.rejected);
    assert_eq!(out.ctx.metrics.retries.get(), 0);
    assert_eq!(std::fs::read_to_string(dir.path().join("fine.log")).unwrap(), "z\n");
}

#[test]
fn the_template_file_name_skips_slashes_inside_fields() {
    assert_eq!(template_file_name("/var/log/.%{/a}%{/b/c}-x.log"), ".%{/a}%{/b/c}-x.log");
    assert_eq!(template_file_name("out/%{/svc}/app.log"), "app.log");
    assert_eq!(template_file_name("%{/dir}"), "%{/dir}");
    assert_eq!(template_file_name("a/%{unterminated/b"), "b");
}

/// A file a crashed run left ending in a partial line is cut back to its last complete line at
/// its first open, so the new lines follow whole ones; a file with no newline at all held only
/// the start of its first append.
#[tokio::test]
async fn a_torn_last_line_from_a_crash_is_cut_at_the_first_open() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.log"), "one\ntwo\nthr").unwrap();
    std::fs::write(dir.path().join("b.log"), "half a li").unwrap();
    std::fs::write(dir.path().join("c.log"), "whole\n").unwrap();
    let out = quick(dir.path(), FAST);
    let mut batch = events("a", &["three", "four"]);
    batch.extend(events("b", &["x"]));
    batch.extend(events("c", &["y"]));
    assert!(send_all(&out, &batch).await.rejected.is_empty());
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    assert_eq!(read("a.log"), "one\ntwo\nthree\nfour\n");
    assert_eq!(read("b.log"), "x\n");
    assert_eq!(read("c.log"), "whole\ny\n");
}

#[test]
fn only_a_tail_without_a_newline_is_cut_and_a_whole_file_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let open = |text: &[u8]| {
        std::fs::write(&path, text).unwrap();
        OpenOptions::new().read(true).append(true).open(&path).unwrap()
    };
    assert_eq!(cut_torn_tail(&open(b"")).unwrap(), Tail::Whole);
    assert_eq!(cut_torn_tail(&open(b"a\nb\n")).unwrap(), Tail::Whole);
    assert_eq!(std::fs::read(&path).unwrap(), b"a\nb\n");
    // A partial line longer than one read of the backwards scan.
    let mut long = b"first\n".to_vec();
    long.extend(std::iter::repeat_n(b'z', 200_000));
    assert_eq!(cut_torn_tail(&open(&long)).unwrap(), Tail::Cut(200_000));
    assert_eq!(std::fs::read(&path).unwrap(), b"first\n");
}
