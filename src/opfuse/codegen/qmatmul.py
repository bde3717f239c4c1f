"""Integer MatMul of 8-bit activations and constant weights: the portable kernel (SMLAD on the M7).

A QDQ ``DQ -> Gemm/MatMul -> [Add bias] -> [Relu] -> Q`` (the ``integer_matmul`` rule) becomes
``MatMul(int32(a_q) - a_zp, int32(W_q) - w_zp)`` (int32), the int32 bias Add and a fixed-point
``Requantize`` per output column. Per row ``m`` of ``A`` (``M x K``) the kernel

1. converts the row (the dequantizing prologue, ``rules/quantized.py``) into an int16 column of ``Kp``
   (``K`` rounded up to even, the last zero), once for all ``N`` outputs;
2. takes ``acc[n] = sum_k B[k, n] * col[k]`` two output columns per pass over the weights packed at
   build time as int16 rows of ``Kp`` per column (``B`` transposed), so each column word feeds two
   ``SMLAD`` (``opfuse_dot2_s16``, ``qconv.py``; plain C elsewhere, exact either way);
3. hands each accumulator to the fused epilogue (the bias Add, ``Requantize``, the clamp).

This is the M7 / portable path (``simd="none"``, and the host where ``qmatmul_host.py``'s word GEMM
refuses, the reason in the kernel's notes). The values are exact integers: the C equals the reference
executor bit for bit.
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.index import Index
from opfuse.codegen.qconv import (CHANNELS_PER_PASS, DOT_C, DOT_CALL_C, DOT_CALL_HELPER, DOT_HELPER, INT16_MAX,
                                  _is_8bit_centred)
from opfuse.codegen.stages import Stage
from opfuse.ir.graph import Node


def int8_matmul_applies(node: Node, static: dict) -> bool:
    """A 2-D MatMul accumulating in int32 of 8-bit centred activations and a constant weight of int16 range."""
    if node.op_type != "MatMul" or node.outputs[0].dtype != np.int32:
        return False
    a, b = node.input(0), node.input(1)
    if len(a.shape) != 2 or len(b.shape) != 2:
        return False
    w = static.get(id(b))
    if w is None or np.abs(w.astype(np.int64)).max(initial=0) > INT16_MAX:
        return False
    return _is_8bit_centred(a, static)


def lower_int8_matmul(kc, ev, stage: Stage) -> None:
    node = stage.anchor_node
    a, b = node.input(0), node.input(1)
    out = node.outputs[0]
    M, K = a.shape
    N = b.shape[1]
    Kp = K + (K & 1)
    Np = -(-N // CHANNELS_PER_PASS) * CHANNELS_PER_PASS
    packed = np.zeros((Np, Kp), np.int16)
    packed[:N, :K] = ev.static[id(b)].T.astype(np.int16)
    wq = kc.const_array(("int8_matmul", node.name), packed, f"{b.name}_s16", np.int16)
    kc.note(lambda name: f"int8 matmul '{name}': int16 rows of {Kp}, two output columns per pass, SMLAD with "
                         f"the DSP extension", node)
    kc.program.require_helper(DOT_HELPER, DOT_C)
    dot = "opfuse_dot2_s16"
    if stage.epilogue and Kp // 2 >= kc.program.options.int8_dot_call_min_pairs:
        dot = kc.program.require_helper(DOT_CALL_HELPER, DOT_CALL_C)
    col_off = kc.scratch(Kp * 2)
    w = kc.w
    kc.parallel_for(M * N * K)
    m = kc.tmp("m")
    with w.block(f"for (long {m} = 0; {m} < {M}; ++{m})"):
        col, k = kc.tmp("col"), kc.tmp("k")
        w.line(f"int16_t* restrict {col} = {kc.scratch_ptr('int16_t', col_off)};")
        if Kp != K:
            w.line(f"{col}[{K}] = 0;")
        with w.block(f"for (long {k} = 0; {k} < {K}; ++{k})"), ev.scope():
            w.line(f"{col}[{k}] = (int16_t)({ev.at(a, Index(a.shape, (m, k)))});")
        n = kc.tmp("n")
        with w.block(f"for (long {n} = 0; {n} < {Np}; {n} += {CHANNELS_PER_PASS})"):
            a0, a1 = kc.tmp("acc"), kc.tmp("acc")
            row = f"{wq} + {n} * {Kp}"
            w.line(f"int32_t {a0}, {a1};")
            w.line(f"{dot}({row}, {row} + {Kp}, {col}, {Kp // 2}, &{a0}, &{a1});")
            for j, acc in enumerate((a0, a1)):
                nn = f"{n} + {j}" if j else n
                with w.block(f"if ({nn} < {N})") if N % CHANNELS_PER_PASS and j else nullcontext(), ev.scope():
                    y = kc.tmp("y")
                    w.line(f"const int32_t {y} = {acc};")
                    finish_element(kc, ev, stage, out, Index(out.shape, (m, nn)), y)
