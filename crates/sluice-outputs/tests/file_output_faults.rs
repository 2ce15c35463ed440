//! The `file` output against hostile events and a changing file system: an event's own fault is
//! rejected for good at once, the environment's is retried until it clears (backpressure), and
//! no rendered path leaves its root.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{build, build_err, build_with, context, event, refs};
use serde_json::json;
use sluice_outputs::Output;
use sluice_testkit::wait_until_async;

fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()))
}

/// Long enough for any retry loop here to have turned several times; a send that should not
/// retry must be back long before.
const PATIENCE: Duration = Duration::from_secs(20);

async fn send(out: &dyn Output, events: &[sluice_core::Event]) -> sluice_outputs::Delivery {
    tokio::time::timeout(PATIENCE, out.send(&refs(events)))
        .await
        .expect("the send came back (an event's own fault must not be retried)")
        .expect("not aborted")
}

#[tokio::test]
async fn a_name_too_long_is_refused_at_once_and_the_rest_is_written() {
    let dir = tempfile::tempdir().unwrap();
    // No retry limit: before, the output retried the open forever and nothing behind it moved.
    let out = build(&format!("{{type: file, path: '{}/%{{/name}}.log'}}", dir.path().display()));
    let long = "n".repeat(300);
    let events = vec![
        event(json!({"name": "ok", "message": "first"})),
        event(json!({"name": long, "message": "too long"})),
        event(json!({"name": "ok", "message": "after"})),
    ];
    let d = send(&*out, &events).await;
    assert_eq!(d.rejected.iter().map(|r| r.index).collect::<Vec<_>>(), [1]);
    let r = &d.rejected[0];
    assert!(r.permanent, "the event's own name is at fault: {r:?}");
    assert!(r.reason.contains("ENAMETOOLONG") && r.reason.contains(&long), "{}", r.reason);
    assert_eq!(read(dir.path().join("ok.log")).lines().count(), 2);
}

#[tokio::test]
async fn a_path_naming_a_directory_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let out = build(&format!("{{type: file, path: '{}/%{{/name}}'}}", dir.path().display()));
    let events = vec![event(json!({"name": "sub"})), event(json!({"name": "fine.log"}))];
    let d = send(&*out, &events).await;
    assert_eq!(d.rejected.len(), 1, "{:?}", d.rejected);
    assert!(d.rejected[0].permanent && d.rejected[0].reason.contains("EISDIR"), "{:?}", d.rejected[0]);
    assert_eq!(read(dir.path().join("fine.log")).lines().count(), 1);
}

#[tokio::test]
async fn a_directory_an_event_names_through_a_file_is_its_fault_but_a_missing_root_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("plain"), "").unwrap();
    let out = build(&format!(
        "{{type: file, path: '{}/%{{/a}}/x.log', create_dirs: false, retry: {{initial_backoff: 5ms, max_backoff: 5ms}}}}",
        root.display()
    ));
    // `plain` is a file and `absent` does not exist: with create_dirs off, both are what the
    // events' values named below a directory that is there.
    let events = vec![event(json!({"a": "plain"})), event(json!({"a": "absent"}))];
    let d = send(&*out, &events).await;
    assert_eq!(d.rejected.len(), 2, "{:?}", d.rejected);
    assert!(d.rejected.iter().all(|r| r.permanent), "{:?}", d.rejected);
    assert!(d.rejected[0].reason.contains("ENOTDIR"), "{}", d.rejected[0].reason);
    assert!(d.rejected[1].reason.contains("ENOENT"), "{}", d.rejected[1].reason);
}

#[tokio::test]
async fn an_absolute_path_from_a_field_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("escaped");
    // Relative template starting with a field: confined to the working directory.
    let out = build("{type: file, path: '%{/dir}/x.log'}");
    let d = send(&*out, &[event(json!({"dir": target.display().to_string()}))]).await;
    assert_eq!(d.rejected.len(), 1);
    assert!(d.rejected[0].permanent);
    assert!(d.rejected[0].reason.contains("outside the root directory"), "{}", d.rejected[0].reason);
    assert!(d.rejected[0].reason.contains("the working directory"), "{}", d.rejected[0].reason);
    assert!(!target.exists(), "nothing was written outside the root");
}

