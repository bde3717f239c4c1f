"""``FeatureIndex``: candidate anchor nodes by op type, category and tag (the seed's feature index).

Built once per graph (one pass), then kept up to date as rewrites add and remove nodes, so
finding the nodes an anchor vertex may match is a few hash lookups instead of a scan of the
graph for every pattern.
"""
from __future__ import annotations

from opfuse.ops.registry import REGISTRY


class FeatureIndex:
    def __init__(self, nodes=()):
        self.by_type: dict[str, dict[int, object]] = {}
        self.by_category: dict[object, dict[int, object]] = {}
        self.by_tag: dict[str, dict[int, object]] = {}
        self.all: dict[int, object] = {}
        for n in nodes:
            self.add(n)

    def _buckets(self, node):
        yield self.by_type.setdefault(node.op_type, {})
        spec = REGISTRY.get(node.op_type)
        if spec is not None:
            yield self.by_category.setdefault(spec.category, {})
            for t in spec.tags:
                yield self.by_tag.setdefault(t, {})

    def add(self, node) -> None:
        self.all[id(node)] = node
        for b in self._buckets(node):
            b[id(node)] = node

    def remove(self, node) -> None:
        self.all.pop(id(node), None)
        for b in self._buckets(node):
            b.pop(id(node), None)

    def buckets_for(self, op_pattern) -> list[dict[int, object]]:
        """The smallest buckets that together cover every node ``op_pattern`` can match."""
        out: list[dict[int, object]] = []
        for alt in op_pattern.alternatives:
            if alt.op_types is not None:
                out.extend(self.by_type.get(t, {}) for t in sorted(alt.op_types))
            elif alt.categories is not None:
                out.extend(self.by_category.get(c, {}) for c in sorted(alt.categories))
            elif alt.tags is not None:
                out.extend(self.by_tag.get(t, {}) for t in sorted(alt.tags))
            else:
                return [self.all]
        return out

    def estimate(self, op_pattern) -> int:
        """An upper bound on the candidates (used to pick the most selective anchor)."""
        return sum(len(b) for b in self.buckets_for(op_pattern))

    def candidates(self, op_pattern) -> dict[int, object]:
        buckets = self.buckets_for(op_pattern)
        if len(buckets) == 1:
            return buckets[0]
        merged: dict[int, object] = {}
        for b in buckets:
            merged.update(b)
        return merged
