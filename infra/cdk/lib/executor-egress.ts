/**
 * `executorEgress` (docs/EGRESS.md): which hosts the executor, which runs agent code, may
 * reach. `open` (the default) adds nothing: the executor security group's TCP 443 to
 * anywhere. `allowlist` adds Route 53 Resolver DNS Firewall to the executors' VPC (Route 53
 * Developer Guide, "Using DNS Firewall to filter outbound DNS traffic",
 * https://docs.aws.amazon.com/Route53/latest/DeveloperGuide/resolver-dns-firewall.html):
 * only the listed names resolve, every other query is answered NXDOMAIN. The same resources
 * as the SAM template's (infra/sam/template.yaml, condition EgressAllowlist); the property
 * names are CloudFormation's (Template Reference, AWS::Route53Resolver::FirewallDomainList,
 * ::FirewallRuleGroup and ::FirewallRuleGroupAssociation).
 *
 * Connection-level (SNI) filtering with AWS Network Firewall is not deployed: it works only
 * when the executor subnets' route tables send traffic through the firewall endpoints, and
 * this construct is handed subnets it does not own (docs/EGRESS.md says how to add it).
 */
import { Stack } from "aws-cdk-lib";
import * as route53resolver from "aws-cdk-lib/aws-route53resolver";
import { Construct } from "constructs";

/** The two hosts the provider's self-hosted guide names (../shared/reference/executor-protocol.md, "Peers"). */
export const EXECUTOR_EGRESS_DEFAULT_DOMAINS = ["api.openai.com", "codex-cloud-environments.chatgpt.com"];

/** The values of `executorEgress`. */
export const EXECUTOR_EGRESS_MODES = ["open", "allowlist"] as const;
export type ExecutorEgressMode = (typeof EXECUTOR_EGRESS_MODES)[number];

/**
 * A DNS Firewall domain specification (Route 53 Developer Guide, "Managing your own domain
 * lists"): an optional leading `*.`, then labels of A-Z a-z 0-9 `-`; a bare `*` (everything)
 * is refused. The SAM parameter ExecutorEgressExtraDomains has the same pattern.
 */
const DOMAIN_SPEC = /^(\*\.)?[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*$/;

/** Why `mode` and `extraDomains` cannot be synthesized (empty: they can). */
export function executorEgressProblems(mode: string | undefined, extraDomains: string[] | undefined): string[] {
  const problems: string[] = [];
  if (!(EXECUTOR_EGRESS_MODES as readonly string[]).includes(mode ?? "open")) {
    problems.push("executorEgress must be open or allowlist");
  }
  const extras = extraDomains ?? [];
  if (extras.some((d) => !DOMAIN_SPEC.test(d) || d.length > 255)) {
    problems.push("executorEgressExtraDomains entries must be domains (example.com or *.example.com, 1-255 characters)");
  }
  if (extras.length > 0 && (mode ?? "open") !== "allowlist") {
    problems.push("executorEgressExtraDomains is used only with executorEgress allowlist; with open every host is reachable already");
  }
  return problems;
}

/** What {@link ExecutorEgressFilter} needs. */
export interface ExecutorEgressFilterProps {
  /** The executors' VPC: the rule group is associated with it (every resource of it is filtered). */
  readonly vpcId: string;
  /** Domains allowed beyond {@link EXECUTOR_EGRESS_DEFAULT_DOMAINS}. */
  readonly extraDomains: string[];
  /** Registry host of the executor image (`ACCOUNT.dkr.ecr.REGION.amazonaws.com`) and its region. */
  readonly imageRegistry: string;
  readonly imageRegion: string;
  /** The warm pool is on: its members read their assignment (STS, DynamoDB). */
  readonly pool: boolean;
}

/**
 * The DNS Firewall of `executorEgress` allowlist. Rules in Priority order, the first match
 * decides (Route 53 Developer Guide, "Rule settings in DNS Firewall"): ALLOW the egress list
 * (the two default hosts plus the extras), ALLOW the AWS endpoints the task needs to start,
 * BLOCK `*` with NXDOMAIN. TRUST_REDIRECTION_DOMAIN on the ALLOW rules: a listed name's CNAME
 * chain (CDN names) resolves without listing each link. The security group needs no DNS
 * rule: security groups cannot filter DNS to the Route 53 Resolver (Amazon EC2 User Guide,
 * "Security group rules").
 */
export class ExecutorEgressFilter extends Construct {
  /** The domain list of the first ALLOW rule: the two default hosts plus the extras. */
  public readonly egressDomains: route53resolver.CfnFirewallDomainList;
  public readonly ruleGroup: route53resolver.CfnFirewallRuleGroup;

  constructor(scope: Construct, id: string, props: ExecutorEgressFilterProps) {
    super(scope, id);
    const stack = Stack.of(this);
    const suffix = stack.urlSuffix;
    this.egressDomains = new route53resolver.CfnFirewallDomainList(this, "EgressDomainList", {
      domains: [...EXECUTOR_EGRESS_DEFAULT_DOMAINS, ...props.extraDomains],
    });
    // What the Fargate task resolves through its ENI (Amazon ECS Developer Guide, "Fargate
    // task networking", platform version 1.4.0): the image (ECR API, the registry, its layers
    // in the region's starport S3 bucket; Amazon ECR User Guide, "Amazon ECR interface VPC
    // endpoints"), the executor key (Secrets Manager), the log driver (CloudWatch Logs) and,
    // with the pool, the member's assignment (STS, DynamoDB).
    const r = props.imageRegion;
    const platform = [
      `api.ecr.${r}.${suffix}`,
      props.imageRegistry,
      `prod-${r}-starport-layer-bucket.s3.${r}.${suffix}`,
      `prod-${r}-starport-layer-bucket.s3.${suffix}`,
      `secretsmanager.${stack.region}.${suffix}`,
      `logs.${stack.region}.${suffix}`,
      ...(props.pool ? [`sts.${stack.region}.${suffix}`, `dynamodb.${stack.region}.${suffix}`] : []),
    ];
    const platformDomains = new route53resolver.CfnFirewallDomainList(this, "PlatformDomainList", { domains: platform });
    const blockAll = new route53resolver.CfnFirewallDomainList(this, "BlockAllDomainList", { domains: ["*"] });
    this.ruleGroup = new route53resolver.CfnFirewallRuleGroup(this, "RuleGroup", {
      firewallRules: [
        {
          priority: 100,
          action: "ALLOW",
          firewallDomainListId: this.egressDomains.attrId,
          firewallDomainRedirectionAction: "TRUST_REDIRECTION_DOMAIN",
        },
        {
          priority: 200,
          action: "ALLOW",
          firewallDomainListId: platformDomains.attrId,
          firewallDomainRedirectionAction: "TRUST_REDIRECTION_DOMAIN",
        },
        { priority: 900, action: "BLOCK", blockResponse: "NXDOMAIN", firewallDomainListId: blockAll.attrId },
      ],
    });
    // Priority among the VPC's rule groups (101-8999, lowest first): late, so a rule group
    // of the VPC's owner is consulted before this one's BLOCK `*`. MutationProtection
    // DISABLED: the stack must be able to update and delete it.
    new route53resolver.CfnFirewallRuleGroupAssociation(this, "RuleGroupAssociation", {
      firewallRuleGroupId: this.ruleGroup.attrId,
      vpcId: props.vpcId,
      priority: 8000,
      mutationProtection: "DISABLED",
    });
  }
}
