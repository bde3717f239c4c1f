"""``FusionOptions``: the one holder of legality limits and of the rules a user disabled.

These are the *legality* limits (the seed's resource condition ``R(a) + R(b) <= R_max``);
whether a legal fusion pays off is the planner's business, not decided here. The fusion
rules, the rewrite engine, the planner's legality and the pass context all read this object.

``R`` is measured in ops per kernel: every op a fused loop body holds adds live values to the
register file, so the op count is the portable proxy for register pressure. Hardware-specific
on-chip budgets (SRAM bytes) come from the target profile through the planner.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from opfuse.rules.decisions import Refusal, RefusalKind

# Register-pressure proxy: the largest kernel body we let one group have. The largest group
# the zoo needs is BERT's attention (split heads, two MatMuls, scale, Softmax, merge heads:
# about 14 ops); twice that leaves room for masks and casts without admitting runaway chains.
MAX_OPS_PER_GROUP = 32
# Distinct tensors one fused kernel may read (one pointer register or DMA stream each).
MAX_GROUP_INPUTS = 64
# Horizontal fusion: at most this many siblings share one pass over their input.
MAX_HORIZONTAL_MEMBERS = 8
# Horizontal MatMul/Conv merging concatenates weights; cap the merged weight so one kernel's
# weight stream stays bounded (BERT-base Q|K|V is 3 * 768 * 768 * 4 B = 6.75 MiB).
MAX_MERGED_WEIGHT_BYTES = 64 << 20
# Constant folding never materialises a tensor larger than this (Expand / ConstantOfShape
# could otherwise blow a tiny model up into a huge file of constants).
MAX_FOLDED_CONSTANT_BYTES = 16 << 20


@dataclass(frozen=True)
class FusionOptions:
    """Limits on one fused group (``None`` turns an optional limit off) and disabled rule names."""

    max_ops_per_group: int = MAX_OPS_PER_GROUP
    max_group_inputs: int | None = MAX_GROUP_INPUTS
    max_working_set_bytes: int | None = None  # on-chip budget for values kept inside one group
    max_horizontal_members: int = MAX_HORIZONTAL_MEMBERS
    max_merged_weight_bytes: int = MAX_MERGED_WEIGHT_BYTES
    max_folded_constant_bytes: int = MAX_FOLDED_CONSTANT_BYTES
    disabled: frozenset[str] = field(default_factory=frozenset)  # rule names

    def __post_init__(self):
        object.__setattr__(self, "disabled", frozenset(self.disabled))

    def is_disabled(self, name: str) -> bool:
        return name in self.disabled

    def size_refusal(self, ops: int) -> Refusal | None:
        """The resource condition on one kernel's size: ``ops`` ops fit, or why not."""
        if ops > self.max_ops_per_group:
            return Refusal(RefusalKind.RESOURCE, f"{ops} ops exceed the limit of {self.max_ops_per_group} per kernel")
        return None

    def with_(self, **changes) -> "FusionOptions":
        return replace(self, **changes)


__all__ = ["FusionOptions", "MAX_OPS_PER_GROUP", "MAX_GROUP_INPUTS", "MAX_HORIZONTAL_MEMBERS",
           "MAX_MERGED_WEIGHT_BYTES", "MAX_FOLDED_CONSTANT_BYTES"]
