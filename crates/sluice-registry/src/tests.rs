use super::*;

fn opts() -> RegistryOptions {
    RegistryOptions { flush_interval: Duration::from_secs(3600), compact_after_bytes: 1 << 20 }
}

#[test]
fn commit_flush_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let r = Registry::open(dir.path(), opts()).unwrap();
    let c = r.cursor("a");
    assert!(r.get("a").is_none());
    c.commit(5);
    c.set_meta(serde_json::json!({"path": "/x"}));
    r.flush().unwrap();
    r.close().unwrap();
    drop(r);
    let r = Registry::open(dir.path(), opts()).unwrap();
    let e = r.get("a").unwrap();
    assert_eq!((e.offset, e.meta), (5, serde_json::json!({"path": "/x"})));
}
