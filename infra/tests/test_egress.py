"""ExecutorEgress (docs/EGRESS.md): `open` deploys no DNS Firewall; `allowlist` deploys Route
53 Resolver DNS Firewall on the executors' VPC whose rules admit exactly the provider's two
hosts (../shared/reference/executor-protocol.md, "Peers") plus the user's extra domains, the
AWS endpoints the task needs to start, and block every other name.

The SAM template is evaluated for given parameter values (the intrinsic functions it uses,
as CloudFormation evaluates them: Ref, Fn::Sub, Fn::Join, Fn::Split, Fn::Select, Fn::If and
the condition functions); the CDK stack is the one `make infra-test` synthesizes with
`-c executorEgress=allowlist -c executorEgressExtraDomains=$(CDK_EGRESS_EXTRA_DOMAINS)`.
"""

from __future__ import annotations

import copy
import os
import re

import pytest

from conftest import REPO

DEFAULT_DOMAINS = {"api.openai.com", "codex-cloud-environments.chatgpt.com"}
# The CDK test context (mk/infra.mk CDK_TEST_CONTEXT); the SAM template gets the same values.
VPC_ID = "vpc-0123456789abcdef0"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/sandbox-executor:test"
REGION = "us-east-1"
URL_SUFFIX = "amazonaws.com"


def cdk_extra_domains() -> list[str]:
    """The extras the CDK egress stack was synthesized with: CDK_EGRESS_EXTRA_DOMAINS as
    `make infra-test` passes it, else the value mk/infra.mk sets."""
    value = os.environ.get("CDK_EGRESS_EXTRA_DOMAINS")
    if value is None:
        mk = (REPO / "mk" / "infra.mk").read_text()
        value = re.search(r"^CDK_EGRESS_EXTRA_DOMAINS := (.*)$", mk, re.M).group(1)
    return [d.strip() for d in value.split(",") if d.strip()]


def platform_domains(pool: bool) -> set[str]:
    """The AWS endpoints an executor task resolves to start (docs/EGRESS.md): ECR for IMAGE,
    Secrets Manager, CloudWatch Logs, and STS and DynamoDB with the pool."""
    registry = IMAGE.split("/")[0]
    names = {
        f"api.ecr.{REGION}.{URL_SUFFIX}",
        registry,
        f"prod-{REGION}-starport-layer-bucket.s3.{REGION}.{URL_SUFFIX}",
        f"prod-{REGION}-starport-layer-bucket.s3.{URL_SUFFIX}",
        f"secretsmanager.{REGION}.{URL_SUFFIX}",
        f"logs.{REGION}.{URL_SUFFIX}",
    }
    if pool:
        names |= {f"sts.{REGION}.{URL_SUFFIX}", f"dynamodb.{REGION}.{URL_SUFFIX}"}
    return names


