//! The `remote_url` allowlist: where an executor may be sent with the executor key.
//!
//! agents-api.md: `remote_url` is passed unchanged to the executor on every start. The
//! executor connects there holding the restricted key, so a session whose `remote_url`
//! points elsewhere must never get compute. The check parses the URL with the
//! WHATWG rules (the `url` crate, as reqwest does), so `https://api.openai.com@evil.test/`
//! has host `evil.test`, and compares the scheme, the host and (when an entry names one)
//! the port; the URL itself (it may carry a token) is never echoed, only its scheme and
//! host.
//!
//! The executor is handed the text, not a parsed URL, and other parsers (Python's
//! `urllib.parse.urlsplit`, a shell, Node's legacy `url.parse`) read some texts otherwise
//! than WHATWG does (`wss://api.openai.com\@evil.test/` is host `api.openai.com` to
//! WHATWG, `evil.test` to `urlsplit`). So a `remote_url` whose WHATWG serialisation
//! differs from its text in any byte is refused ([`RemoteUrlRefusal::NotCanonical`])
//! rather than rewritten: what passes is exactly what the executor gets, and every form
//! that parsers disagree on (a `\`, a tab or newline, a percent-encoded or full-width dot,
//! upper case, a numeric IPv4 form, a missing `//`) needs normalising, so it is refused.
//! The API itself sends canonical URLs (`events/sessions/` fixtures).
//!
//! The policy holds an [`Allowlist`], parsed once when it is built, so a decision does
//! not re-parse the entries.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Why a `remote_url` was refused. Carries the scheme and host only, never the path or
/// query (they may hold a token).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "problem", rename_all = "snake_case")]
pub enum RemoteUrlRefusal {
    /// Not an absolute URL with a host.
    Unparsable,
    /// The URL carries a user name or password (`https://user@host/`).
    HasCredentials,
    /// The scheme is not allowed for that host (only `https` and `wss` unless an entry
    /// says so).
    SchemeNotAllowed {
        /// The URL's scheme.
        scheme: String,
        /// The URL's host.
        host: String,
    },
    /// The URL is not exactly its own WHATWG serialisation (upper case, `\`, a tab or
    /// newline, a percent-encoded or full-width dot, a numeric IPv4 form, a default
    /// port, no `//`...): the executor would get text another parser may read otherwise.
    NotCanonical {
        /// The host the WHATWG parser reads.
        host: String,
    },
    /// The host matches no entry.
    HostNotAllowed {
        /// The URL's host.
        host: String,
    },
}

impl fmt::Display for RemoteUrlRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unparsable => f.write_str("remote_url is not an absolute URL with a host"),
            Self::HasCredentials => f.write_str("remote_url carries credentials"),
            Self::SchemeNotAllowed { scheme, host } => {
                write!(
                    f,
                    "remote_url scheme {scheme} is not allowed for host {host}"
                )
            }
            Self::NotCanonical { host } => write!(
                f,
                "remote_url (host {host}) is not in canonical form; the executor would be given text that differs from the URL checked"
            ),
            Self::HostNotAllowed { host } => {
                write!(f, "remote_url host {host} is not on the allowlist")
            }
        }
    }
}

/// The schemes an entry without one allows: TLS only. The API's `remote_url` is a
/// WebSocket URL (`wss://api.openai.com/v1/agents/environments/{id}/connect`, as in the
/// `events/sessions/` fixtures); `https` is the registration endpoint's (seed 002).
const TLS_SCHEMES: [&str; 2] = ["https", "wss"];

/// The host part of one entry, parsed with the WHATWG host parser (`url::Host::parse`,
/// the same rules the URL's host went through), so case, IDNA, IPv4 number forms and
/// IPv6 spellings compare as the URL's host does.
#[derive(Clone, Debug, PartialEq, Eq)]
enum HostPattern {
    /// Exactly this host.
    Exact(url::Host<String>),
    /// `*.suffix`: any subdomain of `suffix` (a domain), not `suffix` itself.
    Subdomains(String),
    /// The entry does not parse: it matches nothing ([`validate_allowlist`] names it).
    Invalid,
}

/// One allowlist entry, parsed once: an optional scheme (lower case; default
/// [`TLS_SCHEMES`]), a host pattern and an optional port (when given, the URL's port, or
/// its scheme's default, must equal it).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    scheme: Option<String>,
    host: HostPattern,
    port: Option<u16>,
}

