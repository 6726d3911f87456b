//! The `remote_url` allowlist: where an executor may be sent with the executor key.
//!
//! agents-api.md: `remote_url` is passed unchanged to the executor on every start. The
//! executor connects there holding the restricted key, so a session whose `remote_url`
//! points elsewhere must never get compute (issue 13). The check parses the URL with the
//! WHATWG rules (the `url` crate, as reqwest does), so `https://api.openai.com@evil.test/`
//! has host `evil.test`, and compares the scheme and the host only; the URL itself (it
//! may carry a token) is never echoed, only its scheme and host.

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

/// One allowlist entry, parsed: an optional scheme (default: [`TLS_SCHEMES`]) and a host
/// pattern (exact, or `*.suffix` for any subdomain of `suffix`, not `suffix` itself).
struct Entry<'a> {
    scheme: Option<&'a str>,
    host: &'a str,
}

impl<'a> Entry<'a> {
    fn parse(raw: &'a str) -> Self {
        let raw = raw.trim();
        let (scheme, rest) = match raw.split_once("://") {
            Some((scheme, rest)) => (Some(scheme), rest),
            None => (None, raw),
        };
        // A port or path in an entry is ignored: the entry names a host.
        let host = rest.split(['/', ':']).next().unwrap_or(rest);
        Self { scheme, host }
    }

    fn host_matches(&self, host: &str) -> bool {
        match self.host.strip_prefix("*.") {
            Some(suffix) => host
                .strip_suffix(suffix)
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            None => self.host.eq_ignore_ascii_case(host),
        }
    }
}

/// Checks `remote_url` against `allowlist` (see
/// [`crate::observed::Policy::remote_url_allowlist`] for the entry forms).
///
/// # Errors
/// [`RemoteUrlRefusal`] naming what is wrong (scheme and host only).
pub fn check(remote_url: &str, allowlist: &[String]) -> Result<(), RemoteUrlRefusal> {
    let url = url::Url::parse(remote_url).map_err(|_| RemoteUrlRefusal::Unparsable)?;
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or(RemoteUrlRefusal::Unparsable)?
        .to_ascii_lowercase();
    if !url.username().is_empty() || url.password().is_some() {
        return Err(RemoteUrlRefusal::HasCredentials);
    }
    let scheme = url.scheme();
    let mut host_known = false;
    for entry in allowlist.iter().map(|e| Entry::parse(e)) {
        if entry.host_matches(&host) {
            host_known = true;
            let allowed = match entry.scheme {
                Some(s) => s.eq_ignore_ascii_case(scheme),
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
            host,
        })
    } else {
        Err(RemoteUrlRefusal::HostNotAllowed { host })
    }
}

/// Checks an allowlist's entries for shape: each is a host, `*.domain` or
/// `scheme://host`, without spaces, user info or an empty host.
///
/// # Errors
/// The first malformed entry's position (1-based) and what is wrong with it.
pub fn validate_allowlist(allowlist: &[String]) -> Result<(), String> {
    for (i, raw) in allowlist.iter().enumerate() {
        let n = i + 1;
        let entry = Entry::parse(raw);
        if raw.trim().is_empty() || entry.host.is_empty() || entry.host == "*." {
            return Err(format!("entry {n} has no host"));
        }
        if raw.contains(char::is_whitespace) || raw.contains('@') {
            return Err(format!(
                "entry {n} must be a host, *.domain or scheme://host (no spaces, no user info)"
            ));
        }
        let rest = entry.host.strip_prefix("*.").unwrap_or(entry.host);
        if rest.contains('*') {
            return Err(format!("entry {n} has a wildcard that is not a leading *."));
        }
        if !entry
            .scheme
            .unwrap_or("https")
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-' || b == b'.')
        {
            return Err(format!("entry {n} has an invalid scheme"));
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
            check(
                "wss://api.openai.com/v1/agents/environments/env_1/connect",
                &allow
            ),
            Ok(())
        );
        assert_eq!(
            check(
                "ws://api.openai.com/v1/agents/environments/env_1/connect",
                &allow
            ),
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
        assert_eq!(check("https://API.OpenAI.com:443/x", &allow), Ok(()));
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
    }
}
