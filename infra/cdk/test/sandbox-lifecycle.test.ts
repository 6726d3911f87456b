/**
 * `SandboxLifecycle` as a specification, with aws-cdk-lib/assertions: the resources, the
 * least-privilege policies and the wiring to the Rust settings. Run offline with
 * `node --import tsx --test test/*.test.ts` (placeholder code, no Rust build, no bundling).
 */
import { App, Stack } from "aws-cdk-lib";
import { Match, Template } from "aws-cdk-lib/assertions";
import * as lambda from "aws-cdk-lib/aws-lambda";
import assert from "node:assert/strict";
import * as path from "node:path";
import { describe, it } from "node:test";
import {
  QUEUE_VISIBILITY_SECS,
  SandboxLifecycle,
  SandboxLifecycleProps,
  WORKER_TIMEOUT_SECS,
  workerReservedConcurrencyOf,
} from "../lib/sandbox-lifecycle";

const SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret";
const PLACEHOLDER_DIR = path.join(__dirname, "..", "placeholder-code");

function props(overrides: Partial<SandboxLifecycleProps> = {}): SandboxLifecycleProps {
  // One Code per stack: an asset belongs to the stack that first uses it.
  const code = lambda.Code.fromAsset(PLACEHOLDER_DIR);
  return {
    code: { webhook: code, worker: code, sweeper: code },
    webhookSecretArn: `${SECRET}:webhook-AbCdEf`,
    openAIApiKeySecretArn: `${SECRET}:api-key-AbCdEf`,
    executorKeySecretArn: `${SECRET}:executor-key-AbCdEf`,
    executorImage: "123456789012.dkr.ecr.us-east-1.amazonaws.com/sandbox-executor:test",
    vpcId: "vpc-0123456789abcdef0",
    subnetIds: ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
    ...overrides,
  };
}

function synth(overrides: Partial<SandboxLifecycleProps> = {}, stackName = "sandbox-test"): Template {
  const app = new App({ analyticsReporting: false });
  const stack = new Stack(app, "Test", { stackName, env: { account: "123456789012", region: "us-east-1" } });
  new SandboxLifecycle(stack, "Sandbox", props(overrides));
  return Template.fromStack(stack);
}

type Statement = { Action: string | string[]; Resource: unknown; Condition?: Record<string, unknown> };

function asList<T>(v: T | T[]): T[] {
  return Array.isArray(v) ? v : [v];
}

/** Inline statements of every role, by logical id. */
function roleStatements(template: Template): Map<string, Statement[]> {
  const out = new Map<string, Statement[]>();
  for (const [id, role] of Object.entries(template.findResources("AWS::IAM::Role"))) {
    const policies = (role.Properties.Policies ?? []) as { PolicyDocument: { Statement: Statement[] } }[];
    out.set(
      id,
      policies.flatMap((p) => p.PolicyDocument.Statement),
    );
  }
  return out;
}

function functionNamed(template: Template, binary: string): Record<string, any> {
  const found = Object.values(template.findResources("AWS::Lambda::Function")).filter((f) =>
    String(f.Properties.Description).startsWith(`sandbox-lifecycle ${binary} `),
  );
  assert.equal(found.length, 1, binary);
  return found[0].Properties;
}

