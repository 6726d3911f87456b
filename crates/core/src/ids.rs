//! Identifiers: session and environment ids, effect keys, generations, provider instance
//! ids, deployment ids and the deterministic compute idempotency token.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps an id as given by its source (the Agents API or the compute provider).
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }
            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }
    };
}

string_id!(
    /// An Agents API session id (`sess_...`), as returned in `agent.session.id`.
    SessionId
);
string_id!(
    /// An Agents API environment id, as in `agent.session.environment.id` and in the
    /// `environment_connection` required action.
    EnvironmentId
);
string_id!(
    /// The compute provider's id of one instance: an ECS task ARN on AWS, a
    /// `pid:<pid>:<start>` handle for a local child process.
    InstanceId
);

impl EnvironmentId {
    /// The effect key that every lock, record and audit entry for this environment's
    /// compute is written under: `agents-api:environment:{environment_id}:compute`.
    pub fn effect_key(&self) -> EffectKey {
        EffectKey(format!("agents-api:environment:{}:compute", self.0))
    }
}

/// The registry key of one environment's compute:
/// `agents-api:environment:{environment_id}:compute` (docs/ARCHITECTURE.md principle 2).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EffectKey(String);

impl EffectKey {
    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The environment id inside a well-formed effect key, or `None` for any other string.
    pub fn environment_id(&self) -> Option<EnvironmentId> {
        self.0
            .strip_prefix("agents-api:environment:")
            .and_then(|rest| rest.strip_suffix(":compute"))
            .filter(|id| !id.is_empty())
            .map(EnvironmentId::new)
    }
}

impl fmt::Display for EffectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The executor generation of one environment: 1 for the first compute the controller
/// starts, +1 for every replacement or restart. 0 means "none started yet".
///
/// A stop always names the generation it targets, so a stale shutdown lease can never stop
/// a newer compute (lifecycle-cases.md row 18).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Generation(pub u64);

