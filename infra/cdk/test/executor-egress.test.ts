/**
 * `executorEgress` (docs/EGRESS.md, lib/executor-egress.ts): open deploys no DNS Firewall,
 * allowlist deploys one whose first rule admits exactly the two default hosts plus the
 * extras; bad values are refused at synth. The full rule order and the SAM counterpart are
 * checked by infra/tests/test_egress.py.
 */
import { App, Stack } from "aws-cdk-lib";
import { Template } from "aws-cdk-lib/assertions";
import * as lambda from "aws-cdk-lib/aws-lambda";
import assert from "node:assert/strict";
import * as path from "node:path";
import { describe, it } from "node:test";
import { EXECUTOR_EGRESS_DEFAULT_DOMAINS } from "../lib/executor-egress";
import { SandboxLifecycle, SandboxLifecycleProps } from "../lib/sandbox-lifecycle";

const SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret";

function synth(overrides: Partial<SandboxLifecycleProps> = {}): Template {
  const app = new App({ analyticsReporting: false });
  const stack = new Stack(app, "Test", { stackName: "egress-test", env: { account: "123456789012", region: "us-east-1" } });
  const code = lambda.Code.fromAsset(path.join(__dirname, "..", "placeholder-code"));
  new SandboxLifecycle(stack, "Sandbox", {
    code: { webhook: code, worker: code, sweeper: code },
    webhookSecretArn: `${SECRET}:webhook-AbCdEf`,
    openAIApiKeySecretArn: `${SECRET}:api-key-AbCdEf`,
    executorKeySecretArn: `${SECRET}:executor-key-AbCdEf`,
    executorImage: "123456789012.dkr.ecr.us-east-1.amazonaws.com/sandbox-executor:test",
    vpcId: "vpc-0123456789abcdef0",
    subnetIds: ["subnet-0123456789abcdef0"],
    ...overrides,
  });
  return Template.fromStack(stack);
}

function firewallTypes(template: Template): string[] {
  return Object.values(template.toJSON().Resources as Record<string, { Type: string }>)
    .map((r) => r.Type)
    .filter((t) => t.startsWith("AWS::Route53Resolver::"))
    .sort();
}

describe("executorEgress", () => {
  it("deploys no DNS Firewall when open (the default)", () => {
    assert.deepEqual(firewallTypes(synth()), []);
    assert.deepEqual(firewallTypes(synth({ executorEgress: "open" })), []);
  });

  it("with allowlist, admits the two default hosts plus the extras first, on the executors' VPC", () => {
    const template = synth({ executorEgress: "allowlist", executorEgressExtraDomains: ["pypi.org"] });
    assert.deepEqual(firewallTypes(template), [
      "AWS::Route53Resolver::FirewallDomainList",
      "AWS::Route53Resolver::FirewallDomainList",
      "AWS::Route53Resolver::FirewallDomainList",
      "AWS::Route53Resolver::FirewallRuleGroup",
      "AWS::Route53Resolver::FirewallRuleGroupAssociation",
    ]);
    const lists = template.findResources("AWS::Route53Resolver::FirewallDomainList");
    const [groupId, group] = Object.entries(template.findResources("AWS::Route53Resolver::FirewallRuleGroup"))[0];
    const rules = [...group.Properties.FirewallRules].sort((a, b) => a.Priority - b.Priority);
    const first = lists[rules[0].FirewallDomainListId["Fn::GetAtt"][0]];
    assert.equal(rules[0].Action, "ALLOW");
    assert.deepEqual(first.Properties.Domains, [...EXECUTOR_EGRESS_DEFAULT_DOMAINS, "pypi.org"]);
    const last = lists[rules[rules.length - 1].FirewallDomainListId["Fn::GetAtt"][0]];
    assert.equal(rules[rules.length - 1].Action, "BLOCK");
    assert.deepEqual(last.Properties.Domains, ["*"]);
    template.hasResourceProperties("AWS::Route53Resolver::FirewallRuleGroupAssociation", {
      VpcId: "vpc-0123456789abcdef0",
      FirewallRuleGroupId: { "Fn::GetAtt": [groupId, "Id"] },
    });
  });

  it("refuses unknown modes, non-domains and extras without allowlist", () => {
    assert.throws(() => synth({ executorEgress: "closed" }), /executorEgress must be open or allowlist/);
    assert.throws(() => synth({ executorEgress: "allowlist", executorEgressExtraDomains: ["*"] }), /executorEgressExtraDomains entries/);
    assert.throws(() => synth({ executorEgress: "allowlist", executorEgressExtraDomains: ["https://pypi.org"] }), /executorEgressExtraDomains entries/);
    assert.throws(() => synth({ executorEgressExtraDomains: ["pypi.org"] }), /only with executorEgress allowlist/);
  });
});
