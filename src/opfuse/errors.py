"""Errors a user can cause. Each one becomes a one-line message and exit code 2 at the CLI.

Anything that is not an ``OpfuseError`` is a bug in opfuse and is allowed to show a traceback.
"""


class OpfuseError(Exception):
    """Base class: a problem with the user's model, inputs or options."""

    exit_code = 2


class ModelError(OpfuseError):
    """The model file is malformed, truncated, cyclic or otherwise not a valid graph."""


class UnsupportedOpError(OpfuseError):
    """An op (or an attribute value of an op) that opfuse does not implement."""

    def __init__(self, op_type: str, node: str = "", opset: int | None = None, detail: str = ""):
        where = f" (node '{node}'" + (f", opset {opset}" if opset is not None else "") + ")" if node else ""
        msg = f"unsupported op '{op_type}'{where}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)
        self.op_type = op_type
        self.node = node
        self.opset = opset


class ShapeInputError(UnsupportedOpError):
    """An operand that decides a shape (Reshape's shape, Resize's scales, ReduceSum's axes, TopK's
    k) is computed at run time. ``inputs`` names the graph inputs its value comes from: giving
    their values (``input_values``, ``--inputs``, or a run's arrays) specialises the model to them."""

    def __init__(self, op_type: str, node: str = "", opset: int | None = None, detail: str = "",
                 inputs: tuple[str, ...] = ()):
        if inputs:
            detail += (f"; its value comes from graph input(s) {list(inputs)}: give their values (--inputs "
                       f"FILE.npz; a model from opfuse.compile is specialised to each run's values)")
        super().__init__(op_type, node, opset, detail)
        self.inputs = inputs


class UnsupportedDtypeError(UnsupportedOpError):
    """An element type that a backend does not implement (float16 in the C backend)."""

    def __init__(self, dtype: str, value: str, backend: str, hint: str = ""):
        OpfuseError.__init__(self, f"{dtype} is not supported by the {backend} backend (value '{value}')"
                                   + (f"; {hint}" if hint else ""))
        self.op_type, self.node, self.opset = dtype, value, None
        self.dtype, self.value = dtype, value


class ShapeError(OpfuseError):
    """Shapes that do not fit together, at compile time or at run time."""


class SizeLimitError(ShapeError):
    """A tensor larger than the configured limit (``opfuse.ops.limits``), refused before allocation."""


class InputError(OpfuseError):
    """Inputs given at run time do not match the model (missing, wrong shape or dtype)."""


class StorageError(OpfuseError):
    """A file or folder that cannot be written or used: permissions, a full disk, a file where a
    folder should be (``opfuse.files``)."""


class SecurityError(ModelError):
    """The model tries to reach outside its folder (external data path traversal)."""


class InfeasibleError(OpfuseError):
    """A planning constraint (latency bound, memory budget) cannot be met."""