describe("SandboxLifecycle", () => {
  const template = synth();

  it("declares the whole deployment", () => {
    template.resourceCountIs("AWS::Lambda::Function", 3);
    template.resourceCountIs("AWS::SQS::Queue", 6);
    template.resourceCountIs("AWS::DynamoDB::Table", 1);
    template.resourceCountIs("AWS::ECS::Cluster", 1);
    template.resourceCountIs("AWS::ECS::TaskDefinition", 1);
    template.resourceCountIs("AWS::EC2::SecurityGroup", 1);
    template.resourceCountIs("AWS::Lambda::Url", 1);
    template.resourceCountIs("AWS::Lambda::EventSourceMapping", 3);
    template.resourceCountIs("AWS::Events::Rule", 1);
    template.resourceCountIs("AWS::Logs::LogGroup", 4);
    template.resourceCountIs("AWS::CloudWatch::Alarm", 14);
    template.resourceCountIs("AWS::CloudWatch::Dashboard", 1);
    template.resourceCountIs("AWS::IAM::Policy", 0);
  });

  it("runs every function on provided.al2023 arm64", () => {
    for (const binary of ["webhook", "worker", "sweeper"]) {
      const fn = functionNamed(template, binary);
      assert.equal(fn.Runtime, "provided.al2023");
      assert.deepEqual(fn.Architectures, ["arm64"]);
      assert.equal(fn.Handler, "bootstrap");
    }
  });

  it("exposes the webhook through a public Function URL (the signature authenticates)", () => {
    template.hasResourceProperties("AWS::Lambda::Url", { AuthType: "NONE" });
    template.hasResourceProperties("AWS::Lambda::Permission", {
      Action: "lambda:InvokeFunctionUrl",
      FunctionUrlAuthType: "NONE",
      Principal: "*",
    });
  });

  it("queues events FIFO with a dead-letter queue after 5 receives", () => {
    template.hasResourceProperties("AWS::SQS::Queue", {
      FifoQueue: true,
      ContentBasedDeduplication: false,
      VisibilityTimeout: QUEUE_VISIBILITY_SECS,
      RedrivePolicy: { maxReceiveCount: 5, deadLetterTargetArn: Match.anyValue() },
    });
  });

  it("keeps both consumed queues invisible for at least 6 worker timeouts", () => {
    assert.ok(QUEUE_VISIBILITY_SECS >= 6 * WORKER_TIMEOUT_SECS);
    assert.equal(functionNamed(template, "worker").Timeout, WORKER_TIMEOUT_SECS);
    const consumed = Object.values(template.findResources("AWS::Lambda::EventSourceMapping"));
    const queues = template.findResources("AWS::SQS::Queue");
    for (const mapping of consumed) {
      const queueId = mapping.Properties.EventSourceArn["Fn::GetAtt"][0];
      assert.ok(queues[queueId].Properties.VisibilityTimeout >= 6 * WORKER_TIMEOUT_SECS);
    }
  });

  it("reports partial batch failures with the batch size and concurrency props", () => {
    const t = synth({ workerBatchSize: 5, workerMaximumConcurrency: 3, workerSweepMaximumConcurrency: 4 });
    const mappings = Object.values(t.findResources("AWS::Lambda::EventSourceMapping"));
    assert.equal(mappings.length, 3, "events, timers and sweep sources");
    const queues = t.findResources("AWS::SQS::Queue");
    const byQueue: Record<string, number> = {};
    for (const m of mappings) {
      assert.deepEqual(m.Properties.FunctionResponseTypes, ["ReportBatchItemFailures"]);
      assert.equal(m.Properties.BatchSize, 5);
      const queueId: string = m.Properties.EventSourceArn["Fn::GetAtt"][0];
      assert.ok(queues[queueId], queueId);
      const name = ["Events", "Timers", "Sweep"].find((n) => queueId.includes(`${n}Queue`));
      assert.ok(name, queueId);
      byQueue[name] = m.Properties.ScalingConfig.MaximumConcurrency;
    }
    assert.deepEqual(byQueue, { Events: 3, Timers: 3, Sweep: 4 });
    // Reserved = 2 x 3 + 4 + 1 (the refill): computed, never a free number.
    const worker = Object.values(t.findResources("AWS::Lambda::Function")).find((f) =>
      String(f.Properties.Description).includes("worker"),
    );
    assert.equal(worker?.Properties.ReservedConcurrentExecutions, 11);
  });

  it("refuses a worker reservation below the sources' maximum concurrency plus the refill", () => {
    assert.equal(workerReservedConcurrencyOf({ ...props() }), 23);
    assert.throws(
      () => synth({ workerMaximumConcurrency: 10, workerSweepMaximumConcurrency: 2, workerReservedConcurrency: 22 }),
      /workerReservedConcurrency must be 23-3001/,
    );
    assert.throws(() => synth({ workerReservedConcurrency: 20 }), /workerReservedConcurrency must be 23-3001/);
    assert.throws(() => synth({ workerSweepMaximumConcurrency: 1 }), /workerSweepMaximumConcurrency must be 2-1000/);
    // At or above the sum it is accepted.
    synth({ workerReservedConcurrency: 23 });
  });

  it("stores the registry on demand with TTL, point-in-time recovery, the by_session and by_open indexes", () => {
    template.hasResourceProperties("AWS::DynamoDB::Table", {
      BillingMode: "PAY_PER_REQUEST",
      KeySchema: [
        { AttributeName: "pk", KeyType: "HASH" },
        { AttributeName: "sk", KeyType: "RANGE" },
      ],
      TimeToLiveSpecification: { AttributeName: "expires_at", Enabled: true },
      PointInTimeRecoverySpecification: { PointInTimeRecoveryEnabled: true },
      GlobalSecondaryIndexes: [
        {
          IndexName: "by_session",
          KeySchema: [{ AttributeName: "session_id", KeyType: "HASH" }],
          Projection: { ProjectionType: "KEYS_ONLY" },
        },
        {
          IndexName: "by_open",
          KeySchema: [
            { AttributeName: "open_shard", KeyType: "HASH" },
            { AttributeName: "pk", KeyType: "RANGE" },
          ],
          Projection: { ProjectionType: "ALL" },
        },
      ],
    });
  });

  it("sweeps every 5 minutes", () => {
    template.hasResourceProperties("AWS::Events::Rule", { ScheduleExpression: "rate(5 minutes)" });
  });

  it("runs one sweep at a time, without retries", () => {
    template.hasResourceProperties("AWS::Lambda::Function", {
      Description: "sandbox-lifecycle sweeper (scheduled reconciliation)",
      ReservedConcurrentExecutions: 1,
    });
    template.hasResourceProperties("AWS::Lambda::EventInvokeConfig", {
      MaximumRetryAttempts: 0,
      MaximumEventAgeInSeconds: 60,
    });
    const [rule] = Object.values(template.findResources("AWS::Events::Rule"));
    assert.equal(rule.Properties.Targets[0].RetryPolicy.MaximumRetryAttempts, 0);
  });

  it("gives the forwarder only CODEX_API_KEY from Secrets Manager and the executor nothing", () => {
    const [taskDef] = Object.values(template.findResources("AWS::ECS::TaskDefinition"));
    const [executor, forwarder] = taskDef.Properties.ContainerDefinitions;
    assert.equal(executor.Name, "executor");
    assert.equal(forwarder.Name, "forwarder");
    assert.equal(executor.Secrets, undefined);
    assert.equal(executor.Environment, undefined);
    assert.deepEqual(executor.Command, ["executor", "ws://127.0.0.1:7070"]);
    assert.deepEqual(executor.DependsOn, [{ ContainerName: "forwarder", Condition: "START" }]);
    assert.deepEqual(forwarder.Secrets, [{ Name: "CODEX_API_KEY", ValueFrom: `${SECRET}:executor-key-AbCdEf` }]);
    assert.deepEqual(forwarder.Command, ["forwarder", "ws://127.0.0.1:7070"]);
    assert.equal(forwarder.Essential, true);
    assert.equal(forwarder.MountPoints, undefined);
    assert.equal(forwarder.Environment, undefined);
    assert.equal(taskDef.Properties.PidMode, undefined);
    assert.equal(executor.WorkingDirectory, "/workspace");
    assert.equal(executor.LogConfiguration.LogDriver, "awslogs");
    assert.deepEqual(taskDef.Properties.RequiresCompatibilities, ["FARGATE"]);
    assert.equal(taskDef.Properties.NetworkMode, "awsvpc");
  });

  it("keeps the single-container fallback behind executorMode=single, the key in the executor", () => {
    const t = synth({ executorMode: "single" });
    const [taskDef] = Object.values(t.findResources("AWS::ECS::TaskDefinition"));
    const containers = taskDef.Properties.ContainerDefinitions;
    assert.equal(containers.length, 1);
    assert.deepEqual(containers[0].Secrets, [{ Name: "CODEX_API_KEY", ValueFrom: `${SECRET}:executor-key-AbCdEf` }]);
    assert.deepEqual(containers[0].Command, ["single"]);
    const env = functionNamed(t, "worker").Environment.Variables;
    assert.equal(env.CONTAINER_NAME, "executor");
    assert.equal(env.EXECUTOR_MODE, "single");
    assert.throws(() => synth({ executorMode: "both" }), /executorMode must be split or single/);
  });

  it("opens no ingress to the executor", () => {
    const [sg] = Object.values(template.findResources("AWS::EC2::SecurityGroup"));
    assert.equal(sg.Properties.SecurityGroupIngress, undefined);
    assert.deepEqual(
      sg.Properties.SecurityGroupEgress.map((r: any) => [r.IpProtocol, r.FromPort, r.ToPort]),
      [["tcp", 443, 443]],
    );
  });

  it("never grants ECS, IAM, DynamoDB, SQS, Secrets Manager or EC2 write actions on *", () => {
    // The actions without a resource type (Service Authorization Reference): the registry
    // token, and the two reads of the workspace inventory.
    const starOnly = [["ecr:GetAuthorizationToken"], ["ec2:DescribeVolumes", "ec2:DescribeSnapshots"]];
    for (const [role, statements] of roleStatements(template)) {
      for (const s of statements) {
        const actions = asList(s.Action);
        assert.ok(!actions.some((a) => a.endsWith("*")), `${role}: wildcard action`);
        if (asList(s.Resource as unknown).includes("*")) {
          assert.ok(
            starOnly.some((allowed) => JSON.stringify(allowed) === JSON.stringify(actions)),
            `${role}: ${actions} on *`,
          );
        }
      }
    }
  });

  it("lets the controller run only the executor family and pass only the executor roles to ECS", () => {
    const worker = functionNamed(template, "worker");
    const statements = roleStatements(template).get(worker.Role["Fn::GetAtt"][0])!;
    const run = statements.find((s) => asList(s.Action).includes("ecs:RunTask"))!;
    assert.match(JSON.stringify(run.Resource), /task-definition\/sandbox-test-executor:\*/);
    assert.ok(run.Condition?.ArnEquals);
    const pass = statements.find(
      (s) => asList(s.Action).includes("iam:PassRole") && JSON.stringify(s.Condition).includes("ecs-tasks"),
    )!;
    assert.deepEqual(pass.Condition, { StringEquals: { "iam:PassedToService": "ecs-tasks.amazonaws.com" } });
    const [taskDef] = Object.values(template.findResources("AWS::ECS::TaskDefinition"));
    assert.deepEqual(
      new Set(asList(pass.Resource as unknown[]).map((r: any) => r["Fn::GetAtt"][0])),
      new Set([taskDef.Properties.ExecutionRoleArn["Fn::GetAtt"][0]]),
    );
    for (const action of ["ecs:StopTask", "ecs:DescribeTasks", "ecs:ListTasks"]) {
      const s = statements.find((st) => asList(st.Action).includes(action))!;
      assert.ok(s.Condition?.ArnEquals, `${action} is conditioned on the cluster`);
    }
  });

  it("gives the executor no task role without the pool (no AWS credential in the sandbox)", () => {
    const [taskDef] = Object.values(template.findResources("AWS::ECS::TaskDefinition"));
    assert.ok(!("TaskRoleArn" in taskDef.Properties));
  });

  it("keeps the warm pool off by default and refuses it with the single-container executor", () => {
    template.resourceCountIs("AWS::DynamoDB::Table", 1);
    for (const binary of ["worker", "sweeper"]) {
      const env = functionNamed(template, binary).Environment.Variables;
      assert.equal(env.POOL_SIZE, "0");
      assert.equal(env.POOL_MAX_AGE_SECS, "3600");
      assert.ok(!("POOL_TABLE_NAME" in env) && !("POOL_TASK_ROLE_ID" in env), binary);
    }
    assert.throws(() => synth({ poolSize: 1, executorMode: "single" }), /poolSize > 0 needs executorMode split/);
    assert.throws(() => synth({ poolSize: 1, workspaceVolumeGiB: 20 }), /poolSize > 0 needs workspaceVolumeGiB 0/);
    assert.doesNotThrow(() => synth({ poolSize: 0, workspaceVolumeGiB: 20 }));
    assert.throws(() => synth({ poolSize: -1 }), /poolSize/);
    assert.throws(() => synth({ poolMaxAgeSecs: 59 }), /poolMaxAgeSecs/);
    assert.doesNotThrow(() => synth({ poolSize: 0, executorMode: "single" }));
  });

  it("with the pool on, lets the task role read only its own pool item and wires the pool", () => {
    const t = synth({ poolSize: 3, poolMaxAgeSecs: 600 });
    t.resourceCountIs("AWS::DynamoDB::Table", 2);
    const [poolId] = Object.entries(t.findResources("AWS::DynamoDB::Table"))
      .filter(([, r]) => r.Properties.GlobalSecondaryIndexes.some((g: { IndexName: string }) => g.IndexName === "by_idle"))
      .map(([id]) => id);
    assert.ok(poolId);
    const [taskDef] = Object.values(t.findResources("AWS::ECS::TaskDefinition"));
    const taskRole = taskDef.Properties.TaskRoleArn["Fn::GetAtt"][0];
    assert.deepEqual(roleStatements(t).get(taskRole), [
      {
        Sid: "OwnPoolItem",
        Effect: "Allow",
        Action: "dynamodb:GetItem",
        Resource: { "Fn::GetAtt": [poolId, "Arn"] },
        Condition: { "ForAllValues:StringEquals": { "dynamodb:LeadingKeys": ["${aws:userid}"] } },
      },
      { Sid: "DenyEveryOtherAction", Effect: "Deny", NotAction: "dynamodb:GetItem", Resource: "*" },
      {
        Sid: "DenyEveryOtherResource",
        Effect: "Deny",
        Action: "dynamodb:GetItem",
        NotResource: { "Fn::GetAtt": [poolId, "Arn"] },
      },
    ]);
    for (const binary of ["worker", "sweeper"]) {
      const env = functionNamed(t, binary).Environment.Variables;
      assert.equal(env.POOL_SIZE, "3");
      assert.equal(env.POOL_MAX_AGE_SECS, "600");
      assert.deepEqual(env.POOL_TABLE_NAME, { Ref: poolId });
      assert.deepEqual(env.POOL_TASK_ROLE_ID, { "Fn::GetAtt": [taskRole, "RoleId"] });
    }
    const dry = Object.values(t.findResources("AWS::CloudWatch::Alarm")).filter(
      (a) => a.Properties.MetricName === "pool_misses",
    );
    assert.equal(dry.length, 1);
    assert.equal(dry[0].Properties.EvaluationPeriods, 3);
    assert.equal(dry[0].Properties.DatapointsToAlarm, 2);
  });

  it("trusts the task role to ECS tasks of this account only (confused-deputy guard)", () => {
    const pooled = synth({ poolSize: 1 });
    const [taskDef] = Object.values(pooled.findResources("AWS::ECS::TaskDefinition"));
    const taskRole = pooled.findResources("AWS::IAM::Role")[taskDef.Properties.TaskRoleArn["Fn::GetAtt"][0]];
    const [statement] = taskRole.Properties.AssumeRolePolicyDocument.Statement;
    assert.deepEqual(statement.Principal, { Service: "ecs-tasks.amazonaws.com" });
    assert.deepEqual(statement.Condition.StringEquals, { "aws:SourceAccount": "123456789012" });
    assert.deepEqual(statement.Condition.ArnLike, {
      "aws:SourceArn": { "Fn::Join": ["", ["arn:", { Ref: "AWS::Partition" }, ":ecs:us-east-1:123456789012:*"]] },
    });
  });

  it("lets each function read only its own secret", () => {
    const secretsOf = (binary: string) => {
      const role = functionNamed(template, binary).Role["Fn::GetAtt"][0];
      return roleStatements(template)
        .get(role)!
        .filter((s) => asList(s.Action).some((a) => a.startsWith("secretsmanager:")))
        .flatMap((s) => asList(s.Resource as string));
    };
    assert.deepEqual(secretsOf("webhook"), [`${SECRET}:webhook-AbCdEf`]);
    assert.deepEqual(secretsOf("worker"), [`${SECRET}:api-key-AbCdEf`]);
    // A sweep reads no session; the sweeper holds no key.
    assert.deepEqual(secretsOf("sweeper"), []);
  });

  it("wires the props to the variables the Rust settings read", () => {
    const t = synth({
      agentIds: ["agent_1", "agent_2"],
      workspaceDirectory: "/workspace",
      shutdownGraceSecs: 120,
      connectDeadlineSecs: 90,
      assignPublicIp: true,
      deploymentId: "prod-1",
    });
    const env = functionNamed(t, "worker").Environment.Variables;
    assert.equal(env.AGENT_IDS, "agent_1,agent_2");
    assert.equal(env.WORKSPACE_DIRECTORY, "/workspace");
    assert.equal(env.SHUTDOWN_GRACE_SECS, "120");
    assert.equal(env.CONNECT_DEADLINE_SECS, "90");
    assert.equal(env.ASSIGN_PUBLIC_IP, "ENABLED");
    assert.equal(env.DEPLOYMENT_ID, "prod-1");
    assert.equal(env.SUBNETS, "subnet-0123456789abcdef0,subnet-0123456789abcdef1");
    assert.equal(env.CONTAINER_NAME, "forwarder");
    assert.equal(env.EXECUTOR_MODE, "split");
    assert.deepEqual(Object.keys(functionNamed(t, "webhook").Environment.Variables).sort(), [
      "DEPLOYMENT_ID",
      "EVENTS_QUEUE_URL",
      "PROVISION_ON",
      "WEBHOOK_PREVIOUS_SECRET_ARN",
      "WEBHOOK_SECRET_ARN",
      "WEBHOOK_TOLERANCE_SECS",
    ]);
    // The webhook's metrics carry the deployment dimension too.
    assert.equal(functionNamed(t, "webhook").Environment.Variables.DEPLOYMENT_ID, "prod-1");
    // The sweeper gets the worker's variables except the Agents API, its key and the
    // operator key (the worker alone verifies forced operator jobs).
    const { AGENTS_API_BASE_URL, OPENAI_API_KEY_SECRET_ARN, OPERATOR_KEY_SECRET_ARN, ...sweeperEnv } = env;
    assert.equal(OPERATOR_KEY_SECRET_ARN, "");
    assert.ok(AGENTS_API_BASE_URL && OPENAI_API_KEY_SECRET_ARN);
    assert.deepEqual(functionNamed(t, "sweeper").Environment.Variables, sweeperEnv);
  });

  it("wires the metadata ownership rule and when to provision", () => {
    const defaults = functionNamed(template, "worker").Environment.Variables;
    assert.equal(defaults.OWNER_METADATA, "");
    assert.equal(defaults.PROVISION_ON, "connection_request");
    const t = synth({ ownerMetadata: { owner: "team-a", tier: "gold" }, provisionOn: "created" });
    for (const binary of ["worker", "sweeper"]) {
      const env = functionNamed(t, binary).Environment.Variables;
      assert.equal(env.OWNER_METADATA, "owner=team-a,tier=gold");
      assert.equal(env.PROVISION_ON, "created");
    }
    assert.equal(functionNamed(t, "webhook").Environment.Variables.PROVISION_ON, "created");
    assert.throws(() => synth({ ownerMetadata: { "": "x" } }), /ownerMetadata/);
    assert.throws(() => synth({ ownerMetadata: { owner: "a,b" } }), /ownerMetadata/);
    assert.throws(() => synth({ provisionOn: "idle" as "created" }), /provisionOn/);
  });

  it("wires the ceilings, the webhook tolerance and the previous signing secret", () => {
    const defaults = functionNamed(template, "worker").Environment.Variables;
    assert.equal(defaults.MAX_LIFETIME_SECS, "28800");
    assert.equal(defaults.LIFETIME_HARD_CAP_SECS, "32400");
    assert.equal(defaults.NO_WORK_SECS, "3600");
    assert.equal(defaults.MAX_REPLACEMENTS, "3");
    assert.equal(defaults.REPLACEMENT_WINDOW_SECS, "3600");
    assert.equal(defaults.REMOTE_URL_ALLOWLIST, "api.openai.com");
    const previous = "arn:aws:secretsmanager:us-east-1:123456789012:secret:webhook-old-AbCdEf";
    const t = synth({
      maxLifetimeSecs: 7200,
      lifetimeHardCapSecs: 0,
      noWorkSecs: 600,
      maxReplacements: 5,
      replacementWindowSecs: 1800,
      remoteUrlAllowlist: ["api.openai.com", "*.corp.example"],
      webhookToleranceSecs: 120,
      previousWebhookSecretArn: previous,
    });
    const env = functionNamed(t, "worker").Environment.Variables;
    assert.equal(env.MAX_LIFETIME_SECS, "7200");
    assert.equal(env.LIFETIME_HARD_CAP_SECS, "0");
    assert.equal(env.NO_WORK_SECS, "600");
    assert.equal(env.MAX_REPLACEMENTS, "5");
    assert.equal(env.REPLACEMENT_WINDOW_SECS, "1800");
    assert.equal(env.REMOTE_URL_ALLOWLIST, "api.openai.com,*.corp.example");
    const webhook = functionNamed(t, "webhook").Environment.Variables;
    assert.equal(webhook.WEBHOOK_TOLERANCE_SECS, "120");
    assert.equal(webhook.WEBHOOK_PREVIOUS_SECRET_ARN, previous);
    assert.ok(JSON.stringify(t.toJSON()).includes(previous));
    assert.throws(() => synth({ maxLifetimeSecs: 7200, lifetimeHardCapSecs: 3600 }), /lifetimeHardCapSecs/);
    assert.throws(() => synth({ previousWebhookSecretArn: "whsec_abc" }), /previousWebhookSecretArn/);
    assert.throws(() => synth({ remoteUrlAllowlist: ["user@evil.example"] }), /remoteUrlAllowlist/);
  });

  it("keeps workspaces on EBS when workspaceVolumeGiB is set, and not by default", () => {
    const off = functionNamed(template, "worker").Environment.Variables;
    assert.equal(off.WORKSPACE_VOLUME_GIB, "");
    assert.equal(off.ECS_INFRASTRUCTURE_ROLE_ARN, "");
    const t = synth({ workspaceVolumeGiB: 30, workspaceVolumeType: "gp2" });
    const env = functionNamed(t, "worker").Environment.Variables;
    assert.equal(env.WORKSPACE_VOLUME_GIB, "30");
    assert.equal(env.WORKSPACE_VOLUME_TYPE, "gp2");
    const [infraId] = Object.entries(t.findResources("AWS::IAM::Role")).find(([, r]) =>
      JSON.stringify(r.Properties.AssumeRolePolicyDocument).includes('"ecs.amazonaws.com"'),
    )!;
    assert.deepEqual(env.ECS_INFRASTRUCTURE_ROLE_ARN, { "Fn::GetAtt": [infraId, "Arn"] });
    const [taskDef] = Object.values(t.findResources("AWS::ECS::TaskDefinition"));
    assert.deepEqual(taskDef.Properties.Volumes, [{ Name: "workspace", ConfiguredAtLaunch: true }]);
    assert.deepEqual(taskDef.Properties.ContainerDefinitions[0].MountPoints, [
      { SourceVolume: "workspace", ContainerPath: "/workspace", ReadOnly: false },
    ]);
    assert.throws(() => synth({ workspaceVolumeGiB: 16385 }), /workspaceVolumeGiB/);
    assert.throws(() => synth({ workspaceVolumeType: "ssd" }), /workspaceVolumeType/);
  });

  it("wires the concurrency cap, off by default", () => {
    for (const fn of ["worker", "sweeper"]) {
      assert.equal(functionNamed(template, fn).Environment.Variables.MAX_EXECUTORS, "0");
      assert.equal(functionNamed(synth({ maxExecutors: 25 }), fn).Environment.Variables.MAX_EXECUTORS, "25");
    }
    assert.throws(() => synth({ maxExecutors: -1 }), /maxExecutors/);
    assert.throws(() => synth({ maxExecutors: 2.5 }), /maxExecutors/);
  });

  it("defaults DEPLOYMENT_ID to the stack name", () => {
    assert.equal(functionNamed(template, "worker").Environment.Variables.DEPLOYMENT_ID, "sandbox-test");
  });

  it("refuses a deployment id the controller would refuse", () => {
    assert.throws(() => synth({ deploymentId: "x".repeat(37) }), /1-36 characters/);
    assert.throws(() => synth({}, "a-stack-name-that-is-longer-than-36-chars"), /1-36 characters/);
  });

  it("refuses a secret given as a value instead of an ARN", () => {
    assert.throws(() => synth({ webhookSecretArn: "whsec_abc" }), /full Secrets Manager ARN/);
  });

  it("alarms on failed starts from the controller's start_failures metric, not a log filter", () => {
    assert.equal(Object.keys(template.findResources("AWS::Logs::MetricFilter")).length, 0);
    template.hasResourceProperties("AWS::CloudWatch::Alarm", {
      Namespace: "SandboxLifecycle",
      MetricName: "start_failures",
    });
  });

  it("alarms on dead letters and worker errors, notifying the topic when one is given", () => {
    const t = synth({ alarmTopicArn: "arn:aws:sns:us-east-1:123456789012:ops" });
    t.hasResourceProperties("AWS::CloudWatch::Alarm", {
      MetricName: "ApproximateNumberOfMessagesVisible",
      AlarmActions: ["arn:aws:sns:us-east-1:123456789012:ops"],
    });
    t.hasResourceProperties("AWS::CloudWatch::Alarm", { Namespace: "AWS/Lambda", MetricName: "Errors" });
    for (const alarm of Object.values(template.findResources("AWS::CloudWatch::Alarm"))) {
      assert.equal(alarm.Properties.AlarmActions, undefined);
    }
  });

  it("alarms on the controller's EMF metrics with the deployment dimension, never an id", () => {
    const emf = Object.values(template.findResources("AWS::CloudWatch::Alarm")).filter(
      (a) => a.Properties.Namespace === "SandboxLifecycle",
    );
    const shown = emf.map((a) => {
      const dims = Object.fromEntries(
        a.Properties.Dimensions.map((d: { Name: string; Value: unknown }) => [d.Name, d.Value]),
      );
      assert.ok("deployment" in dims, JSON.stringify(a.Properties));
      return `${a.Properties.MetricName}/${dims.outcome ?? dims.reason ?? ""}/${a.Properties.EvaluationPeriods}`;
    });
    assert.deepEqual(shown.sort(), [
      "ceilings/remote_url_not_allowed/1",
      "ceilings/replacement_cap/1",
      "decisions/divergent/1",
      "decisions/reconcile/3",
      "decisions/uncertain/3",
      "executor_never_connected//1",
      "orphans_released//1",
      "start_failures//1",
      "stuck_jobs//1",
    ]);
  });

  it("has one dashboard with the lifecycle metrics", () => {
    const [dashboard] = Object.values(template.findResources("AWS::CloudWatch::Dashboard"));
    const body = JSON.stringify(dashboard.Properties.DashboardBody);
    for (const metric of ["decisions", "starts", "start_failures", "enqueue_to_start_seconds", "sweep_duration_seconds", "webhook_rejected"]) {
      assert.ok(body.includes(metric), metric);
    }
  });
});