#[tokio::test]
async fn a_path_must_stay_under_the_literal_directory_or_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().display();
    // Literal directory `<base>/logs/`: a field holding `/` and an absolute path stays inside.
    let out = build(&format!("{{type: file, path: '{base}/logs/%{{/name}}.log'}}"));
    let events = vec![event(json!({"name": "a//./b"})), event(json!({"name": "./"})), event(json!({"name": "c"}))];
    let d = send(&*out, &events).await;
    assert!(d.rejected.is_empty(), "{:?}", d.rejected);
    assert!(dir.path().join("logs/a/b.log").exists() && dir.path().join("logs/c.log").exists());
    assert!(dir.path().join("logs/.log").exists(), "`./` is a value, not a missing field");

    // An explicit root wider than the literal text: the field may choose the directory, but
    // only inside the root.
    let out = build(&format!("{{type: file, root: '{base}/inner', path: '{base}/%{{/name}}.log'}}"));
    let events = vec![event(json!({"name": "inner/ok"})), event(json!({"name": "outer"}))];
    let d = send(&*out, &events).await;
    assert_eq!(d.rejected.iter().map(|r| r.index).collect::<Vec<_>>(), [1]);
    let reason = &d.rejected[0].reason;
    assert!(reason.contains(&format!("{base}/outer.log")) && reason.contains(&format!("`{base}/inner`")), "{reason}");
    assert!(dir.path().join("inner/ok.log").exists());
    assert!(!dir.path().join("outer.log").exists());

    // The rendered path may not be the root itself.
    let out = build(&format!("{{type: file, root: '{base}/r', path: '{base}/r%{{/x}}'}}"));
    assert!(send(&*out, &[event(json!({"x": ""}))]).await.rejected[0].permanent);

    assert!(build_err(&format!("{{type: file, root: '{base}/a', path: '{base}/b/%{{/x}}'}}")).contains("root"));
    assert!(build_err("{type: file, root: '../up', path: 'x/%{/x}'}").contains("`..`"));
    assert!(build_err("{type: file, root: '', path: 'x/%{/x}'}").contains("root"));
}

#[tokio::test]
async fn a_file_name_emptied_by_a_missing_field_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let out = build(&format!("{{type: file, path: '{}/out/%{{/service}}.log'}}", dir.path().display()));
    let events = vec![event(json!({"message": "no service"})), event(json!({"service": "api"}))];
    let d = send(&*out, &events).await;
    assert_eq!(d.rejected.len(), 1, "{:?}", d.rejected);
    assert!(d.rejected[0].permanent);
    assert!(d.rejected[0].reason.contains("`/service`"), "{}", d.rejected[0].reason);
    assert!(!dir.path().join("out/.log").exists());
    assert!(dir.path().join("out/api.log").exists());

    // A template that asks for a dot keeps it; a missing field elsewhere in the name is fine.
    let out = build(&format!("{{type: file, path: '{}/.%{{/a}}%{{/b}}-x.log'}}", dir.path().display()));
    let d = send(&*out, &[event(json!({"a": "h"}))]).await;
    assert!(d.rejected.is_empty(), "{:?}", d.rejected);
    assert!(dir.path().join(".h-x.log").exists());
}

#[tokio::test]
async fn the_directory_removed_while_running_is_created_again() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    let out = build(&format!("{{type: file, path: '{}/app.log', codec: text}}", logs.display()));
    let first = vec![event(json!({"message": "before"}))];
    assert!(send(&*out, &first).await.rejected.is_empty());
    std::fs::remove_dir_all(&logs).unwrap();
    // Before, the kept handle wrote on into the deleted file: no error, and the event was gone.
    let second = vec![event(json!({"message": "after"}))];
    assert!(send(&*out, &second).await.rejected.is_empty());
    assert_eq!(read(logs.join("app.log")), "after\n");
}

#[tokio::test]
async fn a_file_moved_away_is_opened_again_at_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.log");
    let out = build(&format!("{{type: file, path: '{}', codec: text}}", path.display()));
    assert!(send(&*out, &[event(json!({"message": "one"}))]).await.rejected.is_empty());
    std::fs::rename(&path, dir.path().join("app.log.1")).unwrap();
    assert!(send(&*out, &[event(json!({"message": "two"}))]).await.rejected.is_empty());
    assert_eq!(read(&path), "two\n");
    assert_eq!(read(dir.path().join("app.log.1")), "one\n");
}

