"""The cost model: roofline time of fused groups and plans on a hardware profile.

    from opfuse.cost import CostModel
    from opfuse.targets import get_profile
    cm = CostModel(get_profile("cortex-m7"))
    pc = cm.plan_cost(plan)            # PlanCost: per-group GroupCost, latency, peak memory, eta
    print(format_plan_cost(pc))
"""
from opfuse.cost.analysis import GroupAnalysis, analyze_group
from opfuse.cost.correction import (Corrections, Sample, describe_corrections, fit_corrections,
                                    format_corrections, load_corrections, save_corrections)
from opfuse.cost.liveness import peak_activation_bytes
from opfuse.cost.model import CostModel, GroupCost, PlanCost, correction_samples, format_plan_cost
from opfuse.cost.numa import NumaPlacement
from opfuse.cost.roofline import Roofline, bandwidth_saving_rate

__all__ = ["CostModel", "GroupCost", "PlanCost", "correction_samples", "format_plan_cost", "GroupAnalysis",
           "analyze_group", "Corrections", "Sample", "describe_corrections", "fit_corrections", "format_corrections",
           "load_corrections", "save_corrections", "peak_activation_bytes", "NumaPlacement", "Roofline",
           "bandwidth_saving_rate"]
