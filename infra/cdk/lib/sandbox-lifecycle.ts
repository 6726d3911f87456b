/**
 * `SandboxLifecycle`: the whole controller in one construct — the same resources and
 * policies as `infra/sam/template.yaml` (infra/tests/test_templates.py compares the two
 * synthesized templates), with the SAM parameters as props.
 *
 * Resources with implicit grants in their L2 form (ECS cluster and task definition,
 * security group, SQS event sources) are declared at L1 or through
 * `lambda.EventSourceMapping`, and every role carries its whole policy inline: nothing is
 * added to a role behind the author's back, so the policies read here are all there is.
 *
 * Environment variables are the ones `crates/aws/src/settings/` reads.
 */
import { Duration, RemovalPolicy, Stack, Token } from "aws-cdk-lib";
import * as cloudwatch from "aws-cdk-lib/aws-cloudwatch";
import * as cwActions from "aws-cdk-lib/aws-cloudwatch-actions";
import * as dynamodb from "aws-cdk-lib/aws-dynamodb";
import * as ec2 from "aws-cdk-lib/aws-ec2";
import * as ecs from "aws-cdk-lib/aws-ecs";
import * as events from "aws-cdk-lib/aws-events";
import * as targets from "aws-cdk-lib/aws-events-targets";
import * as iam from "aws-cdk-lib/aws-iam";
import * as lambda from "aws-cdk-lib/aws-lambda";
import * as logs from "aws-cdk-lib/aws-logs";
import * as sns from "aws-cdk-lib/aws-sns";
import * as sqs from "aws-cdk-lib/aws-sqs";
import { Construct } from "constructs";
import { ExecutorEgressFilter, executorEgressProblems } from "./executor-egress";

/** The executor container's name in the task definition (the agent's commands run there). */
export const EXECUTOR_CONTAINER_NAME = "executor";
/** The forwarder container's name (split mode): the key holder, `CONTAINER_NAME`. */
export const FORWARDER_CONTAINER_NAME = "forwarder";
/** Where the listening executor serves its WebSocket inside the task (loopback only). */
export const EXECUTOR_LISTEN_URL = "ws://127.0.0.1:7070";
/** Receives before a message moves to its dead-letter queue (crates/aws/src/bootstrap.rs). */
export const MAX_RECEIVE_COUNT = 5;
/**
 * The effect-key lock lease, seconds (crates/controller/src/config.rs `lock_ttl_secs`): it
 * bounds the longest job (no start or stop after the lease minus 15 s, no write after it).
 */
export const LOCK_LEASE_SECS = 120;
/** What a record's settlement may take after its job, seconds (worker_handler.rs SETTLE_SECS). */
export const RECORD_SETTLE_SECS = 10;
/**
 * Worker function timeout, seconds: at least the record budget, lease + settle = 130 s
 * (worker_handler.rs `record_budget`: a record is begun only while that much remains before
 * the invocation's deadline; the first always is), so no job outlives its invocation.
 */
export const WORKER_TIMEOUT_SECS = 150;
/**
 * Visibility timeout of both consumed queues, seconds: 6 x the worker timeout = 900 (the
 * Lambda developer guide's rule for SQS event sources).
 */
export const QUEUE_VISIBILITY_SECS = 6 * WORKER_TIMEOUT_SECS;
/** Sweeper period and timeout, seconds. */
export const SWEEP_PERIOD_SECS = 300;

/** The three function packages. */
export interface SandboxLifecycleCode {
  /** `bootstrap` of the `webhook` binary (a zip or a directory). */
  readonly webhook: lambda.Code;
  /** `bootstrap` of the `worker` binary. */
  readonly worker: lambda.Code;
  /** `bootstrap` of the `sweeper` binary. */
  readonly sweeper: lambda.Code;
}

/** The props: one per SAM template parameter (same names, camelCase), plus the code. */
export interface SandboxLifecycleProps {
  /** The functions' code, built for `provided.al2023` on arm64 (`make build`). */
  readonly code: SandboxLifecycleCode;
  /**
   * `DEPLOYMENT_ID`: tags every executor task; 1-36 characters of [A-Za-z0-9_-].
   * @default the stack name (which must then be at most 36 characters)
   */
  readonly deploymentId?: string;
  /** Full ARN of the webhook signing secret (`whsec_...`); webhook function only. */
  readonly webhookSecretArn: string;
  /** Full ARN of the OpenAI API key secret (`sk-...`); the worker only (the sweeper reads no session). */
  readonly openAIApiKeySecretArn: string;
  /** Full ARN of the executor key secret; injected as `CODEX_API_KEY` by ECS only. */
  readonly executorKeySecretArn: string;
  /** The executor image (infra/executor), preferably pinned by digest. */
  readonly executorImage: string;
  /** @default ARM64 */
  readonly executorCpuArchitecture?: "ARM64" | "X86_64";
  /** Task CPU units. @default 1024 */
  readonly executorCpu?: number;
  /** Task memory, MiB. @default 2048 */
  readonly executorMemory?: number;
  /** VPC of the subnets (holds the egress-only security group). */
  readonly vpcId: string;
  /** `SUBNETS`: executor subnets, at least one. */
  readonly subnetIds: string[];
  /** `ASSIGN_PUBLIC_IP`. @default false */
  readonly assignPublicIp?: boolean;
  /** `AGENT_IDS`. @default any agent */
  readonly agentIds?: string[];
  /** `WORKSPACE_DIRECTORY`. @default any */
  readonly workspaceDirectory?: string;
  /**
   * `OWNER_METADATA`: metadata pairs a session must all carry for this deployment to handle
   * it (handlers sharing a project split sessions by metadata). Keys 1-64 characters, values
   * at most 512, no commas, at most 16 pairs. @default any metadata
   */
  readonly ownerMetadata?: Record<string, string>;
  /**
   * `PROVISION_ON`: `connection_request` starts a session's executor on its first
   * `environment_connection` requirement; `created` already on `agent.session.created`
   * (application-managed provisioning; the idle rules are the same). @default "connection_request"
   */
  readonly provisionOn?: "connection_request" | "created";
  /** `SHUTDOWN_GRACE_SECS`, seconds. @default 300 */
  readonly shutdownGraceSecs?: number;
  /** `CONNECT_DEADLINE_SECS`, seconds (>= 1). @default 180 */
  readonly connectDeadlineSecs?: number;
  /** `SNAPSHOT_KEEP`: workspace snapshots kept per environment (>= 1). @default 1 */
  readonly snapshotKeep?: number;
  /**
   * `SNAPSHOT_WAIT_SECS`: seconds a start waits for the snapshot it restores to leave
   * `pending` before it is a failed start (>= 1). @default 14400
   */
  readonly snapshotWaitSecs?: number;
  /** `SNAPSHOT_RECHECK_SECS`: seconds between two looks at a pending snapshot (>= 1). @default 30 */
  readonly snapshotRecheckSecs?: number;
  /** `CLOSE_WORKSPACE`: `delete` or `retain:<days>`. @default "retain:7" */
  readonly closeWorkspace?: string;
  /**
   * `HISTORY_RETENTION_DAYS`: days audit entries and receipts are kept (DynamoDB TTL),
   * 1-36500; never less than the close's workspace retention. @default 30
   */
  readonly historyRetentionDays?: number;
  /**
   * `WORKSPACE_VOLUME_GIB`: size of each executor's workspace volume (ECS-managed EBS,
   * snapshotted after the task stops, restored into the next generation), GiB, 0-16384.
   * 0 = off: no workspace survives a task. @default 0
   */
  readonly workspaceVolumeGiB?: number;
  /**
   * `WORKSPACE_VOLUME_TYPE`: EBS volume type of the workspace volume: gp3, gp2, io1, io2,
   * st1 or sc1 (sizes: gp2/gp3 1-16384, io1/io2 4-16384, st1/sc1 125-16384 GiB; ECS API
   * reference, TaskManagedEBSVolumeConfiguration). @default "gp3"
   */
  readonly workspaceVolumeType?: string;
  /**
   * `WORKSPACE_VOLUME_IOPS`: provisioned IOPS; required for io1 (100-64000) and io2
   * (100-256000), optional for gp3 (3000-16000), refused otherwise. @default unset
   */
  readonly workspaceVolumeIops?: number;
  /** `WORKSPACE_VOLUME_THROUGHPUT`: gp3 throughput, MiB/s, 125-1000. @default unset */
  readonly workspaceVolumeThroughput?: number;
  /**
   * `EXECUTOR_MODE`: `split` = the executor container holds no credential, a
   * forwarder container of the same task holds the key and runs `codex exec-server forward`;
   * `single` = fallback for codex without `forward`, the executor container holds the key.
   * @default "split"
   */
  readonly executorMode?: string;
  /**
   * `POOL_SIZE` (docs/WARM_POOL.md): idle executor tasks kept running for the next
   * starts (they count toward `maxExecutors`). 0 = off: no pool table, no task-role policy.
   * Needs `executorMode` split (in single mode the executor holds the key from its first
   * instant); synthesis refuses the combination. @default 0
   */
  readonly poolSize?: number;
  /**
   * `POOL_MAX_AGE_SECS`: a pool member's maximum age, seconds (>= 60): claimable while
   * younger, recycled from that age on. @default 3600
   */
  readonly poolMaxAgeSecs?: number;
  /**
   * Which hosts the executor may reach (docs/EGRESS.md): `open` = TCP 443 to anywhere;
   * `allowlist` = Route 53 Resolver DNS Firewall on `vpcId` (every resource of that VPC):
   * only api.openai.com, codex-cloud-environments.chatgpt.com, `executorEgressExtraDomains`
   * and the AWS endpoints the task needs resolve. @default "open"
   */
  readonly executorEgress?: string;
  /**
   * Domains the executor may also resolve with `executorEgress` allowlist (`example.com` or
   * `*.example.com`); refused with open. @default []
   */
  readonly executorEgressExtraDomains?: string[];
  /** `AGENTS_API_BASE_URL`. @default https://api.openai.com/v1 */
  readonly agentsApiBaseUrl?: string;
  /** `MAX_LIFETIME_SECS`: maximum executor lifetime, seconds (0 = off). @default 28800 */
  readonly maxLifetimeSecs?: number;
  /** `LIFETIME_HARD_CAP_SECS`: stop even mid-turn past it, seconds (0 = none). @default 32400 */
  readonly lifetimeHardCapSecs?: number;
  /** `NO_WORK_SECS`: idle without work, seconds (0 = off). @default 3600 */
  readonly noWorkSecs?: number;
  /** `MAX_REPLACEMENTS`: replacements within the window (0 = no cap). @default 3 */
  readonly maxReplacements?: number;
  /** `REPLACEMENT_WINDOW_SECS`, seconds (>= 1). @default 3600 */
  readonly replacementWindowSecs?: number;
  /**
   * `MAX_EXECUTORS`: concurrency cap, executors running at once in this deployment; a start
   * beyond it waits (`capacity_limit`) until one stops (0 = off). @default 0
   */
  readonly maxExecutors?: number;
  /** `REMOTE_URL_ALLOWLIST`: hosts a remote_url may name. @default ["api.openai.com"] */
  readonly remoteUrlAllowlist?: string[];
  /** `WEBHOOK_TOLERANCE_SECS`, seconds (1-900). @default 300 */
  readonly webhookToleranceSecs?: number;
  /** `WEBHOOK_PREVIOUS_SECRET_ARN`: the previous signing secret during a rotation. @default none */
  readonly previousWebhookSecretArn?: string;
  /**
   * `OPERATOR_KEY_SECRET_ARN`: the operator key (at least 32 characters), readable by the
   * worker and operators only; a forced close of a session no record names carries a proof
   * made with it. @default none: every such job is refused
   */
  readonly operatorKeySecretArn?: string;
  /**
   * Principal ARNs (wildcards allowed) that may send to the events, timers and sweep queues
   * besides the functions that do: operators and applications sending `timeout_reported`.
   * Every other principal is denied `sqs:SendMessage`. @default none
   */
  readonly queueSenderArns?: string[];
  /** Records per worker invocation, 1-10. @default 10 */
  readonly workerBatchSize?: number;
  /** Maximum concurrent worker invocations per queue, 2-1000. @default 10 */
  readonly workerMaximumConcurrency?: number;
  /**
   * Maximum concurrent worker invocations on the sweep queue, 2-1000: the sweep's jobs (one
   * per environment, spread over the sweep interval) have their own queue and a lower share
   * of the worker, so rechecks on the timers queue never wait behind them. @default 2
   */
  readonly workerSweepMaximumConcurrency?: number;
  /**
   * Reserved concurrency of the public webhook function: a flood of unsigned
   * POSTs is throttled there instead of taking the account's regional concurrency. 1-1000.
   * @default 10
   */
  readonly webhookReservedConcurrency?: number;
  /**
   * Reserved concurrency of the worker. Computed by default ({@link workerReservedConcurrencyOf}:
   * 2 x workerMaximumConcurrency + workerSweepMaximumConcurrency + 1 for the pool's refill);
   * an explicit value below that sum is refused (synth throws), at most 3001.
   * @default the sum (23 with the defaults)
   */
  readonly workerReservedConcurrency?: number;
  /** Log retention, days. @default 30 */
  readonly logRetentionDays?: logs.RetentionDays;
  /** SNS topic notified by the alarms. @default no alarm actions */
  readonly alarmTopicArn?: string;
}

