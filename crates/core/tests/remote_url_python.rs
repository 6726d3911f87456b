//! Whatever the `remote_url` allowlist accepts, Python's
//! `urllib.parse.urlsplit` (what a Python executor or tool would use) reads the same host
//! as the WHATWG parser the check uses. The generated URLs mix the inputs parsers
//! disagree on (`\`, `@`, percent-encoded and full-width dots, tabs, upper case, numeric
//! IPv4, IPv6, ports); every accepted one is sent, in one batch, to one `python3`
//! process, which answers the host it reads.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use sandbox_core::remote_url::Allowlist;
use std::io::Write;
use std::process::{Command, Stdio};

fn allowlist() -> Allowlist {
    Allowlist::new([
        "api.openai.com",
        "*.example.com",
        "http://127.0.0.1",
        "http://[::1]",
        "wss://10.0.0.1:8443",
    ])
}

/// A URL built as scheme, host, port and path, each from forms that pass and forms
/// parsers read differently, then maybe one tricky piece inserted at any place.
fn candidate() -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(vec![
        "wss://", "https://", "http://", "WSS://", "wss:", "wss:/", "wss:\\\\", "ws://",
    ]);
    let host = prop::sample::select(vec![
        "api.openai.com",
        "API.openai.com",
        "api%2eopenai%2ecom",
        "api\u{ff0e}openai.com",
        "a.example.com",
        "b.a.example.com",
        "example.com",
        "a.example.com.",
        "127.0.0.1",
        "0x7f.1",
        "2130706433",
        "[::1]",
        "[0::1]",
        "10.0.0.1",
        "evil.test",
        "user:pw@api.openai.com",
        "api.openai.com\\@evil.test",
        "api.openai.com%40evil.test",
    ]);
    let port = prop::sample::select(vec!["", "", ":443", ":8443", ":4010", ":80", ":"]);
    let path = prop::sample::select(vec![
        "/",
        "/x",
        "/v1/agents/environments/env_1/connect",
        "/x?t=1",
        "/x#f",
        "/@evil.test/",
        "/a\\b",
        "",
    ]);
    let tricky = prop::sample::select(vec![
        "",
        "",
        "",
        "\t",
        "\n",
        "\\",
        "@",
        "%2e",
        "\u{ff0e}",
        ":",
        "/",
        "#",
        "?",
        "%40",
        "evil.test@",
        " ",
    ]);
    (
        scheme,
        host,
        port,
        path,
        tricky,
        any::<prop::sample::Index>(),
    )
        .prop_map(|(scheme, host, port, path, tricky, at)| {
            let mut s = format!("{scheme}{host}{port}{path}");
            let boundaries: Vec<usize> =
                s.char_indices().map(|(i, _)| i).chain([s.len()]).collect();
            s.insert_str(boundaries[at.index(boundaries.len())], tricky);
            s
        })
}

/// The host WHATWG reads, in the form `urlsplit(...).hostname` gives it: lower case,
/// IPv6 without brackets.
fn rust_host(text: &str) -> String {
    let url = url::Url::parse(text).expect("accepted URLs parse");
    match url.host().expect("accepted URLs have a host") {
        url::Host::Ipv6(a) => a.to_string(),
        h => h.to_string(),
    }
}

/// One `python3` process answers the `urlsplit` hostname of each line (JSON in, JSON out).
fn python_hosts(urls: &[String]) -> Vec<Option<String>> {
    let script = r#"
import json, sys, ipaddress
from urllib.parse import urlsplit
out = []
for u in json.load(sys.stdin):
    try:
        h = urlsplit(u).hostname
        if h and ':' in h:
            h = str(ipaddress.IPv6Address(h))
    except ValueError:
        h = None
    out.append(h)
json.dump(out, sys.stdout)
"#;
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs (make test needs it for the cross-check)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(urls).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python3 failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn accepted_remote_urls_have_the_same_host_for_python_and_rust() {
    let allow = allowlist();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 40_000,
        ..ProptestConfig::default()
    });
    let mut accepted: Vec<String> = Vec::new();
    let strategy = candidate();
    for _ in 0..40_000 {
        let text = strategy.new_tree(&mut runner).unwrap().current();
        if allow.check(&text).is_ok() {
            accepted.push(text);
        }
    }
    // Known-good shapes, so the comparison never runs on an empty batch.
    for known in [
        "wss://api.openai.com/v1/agents/environments/env_1/connect",
        "https://a.example.com/x?t=1#f",
        "http://127.0.0.1:4010/x",
        "http://[::1]:4010/x",
        "wss://10.0.0.1:8443/x",
    ] {
        assert!(allow.check(known).is_ok(), "{known}");
        accepted.push(known.to_owned());
    }
    let python = python_hosts(&accepted);
    assert_eq!(python.len(), accepted.len());
    let mut disagree = Vec::new();
    for (text, py) in accepted.iter().zip(&python) {
        if py.as_deref() != Some(rust_host(text).as_str()) {
            disagree.push(format!("{text:?}: rust {} python {py:?}", rust_host(text)));
        }
    }
    assert!(disagree.is_empty(), "hosts differ: {disagree:#?}");
    // The generator must reach many accepted forms, or the check says little.
    assert!(accepted.len() > 200, "only {} accepted", accepted.len());
    eprintln!("{} accepted URLs cross-checked", accepted.len());
}

#[test]
fn what_python_reads_differently_is_refused() {
    // The issue's inputs: each normalises (WHATWG) into an allowed host, so none may pass.
    let allow = allowlist();
    let texts = [
        "wss://api.openai.com\\@evil.test/x",
        "wss://api%2eopenai%2ecom/x",
        "wss://api.open\tai.com/x",
        "wss://api\u{ff0e}openai\u{ff0e}com/x",
        "WSS://api.openai.com/x",
        "wss:api.openai.com/x",
        "http://2130706433/x",
    ];
    for text in texts {
        assert!(allow.check(text).is_err(), "{text:?} passed");
    }
    // The reason: urlsplit reads the backslash form's host as the part after the `@`.
    let backslash = python_hosts(&["wss://api.openai.com\\@evil.test/x".to_owned()]);
    assert_eq!(backslash[0].as_deref(), Some("evil.test"));
}