impl Entry {
    /// Parses one entry: `host`, `host:port`, `[v6]`, `[v6]:port`, `*.domain`, each
    /// optionally prefixed by `scheme://`; a path after the host is ignored. Never fails:
    /// a malformed entry becomes [`HostPattern::Invalid`].
    fn parse(raw: &str) -> Self {
        let invalid = |scheme| Self {
            scheme,
            host: HostPattern::Invalid,
            port: None,
        };
        let raw = raw.trim();
        let (scheme, rest) = match raw.split_once("://") {
            Some((scheme, rest)) => (Some(scheme.to_ascii_lowercase()), rest),
            None => (None, raw),
        };
        if raw.is_empty()
            || raw.contains(|c: char| c.is_whitespace() || c == '@' || c == '\\')
            || !scheme
                .as_deref()
                .unwrap_or("https")
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-' || b == b'.')
        {
            return invalid(scheme);
        }
        let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        // `[v6]` or `[v6]:port`; otherwise the last `:` starts the port.
        let (host, port) = if authority.starts_with('[') {
            match authority.split_once(']') {
                Some((h, tail)) => (&authority[..=h.len()], tail.strip_prefix(':')),
                None => return invalid(scheme),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(p) => Some(p),
                Err(_) => return invalid(scheme),
            },
        };
        let host = match host.strip_prefix("*.") {
            Some(suffix) => match url::Host::parse(suffix) {
                Ok(url::Host::Domain(d)) if !d.is_empty() && !d.contains('*') => {
                    HostPattern::Subdomains(d)
                }
                _ => HostPattern::Invalid,
            },
            None if host.contains('*') || host.is_empty() => HostPattern::Invalid,
            None => url::Host::parse(host).map_or(HostPattern::Invalid, HostPattern::Exact),
        };
        Self { scheme, host, port }
    }

    fn host_matches(&self, host: &url::Host<&str>) -> bool {
        match (&self.host, host) {
            (HostPattern::Exact(url::Host::Domain(e)), url::Host::Domain(d)) => e == d,
            (HostPattern::Exact(url::Host::Ipv4(e)), url::Host::Ipv4(a)) => e == a,
            (HostPattern::Exact(url::Host::Ipv6(e)), url::Host::Ipv6(a)) => e == a,
            (HostPattern::Subdomains(suffix), url::Host::Domain(d)) => d
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            _ => false,
        }
    }

    fn port_matches(&self, url: &url::Url) -> bool {
        self.port.is_none() || self.port == url.port_or_known_default()
    }
}

/// The `remote_url` allowlist, parsed once when the policy is built (parsing
/// every entry on each `decide()` made a decision ten times slower). Serialises as the
/// list of entries it was built from; equality is that of the entries' text.
#[derive(Clone, Debug)]
pub struct Allowlist {
    raw: Vec<String>,
    parsed: Vec<Entry>,
}

impl Allowlist {
    /// Parses `entries` (see [`crate::observed::Policy::remote_url_allowlist`] for the
    /// forms). A malformed entry matches nothing; [`validate_allowlist`] names it.
    pub fn new<S: Into<String>>(entries: impl IntoIterator<Item = S>) -> Self {
        let raw: Vec<String> = entries.into_iter().map(Into::into).collect();
        let parsed = raw.iter().map(|e| Entry::parse(e)).collect();
        Self { raw, parsed }
    }

    /// The entries as given.
    pub fn entries(&self) -> &[String] {
        &self.raw
    }

    /// Checks `remote_url` against the entries; see [`check`].
    ///
    /// # Errors
    /// [`RemoteUrlRefusal`] naming what is wrong (scheme and host only).
    pub fn check(&self, remote_url: &str) -> Result<(), RemoteUrlRefusal> {
        let url = url::Url::parse(remote_url).map_err(|_| RemoteUrlRefusal::Unparsable)?;
        let host = url
            .host()
            .filter(|h| !matches!(h, url::Host::Domain("")))
            .ok_or(RemoteUrlRefusal::Unparsable)?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(RemoteUrlRefusal::HasCredentials);
        }
        let host_text = host.to_string();
        // The executor is given the text, so the text must be what was checked: any
        // difference between the WHATWG serialisation and the text (case, `\`, tabs,
        // percent-encoded or full-width dots, a numeric IPv4 form, a default port, a
        // missing `//`) is a place where another parser may read another host.
        if url.as_str() != remote_url {
            return Err(RemoteUrlRefusal::NotCanonical { host: host_text });
        }
        let scheme = url.scheme();
        let mut host_known = false;
        for entry in &self.parsed {
            if entry.host_matches(&host) && entry.port_matches(&url) {
                host_known = true;
                let allowed = match &entry.scheme {
                    Some(s) => s == scheme,
                    None => TLS_SCHEMES.contains(&scheme),
                };
                if allowed {
                    return Ok(());
                }
            }
        }
        if host_known {
            Err(RemoteUrlRefusal::SchemeNotAllowed {
                scheme: scheme.to_owned(),
                host: host_text,
            })
        } else {
            Err(RemoteUrlRefusal::HostNotAllowed { host: host_text })
        }
    }
}