/// The environment's fault: the send waits (counting retries) while the directory is missing
/// or not a directory, and delivers once it is back. Running as root, a read-only mode would not
/// stop the writes, so the directory is taken away or replaced by a regular file instead.
async fn stalls_then_resumes(break_it: impl FnOnce(&Path), mend_it: impl FnOnce(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let ctx = context();
    let metrics = ctx.metrics.clone();
    let out = build_with(
        &format!(
            "{{type: file, path: '{}/%{{/k}}.log', codec: text, create_dirs: false, \
             retry: {{initial_backoff: 5ms, max_backoff: 20ms}}}}",
            logs.display()
        ),
        ctx,
    );
    assert!(send(&*out, &[event(json!({"k": "a", "message": "before"}))]).await.rejected.is_empty());
    break_it(&logs);
    let sending = tokio::spawn(async move {
        let events = vec![event(json!({"k": "a", "message": "during"})), event(json!({"k": "b", "message": "new"}))];
        let d = out.send(&refs(&events)).await;
        (d, out)
    });
    wait_until_async("the output retried three times", PATIENCE, || metrics.retries.get() >= 3).await;
    assert!(!sending.is_finished(), "the send waits while the directory is unusable");
    mend_it(&logs);
    let (d, _out) = tokio::time::timeout(PATIENCE, sending).await.expect("resumed").unwrap();
    assert!(d.unwrap().rejected.is_empty(), "every event delivered once the directory is back");
    assert_eq!(read(logs.join("a.log")).lines().last(), Some("during"));
    assert_eq!(read(logs.join("b.log")), "new\n");
}

#[tokio::test]
async fn the_directory_removed_without_create_dirs_holds_the_pipeline_back_until_it_is_back() {
    stalls_then_resumes(|logs| std::fs::remove_dir_all(logs).unwrap(), |logs| std::fs::create_dir(logs).unwrap()).await;
}

#[tokio::test]
async fn the_directory_replaced_by_a_file_holds_the_pipeline_back_until_it_is_a_directory_again() {
    stalls_then_resumes(
        |logs| {
            std::fs::remove_dir_all(logs).unwrap();
            std::fs::write(logs, "not a directory").unwrap();
        },
        |logs| {
            std::fs::remove_file(logs).unwrap();
            std::fs::create_dir(logs).unwrap();
        },
    )
    .await;
}

#[tokio::test]
async fn the_literal_directory_replaced_by_a_file_is_retried_even_with_create_dirs() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::write(&logs, "in the way").unwrap();
    let ctx = context();
    let metrics = ctx.metrics.clone();
    let out = build_with(
        &format!(
            "{{type: file, path: '{}/%{{/k}}.log', retry: {{max_retries: 2, initial_backoff: 5ms, max_backoff: 5ms}}}}",
            logs.display()
        ),
        ctx,
    );
    let d = send(&*out, &[event(json!({"k": "a"}))]).await;
    assert_eq!(d.rejected.len(), 1);
    assert!(!d.rejected[0].permanent, "not the event's fault: {:?}", d.rejected[0]);
    assert!(d.rejected[0].reason.contains("ENOTDIR"), "{}", d.rejected[0].reason);
    assert_eq!(metrics.retries.get(), 2);
}

#[tokio::test]
async fn a_template_starting_with_a_field_goes_where_the_root_allows() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().display();
    let out = build(&format!("{{type: file, root: '{base}/logs', path: '%{{/dir}}/x.log'}}"));
    let events = vec![event(json!({"dir": format!("{base}/logs/a")})), event(json!({"dir": format!("{base}/b")}))];
    let d = send(&*out, &events).await;
    assert_eq!(d.rejected.iter().map(|r| r.index).collect::<Vec<_>>(), [1]);
    assert!(dir.path().join("logs/a/x.log").exists());
    assert!(!dir.path().join("b").exists());
}

/// Runs a command, true when it succeeded.
fn run(program: &str, args: &[&str]) -> bool {
    std::process::Command::new(program).args(args).status().is_ok_and(|s| s.success())
}

/// The directory made read-only while running, for real: a read-only bind mount over it (root
/// ignores a directory's mode, not a read-only mount). New files cannot be created (EROFS):
/// the send waits, retrying; once the mount is writable again it delivers.
#[tokio::test]
async fn the_directory_made_read_only_holds_the_pipeline_back_until_it_is_writable() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let at = logs.to_str().unwrap();
    if !run("mount", &["--bind", at, at]) {
        sluice_testkit::root::root_unavailable("a read-only bind mount", "`mount --bind` failed");
        return;
    }
    // Whatever happens below, the bind mount goes.
    struct Unmount(String);
    impl Drop for Unmount {
        fn drop(&mut self) {
            if !run("umount", &[&self.0]) {
                run("umount", &["-l", &self.0]);
            }
        }
    }
    let _unmount = Unmount(at.to_string());
    assert!(run("mount", &["-o", "remount,bind,ro", at]), "remount read-only");

    let ctx = context();
    let metrics = ctx.metrics.clone();
    let out = build_with(
        &format!(
            "{{type: file, path: '{at}/%{{/k}}.log', codec: text, retry: {{initial_backoff: 5ms, max_backoff: 20ms}}}}"
        ),
        ctx,
    );
    let sending = tokio::spawn(async move {
        let events = vec![event(json!({"k": "a", "message": "one"}))];
        let d = out.send(&refs(&events)).await;
        (d, out)
    });
    wait_until_async("the output retried three times", PATIENCE, || metrics.retries.get() >= 3).await;
    assert!(!sending.is_finished(), "the send waits while the directory is read-only");
    assert!(run("mount", &["-o", "remount,bind,rw", at]), "remount writable");
    let (d, _out) = tokio::time::timeout(PATIENCE, sending).await.expect("resumed").unwrap();
    assert!(d.unwrap().rejected.is_empty());
    assert_eq!(read(logs.join("a.log")), "one\n");
}
