"""Input shapes given by the user, and binding them to a model's graph inputs.

On the command line a shape is ``NAME=D0xD1x...`` or ``NAME=D0,D1,...`` (``NAME=`` is a
scalar). The name is everything before the *last* ``=``, so names such as ``input:0`` work.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping, Sequence

from opfuse.errors import InputError, ShapeError

Dim = int | str | None  # a fixed size, a symbolic name (ONNX dim_param), or unknown


def symbolic_dim(dim_param: str) -> str | None:
    """An ONNX ``dim_param`` as a symbol, or ``None`` (unknown) when it names nothing.

    Exporters write placeholders rather than names for "any size": paddle2onnx ``?``, others
    ``-1`` or ``*``. Such a placeholder in two places is two independent sizes (a model
    ``[?, 3, ?, ?]`` takes a 48x192 image), so a placeholder is unknown, not a shared symbol:
    the empty string, text with no letter or digit, or a negative integer.
    """
    text = dim_param.strip()
    if not any(c.isalnum() for c in text) or re.fullmatch(r"-\d+", text):
        return None
    return dim_param


def parse_input_shapes(specs: Iterable[str] | None) -> dict[str, tuple[int, ...]]:
    """``["x=1x3x224x224", "mask=1,128"]`` -> ``{"x": (1, 3, 224, 224), "mask": (1, 128)}``."""
    if specs is None:
        return {}
    if isinstance(specs, str):
        specs = [specs]
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = str(spec).strip().rpartition("=")
        name = name.strip()
        if not sep or not name:
            raise InputError(f"bad input shape {spec!r}: expected NAME=DIMS such as input=1x3x224x224")
        if name in shapes:
            raise InputError(f"input shape for '{name}' is given twice")
        shapes[name] = _parse_dims(spec, dims.strip())
    return shapes


def _parse_dims(spec: str, text: str) -> tuple[int, ...]:
    if not text:
        return ()
    parts = text.replace(",", "x").replace("X", "x").split("x")
    dims = []
    for p in parts:
        p = p.strip()
        if not (p.isascii() and p.isdigit()):
            raise InputError(f"bad input shape {spec!r}: dimension {p!r} is not a non-negative integer "
                             f"(write e.g. input=1x3x224x224)")
        dims.append(int(p))
    return tuple(dims)


def bind_input_shapes(declared: Mapping[str, Sequence[Dim] | None],
                      given: Mapping[str, Sequence[int]], source: str = "--input-shape") -> dict[str, tuple[int, ...]]:
    """Concrete shapes for every graph input.

    ``declared`` maps each input to its model shape (``None`` = unknown rank). A given shape must
    match the declared rank and fixed dims; it binds the input's symbolic dims by name, and
    those bindings fill the same symbols in inputs the user did not give (one ``batch`` for
    all). Any dim left unknown is a ``ShapeError`` telling the user what to pass. ``source``
    names where the given shapes came from in messages (``--input-shape``, or ``"input"`` for
    the arrays of a run).
    """
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise InputError(f"{source} names unknown input(s) {unknown}; the model's inputs are "
                         f"{list(declared)}")
    symbols = _symbols(declared, given, source)
    shapes: dict[str, tuple[int, ...]] = {}
    for name, dims in declared.items():
        if name in given:
            shapes[name] = tuple(int(d) for d in given[name])
            continue
        if dims is None:
            raise ShapeError(f"graph input '{name}' has an unknown rank; pass --input-shape {name}=...")
        bound = [symbols[d][0] if isinstance(d, str) and d in symbols else d for d in dims]
        known = [d for d in bound if isinstance(d, int)]
        if len(known) != len(bound):
            hint = "x".join(str(d) if isinstance(d, int) else "1" for d in bound)
            raise ShapeError(f"graph input '{name}' has unknown dimension(s) in shape {_fmt(dims)}; "
                             f"pass --input-shape {name}={hint} (with your sizes) or run it on arrays that "
                             f"bind them (--inputs)")
        shapes[name] = tuple(known)
    return shapes


def _symbols(declared: Mapping[str, Sequence[Dim] | None], given: Mapping[str, Sequence[int]],
             source: str) -> dict[str, tuple[int, str]]:
    """dim_param -> (size, input that bound it), after checking ``given`` against ``declared``."""
    symbols: dict[str, tuple[int, str]] = {}
    for name, shape in given.items():
        dims = declared[name]
        shape = tuple(int(d) for d in shape)
        what = f"--input-shape {name}={_given(shape)}" if source == "--input-shape" else \
            f"{source} '{name}' of shape {_given(shape) or 'scalar'}"
        if dims is not None and len(dims) != len(shape):
            raise ShapeError(f"{what} has rank {len(shape)}, but the model's "
                             f"input '{name}' has rank {len(dims)} ({_fmt(dims)})")
        for i, (d, g) in enumerate(zip(dims or (), shape, strict=False)):
            if isinstance(d, int) and d != g:
                raise ShapeError(f"{what}: dimension {i} of input '{name}' is fixed at {d} in the model")
            if isinstance(d, str):
                if d in symbols and symbols[d][0] != g:
                    raise ShapeError(f"symbolic dimension '{d}' is {symbols[d][0]} in input "
                                     f"'{symbols[d][1]}' but {g} in input '{name}'")
                symbols.setdefault(d, (g, name))
    return symbols


def unbound_inputs(declared: Mapping[str, Sequence[Dim] | None], given: Mapping[str, Sequence[int]]) -> list[str]:
    """The inputs whose shape ``given`` leaves open: not given, with an unknown rank or a dim that
    is unknown or a symbol no given input binds (what must come from the inputs of a run)."""
    bound = {d for name, shape in given.items() if name in declared
             for d, _ in zip(declared[name] or (), shape, strict=False) if isinstance(d, str)}
    return [name for name, dims in declared.items() if name not in given and
            (dims is None or any(d is None or (isinstance(d, str) and d not in bound) for d in dims))]


def shapes_from_arrays(declared: Mapping[str, Sequence[Dim] | None], given: Mapping[str, Sequence[int]],
                       arrays: Mapping[str, object]) -> dict[str, tuple[int, ...]]:
    """``given`` plus the shapes of the arrays of a run for the inputs ``given`` leaves open (their
    symbolic dims bound by the arrays, checked against the model's rank and fixed dims)."""
    shapes = {name: tuple(int(d) for d in shape) for name, shape in given.items()}
    for name in unbound_inputs(declared, given):
        if name in arrays:
            shapes[name] = tuple(int(d) for d in getattr(arrays[name], "shape", ()))
    _symbols(declared, {k: v for k, v in shapes.items() if k in declared}, "input")
    return shapes


def _fmt(dims) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in dims) + "]"


def _given(shape) -> str:
    return "x".join(str(d) for d in shape)
