"""Static memory planning: liveness over the kernel order and one arena for every tensor
that crosses a kernel boundary (``plan.py``), offsets by greedy best fit (``arena.py``),
in-place legality from op categories (``inplace.py``), compile-time values (``static.py``)."""
from opfuse.memory.arena import ARENA_ALIGNMENT, Buffer, assign_offsets, lower_bound
from opfuse.memory.plan import Alias, Location, MemoryPlan, plan_memory
from opfuse.memory.static import static_values

__all__ = ["ARENA_ALIGNMENT", "Alias", "Buffer", "Location", "MemoryPlan", "assign_offsets", "lower_bound",
           "plan_memory", "static_values"]
