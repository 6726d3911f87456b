//! The machine a figure was measured on, recorded with every bench output.

use serde_json::Value;

/// Logical CPUs available and the CPU model.
pub fn machine() -> Value {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    serde_json::json!({"cpus": cpus, "cpu_model": model})
}
