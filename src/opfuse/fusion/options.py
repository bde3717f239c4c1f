"""Fusion options: resource limits and the rules a user disabled.

These are the *legality* limits (the seed's resource condition ``R(a) + R(b) <= R_max``);
whether a legal fusion pays off is the planner's business, not decided here.

``R`` is measured in ops per kernel: every op a fused loop body holds adds live values to the
register file, so the op count is the portable proxy for register pressure. Hardware-specific
on-chip budgets (SRAM bytes) come from the target profile through the planner.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Register-pressure proxy: the largest kernel body we let one group have. The largest group
# the zoo needs is BERT's attention (split heads, two MatMuls, scale, Softmax, merge heads:
# about 14 ops); twice that leaves room for masks and casts without admitting runaway chains.
MAX_OPS_PER_GROUP = 32
# Horizontal fusion: at most this many siblings share one pass over their input.
MAX_HORIZONTAL_MEMBERS = 8
# Horizontal MatMul/Conv merging concatenates weights; cap the merged weight so one kernel's
# weight stream stays bounded (BERT-base Q|K|V is 3 * 768 * 768 * 4 B = 6.75 MiB).
MAX_MERGED_WEIGHT_BYTES = 64 << 20
# Constant folding never materialises a tensor larger than this (Expand / ConstantOfShape
# could otherwise blow a tiny model up into a huge file of constants).
MAX_FOLDED_CONSTANT_BYTES = 16 << 20


@dataclass
class FusionOptions:
    max_ops_per_group: int = MAX_OPS_PER_GROUP
    max_horizontal_members: int = MAX_HORIZONTAL_MEMBERS
    max_merged_weight_bytes: int = MAX_MERGED_WEIGHT_BYTES
    max_folded_constant_bytes: int = MAX_FOLDED_CONSTANT_BYTES
    disabled: frozenset[str] = field(default_factory=frozenset)  # rule and pass names

    def is_disabled(self, name: str) -> bool:
        return name in self.disabled


def options_from(ctx) -> FusionOptions:
    """Read limits and disabled names from a pass context (any object; missing fields keep defaults).

    Understood fields: ``disabled_passes``/``disabled_rules``/``disabled`` (iterables of names),
    ``max_group_ops``/``max_ops_per_group`` (int), and a ``config`` mapping with the same keys.
    """
    if ctx is None:
        return FusionOptions()
    if isinstance(ctx, FusionOptions):
        return ctx
    config = dict(getattr(ctx, "config", None) or {})

    def get(*names, default=None):
        for n in names:
            if getattr(ctx, n, None) is not None:
                return getattr(ctx, n)
            if config.get(n) is not None:
                return config[n]
        return default

    disabled: set[str] = set()
    for n in ("disabled_passes", "disabled_rules", "disabled"):
        for src in (getattr(ctx, n, None), config.get(n)):
            if src:
                disabled.update(str(x) for x in src)
    return FusionOptions(
        max_ops_per_group=int(get("max_ops_per_group", "max_group_ops", "max_group_size",
                                  default=MAX_OPS_PER_GROUP)),
        max_horizontal_members=int(get("max_horizontal_members", default=MAX_HORIZONTAL_MEMBERS)),
        max_merged_weight_bytes=int(get("max_merged_weight_bytes", default=MAX_MERGED_WEIGHT_BYTES)),
        max_folded_constant_bytes=int(get("max_folded_constant_bytes", default=MAX_FOLDED_CONSTANT_BYTES)),
        disabled=frozenset(disabled),
    )
