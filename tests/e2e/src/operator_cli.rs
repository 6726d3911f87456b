//! Running `sandboxctl` the way an operator does, from the tests: the binary built next
//! to the test executable, its exit code, its stdout parsed as the `--json` document and
//! validated against the documented schema (`crates/cli/sandboxctl.schema.json`).

use crate::workspace_binary;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

/// What one `sandboxctl` run answered.
#[derive(Debug)]
pub struct CtlOutput {
    /// The exit code (0 ok, 1 a problem shown, 2 a usage or access error).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl CtlOutput {
    /// Standard output as the `--json` document, checked against the schema (panics with
    /// the violations otherwise).
    pub fn json(&self) -> Value {
        let doc: Value = serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"));
        assert_valid(&doc);
        doc
    }
}

fn validator() -> &'static jsonschema::Validator {
    static V: OnceLock<jsonschema::Validator> = OnceLock::new();
    V.get_or_init(|| {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates/cli/sandboxctl.schema.json");
        let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        jsonschema::validator_for(&schema).unwrap()
    })
}

/// Panics unless `doc` is valid against `sandboxctl.schema.json`.
pub fn assert_valid(doc: &Value) {
    let errors: Vec<String> = validator()
        .iter_errors(doc)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "schema violations {errors:?} in {doc:#}");
}

/// Runs `sandboxctl args...` with `envs` added to a clean environment (no AWS or OpenAI
/// variables inherited but `PATH`), off the async runtime.
pub async fn sandboxctl(args: &[&str], envs: &[(&str, &str)]) -> CtlOutput {
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    let envs: Vec<(String, String)> = envs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(workspace_binary("sandboxctl").unwrap())
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(envs)
            .output()
            .unwrap();
        CtlOutput {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    })
    .await
    .unwrap()
}
