"""Graph, Node and Value: a static-shape SSA dataflow graph.

* A ``Value`` is a tensor: a name, a ``TensorType`` (shape, dtype), at most one producer
  (``None`` for graph inputs and constants) and an ordered list of uses ``(node, input_index)``.
  Constants (ONNX initializers and folded values) carry their data in ``Value.const``.
* A ``Node`` applies one op (``op_type``) with attributes ``attrs`` to input values and
  produces output values. A missing optional input is ``None``.
* A ``Graph`` keeps its nodes in a topological order, its values by name (insertion
  ordered, so every walk is deterministic), and lists its inputs and outputs.

Every mutation goes through Graph methods so producer/use links stay consistent.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np

from opfuse.errors import ModelError


@dataclass(frozen=True)
class TensorType:
    """Static type of a tensor: shape (a tuple of ints) and NumPy dtype."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.name}[{','.join(str(d) for d in self.shape)}]"


class Value:
    """A tensor in the graph."""

    __slots__ = ("name", "type", "producer", "uses", "const", "graph")

    def __init__(self, name: str, type: TensorType | None = None, const: np.ndarray | None = None):
        self.name = name
        if const is not None:
            const = np.asarray(const)
            if type is None:
                type = TensorType(const.shape, const.dtype)
        self.type: TensorType | None = type
        self.producer: Node | None = None
        self.uses: list[tuple[Node, int]] = []
        self.const: np.ndarray | None = const
        self.graph: Graph | None = None

    # Convenience accessors -------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        if self.type is None:
            raise ModelError(f"value '{self.name}' has no inferred shape")
        return self.type.shape

    @property
    def dtype(self) -> np.dtype:
        if self.type is None:
            raise ModelError(f"value '{self.name}' has no inferred dtype")
        return self.type.dtype

    @property
    def size(self) -> int:
        if self.type is None:
            raise ModelError(f"value '{self.name}' has no inferred shape")
        return self.type.size

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def nbytes(self) -> int:
        return self.type.nbytes if self.type is not None else 0

    @property
    def consumers(self) -> list[Node]:
        """Distinct consuming nodes, in use order."""
        seen: dict[int, Node] = {}
        for node, _ in self.uses:
            seen.setdefault(id(node), node)
        return list(seen.values())

    def __repr__(self) -> str:
        return f"Value({self.name!r}, {self.type})"


class Node:
    """One op application."""

    __slots__ = ("name", "op_type", "inputs", "outputs", "attrs", "domain")

    def __init__(self, name: str, op_type: str, inputs: Sequence[Value | None],
                 outputs: Sequence[Value], attrs: dict | None = None, domain: str = ""):
        self.name = name
        self.op_type = op_type
        self.inputs: list[Value | None] = list(inputs)
        self.outputs: list[Value] = list(outputs)
        self.attrs: dict = dict(attrs or {})
        self.domain = domain

    @property
    def output(self) -> Value:
        return self.outputs[0]

    def input(self, index: int) -> Value:
        """Input ``index``, which must be present (a required operand); ``ModelError`` if absent."""
        v = self.inputs[index] if -len(self.inputs) <= index < len(self.inputs) else None
        if v is None:
            raise ModelError(f"node '{self.name}' ({self.op_type}) has no input {index}")
        return v

    def input_values(self) -> list[Value]:
        """Inputs that are present (optional missing inputs dropped)."""
        return [v for v in self.inputs if v is not None]

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.op_type})"