# ----------------------------------------------------------------------------- evaluation
class Deployed:
    """`cfn` as CloudFormation deploys it with `parameters` (others at their Default):
    conditions evaluated, resources whose Condition is false dropped, values evaluated by
    [`Deployed.value`]. `Fn::GetAtt` evaluates to `"<id>.<attribute>"`."""

    PSEUDO = {"AWS::Region": REGION, "AWS::URLSuffix": URL_SUFFIX, "AWS::AccountId": "123456789012"}

    def __init__(self, cfn: dict, parameters: dict[str, str] | None = None):
        self.cfn = cfn
        self.parameters = {
            name: str(p["Default"]) for name, p in cfn.get("Parameters", {}).items() if "Default" in p
        } | (parameters or {})
        self.resources = {
            k: r for k, r in cfn["Resources"].items() if "Condition" not in r or self.condition(r["Condition"])
        }

    def condition(self, name: str) -> bool:
        return bool(self.value(self.cfn["Conditions"][name]))

    def value(self, v):
        if isinstance(v, list):
            out = [self.value(x) for x in v]
            return [x for x in out if x is not NO_VALUE]
        if not isinstance(v, dict):
            return v if isinstance(v, (str, bool)) else str(v)
        if len(v) != 1:
            return {k: self.value(x) for k, x in v.items()}
        (key, arg), = v.items()
        if key == "Ref":
            if arg == "AWS::NoValue":
                return NO_VALUE
            if arg in self.PSEUDO:
                return self.PSEUDO[arg]
            if arg in self.parameters:
                return self.parameters[arg]
            return arg + ".Ref"
        if key == "Fn::GetAtt":
            return ".".join(arg) if isinstance(arg, list) else arg
        if key == "Fn::Sub":
            text, variables = (arg, {}) if isinstance(arg, str) else arg
            values = {k: self.value(x) for k, x in variables.items()}
            return re.sub(r"\$\{([^}]+)\}", lambda m: values.get(m.group(1)) or self.value({"Ref": m.group(1)}), text)
        if key == "Fn::Join":
            sep, parts = arg
            return sep.join(self.value(parts))
        if key == "Fn::Split":
            sep, text = arg
            return self.value(text).split(sep)
        if key == "Fn::Select":
            index, items = arg
            return self.value(items)[int(self.value(index))]
        if key == "Fn::If":
            name, yes, no = arg
            return self.value(yes if self.condition(name) else no)
        if key == "Fn::Equals":
            a, b = (self.value(x) for x in arg)
            return a == b
        if key == "Fn::Not":
            return not self.value(arg[0])
        if key == "Fn::And":
            return all(self.value(x) for x in arg)
        if key == "Fn::Or":
            return any(self.value(x) for x in arg)
        if key == "Condition":
            return self.condition(arg)
        return {key: self.value(arg)}

    def of_type(self, cfn_type: str) -> dict[str, dict]:
        return {k: self.value(r.get("Properties", {})) for k, r in self.resources.items() if r["Type"] == cfn_type}


NO_VALUE = object()


def sam_deployed(sam_cfn_raw: dict, egress: str, extras: list[str], pool: bool = False) -> Deployed:
    return Deployed(
        sam_cfn_raw,
        {
            "ExecutorEgress": egress,
            "ExecutorEgressExtraDomains": ",".join(extras),
            "VpcId": VPC_ID,
            "ExecutorImage": IMAGE,
            "PoolSize": "2" if pool else "0",
        },
    )


# ----------------------------------------------------------------------------- the check
def egress_problems(d: Deployed, allowed: set[str], platform: set[str]) -> list[str]:
    """Why the DNS Firewall of `d` does not admit exactly `allowed` (the egress list) and
    `platform` (the AWS endpoints) on the executors' VPC and block every other name; empty
    when it does. Rules are taken in Priority order, the order DNS Firewall applies them
    (Route 53 Developer Guide, "Rule settings in DNS Firewall")."""
    problems = []
    lists = {f"{k}.Id": set(p.get("Domains", [])) for k, p in d.of_type("AWS::Route53Resolver::FirewallDomainList").items()}
    groups = d.of_type("AWS::Route53Resolver::FirewallRuleGroup")
    associations = d.of_type("AWS::Route53Resolver::FirewallRuleGroupAssociation")
    if len(groups) != 1 or len(associations) != 1:
        return [f"want one rule group and one association, got {len(groups)} and {len(associations)}"]
    (group_id, group), = groups.items()
    (association,) = associations.values()
    if association["FirewallRuleGroupId"] != f"{group_id}.Id":
        problems.append(f"the association names {association['FirewallRuleGroupId']}, not the rule group")
    if association["VpcId"] != VPC_ID:
        problems.append(f"the association targets {association['VpcId']}, not the executors' VPC {VPC_ID}")
    if not 100 < int(association["Priority"]) < 9000:
        problems.append("association Priority outside 101-8999")
    rules = sorted(group["FirewallRules"], key=lambda r: int(r["Priority"]))
    if len({int(r["Priority"]) for r in rules}) != len(rules):
        problems.append("two rules share a Priority")
    domains = [lists.get(r["FirewallDomainListId"]) for r in rules]
    if not rules or rules[-1]["Action"] != "BLOCK" or domains[-1] != {"*"}:
        problems.append("the last rule does not BLOCK every name (*)")
    elif rules[-1].get("BlockResponse") not in {"NXDOMAIN", "NODATA"}:
        problems.append("the BLOCK rule answers neither NXDOMAIN nor NODATA")
    admitted = [(r["Action"], ds) for r, ds in zip(rules[:-1], domains[:-1])]
    if [a for a, _ in admitted] != ["ALLOW"] * len(admitted):
        problems.append(f"before the BLOCK rule, want ALLOW rules only: {[a for a, _ in admitted]}")
    if [ds for _, ds in admitted] != [allowed, platform]:
        problems.append(
            f"the ALLOW rules admit {[sorted(ds or []) for _, ds in admitted]}, want {[sorted(allowed), sorted(platform)]}"
        )
    return problems


