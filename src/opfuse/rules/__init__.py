"""Rules: the fusion families and rewrites as data, and the one legality they share.

    from opfuse.rules import form_groups, fusion_rules, RuleLegality
    plan, decisions = form_groups(graph, fusion_rules())     # the rules' candidate groups
    for d in decisions:
        print(d)          # [fuse] epilogue fused at conv1, relu1: 'conv1' fused into 'relu1'

* ``rule.py``: ``Rule`` = pattern + condition + action + priority; ``library.py`` the rule sets;
  one module per fusion family (``attention``, ``vertical``: normalization prologue, epilogue,
  elementwise chain, injective; ``aliasing``: Concat aliasing and views; ``horizontal``);
* ``driver.py``: the one fusion driver; ``resolve.py``: the rewrite engine (greedy by score);
* ``legality.py``: the one legality (kernel shapes ``kernel_shape.py``, sibling conditions
  ``siblings.py``, the partition and its cycle check ``partition.py``), also as the planner's
  protocol (``RuleLegality``);
* ``decisions.py``: the one decision vocabulary; ``options.py``: the one limits object.
"""
from opfuse.rules.conflicts import DependencyRules, check_dependencies, check_overlap, check_resources, outside_path
from opfuse.rules.decisions import Decision, Refusal, RefusalKind, RuleStats, refuse
from opfuse.rules.driver import form_groups, unfused_plan
from opfuse.rules.legality import Legality, PlanLegality, RuleLegality, annotate_plan
from opfuse.rules.library import default_rules, fusion_rule_names, fusion_rules, recognition_rules, rule_by_name
from opfuse.rules.options import FusionOptions
from opfuse.rules.plan_check import verify_plan
from opfuse.rules.resolve import RuleOutcome, apply_rules
from opfuse.rules.rule import Fuse, Replacement, Rule, default_benefit, default_cost

__all__ = ["Rule", "Fuse", "Refusal", "RefusalKind", "refuse", "Replacement", "default_benefit", "default_cost",
           "DependencyRules", "check_dependencies", "check_overlap", "check_resources", "outside_path",
           "Decision", "RuleStats", "RuleOutcome", "apply_rules", "form_groups", "unfused_plan", "Legality",
           "PlanLegality", "RuleLegality", "annotate_plan", "FusionOptions", "verify_plan", "default_rules",
           "fusion_rules", "fusion_rule_names", "recognition_rules", "rule_by_name"]
