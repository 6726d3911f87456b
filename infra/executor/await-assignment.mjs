// await-assignment.mjs: a warm-pool member's forwarder waits here for its assignment
// (docs/WARM_POOL.md "The forwarder waits for its assignment").
//
// entrypoint.sh runs it in the `forwarder` role when REMOTE_URL is unset and POOL_TABLE_NAME
// is set (a member started by the pool's RunTask, which gives the forwarder only
// POOL_TABLE_NAME and POOL_MAX_WAIT_SECS). It
//   1. reads its task ARN from the task metadata endpoint v4
//      (`${ECS_CONTAINER_METADATA_URI_V4}/task`, field TaskARN; no permission needed) and
//      its caller identity from sts:GetCallerIdentity (no permission needed: "No
//      permissions are required to perform this operation", STS API reference). ECS
//      assumes the task role with the task id as the role session name, so UserId is
//      `<role id>:<task id>`; anything else is refused (exit 78), because the task role's
//      only grant (dynamodb:LeadingKeys = ${aws:userid}) would not match the member key;
//   2. reads its own member item (key `<role id>:<task id>`) with a consistent GetItem once
//      a second until `state` is `assigned`;
//   3. checks the assignment (environment_id [A-Za-z0-9_-]{1,128}; remote_url https:// to
//      any host, never http: the forwarder sends the key as its registration bearer and a
//      loopback http URL would carry it in cleartext over the loopback the agent shares;
//      tests that record the registration on 127.0.0.1 set SANDBOX_TEST_ONLY_LOOPBACK_HTTP=1,
//      which neither template sets; no userinfo, no whitespace) and prints it on stdout as two lines, `REMOTE_URL=<url>` and
//      `ENVIRONMENT_ID=<id>`, which the entrypoint reads without evaluating them.
// It exits 0 without printing anything when the item says `recycled`, when the item is gone
// after it existed, or when POOL_MAX_WAIT_SECS passes: the forwarder is essential, so the
// task then stops itself (a member nobody claims ends itself even if no controller recycles
// it). Other exits: 64 usage (a missing input), 65 an invalid assignment, 69 the pool table
// does not exist, 77 access denied (the task role's policy), 78 the identity is not the
// task's, 143 on SIGTERM.
//
// The AWS SDK for JavaScript v3 reads AWS_REGION, the ECS container credentials and
// AWS_ENDPOINT_URL (tests point it at moto) itself.
import { DynamoDBClient, GetItemCommand } from "@aws-sdk/client-dynamodb";
import { GetCallerIdentityCommand, STSClient } from "@aws-sdk/client-sts";

const EX_USAGE = 64;
const EX_DATAERR = 65;
const EX_UNAVAILABLE = 69;
const EX_NOPERM = 77;
const EX_CONFIG = 78;
const POLL_MS = 1000;
// When POOL_MAX_WAIT_SECS is unset: twice the default POOL_MAX_AGE_SECS (3600), so a
// member outlives its claimable age but never idles forever.
const DEFAULT_MAX_WAIT_SECS = 7200;
// Each AWS call is bounded, so neither a hung connection nor the SDK's retries outlast
// the wait.
const REQUEST_TIMEOUT_MS = 5000;

const ENVIRONMENT_ID = /^[A-Za-z0-9_-]{1,128}$/;
// Printable ASCII without space: no whitespace, no control character, nothing that could
// end the line the entrypoint reads.
const URL_CHARACTERS = /^[\x21-\x7e]+$/;

function say(message) {
  process.stderr.write(`await-assignment: ${message}\n`);
}

function fail(status, message) {
  say(message);
  process.exit(status);
}

process.on("SIGTERM", () => fail(143, "SIGTERM while waiting for an assignment; stopping"));
process.on("SIGINT", () => fail(130, "SIGINT while waiting for an assignment; stopping"));