def security_group_egress(d: Deployed) -> list[dict]:
    (sg,) = d.of_type("AWS::EC2::SecurityGroup").values()
    return sg["SecurityGroupEgress"]


# The decision (docs/EGRESS.md): TCP 443 out in both modes. No DNS rule: security groups
# cannot filter DNS to the Route 53 Resolver (Amazon EC2 User Guide, "Security group rules").
HTTPS_ONLY = [{"IpProtocol": "tcp", "FromPort": "443", "ToPort": "443", "CidrIp": "0.0.0.0/0", "Description": "HTTPS out"}]


def normalized(rules: list[dict]) -> list[dict]:
    return [{k: str(v) for k, v in r.items()} for r in rules]


@pytest.fixture(scope="module", params=["sam", "cdk"])
def allowlist(request, sam_cfn_raw, cdk_egress_cfn) -> Deployed:
    """Each template with ExecutorEgress allowlist and the CDK synth's extra domains."""
    if request.param == "sam":
        return sam_deployed(sam_cfn_raw, "allowlist", cdk_extra_domains())
    return Deployed(cdk_egress_cfn)


# ----------------------------------------------------------------------------- tests
def test_the_egress_allowlist_admits_only_the_listed_domains(allowlist):
    extras = cdk_extra_domains()
    assert extras, "the egress synth needs extra domains to show they are added"
    expected = DEFAULT_DOMAINS | set(extras)
    assert egress_problems(allowlist, expected, platform_domains(pool=False)) == []
    assert normalized(security_group_egress(allowlist)) == HTTPS_ONLY

    # Controls: the check fails when a domain is missing or added, on either side.
    assert egress_problems(allowlist, expected - {"api.openai.com"}, platform_domains(False))
    assert egress_problems(allowlist, expected | {"example.com"}, platform_domains(False))
    assert egress_problems(allowlist, expected, platform_domains(True))
    tampered = copy.deepcopy(allowlist.cfn)
    (egress_list,) = [
        r for r in tampered["Resources"].values()
        if r["Type"] == "AWS::Route53Resolver::FirewallDomainList" and "api.openai.com" in str(r["Properties"]["Domains"])
    ]
    domains = egress_list["Properties"]["Domains"]
    if isinstance(domains, list):  # CDK: a literal list
        domains.append("exfil.example.net")
    else:  # SAM: Fn::If [HasEgressExtraDomains, Fn::Split [",", Fn::Sub ...], [...]]
        split = domains["Fn::If"][1]["Fn::Split"]
        split[1] = {"Fn::Sub": split[1]["Fn::Sub"] + ",exfil.example.net"}
    assert egress_problems(Deployed(tampered, allowlist.parameters), expected, platform_domains(False))
    # ... and when BLOCK * comes before an ALLOW rule.
    reordered = copy.deepcopy(allowlist.cfn)
    (group,) = [r for r in reordered["Resources"].values() if r["Type"] == "AWS::Route53Resolver::FirewallRuleGroup"]
    group["Properties"]["FirewallRules"][-1]["Priority"] = 50
    assert egress_problems(Deployed(reordered, allowlist.parameters), expected, platform_domains(False))