class Graph:
    """A dataflow graph in topological order."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.nodes: list[Node] = []
        self.values: dict[str, Value] = {}
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.opset: int = 17
        self._name_counter: dict[str, int] = {}
        self._node_names: set[str] = set()

    # Names -------------------------------------------------------------------------
    def unique_name(self, base: str, *, for_node: bool = False) -> str:
        """A name not yet used by a value (or node), derived deterministically from ``base``."""
        taken = self._node_names if for_node else self.values
        if base not in taken:
            return base
        n = self._name_counter.get(base, 0)
        while True:
            n += 1
            cand = f"{base}_{n}"
            if cand not in taken:
                self._name_counter[base] = n
                return cand

    # Construction ----------------------------------------------------------------------
    def add_value(self, value: Value) -> Value:
        if value.name in self.values:
            raise ModelError(f"value '{value.name}' is defined twice")
        value.graph = self
        self.values[value.name] = value
        return value

    def add_input(self, name: str, shape: Iterable[int], dtype="float32") -> Value:
        v = self.add_value(Value(name, TensorType(tuple(shape), np.dtype(dtype))))
        self.inputs.append(v)
        return v

    def add_const(self, name: str, data, *, unique: bool = True) -> Value:
        name = self.unique_name(name) if unique else name
        return self.add_value(Value(name, const=np.asarray(data)))

    def add_node(self, op_type: str, inputs: Sequence[Value | None], num_outputs: int = 1,
                 attrs: dict | None = None, name: str | None = None,
                 output_names: Sequence[str] | None = None,
                 output_types: Sequence[TensorType | None] | None = None,
                 domain: str = "", index: int | None = None) -> Node:
        """Append (or insert at ``index``) a node; its output values are created here."""
        node_name = self.unique_name(name or op_type.lower(), for_node=True)
        outs = []
        for i in range(num_outputs):
            base = output_names[i] if output_names else (node_name if num_outputs == 1 else f"{node_name}_out{i}")
            t = output_types[i] if output_types else None
            outs.append(self.add_value(Value(self.unique_name(base), t)))
        node = Node(node_name, op_type, inputs, outs, attrs, domain)
        self._attach(node, index)
        return node

    def insert_node(self, node: Node, index: int | None = None) -> Node:
        """Insert an already-built node whose outputs are not yet in the graph."""
        if node.name in self._node_names:
            raise ModelError(f"node name '{node.name}' is used twice")
        for v in node.outputs:
            if v.name not in self.values:
                self.add_value(v)
        self._attach(node, index)
        return node

    def _attach(self, node: Node, index: int | None) -> None:
        for i, v in enumerate(node.inputs):
            if v is not None:
                if v.name not in self.values or self.values[v.name] is not v:
                    raise ModelError(f"node '{node.name}' reads '{v.name}', which is not in the graph")
                v.uses.append((node, i))
        for v in node.outputs:
            if v.producer is not None:
                raise ModelError(f"value '{v.name}' has two producers")
            v.producer = node
        self._node_names.add(node.name)
        if index is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(index, node)

    # Mutation --------------------------------------------------------------------------
    def set_input(self, node: Node, index: int, value: Value | None) -> None:
        old = node.inputs[index]
        if old is not None:
            old.uses.remove((node, index))
        node.inputs[index] = value
        if value is not None:
            value.uses.append((node, index))

    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Redirect every use of ``old`` (node inputs and graph outputs) to ``new``."""
        if old is new:
            return
        for node, i in list(old.uses):
            node.inputs[i] = new
            new.uses.append((node, i))
        old.uses.clear()
        self.outputs = [new if o is old else o for o in self.outputs]

    def remove_node(self, node: Node) -> None:
        """Remove a node; its outputs must be unused (and not graph outputs)."""
        for v in node.outputs:
            if v.uses or v in self.outputs:
                raise ModelError(f"cannot remove node '{node.name}': its output '{v.name}' is still used")
        for i, u in enumerate(node.inputs):
            if u is not None:
                u.uses.remove((node, i))
        for v in node.outputs:
            v.producer = None
            del self.values[v.name]
        self.nodes.remove(node)
        self._node_names.discard(node.name)

    def has_node_name(self, name: str) -> bool:
        return name in self._node_names

    def rename_node(self, node: Node, name: str) -> str:
        """Rename a node to ``name`` (made unique if taken); returns the name it got."""
        if name == node.name:
            return name
        self._node_names.discard(node.name)
        name = self.unique_name(name, for_node=True)
        node.name = name
        self._node_names.add(name)
        return name

    def remove_unused_values(self) -> None:
        """Drop constants and values nobody reads (graph inputs are kept)."""
        keep_inputs = set(map(id, self.inputs)) | set(map(id, self.outputs))
        for name in [n for n, v in self.values.items()
                     if v.producer is None and not v.uses and id(v) not in keep_inputs]:
            del self.values[name]

    def prune(self) -> None:
        """Remove the nodes no graph output depends on, then inputs and constants nobody reads."""
        live = {id(v) for v in self.outputs}
        for node in reversed(list(self.nodes)):
            if any(id(v) in live for v in node.outputs):
                live.update(id(v) for v in node.input_values())
            else:
                self.remove_node(node)
        for v in [v for v in self.inputs if not v.uses and v not in self.outputs]:
            self.inputs.remove(v)
            del self.values[v.name]
        self.remove_unused_values()

    # Queries ---------------------------------------------------------------------------
    @property
    def constants(self) -> list[Value]:
        return [v for v in self.values.values() if v.const is not None and v.producer is None]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def toposort(self) -> None:
        """Re-order nodes topologically (stable: keeps the current order where it is legal).

        Raises ``ModelError`` naming a node on a cycle when there is one.
        """
        position = {id(n): i for i, n in enumerate(self.nodes)}
        indeg: dict[int, int] = {}
        for n in self.nodes:
            preds = {id(v.producer) for v in n.input_values() if v.producer is not None}
            indeg[id(n)] = len(preds)
        import heapq
        ready = [(position[id(n)], n.name, n) for n in self.nodes if indeg[id(n)] == 0]
        heapq.heapify(ready)
        order: list[Node] = []
        while ready:
            _, _, n = heapq.heappop(ready)
            order.append(n)
            succs = {}
            for v in n.outputs:
                for c in v.consumers:
                    succs[id(c)] = c
            for c in succs.values():
                indeg[id(c)] -= 1
                if indeg[id(c)] == 0:
                    heapq.heappush(ready, (position[id(c)], c.name, c))
        if len(order) != len(self.nodes):
            stuck = [n for n in self.nodes if indeg[id(n)] > 0]
            raise ModelError(f"graph has a cycle through node '{stuck[0].name}' ({stuck[0].op_type})")
        self.nodes = order

    def copy(self) -> "Graph":
        """A deep structural copy (constant arrays are shared, they are never mutated in place)."""
        g = Graph(self.name)
        g.opset = self.opset
        vmap: dict[int, Value] = {}
        for v in self.values.values():
            if v.producer is None:
                nv = Value(v.name, v.type, v.const)
                g.add_value(nv)
                vmap[id(v)] = nv
        g.inputs = [vmap[id(v)] for v in self.inputs]
        for n in self.nodes:
            outs = [Value(v.name, v.type) for v in n.outputs]
            for o, v in zip(outs, n.outputs, strict=True):
                vmap[id(v)] = o
            nn = Node(n.name, n.op_type, [vmap[id(v)] if v is not None else None for v in n.inputs],
                      outs, dict(n.attrs), n.domain)
            g.insert_node(nn)
        g.outputs = [vmap[id(v)] for v in self.outputs]
        g._name_counter = dict(self._name_counter)
        return g

    def __str__(self) -> str:
        from opfuse.ir.text import format_graph
        return format_graph(self)

    def verify(self, check_shapes: bool = True) -> None:
        from opfuse.ir.verify import verify
        verify(self, check_shapes=check_shapes)
