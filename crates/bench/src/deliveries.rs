//! Signed 1 KiB deliveries, deterministic but for the timestamp.
//!
//! Each body is an `agent.session.action_required` / `environment_connection` event (the
//! one that starts compute, so every delivery goes the whole way: verify, parse, route)
//! padded with `data.metadata` to exactly [`BODY_BYTES`] bytes. Ids are derived from the
//! index, so two runs differ only in `webhook-timestamp` (the official SDK refuses
//! timestamps older than 300 s, so the file is made right before it is timed).

use sandbox_core::webhook::WebhookVerifier;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The secret the deliveries are signed with (32 bytes after `whsec_`).
pub const SECRET: &str = "whsec_c2FuZGJveC1saWZlY3ljbGUtYmVuY2gtc2VjcmV0LTMyYg==";
/// Size of every body, bytes.
pub const BODY_BYTES: usize = 1024;
/// Fixed timestamp for deliveries made inside the benches when no file is given.
pub const FIXED_TIMESTAMP: u64 = 1_764_400_000;

/// One signed delivery: the three Standard Webhooks headers and the raw body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Delivery {
    /// `webhook-id`.
    pub webhook_id: String,
    /// `webhook-signature` (`v1,<base64>`).
    pub signature: String,
    /// The body, UTF-8 JSON of exactly [`BODY_BYTES`] bytes.
    pub body: String,
}

/// The file the benches and the Python script read.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeliveryFile {
    /// The signing secret (`whsec_...`): a bench value, not a real one.
    pub secret: String,
    /// `webhook-timestamp` of every delivery, Unix seconds.
    pub timestamp: u64,
    /// The deliveries.
    pub deliveries: Vec<Delivery>,
}

impl DeliveryFile {
    /// Reads a file written by [`DeliveryFile::write`].
    ///
    /// # Errors
    /// I/O or JSON errors.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        Ok(serde_json::from_slice(&std::fs::read(path)?)?)
    }

    /// Writes it as JSON.
    ///
    /// # Errors
    /// I/O errors.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, serde_json::to_vec(self)?)?;
        Ok(())
    }

    /// The deliveries of `$SANDBOX_BENCH_DELIVERIES` when set, else `count` made now with
    /// [`FIXED_TIMESTAMP`].
    ///
    /// # Panics
    /// When the file named by the variable cannot be read (a bench setup error).
    pub fn from_env_or(count: usize) -> Self {
        match std::env::var_os("SANDBOX_BENCH_DELIVERIES") {
            Some(path) => Self::read(Path::new(&path))
                .unwrap_or_else(|e| panic!("SANDBOX_BENCH_DELIVERIES {path:?}: {e}")),
            None => make(count, FIXED_TIMESTAMP),
        }
    }
}

/// The body of delivery `i`: exactly [`BODY_BYTES`] bytes.
pub fn body(i: usize, created_at: u64) -> String {
    let head = format!(
        r#"{{"id":"evt_{i:024x}","object":"event","type":"agent.session.action_required","created_at":{created_at},"data":{{"id":"sess_{i:024x}","required_action":{{"type":"environment_connection"}},"metadata":{{"team":"payments","repository":"github.com/example/payments-service","ticket":"PAY-{n:04}","pad":""#,
        n = i % 10_000
    );
    let tail = r#""}}}"#;
    let pad = BODY_BYTES.saturating_sub(head.len() + tail.len());
    // Varied but deterministic filler, plain ASCII so JSON parsers do real string work.
    let filler: String = (0..pad)
        .map(|k| char::from(b'a' + ((k * 7 + i) % 26) as u8))
        .collect();
    format!("{head}{filler}{tail}")
}

/// `count` deliveries signed with [`SECRET`] at `timestamp`.
///
/// # Panics
/// Never: [`SECRET`] is a valid secret.
pub fn make(count: usize, timestamp: u64) -> DeliveryFile {
    let verifier = WebhookVerifier::new(SECRET).expect("bench secret is valid");
    let deliveries = (0..count)
        .map(|i| {
            let body = body(i, timestamp.saturating_sub(1));
            let webhook_id = format!("msg_bench{i:022}");
            let signature = verifier.sign(&webhook_id, timestamp, body.as_bytes());
            Delivery {
                webhook_id,
                signature,
                body,
            }
        })
        .collect();
    DeliveryFile {
        secret: SECRET.to_owned(),
        timestamp,
        deliveries,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_body_is_exactly_one_kib_of_json_that_verifies() {
        let file = make(50, FIXED_TIMESTAMP);
        let verifier = WebhookVerifier::new(SECRET).unwrap();
        for d in &file.deliveries {
            assert_eq!(d.body.len(), BODY_BYTES);
            serde_json::from_str::<serde_json::Value>(&d.body).unwrap();
            verifier
                .verify_parts(
                    &d.webhook_id,
                    &FIXED_TIMESTAMP.to_string(),
                    &d.signature,
                    d.body.as_bytes(),
                    FIXED_TIMESTAMP,
                )
                .unwrap();
        }
    }
}