def test_open_egress_deploys_no_dns_firewall(sam_cfn_raw, cdk_cfn, cdk_pool_cfn):
    for d in (sam_deployed(sam_cfn_raw, "open", []), sam_deployed(sam_cfn_raw, "open", [], pool=True), Deployed(cdk_cfn), Deployed(cdk_pool_cfn)):
        firewall = [k for k, r in d.resources.items() if r["Type"].startswith("AWS::Route53Resolver::")]
        assert firewall == []
        assert normalized(security_group_egress(d)) == HTTPS_ONLY
    # Control: the same SAM template with allowlist has them.
    assert any(r["Type"].startswith("AWS::Route53Resolver::") for r in sam_deployed(sam_cfn_raw, "allowlist", []).resources.values())


def test_sam_allowlist_without_extras_and_with_the_pool(sam_cfn_raw):
    """No extras: exactly the two default hosts (no empty entry). With the pool: STS and
    DynamoDB join the AWS endpoints (a member reads its assignment)."""
    assert egress_problems(sam_deployed(sam_cfn_raw, "allowlist", []), DEFAULT_DOMAINS, platform_domains(False)) == []
    with_pool = sam_deployed(sam_cfn_raw, "allowlist", ["pypi.org"], pool=True)
    assert egress_problems(with_pool, DEFAULT_DOMAINS | {"pypi.org"}, platform_domains(True)) == []
    assert egress_problems(with_pool, DEFAULT_DOMAINS | {"pypi.org"}, platform_domains(False))


def test_sam_and_cdk_deploy_the_same_firewall_resources(sam_cfn_raw, cdk_egress_cfn):
    def types(d: Deployed) -> list[str]:
        return sorted(r["Type"] for r in d.resources.values() if r["Type"].startswith("AWS::Route53Resolver::"))

    sam = types(sam_deployed(sam_cfn_raw, "allowlist", cdk_extra_domains()))
    assert sam == types(Deployed(cdk_egress_cfn))
    assert sam.count("AWS::Route53Resolver::FirewallDomainList") == 3


def test_extra_domains_are_refused_with_open_and_must_be_domains(sam_cfn_raw):
    """SAM refuses extras without allowlist (a rule) and anything but domain specifications
    (the parameter's AllowedPattern; a bare `*` would admit everything). CDK refuses the
    same at synth (infra/cdk/test/executor-egress.test.ts)."""
    (rule,) = [r for name, r in sam_cfn_raw["Rules"].items() if "ExecutorEgressExtraDomains" in str(r)]

    def refused(egress: str, extras: str) -> bool:
        d = Deployed({"Resources": {}, "Conditions": {}}, {"ExecutorEgress": egress, "ExecutorEgressExtraDomains": extras})
        return bool(d.value(rule["RuleCondition"])) and not all(d.value(a["Assert"]) for a in rule["Assertions"])

    assert refused("open", "pypi.org") and not refused("allowlist", "pypi.org") and not refused("open", "")
    pattern = re.compile(sam_cfn_raw["Parameters"]["ExecutorEgressExtraDomains"]["AllowedPattern"])
    for good in ("", "pypi.org", "pypi.org,*.pythonhosted.org", "a-b.example.com"):
        assert pattern.fullmatch(good), good
    for bad in ("*", "pypi.org,*", "pypi.org, x.org", "https://pypi.org", "a..b", "*example.com", "x.org,"):
        assert not pattern.fullmatch(bad), bad


def test_the_default_remote_url_hosts_are_in_the_egress_list(sam_cfn_raw):
    """A session's executor connects to its `remote_url`, whose host must pass
    `RemoteUrlAllowlist`: with its default, `allowlist` must let the executor resolve it
    (docs/EGRESS.md, "Hosts you allow elsewhere are not added for you")."""
    default = sam_cfn_raw["Parameters"]["RemoteUrlAllowlist"]["Default"]
    hosts = {entry.split("://")[-1] for entry in default.split(",")}
    assert hosts and hosts <= DEFAULT_DOMAINS, hosts
