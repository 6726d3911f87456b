/**
 * The CDK app: one stack holding one `SandboxLifecycle`.
 *
 * Every prop comes from CDK context (`-c key=value`, or `cdk.json`); `make deploy-cdk` maps
 * its environment variables onto these keys. Required: executorImage, vpcId, subnetIds
 * (comma-separated), webhookSecretArn, openAIApiKeySecretArn, executorKeySecretArn.
 * Optional: stackName (default sandbox-lifecycle), deploymentId, executorCpuArchitecture,
 * executorCpu, executorMemory, assignPublicIp (true/false), agentIds (comma-separated),
 * workspaceDirectory, ownerMetadata (comma-separated key=value), provisionOn, shutdownGraceSecs,
 * connectDeadlineSecs, snapshotKeep, snapshotWaitSecs, snapshotRecheckSecs, closeWorkspace, historyRetentionDays,
 * workspaceVolumeGiB, workspaceVolumeType, workspaceVolumeIops, workspaceVolumeThroughput, agentsApiBaseUrl,
 * maxLifetimeSecs, lifetimeHardCapSecs, noWorkSecs, maxReplacements, replacementWindowSecs, maxExecutors,
 * remoteUrlAllowlist (comma-separated), webhookToleranceSecs, previousWebhookSecretArn,
 * operatorKeySecretArn, queueSenderArns (comma-separated),
 * poolSize, poolMaxAgeSecs, executorEgress (open/allowlist), executorEgressExtraDomains (comma-separated),
 * workerBatchSize, workerMaximumConcurrency, workerSweepMaximumConcurrency, webhookReservedConcurrency,
 * logRetentionDays, alarmTopicArn, lambdaDir.
 *
 * Code: `<lambdaDir>/<name>/bootstrap.zip` for webhook, worker and sweeper, as
 * `cargo lambda build --output-format zip` lays them out (`make build`); lambdaDir
 * defaults to `$CARGO_TARGET_DIR/lambda`, else `<repo>/target/lambda`. With
 * `-c placeholderCode=true` (tests only) the committed `placeholder-code/` directory
 * stands in, so synthesis needs no Rust build.
 */
import { App, Stack } from "aws-cdk-lib";
import * as lambda from "aws-cdk-lib/aws-lambda";
import * as logs from "aws-cdk-lib/aws-logs";
import { existsSync } from "node:fs";
import * as path from "node:path";
import { SandboxLifecycle, SandboxLifecycleCode } from "../lib/sandbox-lifecycle";

const CDK_DIR = path.resolve(__dirname, "..");
const REPO_ROOT = path.resolve(CDK_DIR, "..", "..");
const PLACEHOLDER_CODE = path.join(CDK_DIR, "placeholder-code");

const app = new App({ analyticsReporting: false });

function context(key: string): string | undefined {
  const value = app.node.tryGetContext(key);
  if (value === undefined || value === null || String(value).trim() === "") return undefined;
  return String(value).trim();
}

function required(key: string): string {
  const value = context(key);
  if (value === undefined) throw new Error(`missing CDK context ${key} (pass -c ${key}=...)`);
  return value;
}

function integer(key: string): number | undefined {
  const value = context(key);
  if (value === undefined) return undefined;
  if (!/^[0-9]+$/.test(value)) throw new Error(`CDK context ${key} must be a whole number`);
  return Number(value);
}

function list(key: string): string[] | undefined {
  return context(key)?.split(",").map((s) => s.trim());
}

function code(): SandboxLifecycleCode {
  if (context("placeholderCode") === "true") {
    const placeholder = lambda.Code.fromAsset(PLACEHOLDER_CODE);
    return { webhook: placeholder, worker: placeholder, sweeper: placeholder };
  }
  const targetDir = process.env.CARGO_TARGET_DIR ?? path.join(REPO_ROOT, "target");
  const lambdaDir = context("lambdaDir") ?? path.join(targetDir, "lambda");
  const zip = (name: string) => {
    const file = path.join(lambdaDir, name, "bootstrap.zip");
    if (!existsSync(file)) {
      throw new Error(`${file} is missing: run \`make build\` first (or pass -c lambdaDir=DIR)`);
    }
    return lambda.Code.fromAsset(file);
  };
  return { webhook: zip("webhook"), worker: zip("worker"), sweeper: zip("sweeper") };
}

