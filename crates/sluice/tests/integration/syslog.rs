//! The `syslog` input end to end, with real senders: util-linux's `logger` over TCP (both
//! framings) and UDP, in RFC 5424 and RFC 3164, beside Cisco IOS lines; an rsyslog relay forwarding over TCP with
//! octet counting and with newlines; and a UDP flood into a tiny receive buffer whose drops
//! must show at `/metrics`. Every event is checked in a file output.
//!
//! `logger` (Debian package `bsdutils`, from util-linux) and `rsyslogd` (package `rsyslog`)
//! must be installed: a test that needs one fails, naming the package, when it is missing.

use crate::common;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The path of `program`, looked up in `PATH` and the system directories; fails the test,
/// naming the Debian package to install, when it is not there.
fn require(program: &str, package: &str) -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    let dirs = path.split(':').map(PathBuf::from).chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from));
    for dir in dirs {
        let candidate = dir.join(program);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "`{program}` is not installed, and this test needs it as a real syslog sender: install Debian's package \
         `{package}` (apt-get install -y --no-install-recommends {package})"
    );
}

fn lines_of(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..=end]);
    complete.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// Runs `logger` with `args`; fails the test if it does not succeed.
fn logger(args: &[&str]) {
    let out = Command::new(require("logger", "bsdutils")).args(args).output().unwrap();
    assert!(out.status.success(), "logger {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// This machine's host name, as `logger` writes it: the full name, or its first label.
fn host_names() -> [String; 2] {
    let full = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    let short = full.split('.').next().unwrap_or_default().to_string();
    [full, short]
}

/// A sluice node with one syslog input per `(mode, port, extra settings)`, all written to
/// `out.log`.
fn start(inputs: &[(&str, u16, &str)]) -> Sluice {
    let inputs: Vec<String> = inputs
        .iter()
        .map(|(mode, port, extra)| format!("{{type: syslog, mode: {mode}, address: '127.0.0.1:{port}'{extra}}}"))
        .collect();
    Sluice::start(&format!(
        "api: {{address: '127.0.0.1:0'}}
pipelines:
  s:
    inputs: [{}]
    outputs: [{{type: file, path: '{{dir}}/out.log'}}]
",
        inputs.join(", ")
    ))
}

/// Waits for a UDP input to log that it listens (it accepts no connection to probe).
fn wait_udp(s: &mut Sluice) {
    s.wait_log("syslog input listening on udp", Duration::from_secs(20));
}

#[test]
fn logger_messages_over_tcp_and_udp_arrive_parsed() {
    require("logger", "bsdutils");
    let (tcp, udp) = (free_port(), free_port());
    let mut s = start(&[("tcp", tcp, ", peer_field: /peer"), ("udp", udp, "")]);
    s.wait_port(tcp);
    wait_udp(&mut s);
    let send = |proto: &str, port: u16, args: &str| {
        let port = port.to_string();
        let mut all = vec![proto, "--server", "127.0.0.1", "--port", &port];
        // Arguments are separated by `|`, so that messages keep their spaces.
        all.extend(args.split('|'));
        logger(&all);
    };
    send(
        "--tcp",
        tcp,
        "--rfc5424|--octet-count|-t|oc5424|-p|local3.warning|--msgid|MID1|--id=4242|one: 5424 octet-counted",
    );
    send(
        "--tcp",
        tcp,
        "--rfc5424|-t|nl5424|-p|user.notice|--msgid|MID2|--id=4243|--sd-id|ex@32473|--sd-param|k=\"v\"|two: 5424 newline",
    );
    send("--tcp", tcp, "--rfc3164|-t|nl3164|-p|mail.err|--id=4244|three: 3164 newline");
    send("--tcp", tcp, "--rfc3164|--octet-count|-t|oc3164|-p|cron.info|--id=4245|four: 3164 octet-counted");
    send("--udp", udp, "--rfc5424|-t|udp5424|-p|daemon.info|--msgid|MID5|--id=4246|five: 5424 udp");
    send("--udp", udp, "--rfc3164|-t|udp3164|-p|auth.crit|six: 3164 udp");
    // Cisco IOS writes its own header, which `logger` cannot: sent raw, over UDP (a router's
    // default) and TCP (`logging host ... transport tcp`).
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(
            b"<189>52: R1: 000123: *Mar  1 18:46:11.123: %LINK-3-UPDOWN: Interface Gi0/1, changed state to up",
            ("127.0.0.1", udp),
        )
        .unwrap();
    let mut router_tcp = TcpStream::connect(("127.0.0.1", tcp)).unwrap();
    router_tcp.write_all(b"<187>7: Mar  1 2024 18:46:11.5 UTC: %SYS-3-CPUHOG: Task ran for 2004 msec\n").unwrap();
    drop(router_tcp);
    let out = s.path("out.log");
    wait_until("eight events", Duration::from_secs(20), || lines_of(&out).len() >= 8);
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    let events = lines_of(&out);
    assert_eq!(events.len(), 8, "{events:#?}");
    let by_message: BTreeMap<String, &serde_json::Value> =
        events.iter().map(|e| (e["message"].as_str().unwrap_or_default().to_string(), e)).collect();
    let hosts = host_names();
    // (message, appname, procid, msgid, facility, facility code, severity, severity code)
    let expected = [
        ("one: 5424 octet-counted", "oc5424", Some(4242), Some("MID1"), "local3", 19, "warning", 4),
        ("two: 5424 newline", "nl5424", Some(4243), Some("MID2"), "user", 1, "notice", 5),
        ("three: 3164 newline", "nl3164", Some(4244), None, "mail", 2, "err", 3),
        ("four: 3164 octet-counted", "oc3164", Some(4245), None, "cron", 9, "info", 6),
        ("five: 5424 udp", "udp5424", Some(4246), Some("MID5"), "daemon", 3, "info", 6),
        ("six: 3164 udp", "udp3164", None, None, "auth", 4, "crit", 2),
    ];
    for (message, appname, procid, msgid, facility, facility_code, severity, severity_code) in expected {
        let e = by_message.get(message).unwrap_or_else(|| panic!("no event `{message}` in {events:#?}"));
        let host = e["hostname"].as_str().unwrap_or_else(|| panic!("no hostname: {e}"));
        assert!(hosts.iter().any(|h| h == host), "{message}: hostname {host}, expected one of {hosts:?}");
        assert_eq!(e["appname"], appname, "{e}");
        assert_eq!(e["procid"].as_i64(), procid, "{e}");
        assert_eq!(e["msgid"].as_str(), msgid, "{e}");
        assert_eq!((e["facility"].as_str(), e["facility_code"].as_i64()), (Some(facility), Some(facility_code)), "{e}");
        assert_eq!((e["severity"].as_str(), e["severity_code"].as_i64()), (Some(severity), Some(severity_code)), "{e}");
        assert!(e["tags"].is_null(), "{e}");
        // The sender's time, within a minute of now.
        let at = e["@timestamp"].as_str().unwrap();
        assert!(at.starts_with(&this_year()), "{message}: @timestamp {at}");
    }
    let two = by_message["two: 5424 newline"];
    assert_eq!(two["structured_data"]["ex@32473"]["k"], "v", "{two}");
    assert_eq!(two["structured_data"]["timeQuality"]["tzKnown"], "1", "{two}");
    assert_eq!(two["version"], 1);
    assert!(by_message["one: 5424 octet-counted"]["peer"].as_str().unwrap().starts_with("127.0.0.1:"));
    let router = by_message["Interface Gi0/1, changed state to up"];
    assert_eq!((&router["hostname"], &router["appname"]), (&"R1".into(), &"LINK-3-UPDOWN".into()), "{router}");
    assert_eq!((&router["facility"], &router["severity"]), (&"local7".into(), &"notice".into()), "{router}");
    assert_eq!(
        router["cisco"],
        serde_json::json!({"facility": "LINK", "severity": 3, "mnemonic": "UPDOWN", "sequence": 123, "message_count": 52,
            "clock": "not_authoritative"}),
        "{router}"
    );
    // Without a year, the year the BSD path gives it.
    assert!(router["@timestamp"].as_str().unwrap().ends_with("-03-01T18:46:11.123Z"), "{router}");
    let over_tcp = by_message["Task ran for 2004 msec"];
    assert_eq!(over_tcp["@timestamp"], "2024-03-01T18:46:11.500Z", "{over_tcp}");
    assert_eq!(
        over_tcp["cisco"],
        serde_json::json!({"facility": "SYS", "severity": 3, "mnemonic": "CPUHOG", "sequence": 7, "timezone": "UTC"}),
        "{over_tcp}"
    );
    assert!(over_tcp["hostname"].is_null() && over_tcp["tags"].is_null(), "{over_tcp}");
    assert_eq!(summary(&log, "s")["failed"], 0, "{log}");
}

/// The current year, from the system clock (no date library in this test crate).
fn this_year() -> String {
    let out = Command::new("date").args(["-u", "+%Y-"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// An rsyslog instance in the foreground with its own config and work directory: it takes
/// messages on `listen` (TCP) and forwards every one to each of `forwards` over TCP.
struct Rsyslog {
    child: Child,
    dir: tempfile::TempDir,
}

impl Rsyslog {
    fn start(listen: u16, forwards: &[(u16, &str)]) -> Rsyslog {
        let rsyslogd = require("rsyslogd", "rsyslog");
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let mut conf = format!(
            "global(workDirectory=\"{}\")\nmodule(load=\"imtcp\")\ninput(type=\"imtcp\" port=\"{listen}\" address=\"127.0.0.1\")\n",
            work.display()
        );
        for (port, framing) in forwards {
            // Octet counting with RFC 5424, or rsyslog's defaults: newline framing and its
            // traditional (RFC 3164-like) forwarding format.
            let style = match *framing {
                "octet-counted" => " TCP_Framing=\"octet-counted\" template=\"RSYSLOG_SyslogProtocol23Format\"",
                _ => "",
            };
            conf.push_str(&format!(
                "*.* action(type=\"omfwd\" target=\"127.0.0.1\" port=\"{port}\" protocol=\"tcp\"{style} \
                 queue.type=\"LinkedList\" action.resumeRetryCount=\"-1\" action.resumeInterval=\"1\")\n"
            ));
        }
        let conf_path = dir.path().join("rsyslog.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let log = std::fs::File::create(dir.path().join("rsyslogd.log")).unwrap();
        let child = Command::new(rsyslogd)
            .args(["-n", "-f"])
            .arg(&conf_path)
            .arg("-i")
            .arg(dir.path().join("rsyslogd.pid"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut r = Rsyslog { child, dir };
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", listen)).is_err() {
            if let Ok(Some(status)) = r.child.try_wait() {
                panic!("rsyslogd exited ({status}) at start:\n{}", r.log());
            }
            assert!(started.elapsed() < Duration::from_secs(20), "rsyslogd did not listen:\n{}", r.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        r
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("rsyslogd.log")).unwrap_or_default()
    }
}

impl Drop for Rsyslog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn rsyslog_forwards_every_message_with_both_framings() {
    require("logger", "bsdutils");
    require("rsyslogd", "rsyslog");
    const N: u64 = 1000;
    let (octet, newline, relay) = (free_port(), free_port(), free_port());
    let mut s = start(&[("tcp", octet, ", peer_field: /via_octet"), ("tcp", newline, ", peer_field: /via_newline")]);
    s.wait_port(octet);
    s.wait_port(newline);
    let rsyslog = Rsyslog::start(relay, &[(octet, "octet-counted"), (newline, "newline")]);
    let messages = s.path("messages.txt");
    let text: String = (0..N).map(|i| format!("relayed message rsyslog-msg-{i} end\n")).collect();
    std::fs::write(&messages, text).unwrap();
    let relay = relay.to_string();
    logger(&[
        "--tcp",
        "--server",
        "127.0.0.1",
        "--port",
        &relay,
        "-t",
        "relayed",
        "-p",
        "local5.notice",
        "-f",
        messages.to_str().unwrap(),
    ]);
    let out = s.path("out.log");
    let count = |field: &str| lines_of(&out).iter().filter(|e| !e[field].is_null()).count() as u64;
    let arrived = common::eventually(Duration::from_secs(30), || count("via_octet") >= N && count("via_newline") >= N);
    assert!(
        arrived,
        "octet-counted: {}, newline: {} of {N}\nrsyslogd:\n{}\nsluice:\n{}",
        count("via_octet"),
        count("via_newline"),
        rsyslog.log(),
        s.log()
    );
    drop(rsyslog);
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    let events = lines_of(&out);
    for via in ["via_octet", "via_newline"] {
        let mut seen = BTreeMap::new();
        for e in events.iter().filter(|e| !e[via].is_null() && e["appname"] == "relayed") {
            assert_eq!(
                (e["facility"].as_str(), e["severity"].as_str()),
                (Some("local5"), Some("notice")),
                "{via}: {e}"
            );
            assert!(e["tags"].is_null(), "{via}: {e}");
            let message = e["message"].as_str().unwrap();
            let n: u64 = message
                .strip_prefix("relayed message rsyslog-msg-")
                .and_then(|m| m.strip_suffix(" end"))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{via}: message not relayed whole: {e}"));
            *seen.entry(n).or_insert(0) += 1;
        }
        assert_eq!(seen.len() as u64, N, "{via}: every message arrives");
        assert!(seen.values().all(|&c| c == 1), "{via}: and once");
    }
    assert_eq!(summary(&log, "s")["failed"], 0, "{log}");
}

#[test]
fn a_udp_flood_into_a_tiny_receive_buffer_counts_the_kernels_drops() {
    let port = free_port();
    let mut s = start(&[("udp", port, ", receive_buffer_bytes: 4KiB")]);
    wait_udp(&mut s);
    let api = s.api();
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    let message = format!("<13>Nov 26 07:16:16 flood app: {}", "x".repeat(300));
    let sent = 50_000u64;
    for _ in 0..sent {
        sender.send_to(message.as_bytes(), ("127.0.0.1", port)).unwrap();
    }
    // One more once the flood is over, so the kernel reports its count with a datagram too.
    std::thread::sleep(Duration::from_millis(200));
    sender.send_to(message.as_bytes(), ("127.0.0.1", port)).unwrap();
    let sent = sent + 1;
    let figures = || {
        let stats = get_json(&api, "/stats");
        let input = common::component(&stats, "s", "type", "syslog");
        (input["state"]["datagrams_received"].as_u64().unwrap(), input["state"]["datagrams_dropped"].as_u64().unwrap())
    };
    // Settled: everything sent is either received or dropped (loopback loses nothing else).
    let settled = common::eventually(Duration::from_secs(15), || {
        let (received, dropped) = figures();
        received + dropped >= sent
    });
    let (received, dropped) = figures();
    let metrics = http(&api, "GET", "/metrics", &[], b"").1;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("sluice_component_datagrams_dropped_total{"))
        .unwrap_or_else(|| panic!("no dropped-datagram series at /metrics:\n{metrics}"));
    let exported: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    eprintln!("sent {sent}, received {received}, dropped {dropped}; /metrics: {line}");
    assert!(exported > 0.0, "{line}");
    assert!(dropped > 0 && received > 0, "received {received}, dropped {dropped}");
    assert!(settled, "received {received} + dropped {dropped} do not account for the {sent} sent");
    assert_eq!(received + dropped, sent, "received {received} + dropped {dropped}");
    wait_until("every datagram received written", Duration::from_secs(20), || {
        get_json(&api, "/stats")["pipelines"]["s"]["events"]["out"].as_u64() == Some(received)
    });
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("the kernel dropped syslog datagrams"), "{log}");
    assert!(log.contains("granted_bytes"), "the granted buffer size is logged: {log}");
}

#[test]
fn validate_checks_the_tls_files_and_refuses_tls_over_udp() {
    let (ok, out) = validate(
        "pipelines:
  s:
    inputs:
      - {type: syslog, mode: tcp, address: '127.0.0.1:5514', tls: {cert: '{dir}/missing.crt', key: '{dir}/missing.key'}}
      - {type: syslog, mode: udp, address: '127.0.0.1:5514', tls: {cert: a.crt, key: a.key}}
      - {type: syslog, mode: udp, address: '127.0.0.1:5514', idle_timeout: 5s}
    outputs: [{type: stdout}]
",
    );
    assert!(!ok, "{out}");
    assert!(out.contains("inputs[0].tls.cert") && out.contains("missing.crt"), "{out}");
    assert!(out.contains("inputs[1].tls") && out.contains("TLS needs `mode: tcp`"), "{out}");
    assert!(out.contains("inputs[2].idle_timeout"), "{out}");
}
