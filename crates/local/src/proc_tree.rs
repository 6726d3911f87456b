//! The process tree as `/proc` shows it: the parent link of every live process
//! (`/proc/<pid>/stat`, proc(5), field 4) and the descendants of a process found through
//! them. Shared by the supervisor ([`crate::supervise`], which kills the descendants) and
//! the relay ([`crate::executor_relay`], which admits only sockets of the forwarder's tree).

use std::collections::HashMap;

/// `(pid, parent pid)` of every live (not zombie) process in `/proc`.
fn process_parents() -> Vec<(i32, i32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // Fields after the parenthesised command (which may hold spaces): state, ppid.
            let rest = &stat[stat.rfind(')')? + 1..];
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            let ppid = fields.next()?.parse().ok()?;
            (state != "Z" && state != "X").then_some((pid, ppid))
        })
        .collect()
}

/// Every live descendant of `root` (children, their children, ...), read from `/proc`.
pub fn descendants(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (pid, ppid) in process_parents() {
        children.entry(ppid).or_default().push(pid);
    }
    let mut out = vec![];
    let mut next = vec![root];
    while let Some(p) = next.pop() {
        for &c in children.get(&p).into_iter().flatten() {
            if c != root && !out.contains(&c) {
                out.push(c);
                next.push(c);
            }
        }
    }
    out
}
