"""Det: the determinant of each trailing ``M x M`` matrix, by LU with partial pivoting.

Per matrix (one iteration of the loop nest over the batch axes, split across threads): the
matrix is copied into a per-thread ``double`` scratch, then for each column ``k`` the row with
the largest ``|a[r][k]|`` (r >= k) is swapped up (negating the determinant), the pivot multiplies
the determinant and the rows below subtract their multiple of row ``k``:

    det = (-1)^swaps * prod_k U[k][k]

A zero pivot column makes the determinant 0 (the loop stops). A matrix with a NaN or infinite
entry has determinant NaN, as in the reference: with infinities the LU's result depends on the
order of elimination (inf - inf), NaN here and inf in LAPACK for the same matrix. The work is
``2 M^3 / 3`` flops in double, rounded once to the output type, as the reference (LAPACK in
float64) does.
"""
from __future__ import annotations

from opfuse.codegen.ctype import c_type
from opfuse.codegen.index import Index
from opfuse.codegen.loops import emit_loop_nest, store
from opfuse.codegen.stages import GroupAnalysis, Stage


def lower_det(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    node = stage.anchor_node
    x, y = node.input(0), node.outputs[0]
    m = int(x.shape[-1])
    batch = tuple(int(d) for d in x.shape[:-2])
    ct = c_type(y.dtype)
    w = kc.w

    def body(bidx: Index):
        a, det = kc.tmp("lu"), kc.tmp("det")
        w.line(f"double* restrict {a} = {kc.scratch_ptr('double', kc.scratch(max(m * m, 1) * 8))};")
        r, c, finite = kc.tmp("r"), kc.tmp("c"), kc.tmp("finite")
        w.line(f"int {finite} = 1;")
        with w.block(f"for (long {r} = 0; {r} < {m}; ++{r})"), w.block(f"for (long {c} = 0; {c} < {m}; ++{c})"), \
                ev.scope():
            v = ev.at(x, Index(tuple(x.shape), tuple(bidx.dims) + (r, c)))
            w.line(f"{a}[{r} * {m} + {c}] = (double){v};")
            w.line(f"{finite} &= isfinite({a}[{r} * {m} + {c}]) != 0;")
        w.line(f"double {det} = {finite} ? 1.0 : (double)NAN;")
        k, p, best, t = kc.tmp("k"), kc.tmp("p"), kc.tmp("best"), kc.tmp("t")
        with w.block(f"for (long {k} = 0; {finite} && {k} < {m}; ++{k})"):
            w.line(f"long {p} = {k};")
            w.line(f"double {best} = fabs({a}[{k} * {m} + {k}]);")
            with w.block(f"for (long {r} = {k} + 1; {r} < {m}; ++{r})"):
                w.line(f"double {t} = fabs({a}[{r} * {m} + {k}]);")
                w.line(f"if ({t} > {best}) {{ {best} = {t}; {p} = {r}; }}")
            w.line(f"if ({a}[{p} * {m} + {k}] == 0.0) {{ {det} = 0.0; break; }}")
            with w.block(f"if ({p} != {k})"):
                with w.block(f"for (long {c} = 0; {c} < {m}; ++{c})"):
                    w.line(f"double {t} = {a}[{k} * {m} + {c}];")
                    w.line(f"{a}[{k} * {m} + {c}] = {a}[{p} * {m} + {c}];")
                    w.line(f"{a}[{p} * {m} + {c}] = {t};")
                w.line(f"{det} = -{det};")
            w.line(f"{det} *= {a}[{k} * {m} + {k}];")
            with w.block(f"for (long {r} = {k} + 1; {r} < {m}; ++{r})"):
                w.line(f"double {t} = {a}[{r} * {m} + {k}] / {a}[{k} * {m} + {k}];")
                with w.block(f"for (long {c} = {k} + 1; {c} < {m}; ++{c})"):
                    w.line(f"{a}[{r} * {m} + {c}] -= {t} * {a}[{k} * {m} + {c}];")
        store(kc, ev, y, Index(batch, tuple(bidx.dims)), f"({ct}){det}")

    emit_loop_nest(kc, ev, batch, body, cost_per_element=max(2 * m ** 3 // 3, 1))