/** An ECR image in one repository: the execution role pulls from that repository only. */
const ECR_IMAGE = /^([0-9]{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?\/([a-z0-9][a-z0-9._-]*)(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})$/;
const SECRET_ARN = /^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:.+$/;
const DEPLOYMENT_ID = /^[A-Za-z0-9_-]{1,36}$/;

function lambdaAssumeRole(): iam.ServicePrincipal {
  return new iam.ServicePrincipal("lambda.amazonaws.com");
}

/** See the module docs. */
export class SandboxLifecycle extends Construct {
  /** The public webhook endpoint (register it for the four `agent.session.*` events). */
  public readonly webhookUrl: lambda.FunctionUrl;
  public readonly eventsQueue: sqs.Queue;
  public readonly timersQueue: sqs.Queue;
  /** The sweep's jobs, one per environment (standard; consumed by the worker). */
  public readonly sweepQueue: sqs.Queue;
  public readonly table: dynamodb.Table;
  /** The warm pool's table; only with `poolSize > 0`. */
  public readonly poolTable?: dynamodb.Table;
  public readonly cluster: ecs.CfnCluster;
  public readonly taskDefinition: ecs.CfnTaskDefinition;
  public readonly webhookFunction: lambda.Function;
  public readonly workerFunction: lambda.Function;
  public readonly sweeperFunction: lambda.Function;
  /** The value of `DEPLOYMENT_ID`. */
  public readonly deploymentId: string;

  constructor(scope: Construct, id: string, props: SandboxLifecycleProps) {
    super(scope, id);
    const stack = Stack.of(this);
    validate(props);
    const deploymentId = props.deploymentId ?? stack.stackName;
    if (!Token.isUnresolved(deploymentId) && !DEPLOYMENT_ID.test(deploymentId)) {
      throw new Error(
        `deploymentId (or the stack name) must be 1-36 characters of [A-Za-z0-9_-]: got ${deploymentId.length} characters`,
      );
    }
    this.deploymentId = deploymentId;
    const retention = props.logRetentionDays ?? logs.RetentionDays.ONE_MONTH;
    const logGroup = (name: string) =>
      new logs.LogGroup(this, name, { retention, removalPolicy: RemovalPolicy.DESTROY });

    // ------------------------------------------------------------ queues
    // Events: FIFO, MessageGroupId = session id, MessageDeduplicationId = webhook-id.
    const eventsDlq = new sqs.Queue(this, "EventsDeadLetterQueue", {
      fifo: true,
      retentionPeriod: Duration.days(14),
      encryption: sqs.QueueEncryption.SQS_MANAGED,
    });
    this.eventsQueue = new sqs.Queue(this, "EventsQueue", {
      fifo: true,
      contentBasedDeduplication: false,
      visibilityTimeout: Duration.seconds(QUEUE_VISIBILITY_SECS),
      retentionPeriod: Duration.days(4),
      encryption: sqs.QueueEncryption.SQS_MANAGED,
      deadLetterQueue: { queue: eventsDlq, maxReceiveCount: MAX_RECEIVE_COUNT },
    });
    // Timers: standard (per-message DelaySeconds <= 900 works only there).
    const timersDlq = new sqs.Queue(this, "TimersDeadLetterQueue", {
      retentionPeriod: Duration.days(14),
      encryption: sqs.QueueEncryption.SQS_MANAGED,
    });
    this.timersQueue = new sqs.Queue(this, "TimersQueue", {
      visibilityTimeout: Duration.seconds(QUEUE_VISIBILITY_SECS),
      retentionPeriod: Duration.days(4),
      encryption: sqs.QueueEncryption.SQS_MANAGED,
      deadLetterQueue: { queue: timersDlq, maxReceiveCount: MAX_RECEIVE_COUNT },
    });
    // Sweep: standard too (the fan-out delays each job within the sweep interval), a queue
    // of its own so a sweep of thousands of environments never sits in front of a due
    // recheck; consumed by the worker with its own, lower, maxConcurrency.
    const sweepDlq = new sqs.Queue(this, "SweepDeadLetterQueue", {
      retentionPeriod: Duration.days(14),
      encryption: sqs.QueueEncryption.SQS_MANAGED,
    });
    this.sweepQueue = new sqs.Queue(this, "SweepQueue", {
      visibilityTimeout: Duration.seconds(QUEUE_VISIBILITY_SECS),
      retentionPeriod: Duration.days(4),
      encryption: sqs.QueueEncryption.SQS_MANAGED,
      deadLetterQueue: { queue: sweepDlq, maxReceiveCount: MAX_RECEIVE_COUNT },
    });

    // ------------------------------------------------------------ registry
    // The schema of crates/aws/src/dynamo_registry/.
    this.table = new dynamodb.Table(this, "RegistryTable", {
      partitionKey: { name: "pk", type: dynamodb.AttributeType.STRING },
      sortKey: { name: "sk", type: dynamodb.AttributeType.STRING },
      billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
      timeToLiveAttribute: "expires_at",
      pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
      encryption: dynamodb.TableEncryption.AWS_MANAGED,
      removalPolicy: RemovalPolicy.RETAIN,
    });
    this.table.addGlobalSecondaryIndex({
      indexName: "by_session",
      partitionKey: { name: "session_id", type: dynamodb.AttributeType.STRING },
      projectionType: dynamodb.ProjectionType.KEYS_ONLY,
    });
    // Sparse: only records that are not closed carry open_shard (what the sweep reads).
    this.table.addGlobalSecondaryIndex({
      indexName: "by_open",
      partitionKey: { name: "open_shard", type: dynamodb.AttributeType.STRING },
      sortKey: { name: "pk", type: dynamodb.AttributeType.STRING },
      projectionType: dynamodb.ProjectionType.ALL,
    });

    // The warm pool's table (docs/WARM_POOL.md "The pool table"; the schema of
    // crates/aws/src/pool_table/), only with the pool on. Apart from the registry, so the
    // executor task role's one grant can never reach a registry item. Sparse GSIs by_idle
    // (idle members, oldest first), by_pool (the refill's own items: launches, idle and
    // recycled members, never a claimed one) and by_environment (members claimed for an
    // environment).
    // Destroyed with the stack or when the pool is turned off: it holds only bookkeeping
    // (a claimed member's item expires with the history retention after its stop), and a
    // member whose item is gone stops itself.
    const poolSize = props.poolSize ?? 0;
    // As SAM's PoolSize MaxValue and start-up (POOL_SIZE ≤ 100: one DescribeTasks lists
    // the idle members).
    if (!Number.isInteger(poolSize) || poolSize < 0 || poolSize > 100) {
      throw new Error(`poolSize must be a whole number from 0 to 100, not ${poolSize}`);
    }
    const pool = poolSize > 0;
    if (pool) {
      const poolTable = new dynamodb.Table(this, "PoolTable", {
        partitionKey: { name: "pk", type: dynamodb.AttributeType.STRING },
        billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
        timeToLiveAttribute: "expires_at",
        pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
        encryption: dynamodb.TableEncryption.AWS_MANAGED,
        removalPolicy: RemovalPolicy.DESTROY,
      });
      poolTable.addGlobalSecondaryIndex({
        indexName: "by_idle",
        partitionKey: { name: "idle_deployment", type: dynamodb.AttributeType.STRING },
        sortKey: { name: "created_at", type: dynamodb.AttributeType.NUMBER },
        projectionType: dynamodb.ProjectionType.ALL,
      });
      poolTable.addGlobalSecondaryIndex({
        indexName: "by_pool",
        partitionKey: { name: "pool_deployment", type: dynamodb.AttributeType.STRING },
        sortKey: { name: "created_at", type: dynamodb.AttributeType.NUMBER },
        projectionType: dynamodb.ProjectionType.ALL,
      });
      poolTable.addGlobalSecondaryIndex({
        indexName: "by_environment",
        partitionKey: { name: "claimed_environment", type: dynamodb.AttributeType.STRING },
        projectionType: dynamodb.ProjectionType.ALL,
      });
      this.poolTable = poolTable;
    }

    // ------------------------------------------------------------ executor
    this.cluster = new ecs.CfnCluster(this, "ExecutorCluster");
    const executorLogs = logGroup("ExecutorLogGroup");
    // Egress-only: no ingress rule; HTTPS out (Agents API, registry, Secrets Manager).
    const securityGroup = new ec2.CfnSecurityGroup(this, "ExecutorSecurityGroup", {
      groupDescription: "sandbox-lifecycle executor tasks (egress only, HTTPS)",
      vpcId: props.vpcId,
      securityGroupEgress: [
        { ipProtocol: "tcp", fromPort: 443, toPort: 443, cidrIp: "0.0.0.0/0", description: "HTTPS out" },
      ],
    });
    if (props.executorEgress === "allowlist") {
      const registry = props.executorImage.split("/")[0];
      new ExecutorEgressFilter(this, "ExecutorEgress", {
        vpcId: props.vpcId,
        extraDomains: props.executorEgressExtraDomains ?? [],
        imageRegistry: registry,
        imageRegion: registry.split(".")[3],
        pool,
      });
    }
    const ecsTasks = new iam.ServicePrincipal("ecs-tasks.amazonaws.com");
    // Trust: ecs-tasks.amazonaws.com acting for this account only (aws:SourceAccount, IAM
    // User Guide, "The confused deputy problem").
    const executionRole = new iam.Role(this, "ExecutorExecutionRole", {
      assumedBy: ecsTasks.withConditions({ StringEquals: { "aws:SourceAccount": stack.account } }),
      inlinePolicies: {
        "executor-execution": new iam.PolicyDocument({
          statements: [
            new iam.PolicyStatement({
              sid: "ExecutorKey",
              actions: ["secretsmanager:GetSecretValue"],
              resources: [props.executorKeySecretArn],
            }),
            new iam.PolicyStatement({
              sid: "Logs",
              actions: ["logs:CreateLogStream", "logs:PutLogEvents"],
              resources: [executorLogs.logGroupArn],
            }),
            // ecr:GetAuthorizationToken has no resource type (Service Authorization
            // Reference): "*" is the only valid resource, and it grants no image access.
            new iam.PolicyStatement({
              sid: "RegistryToken",
              actions: ["ecr:GetAuthorizationToken"],
              resources: ["*"],
            }),
            new iam.PolicyStatement({
              sid: "ImagePull",
              actions: ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
              // The executor image's repository only, from executorImage.
              resources: [executorRepositoryArn(stack, props.executorImage)],
            }),
          ],
        }),
      },
    });
    // The executor task's own role (what code in either container can use). Without the
    // pool: no policy at all (codex exec-server calls no AWS API). With the pool:
    // one statement, GetItem of the task's own member item and nothing else. ECS assumes the
    // task role with the task id as the session name (aws/amazon-ecs-agent#3498,
    // aws/containers-roadmap#1917); for an assumed role aws:userid is ROLE-ID:SESSION-NAME
    // (IAM User Guide, "IAM policy elements: Variables and tags"), so dynamodb:LeadingKeys =
    // ${aws:userid} (DynamoDB Developer Guide, "Using IAM policy conditions for fine-grained
    // access control") admits exactly `<role id>:<task id>`: no other item, no write, no
    // Query or Scan, no index. "${aws:userid}" is a plain string: CDK and CloudFormation
    // substitute nothing in it, IAM reads it as the policy variable.
    // Trust: the confused-deputy guard of the ECS Developer Guide ("Amazon ECS task IAM
    // role"): only ecs-tasks.amazonaws.com acting for this account and an ECS resource of
    // this account and region. The role does not trust itself, so code in the task cannot
    // assume it again under another session name.
    // Only with the pool: without it the task definition names no task role, so code in the
    // sandbox gets no AWS credential at all. With it, the one grant plus explicit denies of
    // every other action and of GetItem on any other resource: an explicit deny in the
    // role's own policy wins over any allow, a resource policy's included (IAM User Guide,
    // "Policy evaluation logic").
    const poolTable = this.poolTable;
    const taskRole = poolTable
      ? new iam.Role(this, "ExecutorTaskRole", {
          assumedBy: new iam.ServicePrincipal("ecs-tasks.amazonaws.com").withConditions({
            ArnLike: { "aws:SourceArn": `arn:${stack.partition}:ecs:${stack.region}:${stack.account}:*` },
            StringEquals: { "aws:SourceAccount": stack.account },
          }),
          inlinePolicies: {
            "executor-task": new iam.PolicyDocument({
              statements: [
                new iam.PolicyStatement({
                  sid: "OwnPoolItem",
                  actions: ["dynamodb:GetItem"],
                  resources: [poolTable.tableArn],
                  conditions: { "ForAllValues:StringEquals": { "dynamodb:LeadingKeys": ["${aws:userid}"] } },
                }),
                new iam.PolicyStatement({
                  sid: "DenyEveryOtherAction",
                  effect: iam.Effect.DENY,
                  notActions: ["dynamodb:GetItem"],
                  resources: ["*"],
                }),
                new iam.PolicyStatement({
                  sid: "DenyEveryOtherResource",
                  effect: iam.Effect.DENY,
                  actions: ["dynamodb:GetItem"],
                  notResources: [poolTable.tableArn],
                }),
              ],
            }),
          },
        })
      : undefined;
    // The ECS infrastructure role: ECS creates, attaches, tags and deletes the
    // executor's workspace volume with it (RunTask volumeConfigurations roleArn), so the
    // executor holds no AWS credential for its files (Amazon ECS Developer Guide, "Amazon
    // ECS infrastructure IAM role").
    const workspaceGiB = props.workspaceVolumeGiB ?? 0;
    const workspaces = workspaceGiB > 0;
    // Only with workspaces on: nothing passes it otherwise.
    const infrastructureRole = workspaces
      ? new iam.Role(this, "ExecutorInfrastructureRole", {
          assumedBy: new iam.ServicePrincipal("ecs.amazonaws.com").withConditions({
            StringEquals: { "aws:SourceAccount": stack.account },
          }),
          managedPolicies: [
            iam.ManagedPolicy.fromAwsManagedPolicyName("service-role/AmazonECSInfrastructureRolePolicyForVolumes"),
          ],
        })
      : undefined;
    const family = `${stack.stackName}-executor`;
    const singleContainer = (props.executorMode ?? "split") === "single";
    // REMOTE_URL and ENVIRONMENT_ID come per task from RunTask container overrides.
    this.taskDefinition = new ecs.CfnTaskDefinition(this, "ExecutorTaskDefinition", {
      family,
      requiresCompatibilities: ["FARGATE"],
      networkMode: "awsvpc",
      cpu: String(props.executorCpu ?? 1024),
      memory: String(props.executorMemory ?? 2048),
      runtimePlatform: {
        operatingSystemFamily: "LINUX",
        cpuArchitecture: props.executorCpuArchitecture ?? "ARM64",
      },
      executionRoleArn: executionRole.roleArn,
      taskRoleArn: taskRole?.roleArn,
      // The workspace volume, configured per task at RunTask (crates/aws/src/ebs_workspaces.rs).
      volumes: workspaces ? [{ name: "workspace", configuredAtLaunch: true }] : undefined,
      // Split mode: the executor container has no secret and no environment and
      // listens on 127.0.0.1; the forwarder holds the key (secrets, read with the execution
      // role) and connects to it over the task's shared loopback. No pidMode, no shared
      // volume, no ECS Exec; the forwarder is essential and starts first.
      containerDefinitions: [
        {
          name: EXECUTOR_CONTAINER_NAME,
          image: props.executorImage,
          essential: true,
          workingDirectory: "/workspace",
          command: singleContainer ? ["single"] : ["executor", EXECUTOR_LISTEN_URL],
          dependsOn: singleContainer ? undefined : [{ containerName: FORWARDER_CONTAINER_NAME, condition: "START" }],
          mountPoints: workspaces
            ? [{ sourceVolume: "workspace", containerPath: "/workspace", readOnly: false }]
            : undefined,
          // Seconds between SIGTERM and SIGKILL (Fargate maximum 120).
          stopTimeout: 30,
          secrets: singleContainer ? [{ name: "CODEX_API_KEY", valueFrom: props.executorKeySecretArn }] : undefined,
          logConfiguration: {
            logDriver: "awslogs",
            options: {
              "awslogs-group": executorLogs.logGroupName,
              "awslogs-region": stack.region,
              "awslogs-stream-prefix": "executor",
            },
          },
        },
        ...(singleContainer
          ? []
          : [
              {
                name: FORWARDER_CONTAINER_NAME,
                image: props.executorImage,
                essential: true,
                command: ["forwarder", EXECUTOR_LISTEN_URL],
                stopTimeout: 30,
                secrets: [{ name: "CODEX_API_KEY", valueFrom: props.executorKeySecretArn }],
                logConfiguration: {
                  logDriver: "awslogs",
                  options: {
                    "awslogs-group": executorLogs.logGroupName,
                    "awslogs-region": stack.region,
                    "awslogs-stream-prefix": "forwarder",
                  },
                },
              },
            ]),
      ],
    });

    // ------------------------------------------------------------ roles
    const clusterArn = this.cluster.attrArn;
    const clusterName = this.cluster.ref;
    const taskArns = stack.formatArn({ service: "ecs", resource: "task", resourceName: `${clusterName}/*` });
    const onCluster = { ArnEquals: { "ecs:cluster": clusterArn } };
    const registryResources = [
      this.table.tableArn,
      `${this.table.tableArn}/index/by_session`,
      `${this.table.tableArn}/index/by_open`,
    ];
    const volumeArns = stack.formatArn({ service: "ec2", resource: "volume", resourceName: "*" });
    // Snapshot ARNs have no account: arn:PARTITION:ec2:REGION::snapshot/ID.
    const snapshotArns = stack.formatArn({ service: "ec2", account: "", resource: "snapshot", resourceName: "*" });
    // One set of statements per function, each with exactly the actions its code sends
    // (infra/tests/test_iam_per_function.py derives them from crates/aws/src and checks
    // both templates against them).
    // Workspace statements only with workspaces on.
    const sharedControllerStatements = (): iam.PolicyStatement[] => [
      new iam.PolicyStatement({
        sid: "DeadLetterCount",
        actions: ["sqs:GetQueueAttributes"],
        resources: [eventsDlq.queueArn],
      }),
      new iam.PolicyStatement({
        sid: "Registry",
        // UpdateItem: lock, record, release; ConditionCheckItem: the fence inside
        // TransactWriteItems (authorized per item action).
        actions: [
          "dynamodb:GetItem",
          "dynamodb:PutItem",
          "dynamodb:UpdateItem",
          "dynamodb:DeleteItem",
          "dynamodb:ConditionCheckItem",
          "dynamodb:Query",
        ],
        resources: registryResources,
      }),
      // ListTasks authorizes on the container-instance resource type.
      new iam.PolicyStatement({
        sid: "ListExecutors",
        actions: ["ecs:ListTasks"],
        resources: [
          stack.formatArn({ service: "ecs", resource: "container-instance", resourceName: `${clusterName}/*` }),
        ],
        conditions: onCluster,
      }),
    ];
    const workerStatements = (): iam.PolicyStatement[] => [
      // The worker alone reads sessions, so it alone reads the API key (the sweeper is
      // built without it: aws_wiring::sweeper_controller).
      new iam.PolicyStatement({
        sid: "ApiKey",
        actions: ["secretsmanager:GetSecretValue"],
        resources: [props.openAIApiKeySecretArn, ...(props.operatorKeySecretArn ? [props.operatorKeySecretArn] : [])],
      }),
      new iam.PolicyStatement({
        sid: "ScheduleRecheck",
        actions: ["sqs:SendMessage"],
        resources: [this.timersQueue.queueArn],
      }),
      // A sweep record not attempted (the batch's budget ran out) is deferred to its own
      // queue (worker_handler.rs defer), never among the rechecks.
      new iam.PolicyStatement({
        sid: "DeferSweep",
        actions: ["sqs:SendMessage"],
        resources: [this.sweepQueue.queueArn],
      }),
      ...sharedControllerStatements(),
      new iam.PolicyStatement({
        sid: "RunExecutor",
        actions: ["ecs:RunTask"],
        resources: [stack.formatArn({ service: "ecs", resource: "task-definition", resourceName: `${family}:*` })],
        conditions: onCluster,
      }),
      // RunTask with tags needs ecs:TagResource on the new task, only as part of RunTask.
      new iam.PolicyStatement({
        sid: "TagOnRun",
        actions: ["ecs:TagResource"],
        resources: [taskArns],
        conditions: { StringEquals: { "ecs:CreateAction": "RunTask" } },
      }),
      new iam.PolicyStatement({
        sid: "ManageExecutors",
        actions: ["ecs:StopTask", "ecs:DescribeTasks"],
        resources: [taskArns],
        conditions: onCluster,
      }),
      new iam.PolicyStatement({
        sid: "PassExecutorRoles",
        actions: ["iam:PassRole"],
        resources: [executionRole.roleArn, ...(taskRole ? [taskRole.roleArn] : [])],
        conditions: { StringEquals: { "iam:PassedToService": "ecs-tasks.amazonaws.com" } },
      }),
      // The warm pool (docs/WARM_POOL.md "ECS calls"), only with it on: the pool
      // table's calls of crates/aws/src/pool_table/ (claim: GetItem of the token, Query
      // by_idle, TransactWriteItems = UpdateItem + PutItem, authorized per item action, plus
      // the lock's ConditionCheckItem on the registry record, granted by the registry
      // statement; refill: PutItem of a launch, TransactWriteItems = PutItem + DeleteItem,
      // the lease's UpdateItem; recycle: UpdateItem; reconcile: Query by_pool, DeleteItem,
      // UpdateItem, the backstop cursor's GetItem/PutItem;
      // find: Query by_environment; describe: BatchGetItem). Members start, are described,
      // listed and stopped with the statements above (same task definition and cluster).
      ...(this.poolTable
        ? [
            new iam.PolicyStatement({
              sid: "PoolTable",
              actions: [
                "dynamodb:GetItem",
                "dynamodb:Query",
                "dynamodb:PutItem",
                "dynamodb:UpdateItem",
                "dynamodb:DeleteItem",
                "dynamodb:BatchGetItem",
              ],
              resources: [this.poolTable.tableArn, `${this.poolTable.tableArn}/index/*`],
            }),
            // A claim tags the member it assigned (TagResource outside RunTask, which
            // TagOnRun's ecs:CreateAction condition does not cover): only a pool member, only
            // the assignment's tag keys (ECS Developer Guide, "Grant permission to tag
            // resources on creation": aws:TagKeys controls the tag keys applied).
            new iam.PolicyStatement({
              sid: "TagClaimedMember",
              actions: ["ecs:TagResource"],
              resources: [taskArns],
              conditions: {
                StringEquals: { "aws:ResourceTag/sandbox:pool": "member" },
                "ForAllValues:StringEquals": {
                  "aws:TagKeys": ["sandbox:environment", "sandbox:session", "sandbox:generation"],
                },
              },
            }),
          ]
        : []),
      ...(infrastructureRole
        ? [
      // Workspaces (crates/aws/src/ebs_workspaces.rs): pass the ECS
      // infrastructure role to ECS for the volume; snapshot, delete and tag only what
      // carries this deployment's tag.
      new iam.PolicyStatement({
        sid: "PassInfrastructureRole",
        actions: ["iam:PassRole"],
        resources: [infrastructureRole.roleArn],
        conditions: { StringEquals: { "iam:PassedToService": "ecs.amazonaws.com" } },
      }),
      new iam.PolicyStatement({
        sid: "SnapshotWorkspaceVolume",
        actions: ["ec2:CreateSnapshot"],
        resources: [volumeArns],
        conditions: { StringEquals: { "aws:ResourceTag/sandbox:deployment": deploymentId } },
      }),
      new iam.PolicyStatement({
        sid: "CreateWorkspaceSnapshot",
        actions: ["ec2:CreateSnapshot"],
        resources: [snapshotArns],
        conditions: { StringEquals: { "aws:RequestTag/sandbox:deployment": deploymentId } },
      }),
      new iam.PolicyStatement({
        sid: "TagOnSnapshot",
        actions: ["ec2:CreateTags"],
        resources: [snapshotArns],
        conditions: { StringEquals: { "ec2:CreateAction": "CreateSnapshot" } },
      }),
      new iam.PolicyStatement({
        sid: "DeleteWorkspaceVolume",
        actions: ["ec2:DeleteVolume"],
        resources: [volumeArns],
        conditions: { StringEquals: { "aws:ResourceTag/sandbox:deployment": deploymentId } },
      }),
      new iam.PolicyStatement({
        sid: "DeleteWorkspaceSnapshot",
        actions: ["ec2:DeleteSnapshot"],
        resources: [snapshotArns],
        conditions: { StringEquals: { "aws:ResourceTag/sandbox:deployment": deploymentId } },
      }),
      // DescribeVolumes and DescribeSnapshots have no resource type (Service Authorization
      // Reference): "*" is the only valid resource; read-only.
      new iam.PolicyStatement({
        sid: "WorkspaceInventory",
        actions: ["ec2:DescribeVolumes", "ec2:DescribeSnapshots"],
        resources: ["*"],
      }),
          ]
        : []),
    ];
    // The sweeper reads the inventory and starts, stops, tags and snapshots nothing (the
    // jobs it fans out run in the worker); with workspaces on it deletes expendable ones.
    const sweeperStatements = (): iam.PolicyStatement[] => [
      new iam.PolicyStatement({
        sid: "FanOutSweep",
        actions: ["sqs:SendMessage"],
        resources: [this.sweepQueue.queueArn],
      }),
      ...sharedControllerStatements(),
      new iam.PolicyStatement({
        sid: "DescribeExecutors",
        actions: ["ecs:DescribeTasks"],
        resources: [taskArns],
        conditions: onCluster,
      }),
      // The warm pool, only with it on: a sweep resolves claimed pool members and never
      // starts, tags or stops one (its refill is a message to the worker on the timers
      // queue): find = Query by_environment, list/describe = BatchGetItem of member items.
      ...(this.poolTable
        ? [
            new iam.PolicyStatement({
              sid: "PoolFind",
              actions: ["dynamodb:Query"],
              resources: [`${this.poolTable.tableArn}/index/by_environment`],
            }),
            new iam.PolicyStatement({
              sid: "PoolDescribe",
              actions: ["dynamodb:BatchGetItem"],
              resources: [this.poolTable.tableArn],
            }),
          ]
        : []),
      ...(workspaces
        ? [
      new iam.PolicyStatement({
        sid: "DeleteWorkspaceVolume",
        actions: ["ec2:DeleteVolume"],
        resources: [volumeArns],
        conditions: { StringEquals: { "aws:ResourceTag/sandbox:deployment": deploymentId } },
      }),
      new iam.PolicyStatement({
        sid: "DeleteWorkspaceSnapshot",
        actions: ["ec2:DeleteSnapshot"],
        resources: [snapshotArns],
        conditions: { StringEquals: { "aws:ResourceTag/sandbox:deployment": deploymentId } },
      }),
      // DescribeVolumes and DescribeSnapshots have no resource type (Service Authorization
      // Reference): "*" is the only valid resource; read-only.
      new iam.PolicyStatement({
        sid: "WorkspaceInventory",
        actions: ["ec2:DescribeVolumes", "ec2:DescribeSnapshots"],
        resources: ["*"],
      }),
          ]
        : []),
    ];
    const logStatement = (group: logs.LogGroup) =>
      new iam.PolicyStatement({
        sid: "Logs",
        actions: ["logs:CreateLogStream", "logs:PutLogEvents"],
        resources: [group.logGroupArn],
      });

    const webhookLogs = logGroup("WebhookLogGroup");
    const workerLogs = logGroup("WorkerLogGroup");
    const sweeperLogs = logGroup("SweeperLogGroup");
    const webhookRole = new iam.Role(this, "WebhookRole", {
      assumedBy: lambdaAssumeRole(),
      inlinePolicies: {
        webhook: new iam.PolicyDocument({
          statements: [
            logStatement(webhookLogs),
            new iam.PolicyStatement({
              sid: "SigningSecret",
              actions: ["secretsmanager:GetSecretValue"],
              resources: [
                props.webhookSecretArn,
                ...(props.previousWebhookSecretArn ? [props.previousWebhookSecretArn] : []),
              ],
            }),
            new iam.PolicyStatement({
              sid: "Enqueue",
              actions: ["sqs:SendMessage"],
              resources: [this.eventsQueue.queueArn],
            }),
          ],
        }),
      },
    });
    const workerRole = new iam.Role(this, "WorkerRole", {
      assumedBy: lambdaAssumeRole(),
      inlinePolicies: {
        worker: new iam.PolicyDocument({
          statements: [
            logStatement(workerLogs),
            // The event source mapping polls with the function's role; the handler
            // changes visibility on retries (worker_handler.rs).
            new iam.PolicyStatement({
              sid: "Consume",
              actions: [
                "sqs:ReceiveMessage",
                "sqs:DeleteMessage",
                "sqs:ChangeMessageVisibility",
                "sqs:GetQueueAttributes",
              ],
              resources: [this.eventsQueue.queueArn, this.timersQueue.queueArn, this.sweepQueue.queueArn],
            }),
            ...workerStatements(),
          ],
        }),
      },
    });
    const sweeperRole = new iam.Role(this, "SweeperRole", {
      assumedBy: lambdaAssumeRole(),
      inlinePolicies: {
        sweeper: new iam.PolicyDocument({ statements: [logStatement(sweeperLogs), ...sweeperStatements()] }),
      },
    });
    // Only the principals that send may send (docs/SECURITY.md): the webhook function
    // to the events queue, the worker's rechecks and hand-offs to the timers queue, the
    // sweeper's fan-out (and the worker's deferral of a sweep record) to the sweep queue,
    // plus queueSenderArns (operators; applications sending timeout_reported). An
    // explicit deny: in the same account an identity policy alone would otherwise admit any
    // principal granted sqs:SendMessage (IAM User Guide, "Policy evaluation logic").
    const senders = props.queueSenderArns ?? [];
    const onlyTheSendersSend = (queue: sqs.Queue, roles: iam.Role[]) =>
      queue.addToResourcePolicy(
        new iam.PolicyStatement({
          sid: "OnlyTheSendersSend",
          effect: iam.Effect.DENY,
          principals: [new iam.AnyPrincipal()],
          actions: ["sqs:SendMessage"],
          resources: [queue.queueArn],
          conditions: { ArnNotLike: { "aws:PrincipalArn": [...roles.map((r) => r.roleArn), ...senders] } },
        }),
      );
    onlyTheSendersSend(this.eventsQueue, [webhookRole]);
    onlyTheSendersSend(this.timersQueue, [workerRole]);
    onlyTheSendersSend(this.sweepQueue, [workerRole, sweeperRole]);

    // ------------------------------------------------------------ functions
    const common = {
      runtime: lambda.Runtime.PROVIDED_AL2023,
      architecture: lambda.Architecture.ARM_64,
      handler: "bootstrap",
    };
    this.webhookFunction = new lambda.Function(this, "WebhookFunction", {
      ...common,
      code: props.code.webhook,
      description: "sandbox-lifecycle webhook (verify, enqueue, answer)",
      role: webhookRole,
      reservedConcurrentExecutions: props.webhookReservedConcurrency ?? 10,
      memorySize: 256,
      timeout: Duration.seconds(10),
      logGroup: webhookLogs,
      environment: {
        EVENTS_QUEUE_URL: this.eventsQueue.queueUrl,
        WEBHOOK_SECRET_ARN: props.webhookSecretArn,
        // Empty = no previous secret (the settings treat a blank variable as unset).
        WEBHOOK_PREVIOUS_SECRET_ARN: props.previousWebhookSecretArn ?? "",
        WEBHOOK_TOLERANCE_SECS: String(props.webhookToleranceSecs ?? 300),
        DEPLOYMENT_ID: deploymentId,
        PROVISION_ON: props.provisionOn ?? "connection_request",
      },
    });
    // The signature is the authentication, so the URL is public (AuthType NONE).
    this.webhookUrl = this.webhookFunction.addFunctionUrl({ authType: lambda.FunctionUrlAuthType.NONE });

    const controllerEnvironment: Record<string, string> = {
      EVENTS_QUEUE_URL: this.eventsQueue.queueUrl,
      EVENTS_DLQ_URL: eventsDlq.queueUrl,
      TIMERS_QUEUE_URL: this.timersQueue.queueUrl,
      SWEEP_QUEUE_URL: this.sweepQueue.queueUrl,
      TABLE_NAME: this.table.tableName,
      ECS_CLUSTER: clusterName,
      TASK_DEFINITION: this.taskDefinition.ref,
      CONTAINER_NAME: singleContainer ? EXECUTOR_CONTAINER_NAME : FORWARDER_CONTAINER_NAME,
      EXECUTOR_MODE: singleContainer ? "single" : "split",
      SUBNETS: props.subnetIds.join(","),
      SECURITY_GROUPS: securityGroup.attrGroupId,
      ASSIGN_PUBLIC_IP: props.assignPublicIp ? "ENABLED" : "DISABLED",
      DEPLOYMENT_ID: deploymentId,
      AGENT_IDS: (props.agentIds ?? []).join(","),
      WORKSPACE_DIRECTORY: props.workspaceDirectory ?? "",
      OWNER_METADATA: Object.entries(props.ownerMetadata ?? {}).map(([k, v]) => `${k}=${v}`).join(","),
      PROVISION_ON: props.provisionOn ?? "connection_request",
      SHUTDOWN_GRACE_SECS: String(props.shutdownGraceSecs ?? 300),
      CONNECT_DEADLINE_SECS: String(props.connectDeadlineSecs ?? 180),
      MAX_LIFETIME_SECS: String(props.maxLifetimeSecs ?? 28800),
      LIFETIME_HARD_CAP_SECS: String(props.lifetimeHardCapSecs ?? 32400),
      NO_WORK_SECS: String(props.noWorkSecs ?? 3600),
      MAX_REPLACEMENTS: String(props.maxReplacements ?? 3),
      REPLACEMENT_WINDOW_SECS: String(props.replacementWindowSecs ?? 3600),
      MAX_EXECUTORS: String(props.maxExecutors ?? 0),
      REMOTE_URL_ALLOWLIST: (props.remoteUrlAllowlist ?? ["api.openai.com"]).join(","),
      SNAPSHOT_KEEP: String(props.snapshotKeep ?? 1),
      SNAPSHOT_WAIT_SECS: String(props.snapshotWaitSecs ?? 14400),
      SNAPSHOT_RECHECK_SECS: String(props.snapshotRecheckSecs ?? 30),
      CLOSE_WORKSPACE: props.closeWorkspace ?? "retain:7",
      HISTORY_RETENTION_DAYS: String(props.historyRetentionDays ?? 30),
      // Empty = off (the settings treat a blank variable as unset).
      ECS_INFRASTRUCTURE_ROLE_ARN: infrastructureRole ? infrastructureRole.roleArn : "",
      WORKSPACE_VOLUME_GIB: workspaces ? String(workspaceGiB) : "",
      WORKSPACE_VOLUME_TYPE: workspaces ? (props.workspaceVolumeType ?? "gp3") : "",
      WORKSPACE_VOLUME_IOPS: workspaces && props.workspaceVolumeIops !== undefined ? String(props.workspaceVolumeIops) : "",
      WORKSPACE_VOLUME_THROUGHPUT:
        workspaces && props.workspaceVolumeThroughput !== undefined ? String(props.workspaceVolumeThroughput) : "",
      // The warm pool. The table and the task role's unique id (the first half of
      // every member key, `<role id>:<task id>`) only with the pool on.
      POOL_SIZE: String(poolSize),
      POOL_MAX_AGE_SECS: String(props.poolMaxAgeSecs ?? 3600),
      ...(this.poolTable && taskRole ? { POOL_TABLE_NAME: this.poolTable.tableName, POOL_TASK_ROLE_ID: taskRole.roleId } : {}),
    };
    // What only the worker reads: the Agents API and its key (the sweeper reads no session).
    const workerEnvironment: Record<string, string> = {
      ...controllerEnvironment,
      AGENTS_API_BASE_URL: props.agentsApiBaseUrl ?? "https://api.openai.com/v1",
      OPENAI_API_KEY_SECRET_ARN: props.openAIApiKeySecretArn,
      OPERATOR_KEY_SECRET_ARN: props.operatorKeySecretArn ?? "",
    };
    this.workerFunction = new lambda.Function(this, "WorkerFunction", {
      ...common,
      code: props.code.worker,
      description: "sandbox-lifecycle worker (events, timers and sweep queues)",
      role: workerRole,
      reservedConcurrentExecutions: props.workerReservedConcurrency ?? workerReservedConcurrencyOf(props),
      memorySize: 512,
      timeout: Duration.seconds(WORKER_TIMEOUT_SECS),
      logGroup: workerLogs,
      environment: workerEnvironment,
    });
    const batchSize = props.workerBatchSize ?? 10;
    const maxConcurrency = props.workerMaximumConcurrency ?? 10;
    const sweepMaxConcurrency = props.workerSweepMaximumConcurrency ?? 2;
    for (const [name, queue, max] of [
      ["Events", this.eventsQueue, maxConcurrency],
      ["Timers", this.timersQueue, maxConcurrency],
      ["Sweep", this.sweepQueue, sweepMaxConcurrency],
    ] as const) {
      new lambda.EventSourceMapping(this, `Worker${name}Source`, {
        target: this.workerFunction,
        eventSourceArn: queue.queueArn,
        batchSize,
        maxConcurrency: max,
        reportBatchItemFailures: true,
      });
    }

    this.sweeperFunction = new lambda.Function(this, "SweeperFunction", {
      ...common,
      code: props.code.sweeper,
      description: "sandbox-lifecycle sweeper (scheduled reconciliation)",
      role: sweeperRole,
      memorySize: 512,
      timeout: Duration.seconds(SWEEP_PERIOD_SECS),
      logGroup: sweeperLogs,
      environment: controllerEnvironment,
      // One sweep at a time, no retries: see the SAM template.
      reservedConcurrentExecutions: 1,
      retryAttempts: 0,
      maxEventAge: Duration.seconds(60),
    });
    new events.Rule(this, "SweepSchedule", {
      schedule: events.Schedule.rate(Duration.seconds(SWEEP_PERIOD_SECS)),
      targets: [new targets.LambdaFunction(this.sweeperFunction, { retryAttempts: 0 })],
    });
    // The pool's refill schedule (see the SAM template's PoolRefillSchedule).
    if (pool) {
      new events.Rule(this, "PoolRefillSchedule", {
        description: "sandbox-lifecycle warm pool refill (worker)",
        schedule: events.Schedule.rate(Duration.minutes(1)),
        targets: [
          new targets.LambdaFunction(this.workerFunction, {
            retryAttempts: 0,
            event: events.RuleTargetInput.fromObject({ pool_refill: {} }),
          }),
        ],
      });
    }

    // ------------------------------------------------------------ alarms
    const topic = props.alarmTopicArn ? sns.Topic.fromTopicArn(this, "AlarmTopic", props.alarmTopicArn) : undefined;
    const alarm = (
      name: string,
      description: string,
      metric: cloudwatch.IMetric,
      threshold = 1,
      periods = 1,
      datapoints = periods,
    ) => {
      const a = new cloudwatch.Alarm(this, name, {
        alarmDescription: description,
        metric,
        evaluationPeriods: periods,
        // Every period breaching unless stated (SAM states DatapointsToAlarm for all alarms alike).
        datapointsToAlarm: datapoints,
        threshold,
        comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
      });
      if (topic) a.addAlarmAction(new cwActions.SnsAction(topic));
      return a;
    };
    const fiveMinutes = Duration.minutes(5);
    alarm(
      "EventsDeadLetterAlarm",
      "Webhook jobs reached the events dead-letter queue.",
      eventsDlq.metricApproximateNumberOfMessagesVisible({ statistic: "Maximum", period: fiveMinutes }),
    );
    alarm(
      "TimersDeadLetterAlarm",
      "Timer jobs reached the timers dead-letter queue.",
      timersDlq.metricApproximateNumberOfMessagesVisible({ statistic: "Maximum", period: fiveMinutes }),
    );
    alarm(
      "SweepDeadLetterAlarm",
      "Sweep jobs reached the sweep dead-letter queue.",
      sweepDlq.metricApproximateNumberOfMessagesVisible({ statistic: "Maximum", period: fiveMinutes }),
    );
    alarm(
      "WorkerErrorsAlarm",
      "The worker function failed invocations (crash, timeout, cold start).",
      this.workerFunction.metricErrors({ statistic: "Sum", period: fiveMinutes }),
    );
    alarm(
      "SweeperErrorsAlarm",
      "The sweeper failed (inventory unavailable, crash, timeout).",
      this.sweeperFunction.metricErrors({ statistic: "Sum", period: Duration.minutes(15) }),
      2,
    );

    // The controller's own metrics: CloudWatch embedded metric format from the three
    // functions (namespace SandboxLifecycle, dimension deployment; names in
    // crates/controller/src/metrics.rs). A held reconcile or uncertain is re-decided by
    // every sweep (every 5 minutes), so "held 15 minutes" is one such decision in each of
    // three consecutive 5-minute periods.
    const lifecycle = (metricName: string, extra: Record<string, string> = {}, statistic = "Sum") =>
      new cloudwatch.Metric({
        namespace: METRICS_NAMESPACE,
        metricName,
        dimensionsMap: { deployment: deploymentId, ...extra },
        statistic,
        period: fiveMinutes,
      });
    alarm(
      "DivergentAlarm",
      "More than one compute for an environment, or a record the provider contradicts (decision outcome divergent).",
      lifecycle("decisions", { outcome: "divergent" }),
    );
    alarm(
      "ReconcileHeldAlarm",
      "An environment has waited for an owner (decision outcome reconcile) for 15 minutes.",
      lifecycle("decisions", { outcome: "reconcile" }),
      1,
      3,
    );
    alarm(
      "UncertainHeldAlarm",
      "Evidence has been missing (decision outcome uncertain) for 15 minutes.",
      lifecycle("decisions", { outcome: "uncertain" }),
      1,
      3,
    );
    alarm(
      "RemoteUrlNotAllowedAlarm",
      "A session's remote_url is not on the allowlist; no compute started for it (ceilings, reason remote_url_not_allowed).",
      lifecycle("ceilings", { reason: "remote_url_not_allowed" }),
    );
    alarm(
      "ReplacementCapAlarm",
      "An environment's executors keep missing their connect deadline; replacements are capped (ceilings, reason replacement_cap).",
      lifecycle("ceilings", { reason: "replacement_cap" }),
    );
    alarm(
      "OrphansReleasedAlarm",
      "A compute of this deployment ran without a record and was stopped by a sweep.",
      lifecycle("orphans_released"),
    );
    alarm(
      "StuckJobsAlarm",
      "A job reached the hand-off cap and is on its way to a dead-letter queue.",
      lifecycle("stuck_jobs"),
    );
    alarm(
      "FailedStartsAlarm",
      "An executor task failed to start (RunTask answered failures, or the task stopped before it ran).",
      lifecycle("start_failures"),
    );
    alarm(
      "ExecutorNeverConnectedAlarm",
      "An executor stopped without ever connecting (rejected executor key, image without codex, forwarder exit); see sandboxctl explain.",
      lifecycle("executor_never_connected"),
    );
    // Starts keep finding the warm pool empty (pool_misses) in 2 of 3 five-minute
    // periods: poolSize is too small for the start rate, or refills fail.
    if (pool) {
      alarm(
        "PoolRunsDryAlarm",
        "The warm pool runs dry - starts found no idle member (pool_misses) in 2 of 3 five-minute periods.",
        lifecycle("pool_misses"),
        1,
        3,
        2,
      );
    }

    // ------------------------------------------------------------ dashboard
    const labelled = (m: cloudwatch.Metric, label: string) => m.with({ label });
    const graph = (title: string, left: cloudwatch.IMetric[]) =>
      new cloudwatch.GraphWidget({ title, left, width: 12, height: 6 });
    new cloudwatch.Dashboard(this, "LifecycleDashboard", {
      dashboardName: `${stack.stackName}-lifecycle`,
      widgets: [
        [
          graph(
            "Decisions by outcome",
            DECISION_OUTCOMES.map((outcome) => lifecycle("decisions", { outcome })),
          ),
          graph(
            "Starts, failed starts, orphans released, hand-offs, stuck jobs, ceilings by reason",
            [
              ...CEILING_REASONS.map((reason) => lifecycle("ceilings", { reason })),
              ...["starts", "start_failures", "executor_never_connected", "orphans_released", "handoffs", "stuck_jobs", "capacity_waits"].map((n) =>
                lifecycle(n),
              ),
            ],
          ),
        ],
        [
          graph(
            "Webhook enqueue to RunTask, RunTask to executor connected (seconds)",
            [
              ...["p50", "p90", "Maximum"].map((s) => labelled(lifecycle("enqueue_to_start_seconds", {}, s), `to RunTask ${s}`)),
              ...["p50", "p90"].map((s) => labelled(lifecycle("start_to_connected_seconds", {}, s), `to connected ${s}`)),
            ],
          ),
          graph("Executor lifetime at stop and idle compute before a stop (seconds)", [
            labelled(lifecycle("executor_lifetime_seconds", {}, "p50"), "lifetime p50"),
            labelled(lifecycle("executor_lifetime_seconds", {}, "p90"), "lifetime p90"),
            labelled(lifecycle("idle_to_stop_seconds"), "idle compute seconds"),
          ]),
        ],
        [
          graph("Sweeps", [
            labelled(lifecycle("sweep_duration_seconds", {}, "Maximum"), "duration max (s)"),
            labelled(lifecycle("environments_swept"), "environments swept"),
            labelled(lifecycle("sweep_deferred"), "deferred"),
            labelled(lifecycle("sweep_no_effect"), "jobs with no effect (nothing written)"),
            labelled(lifecycle("held_environments", {}, "Maximum"), "held for an owner"),
            labelled(lifecycle("executor_slots", {}, "Maximum"), "executor slots in use"),
            // The warm pool (off on AWS by default, size 0: nothing to plot then).
            labelled(lifecycle("pool_size", {}, "Maximum"), "warm pool members idle"),
            labelled(lifecycle("pool_hits"), "warm pool hits"),
            labelled(lifecycle("pool_misses"), "warm pool misses"),
          ]),
          graph("Webhook deliveries", [
            lifecycle("webhook_accepted"),
            lifecycle("webhook_ignored"),
            ...WEBHOOK_REJECTIONS.map((reason) => lifecycle("webhook_rejected", { reason })),
          ]),
        ],
        [
          graph("Dead letters", [
            labelled(eventsDlq.metricApproximateNumberOfMessagesVisible({ statistic: "Maximum", period: fiveMinutes }), "events DLQ"),
            labelled(timersDlq.metricApproximateNumberOfMessagesVisible({ statistic: "Maximum", period: fiveMinutes }), "timers DLQ"),
            labelled(sweepDlq.metricApproximateNumberOfMessagesVisible({ statistic: "Maximum", period: fiveMinutes }), "sweep DLQ"),
          ]),
          graph(
            "Function errors",
            [this.webhookFunction, this.workerFunction, this.sweeperFunction].map((f) =>
              f.metricErrors({ statistic: "Sum", period: fiveMinutes }),
            ),
          ),
        ],
      ],
    });
  }
}

/** The namespace of the controller's EMF metrics (crates/controller/src/metrics.rs). */
const METRICS_NAMESPACE = "SandboxLifecycle";
/** Every decision outcome (sandbox_core::decision::Outcome). */
const DECISION_OUTCOMES = [
  "start",
  "adopt",
  "reuse",
  "wait",
  "replace",
  "schedule-stop",
  "cancel-stop",
  "stop",
  "release",
  "reconcile",
  "uncertain",
  "divergent",
  "cleanup",
  "ignore",
];
/** The `reason` label of `ceilings` (crates/controller/src/metrics.rs). */
const CEILING_REASONS = ["lifetime_exceeded", "lifetime_hard_cap", "no_work", "replacement_cap", "remote_url_not_allowed"];
/** The `reason` label of `webhook_rejected` (crates/controller/src/metrics.rs). */
const WEBHOOK_REJECTIONS = ["too_large", "headers", "signature", "malformed", "queue_unavailable"];

/**
 * The worker's reserved concurrency the sources and the refill need: the events and timers
 * sources' `workerMaximumConcurrency` each, the sweep source's
 * `workerSweepMaximumConcurrency`, and 1 for the pool's refill (invoked by its schedule), so
 * every source can reach its maximum concurrency and the refill still finds a slot (Lambda
 * Developer Guide, "Configuring scaling behavior for SQS event source mappings"). The SAM
 * template tabulates the same sum (Mappings `WorkerReservedConcurrency`).
 */
export function workerReservedConcurrencyOf(props: SandboxLifecycleProps): number {
  return 2 * (props.workerMaximumConcurrency ?? 10) + (props.workerSweepMaximumConcurrency ?? 2) + 1;
}

function validate(props: SandboxLifecycleProps): void {
  const problems: string[] = [];
  for (const [name, arn] of [
    ["webhookSecretArn", props.webhookSecretArn],
    ["openAIApiKeySecretArn", props.openAIApiKeySecretArn],
    ["executorKeySecretArn", props.executorKeySecretArn],
  ] as const) {
    if (!Token.isUnresolved(arn) && !SECRET_ARN.test(arn)) problems.push(`${name} must be a full Secrets Manager ARN`);
  }
  if (props.subnetIds.length === 0) problems.push("subnetIds must name at least one subnet");
  const batch = props.workerBatchSize ?? 10;
  if (batch < 1 || batch > 10) problems.push("workerBatchSize must be 1-10 (the SQS FIFO maximum)");
  const concurrency = props.workerMaximumConcurrency ?? 10;
  if (concurrency < 2 || concurrency > 1000) problems.push("workerMaximumConcurrency must be 2-1000");
  const sweepConcurrency = props.workerSweepMaximumConcurrency ?? 2;
  if (sweepConcurrency < 2 || sweepConcurrency > 1000) problems.push("workerSweepMaximumConcurrency must be 2-1000");
  if ((props.connectDeadlineSecs ?? 180) < 1) problems.push("connectDeadlineSecs must be at least 1");
  if ((props.shutdownGraceSecs ?? 300) < 0) problems.push("shutdownGraceSecs must not be negative");
  for (const [name, value] of [
    ["maxLifetimeSecs", props.maxLifetimeSecs],
    ["lifetimeHardCapSecs", props.lifetimeHardCapSecs],
    ["noWorkSecs", props.noWorkSecs],
    ["maxReplacements", props.maxReplacements],
    ["maxExecutors", props.maxExecutors],
  ] as const) {
    if (value !== undefined && (!Number.isInteger(value) || value < 0)) problems.push(`${name} must be a whole number >= 0`);
  }
  const lifetime = props.maxLifetimeSecs ?? 28800;
  const hardCap = props.lifetimeHardCapSecs ?? 32400;
  if (lifetime !== 0 && hardCap !== 0 && hardCap < lifetime) {
    problems.push("lifetimeHardCapSecs must be 0 or at least maxLifetimeSecs");
  }
  if ((props.replacementWindowSecs ?? 3600) < 1) problems.push("replacementWindowSecs must be at least 1");
  const tolerance = props.webhookToleranceSecs ?? 300;
  if (!Number.isInteger(tolerance) || tolerance < 1 || tolerance > 900) problems.push("webhookToleranceSecs must be 1-900");
  const webhookReserved = props.webhookReservedConcurrency ?? 10;
  if (!Number.isInteger(webhookReserved) || webhookReserved < 1 || webhookReserved > 1000) {
    problems.push("webhookReservedConcurrency must be 1-1000");
  }
  const needed = workerReservedConcurrencyOf(props);
  const workerReserved = props.workerReservedConcurrency ?? needed;
  if (!Number.isInteger(workerReserved) || workerReserved < needed || workerReserved > 3001) {
    problems.push(
      `workerReservedConcurrency must be ${needed}-3001: at least the events, timers and sweep sources' ` +
        "maximum concurrency plus 1 for the pool's refill",
    );
  }
  if (!ECR_IMAGE.test(props.executorImage)) {
    problems.push("executorImage must be ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPOSITORY:TAG or @sha256:DIGEST");
  }
  if (props.remoteUrlAllowlist?.some((h) => h.trim() === "" || /[\s,@]/.test(h))) {
    problems.push("remoteUrlAllowlist entries must be hosts, *.domain or scheme://host (no spaces, commas or @)");
  }
  const operatorKey = props.operatorKeySecretArn;
  if (operatorKey !== undefined && !Token.isUnresolved(operatorKey) && !SECRET_ARN.test(operatorKey)) {
    problems.push("operatorKeySecretArn must be a full Secrets Manager ARN");
  }
  const previous = props.previousWebhookSecretArn;
  if (previous !== undefined && !Token.isUnresolved(previous) && !SECRET_ARN.test(previous)) {
    problems.push("previousWebhookSecretArn must be a full Secrets Manager ARN");
  }
  if (!Number.isInteger(props.snapshotKeep ?? 1) || (props.snapshotKeep ?? 1) < 1) problems.push("snapshotKeep must be an integer of at least 1");
  if (!/^(delete|retain:[1-9][0-9]*)$/.test(props.closeWorkspace ?? "retain:7")) problems.push("closeWorkspace must be delete or retain:<days >= 1>");
  const historyDays = props.historyRetentionDays ?? 30;
  if (!Number.isInteger(historyDays) || historyDays < 1 || historyDays > 36500) problems.push("historyRetentionDays must be a whole number 1-36500");
  if (!["split", "single"].includes(props.executorMode ?? "split")) problems.push("executorMode must be split or single");
  // As the SAM template's rule PoolNeedsSplitExecutor.
  const poolSize = props.poolSize ?? 0;
  if (!Number.isInteger(poolSize) || poolSize < 0) problems.push("poolSize must be a whole number >= 0 (0 = off)");
  const poolMaxAge = props.poolMaxAgeSecs ?? 3600;
  if (!Number.isInteger(poolMaxAge) || poolMaxAge < 60) problems.push("poolMaxAgeSecs must be a whole number >= 60");
  if (poolSize > 0 && (props.executorMode ?? "split") !== "split") {
    problems.push(
      "poolSize > 0 needs executorMode split: in single mode the executor holds the key from its first instant, so a pooled executor would hold it before any assignment",
    );
  }
  const gib = props.workspaceVolumeGiB ?? 0;
  if (!Number.isInteger(gib) || gib < 0 || gib > 16384) problems.push("workspaceVolumeGiB must be a whole number 0-16384 (0 = off)");
  if (poolSize > 0 && gib > 0) {
    problems.push(
      "poolSize > 0 needs workspaceVolumeGiB 0: a pooled executor starts without the environment's workspace volume and RunTask cannot attach one to a running task",
    );
  }
  const volumeType = props.workspaceVolumeType ?? "gp3";
  if (!["gp3", "gp2", "io1", "io2", "st1", "sc1"].includes(volumeType)) {
    problems.push("workspaceVolumeType must be one of gp3, gp2, io1, io2, st1, sc1 (standard is not supported on Fargate)");
  }
  if (gib > 0) {
    // The per-type rules of crates/aws/src/settings/ (VOLUME_TYPE_RULES), which the
    // worker checks again at start-up.
    const minGib = volumeType.startsWith("io") ? 4 : volumeType === "st1" || volumeType === "sc1" ? 125 : 1;
    if (gib < minGib) problems.push(`workspaceVolumeGiB must be at least ${minGib} for ${volumeType}`);
    const iops = props.workspaceVolumeIops;
    if ((volumeType === "io1" || volumeType === "io2") && iops === undefined) {
      problems.push(`workspaceVolumeIops is required for ${volumeType}`);
    }
    if (iops !== undefined && !["gp3", "io1", "io2"].includes(volumeType)) {
      problems.push("workspaceVolumeIops is only for gp3, io1 and io2");
    }
    if (props.workspaceVolumeThroughput !== undefined && volumeType !== "gp3") {
      problems.push("workspaceVolumeThroughput is only for gp3");
    }
  }
  if (props.agentIds?.some((a) => a.trim() === "" || a.includes(","))) {
    problems.push("agentIds must be non-empty ids without commas");
  }
  const ownerMetadata = Object.entries(props.ownerMetadata ?? {});
  if (
    ownerMetadata.length > 16 ||
    ownerMetadata.some(([k, v]) => k.trim() === "" || k.length > 64 || v.length > 512 || /[,=]/.test(k) || v.includes(","))
  ) {
    problems.push("ownerMetadata must hold at most 16 pairs, keys of 1-64 characters and values of at most 512, without commas (or = in keys)");
  }
  if (!["connection_request", "created"].includes(props.provisionOn ?? "connection_request")) {
    problems.push("provisionOn must be connection_request or created");
  }
  if (props.agentsApiBaseUrl !== undefined && !/^https?:\/\/.+/.test(props.agentsApiBaseUrl)) {
    problems.push("agentsApiBaseUrl must be an absolute http(s) URL");
  }
  problems.push(...executorEgressProblems(props.executorEgress, props.executorEgressExtraDomains));
  if (problems.length > 0) throw new Error(`SandboxLifecycle: ${problems.join("; ")}`);
}

/**
 * The ECR repository ARN of `image` (`ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG` or
 * `...@sha256:DIGEST`; validateProps checks the shape).
 */
function executorRepositoryArn(stack: Stack, image: string): string {
  const m = ECR_IMAGE.exec(image);
  if (!m) throw new Error("SandboxLifecycle: executorImage is not an ECR image");
  return `arn:${stack.partition}:ecr:${m[2]}:${m[1]}:repository/${m[4]}`;
}