impl Generation {
    /// The generation after this one (saturating: `u64::MAX` stays `u64::MAX`).
    pub fn next(self) -> Self {
        Generation(self.0.saturating_add(1))
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Maximum length of a compute idempotency token: ECS `clientToken` allows 64 characters.
pub const IDEMPOTENCY_TOKEN_MAX_LEN: usize = 64;

/// The deterministic idempotency token of the compute for `(environment, generation)`.
///
/// Shape: `sl-{32 lowercase hex}-g{generation}`, at most 57 printable ASCII characters
/// (≤ [`IDEMPOTENCY_TOKEN_MAX_LEN`]). The hex part is the first 128 bits of
/// `SHA-256("{effect_key}#{generation}")`, so any environment id (whatever its length or
/// characters) yields a short token, and the same pair always yields the same token: a
/// retried start after a crash presents the same token and tags, which is how the next
/// worker finds and adopts the compute instead of creating a second one (row 12).
pub fn idempotency_token(environment_id: &EnvironmentId, generation: Generation) -> String {
    let hex = digest_hex32(&format!("{}#{}", environment_id.effect_key(), generation.0));
    format!("sl-{hex}-g{}", generation.0)
}

/// The first 128 bits of SHA-256(`text`) in lowercase hex (32 characters): the short,
/// stable names of the ECS fields with tight limits (`startedBy` ≤ 36 characters,
/// `clientToken` ≤ 64).
pub fn digest_hex32(text: &str) -> String {
    let digest = Sha256::digest(text);
    let mut hex = String::with_capacity(32);
    for byte in &digest[..16] {
        hex.push_str(&format!("{byte:02x}"));
    }
    hex
}

/// The ECS `startedBy` of the computes one deployment starts for one environment: `se-`
/// and the first 128 bits of `SHA-256("{deployment}/{effect_key}")` in hex (35
/// characters: `startedBy` allows at most 36 letters, digits, hyphens and underscores).
///
/// Why per environment: "When you specify `startedBy` as the filter, it must be the only
/// filter that you use" (ECS API reference, ListTasks), so this value alone lists one
/// environment's live tasks in one call, whatever the size of the deployment: how a worker
/// that takes over from a crashed one discovers a task that was started but never recorded
/// (lifecycle-cases.md row 12) without listing the deployment.
pub fn environment_started_by(deployment: &DeploymentId, environment_id: &EnvironmentId) -> String {
    let hex = digest_hex32(&format!(
        "{}/{}",
        deployment.as_str(),
        environment_id.effect_key()
    ));
    format!("se-{hex}")
}

/// The ECS `startedBy` of one deployment's warm pool members (docs/WARM_POOL.md): `sp-` and the first 128 bits of `SHA-256("pool/{deployment}")` in
/// hex (35 characters). Distinct from every [`environment_started_by`] (`se-…`), so the
/// pool's `ListTasks` (the refill's reconcile) and an environment's never overlap.
pub fn pool_started_by(deployment: &DeploymentId) -> String {
    format!(
        "sp-{}",
        digest_hex32(&format!("pool/{}", deployment.as_str()))
    )
}

/// Identifies one deployment of this controller; every compute it starts is tagged with
/// it (`sandbox:deployment`).
///
/// Rules (ECS `startedBy` allows up to 36 letters, digits, hyphens and underscores):
/// 1 to 36 characters of `[A-Za-z0-9_-]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DeploymentId(String);

/// A deployment id that breaks the rules of [`DeploymentId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("deployment id must be 1 to 36 characters of [A-Za-z0-9_-], got {len} characters")]
pub struct InvalidDeploymentId {
    /// Length of the rejected id, in characters.
    pub len: usize,
}

impl DeploymentId {
    /// Validates and wraps a deployment id.
    ///
    /// # Errors
    /// [`InvalidDeploymentId`] when empty, longer than 36 characters, or holding any
    /// character outside `[A-Za-z0-9_-]`.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidDeploymentId> {
        let id = id.into();
        let ok = !id.is_empty()
            && id.len() <= 36
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if ok {
            Ok(Self(id))
        } else {
            Err(InvalidDeploymentId {
                len: id.chars().count(),
            })
        }
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for DeploymentId {
    type Error = InvalidDeploymentId;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl From<DeploymentId> for String {
    fn from(d: DeploymentId) -> Self {
        d.0
    }
}

impl fmt::Display for DeploymentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_started_by_fits_ecs_started_by_and_differs_per_environment() {
        let d = DeploymentId::new("prod-eu").unwrap();
        let a = environment_started_by(&d, &EnvironmentId::new("env_a"));
        let b = environment_started_by(&d, &EnvironmentId::new("env_b"));
        let other = environment_started_by(
            &DeploymentId::new("prod-us").unwrap(),
            &EnvironmentId::new("env_a"),
        );
        for v in [&a, &b, &other] {
            assert_eq!(v.len(), 35, "{v}");
            assert!(
                v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
                "{v}"
            );
        }
        assert_ne!(a, b);
        assert_ne!(a, other);
        assert_eq!(
            a,
            environment_started_by(&d, &EnvironmentId::new("env_a")),
            "deterministic"
        );
    }

    #[test]
    fn effect_key_has_the_documented_shape_and_round_trips() {
        let env = EnvironmentId::new("env_123");
        let key = env.effect_key();
        assert_eq!(key.as_str(), "agents-api:environment:env_123:compute");
        assert_eq!(key.environment_id(), Some(env));
    }

    #[test]
    fn idempotency_token_is_deterministic_short_and_generation_specific() {
        let env = EnvironmentId::new("env_".to_owned() + &"x".repeat(500));
        let a = idempotency_token(&env, Generation(1));
        assert_eq!(a, idempotency_token(&env, Generation(1)));
        assert_ne!(a, idempotency_token(&env, Generation(2)));
        let max = idempotency_token(&env, Generation(u64::MAX));
        assert!(max.len() <= IDEMPOTENCY_TOKEN_MAX_LEN, "{}", max.len());
        assert!(max.bytes().all(|b| b.is_ascii_graphic()));
    }

    #[test]
    fn deployment_id_rejects_long_empty_and_odd_characters() {
        assert!(DeploymentId::new("prod-eu_1").is_ok());
        assert!(DeploymentId::new("a".repeat(36)).is_ok());
        assert!(DeploymentId::new("a".repeat(37)).is_err());
        assert!(DeploymentId::new("").is_err());
        assert!(DeploymentId::new("has space").is_err());
    }
}
