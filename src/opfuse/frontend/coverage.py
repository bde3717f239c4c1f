"""Which standard ONNX operators opfuse takes, how, and why the others are refused (``opfuse ops``).

Every operator of the default ONNX domain that the installed onnx package defines is put in one
of these kinds, from the importer's own tables (nothing here is a second list of what works):

* ``op``: an opfuse op (``opfuse.ops.REGISTRY``): the reference executor and the C backend run
  it, and the fusion rules see it under its fusion category;
* ``rewritten``: the importer rewrites it into ops (Einsum into MatMul/Transpose/ReduceSum, DFT
  into a MatMul by a constant matrix, QLinearConv into an integer Conv and a Requantize...);
* ``folded``: control flow and sequences, folded or unrolled at import when what decides them is
  known (``onnx_control``, ``onnx_sequences``);
* ``removed``: nothing to compute at inference (Identity, Dropout, Constant);
* ``function``: expanded through its ONNX function body, so it is taken when its body's ops are;
* ``refused``: with the reason (``REFUSED_REASONS``; a function whose body uses a refused op is
  refused for that op).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx.defs

from opfuse.frontend.onnx_canonical import REMOVED_OPS, REWRITTEN_OPS
from opfuse.frontend.onnx_control import CONTROL_FLOW
from opfuse.frontend.onnx_opsets import DEFAULT_DOMAINS, MIN_OPSET
from opfuse.frontend.onnx_sequences import SEQUENCE_OPS
from opfuse.ops.registry import is_supported

KINDS = ("op", "rewritten", "folded", "removed", "function", "refused")

_RANDOM = ("random sampling: the output is not a function of the inputs, so no build can be checked against "
           "the reference or another runtime; opfuse compiles deterministic inference graphs")
_STRING = "string tensors: opfuse compiles numeric tensors (the C backend has no string type)"

# Why each standard operator that opfuse does not take is refused.
REFUSED_REASONS: dict[str, str] = {
    "RandomNormal": _RANDOM,
    "RandomNormalLike": _RANDOM,
    "RandomUniform": _RANDOM,
    "RandomUniformLike": _RANDOM,
    "Multinomial": _RANDOM,
    "Bernoulli": _RANDOM,
    "StringConcat": _STRING,
    "StringNormalizer": _STRING,
    "StringSplit": _STRING,
    "RegexFullMatch": _STRING,
    "ImageDecoder": "decodes compressed image bytes (JPEG, PNG, BMP...): a codec, not a tensor computation",
    "MaxRoiPool": "not implemented (RoiAlign, which replaced it in detection models, is)",
}
NOT_IMPLEMENTED = "not implemented"


@dataclass(frozen=True)
class OpCoverage:
    op: str
    since: int  # the newest version of the op in the installed onnx
    kind: str  # one of KINDS
    detail: str = ""  # the refusal's reason, or what a function's body needs

    def as_dict(self) -> dict:
        return {"op": self.op, "since": self.since, "kind": self.kind, "detail": self.detail}


def standard_schemas() -> dict[str, Any]:
    """The newest schema of every non-deprecated operator of the default domain."""
    newest: dict[str, Any] = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain in DEFAULT_DOMAINS and (s.name not in newest or s.since_version > newest[s.name].since_version):
            newest[s.name] = s
    return {name: s for name, s in sorted(newest.items()) if not s.deprecated}


def _body_ops(schema: Any) -> set[str] | None:
    """Op types of a function body, or None when the body depends on the node (context-dependent)."""
    if not schema.has_function:
        return None
    return {n.op_type for n in schema.function_body.node if n.domain in DEFAULT_DOMAINS}


def _direct_kind(op: str) -> str | None:
    if op in REMOVED_OPS:
        return "removed"
    if is_supported(op):
        return "op"
    if op in REWRITTEN_OPS:
        return "rewritten"
    if op in SEQUENCE_OPS or op in CONTROL_FLOW:
        return "folded"
    return None


def _taken(op: str, schemas: dict[str, Any], seen: set[str]) -> bool:
    """Whether the importer takes ``op``: directly, or through a function body whose ops it takes."""
    if _direct_kind(op) is not None:
        return True
    schema = schemas.get(op)
    if op in REFUSED_REASONS or op in seen or schema is None:
        return False
    if schema.has_context_dependent_function:
        return True
    body = _body_ops(schema)
    return body is not None and all(_taken(o, schemas, seen | {op}) for o in body)


def coverage() -> list[OpCoverage]:
    """One row per standard operator, sorted by name."""
    schemas = standard_schemas()
    rows: list[OpCoverage] = []
    for op, schema in schemas.items():
        kind = _direct_kind(op)
        if kind is not None:
            rows.append(OpCoverage(op, schema.since_version, kind))
            continue
        if op in REFUSED_REASONS:
            rows.append(OpCoverage(op, schema.since_version, "refused", REFUSED_REASONS[op]))
            continue
        if schema.has_function or schema.has_context_dependent_function:
            body = _body_ops(schema)
            missing = sorted(o for o in (body or ()) if not _taken(o, schemas, {op}))
            if missing:
                rows.append(OpCoverage(op, schema.since_version, "refused",
                                       f"its function body uses {', '.join(missing)}: "
                                       + "; ".join(REFUSED_REASONS.get(o, NOT_IMPLEMENTED) for o in missing[:1])))
            else:
                detail = "context-dependent body" if body is None else "body: " + ", ".join(sorted(body))
                rows.append(OpCoverage(op, schema.since_version, "function", detail))
            continue
        rows.append(OpCoverage(op, schema.since_version, "refused", NOT_IMPLEMENTED))
    return rows


def summary(rows: list[OpCoverage]) -> dict[str, int]:
    counts = {k: 0 for k in KINDS}
    for r in rows:
        counts[r.kind] += 1
    return counts


def headline(rows: list[OpCoverage]) -> str:
    c = summary(rows)
    taken = len(rows) - c["refused"]
    return (f"{taken} of {len(rows)} standard ONNX operators (opsets {MIN_OPSET}-{onnx.defs.onnx_opset_version()}) "
            f"taken: {c['op']} ops, {c['rewritten']} rewritten, {c['folded']} folded, {c['removed']} removed, "
            f"{c['function']} through their function body; {c['refused']} refused")
