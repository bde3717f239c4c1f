"""ONNX backend node conformance, counted honestly: every node test of the installed onnx, as shipped.

    python benchmarks/bench_conformance.py                 # all tests, 2 worker processes
    python benchmarks/bench_conformance.py --every 10      # every 10th test (sorted by name)
    python benchmarks/bench_conformance.py -k relu --jobs 1

Each test's model is used exactly as ``onnx.backend.test`` builds it: its own opset (no version
conversion), every graph input fed at run time. The only thing passed besides the model is each
input's shape, as ``--input-shape`` would (a test's data fixes them). An input that decides a
shape (a Reshape's shape, a ReduceSum's axes) is bound to the value the test feeds, as a model
from ``opfuse.compile`` is specialised to each run's values (``SpecializingModel``; the C library
is built for them). Each test runs on three backends:

* ``reference``: ``opfuse.api.load_for_arrays`` (the import, shape-deciding inputs bound to the
  values fed) then the NumPy reference executor;
* ``c``: ``opfuse.compile(model, target="host")`` (rewrites, fusion, planner, memory plan, C,
  gcc) and the compiled model's ``run``, on one thread;
* ``onnxruntime`` (when installed): the yardstick, on the same models and data.

A test passes when every output has the expected shape and dtype and its values are within the
test's own ``rtol``/``atol`` (ONNX's defaults 1e-3 / 1e-7; NaN equals NaN; integers and bools
exactly), as ``onnx.backend.test`` compares them. Every failure is put in one category (see
``classify``) with a detail (the op, the opset, the dtype...), so the JSON says why each test
does not pass. Nothing is excluded: float8, int4 and string tests count as failures, under
the "dtype" category.

Writes ``benchmarks/results/conformance.json`` (counts, failure categories and details per
backend, and every test's outcome) and prints the headline. Tests run in ``--jobs`` worker
processes (each test under a ``--timeout``); compiled libraries go to a fresh build cache
unless ``--cache`` names one.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "conformance.json"
BACKENDS = ("reference", "c", "onnxruntime")
PASS = "pass"
DEFAULT_TIMEOUT_S = 60


class TestTimeout(Exception):
    pass


# The suite --------------------------------------------------------------------------------------

_TESTS: dict | None = None


def node_tests() -> dict:
    """Every node test case of the installed onnx, by name (built in memory by onnx's loader)."""
    global _TESTS
    if _TESTS is None:
        import onnx.backend.test.loader as loader
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the generators overflow casts on purpose
            _TESTS = {t.name: t for t in loader.load_node_model_tests()}
    return _TESTS


def _value(x):
    """A test's input or output as NumPy: an array, a list of them (a sequence) or ``None``."""
    import onnx
    from onnx import numpy_helper
    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    if isinstance(x, (list, tuple)):
        return [_value(e) for e in x]
    return None if x is None else np.asarray(x)


def _data_sets(test) -> list[tuple[dict, list]]:
    """``[(feeds by input name, expected outputs)]``. Optional inputs the test leaves out are
    named ``""`` in the node and absent from the graph inputs, so inputs pair by position."""
    names = [vi.name for vi in test.model.graph.input]
    init = {t.name for t in test.model.graph.initializer}
    names = [n for n in names if n not in init]
    return [({n: _value(x) for n, x in zip(names, inputs, strict=False)}, [_value(y) for y in expected])
            for inputs, expected in test.data_sets]


def compare(test, got: dict, expected: list) -> str | None:
    """``None`` when every output matches, else why not (one line)."""
    for vi, want in zip(test.model.graph.output, expected, strict=True):
        if vi.name not in got:
            return f"output '{vi.name}' missing"
        why = _compare_value(test, got[vi.name], want)
        if why:
            return f"output '{vi.name}': {why}"
    return None


def _compare_value(test, got, want) -> str | None:
    if isinstance(want, list) or want is None:
        if not isinstance(got, list) and want is not None:
            return "values differ (a sequence was expected)"
        if want is None:
            return None if got is None else "values differ (none was expected)"
        if len(got) != len(want):
            return "values differ (sequence length)"
        return next((w for w in (_compare_value(test, g, x) for g, x in zip(got, want, strict=True)) if w), None)
    g = np.asarray(got)
    if g.shape != want.shape:
        return f"shape {list(g.shape)}, expected {list(want.shape)}"
    if g.dtype != want.dtype:
        return f"dtype {g.dtype}, expected {want.dtype}"
    if want.dtype.kind == "V" and want.dtype.itemsize <= 2:  # ml_dtypes floats (bfloat16): compared as floats
        g, want = g.astype(np.float32), want.astype(np.float32)
    if want.dtype.kind in "fc":
        ok = np.allclose(g, want, rtol=test.rtol, atol=test.atol, equal_nan=True)
    else:
        ok = np.array_equal(g, want)
    return None if ok else "values differ"


# Running one test on one backend ------------------------------------------------------------------

def _shapes(feeds: dict) -> dict:
    """The shape of every tensor input, as ``--input-shape`` gives them."""
    return {k: v.shape for k, v in feeds.items() if isinstance(v, np.ndarray)}


def run_reference(test, feeds: dict) -> dict:
    from opfuse.api import load_for_arrays
    from opfuse.runtime.reference import run
    graph, values = load_for_arrays(test.model, _shapes(feeds), feeds)
    return run(graph, {k: v for k, v in feeds.items() if k not in values})


def run_c(test, feeds: dict) -> dict:
    import opfuse
    model = opfuse.compile(test.model, target="host", threads=1,
                           input_shapes=_shapes(feeds))
    return model.run(feeds)


def run_onnxruntime(test, feeds: dict) -> dict:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 4
    sess = ort.InferenceSession(test.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    return {o.name: r for o, r in zip(sess.get_outputs(), outs, strict=True)}


RUNNERS = {"reference": run_reference, "c": run_c, "onnxruntime": run_onnxruntime}


# Why a test fails --------------------------------------------------------------------------------

_DTYPE_WORDS = ("bfloat16", "float8", "float4", "int4", "int2", "uint4", "uint2", "string", "e4m3", "e5m2",
                "e8m0", "dtype", "element type", "has no float16", "float16 is not supported", "complex")


def classify(backend: str, exc: BaseException | None, mismatch: str | None) -> tuple[str, str]:
    """``(category, detail)`` of one failure: the category is what to fix, the detail names it."""
    if mismatch is not None:
        if "shape" in mismatch:
            return "wrong shape", mismatch.split(": ", 1)[0]
        if "dtype" in mismatch:
            return "wrong dtype", mismatch.split(": ", 1)[1]
        return "wrong values", ""
    assert exc is not None
    if isinstance(exc, TestTimeout):
        return "timeout", ""
    msg = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    low = msg.lower()
    if backend == "onnxruntime":
        m = re.search(r"(NOT_IMPLEMENTED|INVALID_GRAPH|INVALID_ARGUMENT|FAIL|RUNTIME_EXCEPTION)", msg)
        return "onnxruntime error", m.group(1) if m else type(exc).__name__
    from opfuse.errors import OpfuseError, UnsupportedDtypeError, UnsupportedOpError
    if not isinstance(exc, OpfuseError):
        return "crash (a bug)", f"{type(exc).__name__}: {_generic(msg)}"
    if isinstance(exc, UnsupportedDtypeError):
        return "dtype", f"{exc.dtype} (C backend)"
    if type(exc).__name__ == "UnsupportedGroupError" or "c kernel" in low or "inside this kernel" in low:
        return "C backend: no kernel", _generic(msg.split(": ", 1)[-1])
    m = re.search(r"uses opset (\d+)", msg)
    if m:
        return "opset", f"opset {m.group(1)}"
    if "not an op opfuse imports" in msg:
        assert isinstance(exc, UnsupportedOpError)
        return "unsupported op", exc.op_type
    if "not an ONNX op at this opset" in msg:
        return "opset", f"{getattr(exc, 'op_type', '?')} at this opset"
    if "imports no opset of the default" in msg:
        return "non-default domain", "no ai.onnx opset"
    if "domain" in low and "not supported" in low:
        return "non-default domain", re.sub(r".*domain '([^']*)'.*", r"\1", msg)
    if "subgraph" in low or "control flow" in low:
        return "control flow", getattr(exc, "op_type", "")
    if "sequence" in low or "optional" in low or "not a tensor" in low:
        return "non-tensor value", ""
    if any(w in low for w in _DTYPE_WORDS):
        return "dtype", _dtype_detail(msg)
    if "must be a constant" in msg:
        return "non-constant shape input", getattr(exc, "op_type", "")
    if "unknown attribute" in msg or ("unsupported op" in low and ":" in msg):
        return "unsupported attribute or mode", f"{getattr(exc, 'op_type', '?')}: {_generic(msg.split(': ', 1)[-1])}"
    return f"other {type(exc).__name__}", _generic(msg)


def _dtype_detail(msg: str) -> str:
    m = re.search(r"(bfloat16|float8\w*|float4\w*|u?int[24]\b|string|float16|complex\d*|e4m3\w*|e5m2\w*|e8m0\w*)",
                  msg, re.IGNORECASE)
    return m.group(1).lower() if m else _generic(msg)


def _generic(msg: str) -> str:
    """The message with names and numbers blanked, so equal causes group together."""
    msg = re.sub(r"'[^']*'", "'*'", msg)
    msg = re.sub(r"\b\d+\b", "N", msg)
    return msg[:160]


# Workers -------------------------------------------------------------------------------------------

def _alarm(signum, frame):
    raise TestTimeout()


def run_test(args: tuple[str, tuple[str, ...], int]) -> tuple[str, dict]:
    """Every backend on one test: ``{backend: "pass" | [category, detail, message]}``."""
    name, backends, timeout = args
    test = node_tests()[name]
    outcome: dict = {}
    for backend in backends:
        exc: BaseException | None = None
        mismatch = None
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(timeout)
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                for feeds, expected in _data_sets(test):
                    mismatch = compare(test, RUNNERS[backend](test, feeds), expected)
                    if mismatch:
                        break
        except BaseException as e:  # noqa: B036 -- a test's failure of any kind is counted, not raised
            if isinstance(e, KeyboardInterrupt):
                raise
            exc = e
        finally:
            signal.alarm(0)
        if exc is None and mismatch is None:
            outcome[backend] = PASS
        else:
            cat, detail = classify(backend, exc, mismatch)
            text = mismatch or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if cat == "crash (a bug)" and exc is not None:
                tb = traceback.extract_tb(exc.__traceback__)
                where = tb[-1] if tb else None
                text += f" [{Path(where.filename).name}:{where.lineno}]" if where else ""
            outcome[backend] = [cat, detail, text[:300]]
    return name, outcome


def _init_worker(cache: str) -> None:
    os.environ["OPFUSE_CACHE_DIR"] = cache
    os.environ["OMP_NUM_THREADS"] = "1"
    node_tests()


# Summary ---------------------------------------------------------------------------------------------

def summarise(results: dict[str, dict], backends: tuple[str, ...]) -> dict:
    out = {}
    for b in backends:
        outcomes = [r[b] for r in results.values() if b in r]
        passed = sum(1 for o in outcomes if o == PASS)
        cats: Counter = Counter()
        details: dict[str, Counter] = {}
        for o in outcomes:
            if o == PASS:
                continue
            cats[o[0]] += 1
            details.setdefault(o[0], Counter())[o[1]] += 1
        out[b] = {
            "passed": passed,
            "failed": len(outcomes) - passed,
            "total": len(outcomes),
            "failures": {c: {"count": n, "details": dict(details[c].most_common())}
                         for c, n in cats.most_common()},
        }
    return out


def headline(summary: dict, total_suite: int, ran: int) -> str:
    parts = [f"{b} {s['passed']}/{s['total']}" for b, s in summary.items()]
    scope = f"all {total_suite} tests" if ran == total_suite else f"{ran} of {total_suite} tests"
    return f"ONNX node conformance ({scope}, as shipped): " + ", ".join(parts)


def select(names: list[str], every: int, pattern: str | None) -> list[str]:
    names = sorted(names)
    if pattern:
        names = [n for n in names if re.search(pattern, n)]
    return names[::every]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--every", type=int, default=1, help="run every Nth test (sorted by name; default all)")
    p.add_argument("-k", dest="pattern", help="only tests whose name matches this regular expression")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: cores)")
    p.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, help="seconds per test and backend")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, of " + ", ".join(BACKENDS))
    p.add_argument("--cache", help="build cache folder (default: a fresh temporary one)")
    p.add_argument("--out", default=str(RESULTS), help="JSON output path")
    p.add_argument("--top", type=int, default=8, help="failure categories and details to print per backend")
    args = p.parse_args(argv)

    backends = tuple(b for b in args.backends.split(",") if b)
    if "onnxruntime" in backends:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            print("onnxruntime is not installed: its column is skipped")
            backends = tuple(b for b in backends if b != "onnxruntime")
    import onnx
    tests = node_tests()
    names = select(list(tests), max(args.every, 1), args.pattern)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="opfuse-conformance-") as tmp:
        cache = args.cache or tmp
        work = [(n, backends, args.timeout) for n in names]
        results: dict[str, dict] = {}
        if args.jobs <= 1:
            _init_worker(cache)
            for i, item in enumerate(work):
                name, outcome = run_test(item)
                results[name] = outcome
                _progress(i + 1, len(work))
        else:
            ctx = mp.get_context("fork")
            with ctx.Pool(args.jobs, initializer=_init_worker, initargs=(cache,), maxtasksperchild=200) as pool:
                for i, (name, outcome) in enumerate(pool.imap_unordered(run_test, work, chunksize=4)):
                    results[name] = outcome
                    _progress(i + 1, len(work))
    elapsed = time.perf_counter() - start
    summary = summarise(results, backends)
    line = headline(summary, len(tests), len(names))
    report = {
        "headline": line,
        "onnx_version": onnx.__version__,
        "newest_opset": onnx.defs.onnx_opset_version(),
        "suite_tests": len(tests),
        "ran": len(names),
        "selection": {"every": args.every, "pattern": args.pattern},
        "method": "each test's model as shipped (its own opset, every graph input fed at run time, input "
                  "shapes from the test data); outputs compared with the test's rtol/atol, shapes and dtypes "
                  "exactly; nothing excluded",
        "jobs": args.jobs,
        "elapsed_s": round(elapsed, 1),
        "backends": summary,
        "tests": dict(sorted(results.items())),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_json_text(report))
    print(f"\n{line}  ({elapsed:.0f} s, {args.jobs} jobs)")
    for b, s in summary.items():
        print(f"  {b}: {s['passed']} passed, {s['failed']} failed")
        for cat, info in list(s["failures"].items())[:args.top]:
            top = ", ".join(f"{d or '-'} {n}" for d, n in list(info["details"].items())[:args.top])
            print(f"    {info['count']:5d}  {cat}: {top}")
    print(f"wrote {out}")
    return 0


def _json_text(report: dict) -> str:
    """Indented JSON with one line per test (the file stays small enough to diff)."""
    tests = report.pop("tests")
    head = json.dumps(report, indent=1)[:-2]
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in tests.items())
    return f"{head},\n \"tests\": {{\n{rows}\n }}\n}}\n"


def _progress(done: int, total: int) -> None:
    if sys.stderr.isatty() and (done % 25 == 0 or done == total):
        print(f"\r{done}/{total}", end="", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