/** Why `url` is not a remote URL codex exec-server may be given, or null when it is one. */
export function remoteUrlProblem(url, allowLoopbackHttp = process.env.SANDBOX_TEST_ONLY_LOOPBACK_HTTP === "1") {
  if (typeof url !== "string" || !URL_CHARACTERS.test(url)) return "remote_url is empty or holds whitespace or non-ASCII characters";
  const scheme = /^([a-z]+):\/\/([^/?#]*)/i.exec(url);
  if (!scheme) return "remote_url is not an absolute http(s) URL";
  if (scheme[2].includes("@")) return "remote_url carries userinfo";
  let parsed;
  try {
    parsed = new URL(url);
  } catch {
    return "remote_url does not parse as a URL";
  }
  if (parsed.username !== "" || parsed.password !== "") return "remote_url carries userinfo";
  if (parsed.hostname === "") return "remote_url has no host";
  if (parsed.protocol === "https:") return null;
  if (allowLoopbackHttp && parsed.protocol === "http:" && parsed.hostname === "127.0.0.1") return null;
  return "remote_url must be https://";
}

/** Why `id` is not an environment id, or null. */
export function environmentIdProblem(id) {
  return typeof id === "string" && ENVIRONMENT_ID.test(id) ? null : "environment_id is not 1-128 characters of [A-Za-z0-9_-]";
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function positiveInteger(name, fallback) {
  const raw = process.env[name];
  if (raw === undefined || raw.trim() === "") return fallback;
  if (!/^[0-9]+$/.test(raw.trim()) || Number(raw) < 1) fail(EX_USAGE, `${name} must be a whole number of seconds >= 1`);
  return Number(raw);
}

async function taskId(metadataUri, deadline) {
  // The agent may answer a moment after the container starts: retry until the deadline.
  for (;;) {
    try {
      const response = await fetch(`${metadataUri}/task`, { signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const arn = (await response.json()).TaskARN;
      // arn:PARTITION:ecs:REGION:ACCOUNT:task/CLUSTER/TASK-ID (or the old task/TASK-ID).
      const match = typeof arn === "string" ? /^arn:[^:]+:ecs:[^:]*:[0-9]*:task\/(?:[^/]+\/)?([A-Za-z0-9-]+)$/.exec(arn) : null;
      if (!match) fail(EX_CONFIG, "the task metadata endpoint gave no task ARN of the form arn:...:ecs:...:task/CLUSTER/ID");
      return match[1];
    } catch (error) {
      if (Date.now() >= deadline) fail(EX_UNAVAILABLE, `the task metadata endpoint did not answer: ${error.message}`);
      await sleep(POLL_MS);
    }
  }
}

function errorName(error) {
  return error?.name ?? error?.Code ?? "Error";
}

function isAccessDenied(error) {
  return /AccessDenied|UnauthorizedOperation|NotAuthorized/.test(errorName(error));
}

async function main() {
  const started = Date.now();
  const table = process.env.POOL_TABLE_NAME ?? "";
  if (table.trim() === "") fail(EX_USAGE, "POOL_TABLE_NAME is not set (the pool's RunTask container override)");
  const metadataUri = process.env.ECS_CONTAINER_METADATA_URI_V4 ?? "";
  if (metadataUri === "") fail(EX_USAGE, "ECS_CONTAINER_METADATA_URI_V4 is not set (ECS sets it in every Fargate container)");
  const maxWaitSecs = positiveInteger("POOL_MAX_WAIT_SECS", DEFAULT_MAX_WAIT_SECS);
  const deadline = started + maxWaitSecs * 1000;

  const id = await taskId(metadataUri, deadline);
  const clientConfig = { requestHandler: { requestTimeout: REQUEST_TIMEOUT_MS, connectionTimeout: REQUEST_TIMEOUT_MS } };
  let userId;
  try {
    userId = (await new STSClient(clientConfig).send(new GetCallerIdentityCommand({}))).UserId ?? "";
  } catch (error) {
    fail(EX_UNAVAILABLE, `sts:GetCallerIdentity failed (${errorName(error)}): ${error.message}`);
  }
  const colon = userId.indexOf(":");
  const roleId = colon > 0 ? userId.slice(0, colon) : "";
  const session = colon > 0 ? userId.slice(colon + 1) : "";
  if (session !== id) {
    fail(
      EX_CONFIG,
      `the caller identity is not this task's: its role session name is "${session}", the task id is "${id}" ` +
        "(ECS names the task role's session after the task id; the pool item key is <role id>:<task id>)",
    );
  }
  const key = `${roleId}:${id}`;
  say(`task ${id}: waiting up to ${maxWaitSecs} s for an assignment in ${table}`);

  const dynamodb = new DynamoDBClient(clientConfig);
  let existed = false;
  let lastError = "";
  for (;;) {
    let item;
    try {
      item = (
        await dynamodb.send(new GetItemCommand({ TableName: table, Key: { pk: { S: key } }, ConsistentRead: true }))
      ).Item;
      lastError = "";
    } catch (error) {
      if (isAccessDenied(error)) {
        fail(
          EX_NOPERM,
          `dynamodb:GetItem on ${table} was denied (${errorName(error)}): the executor task role's policy must allow ` +
            "dynamodb:GetItem on the pool table with dynamodb:LeadingKeys = ${aws:userid} " +
            "(ExecutorTaskRole, statement OwnPoolItem, in infra/sam/template.yaml and infra/cdk)",
        );
      }
      if (errorName(error) === "ResourceNotFoundException") fail(EX_UNAVAILABLE, `the pool table ${table} does not exist`);
      // Throttling, a network error: say it once, try again next second.
      const text = `${errorName(error)}: ${error.message}`;
      if (text !== lastError) say(`GetItem failed, retrying: ${text}`);
      lastError = text;
    }
    if (item === undefined && existed && lastError === "") {
      say("the pool item is gone; stopping this member");
      return 0;
    }
    const state = item?.state?.S;
    if (item !== undefined) existed = true;
    if (state === "recycled") {
      say("this member was recycled; stopping");
      return 0;
    }
    if (state === "assigned") {
      const remoteUrl = item.remote_url?.S;
      const environmentId = item.environment_id?.S;
      const problem = environmentIdProblem(environmentId) ?? remoteUrlProblem(remoteUrl);
      if (problem) fail(EX_DATAERR, `refusing the assignment: ${problem}`);
      say(`assigned to environment ${environmentId}`);
      process.stdout.write(`REMOTE_URL=${remoteUrl}\nENVIRONMENT_ID=${environmentId}\n`);
      return 0;
    }
    // The last read is at the deadline itself: a claim made just before it still counts.
    const left = deadline - Date.now();
    if (left <= 0) {
      say(`no assignment within POOL_MAX_WAIT_SECS (${maxWaitSecs} s); stopping this member`);
      return 0;
    }
    await sleep(Math.min(POLL_MS, left));
  }
}

// process.exit, not exitCode: the SDK's keep-alive sockets must not hold the member open.
// stdout is a file or a pipe here, which Node writes synchronously on Linux, so nothing
// printed is lost.
process.exit(await main());
