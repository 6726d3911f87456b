// The executor image's `preflight` role (entrypoint.sh `preflight`): checks, from inside an
// executor task, what the executor needs to register with the Agents API, before any
// session is provisioned. `sandboxctl preflight --backend aws` starts it as a one-off
// RunTask of the executor task definition and reads its lines from CloudWatch Logs (the
// task definition's awslogs configuration); the local backend runs the same checks in
// Rust (crates/cli/src/preflight/mod.rs).
//
// Checks, in this order (the names are the local form's):
//   resolve HOST      the name resolves (node:dns lookup, every address);
//   tls HOST          a TLS handshake with HOST at its first address, the certificate
//                     verified against the image's CA roots (plus NODE_EXTRA_CA_CERTS) and
//                     the host name; a refused connection, a handshake or certificate
//                     failure or a timeout fails;
//   executor_key      the variable PREFLIGHT_KEY_VAR (default CODEX_API_KEY, injected from
//                     the task definition's `secrets` by the execution role) is set and not
//                     blank; its value is never printed;
//   executor_version  `codex --version` answers; its first line (run without the key).
// Hosts: PREFLIGHT_HOSTS, comma-separated `host` or `host:port` (port 443 by default);
// default the two hosts of the provider's guide (shared/reference/agents-api.md).
// Each check's time limit: PREFLIGHT_TIMEOUT_SECS (default 5).
//
// Output: stdout, one JSON object per line, each `{"preflight":"v1","name":…,"ok":…,
// "detail":…}`, then `{"preflight":"v1","done":true,"failed":N}` (a reader that misses the
// last line knows the run was cut short). Exit 0 when every check passed, 1 when any
// failed, 64 (EX_USAGE) on a malformed PREFLIGHT_HOSTS.

import { execFile } from "node:child_process";
import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import { connect } from "node:tls";

const DEFAULT_HOSTS = ["api.openai.com", "codex-cloud-environments.chatgpt.com"];
const KEY_VARS = ["CODEX_API_KEY", "OPENAI_API_KEY", "CODEX_ACCESS_TOKEN"];

const env = process.env;
const limitSecs = Math.max(1, Number.parseInt(env.PREFLIGHT_TIMEOUT_SECS ?? "5", 10) || 5);
const limitMs = limitSecs * 1000;
const keyVar = env.PREFLIGHT_KEY_VAR || "CODEX_API_KEY";
const codex = env.PREFLIGHT_CODEX || "codex";

/** One line of detail: whitespace runs folded to one space. */
function oneLine(s) {
  return String(s).split(/\s+/).filter(Boolean).join(" ");
}

/** `host` or `host:port` → [host, port]; throws on a malformed entry. */
function hostPort(s) {
  const i = s.lastIndexOf(":");
  if (i < 0) {
    if (!s) throw new Error("an empty host");
    return [s, 443];
  }
  const host = s.slice(0, i);
  const port = Number(s.slice(i + 1));
  if (!host) throw new Error(`${JSON.stringify(s)}: no host`);
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new Error(`${JSON.stringify(s)}: the port is not a number from 1 to 65535`);
  }
  return [host, port];
}

function withLimit(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${limitSecs} s`)), limitMs);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function resolve(host) {
  const addrs = await withLimit(lookup(host, { all: true }), "lookup");
  if (addrs.length === 0) throw new Error("resolves to no address");
  return addrs;
}

function tls(host, port, addr) {
  return new Promise((done, fail) => {
    const socket = connect({
      host,
      port,
      // The address just resolved, so the check is of that address.
      lookup: (_name, opts, cb) =>
        opts && opts.all ? cb(null, [addr]) : cb(null, addr.address, addr.family),
      // SNI takes a name, never an address (RFC 6066 section 3).
      servername: isIP(host) ? undefined : host,
      rejectUnauthorized: true,
      timeout: limitMs,
    });
    const at = addr.family === 6 ? `[${addr.address}]:${port}` : `${addr.address}:${port}`;
    socket.once("secureConnect", () => {
      const protocol = socket.getProtocol();
      socket.destroy();
      done(`TLS accepted at ${at} (${protocol})`);
    });
    socket.once("timeout", () => {
      socket.destroy();
      fail(new Error(`at ${at}: no TLS answer within ${limitSecs} s`));
    });
    socket.once("error", (e) => {
      socket.destroy();
      fail(new Error(`at ${at}: ${e.code ? `${e.code}: ` : ""}${e.message}`));
    });
  });
}

function keyReadable() {
  const value = env[keyVar];
  if (value === undefined) {
    throw new Error(`the variable ${keyVar} is not set (the task definition's secrets)`);
  }
  if (value.trim() === "") throw new Error(`the variable ${keyVar} is empty`);
  return `the variable ${keyVar} is set, not empty`;
}

function version() {
  const childEnv = { ...env };
  for (const v of KEY_VARS) delete childEnv[v];
  return new Promise((done, fail) => {
    execFile(codex, ["--version"], { env: childEnv, timeout: limitMs }, (e, stdout, stderr) => {
      const first = (s) => String(s).split("\n")[0].trim();
      if (e) {
        const why = e.killed ? `no answer within ${limitSecs} s` : first(stderr) || e.message;
        fail(new Error(`${codex} --version: ${why}`));
      } else {
        done(first(stdout));
      }
    });
  });
}

function say(name, ok, detail) {
  process.stdout.write(`${JSON.stringify({ preflight: "v1", name, ok, detail: oneLine(detail) })}\n`);
  return ok;
}

async function check(name, run) {
  try {
    return say(name, true, await run());
  } catch (e) {
    return say(name, false, e.message);
  }
}

async function main() {
  let hosts;
  try {
    const raw = env.PREFLIGHT_HOSTS ? env.PREFLIGHT_HOSTS.split(",").map((h) => h.trim()) : DEFAULT_HOSTS;
    hosts = raw.map(hostPort);
  } catch (e) {
    process.stderr.write(`preflight: PREFLIGHT_HOSTS ${e.message}\n`);
    return 64;
  }
  let failed = 0;
  const count = (ok) => {
    if (!ok) failed += 1;
  };
  for (const [host, port] of hosts) {
    let first;
    count(
      await check(`resolve ${host}`, async () => {
        const addrs = await resolve(host);
        first = addrs[0];
        const shown = addrs.slice(0, 3).map((a) => a.address);
        return `${addrs.length} address(es): ${shown.join(", ")}`;
      }),
    );
    count(
      await check(`tls ${host}`, async () => {
        if (!first) throw new Error("not checked: the name did not resolve");
        return tls(host, port, first);
      }),
    );
  }
  count(await check("executor_key", async () => keyReadable()));
  count(await check("executor_version", version));
  process.stdout.write(`${JSON.stringify({ preflight: "v1", done: true, failed })}\n`);
  return failed === 0 ? 0 : 1;
}

process.exitCode = await main();
