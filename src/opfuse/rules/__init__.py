"""Rules: what may fuse (legality), as data. ``Rule`` = pattern + condition + action + priority.

    from opfuse.rules import apply_rules, build_plan, fusion_rules
    outcome = apply_rules(graph, fusion_rules())
    plan = build_plan(graph, outcome.groups)
    for d in outcome.decisions:
        print(d)          # [rules] conv_bn_act fused at conv1, conv1_bn, conv1_relu: 3 ops into one kernel
"""
from opfuse.rules.rule import GROUP, Refusal, Replacement, Rule, default_benefit, default_cost, refuse
from opfuse.rules.conflicts import (Conflict, DependencyRules, ResourceLimits, check_dependencies, check_overlap,
                                    check_resources, outside_path)
from opfuse.rules.decisions import Decision, RuleStats
from opfuse.rules.resolve import RuleOutcome, apply_rules, build_plan
from opfuse.rules.library import default_rules, fusion_rules, recognition_rules, rule_by_name

__all__ = ["Rule", "Refusal", "refuse", "GROUP", "Replacement", "default_benefit", "default_cost", "Conflict", "DependencyRules",
           "ResourceLimits", "check_dependencies", "check_overlap", "check_resources", "outside_path", "Decision",
           "RuleStats", "RuleOutcome", "apply_rules", "build_plan", "default_rules", "fusion_rules",
           "recognition_rules", "rule_by_name"]
