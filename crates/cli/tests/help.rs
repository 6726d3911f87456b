//! `sandboxctl --help` describes every command, in its one-line summary too.

use std::process::Command;

const COMMANDS: [&str; 7] = [
    "serve", "demo", "status", "explain", "sign", "verify", "decode",
];

fn help(flag: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxctl"))
        .arg(flag)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn help_summary_names_every_command() {
    for flag in ["-h", "--help"] {
        let text = help(flag);
        let summary = text.split("Usage:").next().unwrap();
        for command in COMMANDS {
            assert!(
                summary.contains(&format!("`{command}`")),
                "{flag}: the summary does not name `{command}`:\n{summary}"
            );
        }
    }
}

#[test]
fn help_lists_every_command_with_a_description() {
    let text = help("--help");
    for command in COMMANDS {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(command) && l.trim().len() > command.len()),
            "--help has no line describing `{command}`:\n{text}"
        );
    }
}