/** `key=value,key=value` context as a metadata map (`OWNER_METADATA`). */
function metadataPairs(key: string): Record<string, string> | undefined {
  const items = list(key);
  if (items === undefined) return undefined;
  const out: Record<string, string> = {};
  for (const item of items) {
    const at = item.indexOf("=");
    if (at <= 0) throw new Error(`CDK context ${key} must be comma-separated key=value pairs`);
    out[item.slice(0, at).trim()] = item.slice(at + 1).trim();
  }
  return out;
}

const architecture = context("executorCpuArchitecture");
if (architecture !== undefined && architecture !== "ARM64" && architecture !== "X86_64") {
  throw new Error("CDK context executorCpuArchitecture must be ARM64 or X86_64");
}
const assignPublicIp = context("assignPublicIp");
if (assignPublicIp !== undefined && !["true", "false"].includes(assignPublicIp)) {
  throw new Error("CDK context assignPublicIp must be true or false");
}

const stack = new Stack(app, "SandboxLifecycle", {
  stackName: context("stackName") ?? "sandbox-lifecycle",
  env: { account: process.env.CDK_DEFAULT_ACCOUNT, region: process.env.CDK_DEFAULT_REGION },
  description: "sandbox-lifecycle: one ECS Fargate executor task per OpenAI Agents API self-hosted environment",
});

new SandboxLifecycle(stack, "Sandbox", {
  code: code(),
  deploymentId: context("deploymentId"),
  webhookSecretArn: required("webhookSecretArn"),
  openAIApiKeySecretArn: required("openAIApiKeySecretArn"),
  executorKeySecretArn: required("executorKeySecretArn"),
  executorImage: required("executorImage"),
  executorCpuArchitecture: architecture as "ARM64" | "X86_64" | undefined,
  executorCpu: integer("executorCpu"),
  executorMemory: integer("executorMemory"),
  vpcId: required("vpcId"),
  subnetIds: list("subnetIds") ?? [],
  assignPublicIp: assignPublicIp === "true",
  agentIds: list("agentIds"),
  workspaceDirectory: context("workspaceDirectory"),
  ownerMetadata: metadataPairs("ownerMetadata"),
  provisionOn: context("provisionOn") as "connection_request" | "created" | undefined,
  shutdownGraceSecs: integer("shutdownGraceSecs"),
  connectDeadlineSecs: integer("connectDeadlineSecs"),
  snapshotKeep: integer("snapshotKeep"),
  snapshotWaitSecs: integer("snapshotWaitSecs"),
  snapshotRecheckSecs: integer("snapshotRecheckSecs"),
  closeWorkspace: context("closeWorkspace"),
  historyRetentionDays: integer("historyRetentionDays"),
  workspaceVolumeGiB: integer("workspaceVolumeGiB"),
  workspaceVolumeType: context("workspaceVolumeType"),
  workspaceVolumeIops: integer("workspaceVolumeIops"),
  workspaceVolumeThroughput: integer("workspaceVolumeThroughput"),
  agentsApiBaseUrl: context("agentsApiBaseUrl"),
  executorMode: context("executorMode"),
  maxLifetimeSecs: integer("maxLifetimeSecs"),
  lifetimeHardCapSecs: integer("lifetimeHardCapSecs"),
  noWorkSecs: integer("noWorkSecs"),
  maxReplacements: integer("maxReplacements"),
  replacementWindowSecs: integer("replacementWindowSecs"),
  maxExecutors: integer("maxExecutors"),
  poolSize: integer("poolSize"),
  poolMaxAgeSecs: integer("poolMaxAgeSecs"),
  executorEgress: context("executorEgress"),
  executorEgressExtraDomains: list("executorEgressExtraDomains"),
  remoteUrlAllowlist: list("remoteUrlAllowlist"),
  webhookToleranceSecs: integer("webhookToleranceSecs"),
  previousWebhookSecretArn: context("previousWebhookSecretArn"),
  operatorKeySecretArn: context("operatorKeySecretArn"),
  queueSenderArns: list("queueSenderArns"),
  workerBatchSize: integer("workerBatchSize"),
  workerMaximumConcurrency: integer("workerMaximumConcurrency"),
  workerSweepMaximumConcurrency: integer("workerSweepMaximumConcurrency"),
  webhookReservedConcurrency: integer("webhookReservedConcurrency"),
  logRetentionDays: integer("logRetentionDays") as logs.RetentionDays | undefined,
  alarmTopicArn: context("alarmTopicArn"),
});
