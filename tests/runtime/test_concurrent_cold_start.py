"""Processes that start at once on an empty cache (``OPFUSE_CACHE_DIR``): they build each entry
once (the entry's lock), get the same C and the same outputs, calibrate once, and leave no
temporary file, folder or lock behind."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import opfuse
from opfuse.files import file_lock
from opfuse.runtime.toolchain import BUILD_PREFIX, KEY_LOCK_PREFIX, LOAD_PREFIX, PCH_FOLDER

SRC = str(Path(opfuse.__file__).resolve().parents[1])
WAIT_S = 120  # for a child to get ready or finish (a busy machine compiles slowly)

# A child: signal ready, wait for "go", compile resnet8 (plenty of C: the builds overlap), run it.
COMPILE_CHILD = """
import hashlib, json, sys, time
from pathlib import Path
import numpy as np
import opfuse
from opfuse.runtime import reference
out, ready, go = map(Path, sys.argv[1:4])
ready.touch()
while not go.exists():
    time.sleep(0.002)
m = opfuse.compile("zoo:resnet8")
res = m.run(reference.random_inputs(m.graph, 0))
json.dump({"source": m.program.source, "key": m.build_result.key, "hit": m.build_result.cache_hit,
           "outputs": {k: v.tobytes().hex() for k, v in res.items()}}, out.open("w"))
"""

# A child calibrating the host with a stand-in measurement that takes a while and counts itself.
CALIBRATE_CHILD = """
import sys, time
from pathlib import Path
from opfuse.targets.calibrate import calibrate_host
from opfuse.targets.microbench import Measurement
out, ready, go, count = map(Path, sys.argv[1:5])
def measure():
    with count.open("a") as f:
        f.write("measured\\n")
    time.sleep(1.0)
    return Measurement(bandwidth_Bps=1e10, peak_flops={"float32": 1e11, "float64": 5e10}, call_overhead_s=1e-6,
                       dram_latency_s=1e-7, method="stand-in")
ready.touch()
while not go.exists():
    time.sleep(0.002)
p = calibrate_host(measure=measure)
out.write_text(p.to_dict()["source"] + " " + repr(p.notes[0]))
"""


def _env(cache: Path) -> dict:
    env = dict(os.environ, OPFUSE_CACHE_DIR=str(cache), PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    env.pop("CC", None)
    return env


def _start_together(tmp_path: Path, script: str, n: int, extra=()) -> list[Path]:
    """Run ``n`` children of ``script`` released at the same instant; their result files."""
    (tmp_path / "child.py").write_text(textwrap.dedent(script))
    cache = tmp_path / "cache"
    go = tmp_path / "go"
    procs, outs, readies = [], [], []
    for i in range(n):
        out, ready = tmp_path / f"out{i}", tmp_path / f"ready{i}"
        procs.append(subprocess.Popen([sys.executable, str(tmp_path / "child.py"), str(out), str(ready), str(go),
                                       *map(str, extra)], env=_env(cache), stderr=subprocess.PIPE, text=True))
        outs.append(out)
        readies.append(ready)
    deadline = time.monotonic() + WAIT_S
    while not all(r.exists() for r in readies) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=WAIT_S)
        assert p.returncode == 0, err
    return outs


def _temporaries(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*")
            if p.name.startswith((BUILD_PREFIX, LOAD_PREFIX, KEY_LOCK_PREFIX)) or p.name.endswith((".tmp", ".lock"))]


def test_two_cold_starts_at_once_build_once_and_agree(tmp_path):
    a, b = (json.loads(p.read_text()) for p in _start_together(tmp_path, COMPILE_CHILD, 2))
    assert a["source"] == b["source"] and a["key"] == b["key"]
    assert a["outputs"] == b["outputs"]
    assert sorted([a["hit"], b["hit"]]) == [False, True]  # one compiled, the other waited and loaded it
    cache = tmp_path / "cache"
    assert _temporaries(cache) == []
    entries = [p for p in cache.glob("*/*") if p.is_dir() and p.parent.name != PCH_FOLDER]
    assert [p.name for p in entries] == [a["key"]]
    assert len(list(cache.glob(f"{PCH_FOLDER}/*/*.gch"))) <= 1  # the system headers precompiled once (GCC)
    assert (entries[0] / "model.c").read_text() == a["source"]


def test_two_calibrations_at_once_measure_once(tmp_path):
    count = tmp_path / "count"
    outs = _start_together(tmp_path, CALIBRATE_CHILD, 2, extra=(count,))
    assert count.read_text().splitlines() == ["measured"]
    assert outs[0].read_text() == outs[1].read_text()  # the same saved calibration, same timestamp
    assert _temporaries(tmp_path / "cache") == []


def test_file_lock_excludes_and_is_removed(tmp_path):
    """The lock is exclusive between processes, and a waiter that opened the file before the
    holder removed it locks the new file, never the removed one."""
    lock = tmp_path / "x.lock"
    child = ("import sys, time\nfrom opfuse.files import file_lock\n"
             "with file_lock(sys.argv[1]) as held:\n    print(held, time.time(), flush=True)\n")
    with file_lock(lock) as held:
        assert held and lock.exists()
        p = subprocess.Popen([sys.executable, "-c", child, str(lock)], env=_env(tmp_path / "c"),
                             stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        assert p.poll() is None  # waiting for us
        released = time.time()
    out, _ = p.communicate(timeout=WAIT_S)
    held_text, when = out.split()
    assert held_text == "True" and float(when) >= released
    assert not lock.exists()


def test_file_lock_in_a_read_only_place_is_no_lock(tmp_path):
    with file_lock(tmp_path / "missing" / "x.lock") as held:
        assert held is False