impl PartialEq for Allowlist {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl Eq for Allowlist {}

impl<S: Into<String>> From<Vec<S>> for Allowlist {
    fn from(entries: Vec<S>) -> Self {
        Self::new(entries)
    }
}

impl Serialize for Allowlist {
    fn serialize<Se: serde::Serializer>(&self, s: Se) -> Result<Se::Ok, Se::Error> {
        self.raw.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Allowlist {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<String>::deserialize(d).map(Self::new)
    }
}

/// Checks `remote_url` against `allowlist` (see
/// [`crate::observed::Policy::remote_url_allowlist`] for the entry forms), parsing the
/// entries for this one call; [`Allowlist::check`] uses entries parsed once.
///
/// The URL must parse (WHATWG, the `url` crate, as reqwest does), carry no user info,
/// and be exactly its own serialisation: the executor is handed the text, so the text
/// must be the URL that was checked (see [`RemoteUrlRefusal::NotCanonical`]).
///
/// # Errors
/// [`RemoteUrlRefusal`] naming what is wrong (scheme and host only).
pub fn check(remote_url: &str, allowlist: &[String]) -> Result<(), RemoteUrlRefusal> {
    Allowlist::new(allowlist.iter().cloned()).check(remote_url)
}

/// Checks an allowlist's entries for shape: each is a host (a domain, an IPv4 address or
/// a bracketed IPv6 address), `*.domain` or `scheme://host`, optionally with `:port`,
/// without spaces, user info or an empty host.
///
/// # Errors
/// The first malformed entry's position (1-based) and what is wrong with it.
pub fn validate_allowlist(allowlist: &[String]) -> Result<(), String> {
    for (i, raw) in allowlist.iter().enumerate() {
        let n = i + 1;
        let entry = Entry::parse(raw);
        if raw.trim().is_empty() {
            return Err(format!("entry {n} has no host"));
        }
        if raw.contains(char::is_whitespace) || raw.contains('@') || raw.contains('\\') {
            return Err(format!(
                "entry {n} must be a host, *.domain or scheme://host (no spaces, no user info)"
            ));
        }
        if entry.host == HostPattern::Invalid {
            return Err(format!(
                "entry {n} is not a host, [IPv6], *.domain or scheme://host[:port] (a wildcard may only lead, as *.)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn websocket_remote_url_of_the_api_passes_the_default_allowlist() {
        // The shape the API gives (events/sessions/ fixtures).
        let allow = crate::observed::Policy::default().remote_url_allowlist;
        assert_eq!(
            allow.check("wss://api.openai.com/v1/agents/environments/env_1/connect"),
            Ok(())
        );
        assert_eq!(
            allow.check("ws://api.openai.com/v1/agents/environments/env_1/connect"),
            Err(RemoteUrlRefusal::SchemeNotAllowed {
                scheme: "ws".into(),
                host: "api.openai.com".into()
            }),
            "plaintext never carries the key"
        );
    }

    #[test]
    fn https_url_on_an_allowed_host_passes() {
        let allow = list(&["api.openai.com"]);
        assert_eq!(
            check(
                "https://api.openai.com/v1/environments/env_1/connect?t=x",
                &allow
            ),
            Ok(())
        );
        assert_eq!(check("https://api.openai.com:8443/x", &allow), Ok(()));
        assert_eq!(
            check("https://API.OpenAI.com:443/x", &allow),
            Err(RemoteUrlRefusal::NotCanonical {
                host: "api.openai.com".into()
            }),
            "upper case and a default port are normalised away: refused"
        );
    }

    fn not_canonical(host: &str) -> Result<(), RemoteUrlRefusal> {
        Err(RemoteUrlRefusal::NotCanonical { host: host.into() })
    }

    /// Every input the WHATWG parser normalises into an allowed host is refused,
    /// because the executor would get the text, which another parser reads otherwise.
    #[test]
    fn texts_that_only_normalise_to_an_allowed_host_are_refused() {
        let allow = list(&["api.openai.com"]);
        let host = "api.openai.com";
        for (text, why) in [
            (
                "wss://api.openai.com\\@evil.test/x",
                "backslash: urlsplit reads host evil.test",
            ),
            ("wss://api%2eopenai%2ecom/x", "percent-encoded dots"),
            ("wss://api.open\tai.com/x", "tab inside the host"),
            ("wss://api.openai\n.com/x", "newline inside the host"),
            (
                "wss://api\r.openai.com/x",
                "carriage return inside the host",
            ),
            ("wss://api\u{ff0e}openai\u{ff0e}com/x", "full-width dots"),
            ("wss://api\u{3002}openai.com/x", "ideographic full stop"),
            ("WSS://api.openai.com/x", "upper-case scheme"),
            ("wss://API.OPENAI.COM/x", "upper-case host"),
            ("wss:api.openai.com/x", "no slashes"),
            ("wss:/api.openai.com/x", "one slash"),
            ("wss:\\\\api.openai.com/x", "backslashes for slashes"),
            ("wss://api.openai.com:443/x", "default port spelled out"),
            ("wss://api.openai.com./x", "trailing dot kept"),
            (" wss://api.openai.com/x", "leading space"),
            ("wss://api.openai.com/x\n", "trailing newline"),
            ("wss://api.openai.com", "no path"),
        ] {
            let got = check(text, &allow);
            if text == "wss://api.openai.com./x" {
                // WHATWG keeps the trailing dot: canonical, but not the entry's host.
                assert_eq!(
                    got,
                    Err(RemoteUrlRefusal::HostNotAllowed {
                        host: "api.openai.com.".into()
                    }),
                    "{why}"
                );
                continue;
            }
            assert_eq!(got, not_canonical(host), "{why}: {text:?}");
        }
        // The same texts, canonical, pass.
        assert_eq!(check("wss://api.openai.com/x", &allow), Ok(()));
        assert_eq!(check("wss://api.openai.com/", &allow), Ok(()));
    }

    #[test]
    fn numeric_ipv4_forms_are_refused_and_the_dotted_form_matches() {
        let allow = list(&["http://127.0.0.1"]);
        assert_eq!(check("http://127.0.0.1:4010/v1/x", &allow), Ok(()));
        for text in [
            "http://2130706433:4010/v1/x",   // decimal
            "http://0x7f000001:4010/v1/x",   // hex
            "http://0x7f.0.0.1:4010/v1/x",   // hex part
            "http://0177.0.0.1:4010/v1/x",   // octal
            "http://017700000001:4010/v1/x", // octal, one number
            "http://127.1:4010/v1/x",        // short form
            "http://127.0.0.1.:4010/v1/x",   // trailing dot
            "http://%31%32%37.0.0.1:4010/x", // percent-encoded digits
        ] {
            assert_eq!(check(text, &allow), not_canonical("127.0.0.1"), "{text}");
        }
        // An entry in a numeric form names the same address.
        let allow = list(&["http://0x7f.1"]);
        assert_eq!(check("http://127.0.0.1/x", &allow), Ok(()));
    }

    #[test]
    fn ipv6_entries_match_their_address() {
        let allow = list(&["http://[::1]", "[2001:db8::1]:8443"]);
        assert_eq!(check("http://[::1]:4010/v1/x", &allow), Ok(()));
        assert_eq!(check("https://[2001:db8::1]:8443/x", &allow), Ok(()));
        assert_eq!(
            check("https://[2001:db8::1]/x", &allow),
            Err(RemoteUrlRefusal::HostNotAllowed {
                host: "[2001:db8::1]".into()
            }),
            "the entry names port 8443"
        );
        // Another spelling of the same address is not canonical.
        assert_eq!(
            check("http://[0:0::1]:4010/x", &allow),
            not_canonical("[::1]")
        );
        assert_eq!(
            check("http://[::2]:4010/x", &allow),
            Err(RemoteUrlRefusal::HostNotAllowed {
                host: "[::2]".into()
            })
        );
        // An entry spelled long matches the canonical URL.
        let allow = list(&["wss://[0:0:0:0:0:0:0:1]"]);
        assert_eq!(check("wss://[::1]/x", &allow), Ok(()));
        assert!(validate_allowlist(&list(&["[::1"])).is_err());
    }

    #[test]
    fn entry_ports_must_match_the_url_port_or_its_default() {
        let allow = list(&["api.openai.com:443", "http://127.0.0.1:4010"]);
        assert_eq!(check("wss://api.openai.com/x", &allow), Ok(()));
        assert!(check("wss://api.openai.com:8443/x", &allow).is_err());
        assert_eq!(check("http://127.0.0.1:4010/x", &allow), Ok(()));
        assert_eq!(
            check("http://127.0.0.1:4011/x", &allow),
            Err(RemoteUrlRefusal::HostNotAllowed {
                host: "127.0.0.1".into()
            })
        );
        assert!(validate_allowlist(&list(&["a.test:http"])).is_err());
        assert!(validate_allowlist(&list(&["a.test:70000"])).is_err());
    }

    #[test]
    fn wildcard_and_entry_case_do_not_matter() {
        let allow = list(&["*.Example.COM", "API.OpenAI.com", "WSS://Agents.Test"]);
        assert_eq!(check("https://a.example.com/", &allow), Ok(()));
        assert_eq!(check("wss://api.openai.com/x", &allow), Ok(()));
        assert_eq!(check("wss://agents.test/x", &allow), Ok(()));
        assert!(check("https://agents.test/x", &allow).is_err());
        assert!(check("https://example.com/", &allow).is_err());
    }

    #[test]
    fn allowlist_is_parsed_once_and_serialises_as_its_entries() {
        let a = Allowlist::new(["api.openai.com", "*.x.test"]);
        assert_eq!(a.entries(), ["api.openai.com", "*.x.test"]);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, r#"["api.openai.com","*.x.test"]"#);
        let back: Allowlist = serde_json::from_str(&json).unwrap();
        assert_eq!(back, a);
        assert_eq!(back.check("https://b.x.test/"), Ok(()));
        // A malformed entry matches nothing.
        let bad = Allowlist::new(["a.*.test"]);
        assert!(bad.check("https://a.b.test/").is_err());
    }

    #[test]
    fn other_host_is_refused_without_echoing_the_path() {
        let allow = list(&["api.openai.com"]);
        let err = check("https://evil.test/steal?token=secret", &allow).unwrap_err();
        assert_eq!(
            err,
            RemoteUrlRefusal::HostNotAllowed {
                host: "evil.test".into()
            }
        );
        assert!(!err.to_string().contains("secret"));
    }

    #[test]
    fn userinfo_trick_is_read_as_the_real_host() {
        let allow = list(&["api.openai.com"]);
        assert!(check("https://api.openai.com@evil.test/", &allow).is_err());
        assert_eq!(
            check("https://user:pw@api.openai.com/", &allow),
            Err(RemoteUrlRefusal::HasCredentials)
        );
    }

    #[test]
    fn plain_http_needs_an_entry_with_that_scheme() {
        let allow = list(&["api.openai.com", "http://127.0.0.1"]);
        assert_eq!(
            check("http://api.openai.com/x", &allow),
            Err(RemoteUrlRefusal::SchemeNotAllowed {
                scheme: "http".into(),
                host: "api.openai.com".into()
            })
        );
        assert_eq!(check("http://127.0.0.1:4010/v1/x", &allow), Ok(()));
        assert!(check("https://127.0.0.1/x", &allow).is_err());
        assert!(check("ws://api.openai.com/x", &allow).is_err());
    }

    #[test]
    fn wildcard_matches_subdomains_only() {
        let allow = list(&["*.example.com"]);
        assert_eq!(check("https://a.example.com/", &allow), Ok(()));
        assert_eq!(check("https://a.b.example.com/", &allow), Ok(()));
        assert!(check("https://example.com/", &allow).is_err());
        assert!(check("https://badexample.com/", &allow).is_err());
    }

    #[test]
    fn garbage_and_empty_allowlist_are_refused() {
        assert_eq!(
            check("not a url", &list(&["api.openai.com"])),
            Err(RemoteUrlRefusal::Unparsable)
        );
        assert!(check("https://api.openai.com/", &[]).is_err());
    }

    #[test]
    fn malformed_entries_are_named_by_position() {
        assert_eq!(validate_allowlist(&list(&["api.openai.com"])), Ok(()));
        assert_eq!(
            validate_allowlist(&list(&["api.openai.com", "http://127.0.0.1", "*.x.test"])),
            Ok(())
        );
        assert!(
            validate_allowlist(&list(&["a.test", " "]))
                .unwrap_err()
                .contains("entry 2")
        );
        assert!(validate_allowlist(&list(&["u@a.test"])).is_err());
        assert!(validate_allowlist(&list(&["a.*.test"])).is_err());
        assert!(validate_allowlist(&list(&["a.test\\b"])).is_err());
        assert!(validate_allowlist(&list(&["*."])).is_err());
    }
}
