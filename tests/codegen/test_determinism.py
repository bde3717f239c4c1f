"""Generated code is the same byte for byte: across calls, processes and hash seeds."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from cg_support import fused_plan
from opfuse.codegen import generate

from opfuse import zoo

SCRIPT = """
import hashlib, sys
sys.path.insert(0, {support!r})
from cg_support import fused_plan
from opfuse import zoo
from opfuse.codegen import generate
g = zoo.load("resnet8")
p = generate(g, fused_plan("resnet8", g))
print(hashlib.sha256(p.source.encode() + p.weights).hexdigest())
"""


def _digest(program) -> str:
    return hashlib.sha256(program.source.encode() + program.weights).hexdigest()


def test_same_source_twice_in_one_process():
    g = zoo.load("bert_layer")
    a = generate(g, fused_plan("bert_layer", g))
    b = generate(g, fused_plan("bert_layer", g))
    assert a.source == b.source and a.weights == b.weights


def test_same_source_across_processes_and_hash_seeds():
    g = zoo.load("resnet8")
    here = _digest(generate(g, fused_plan("resnet8", g)))
    script = SCRIPT.format(support=str(Path(__file__).parent))
    for seed in ("1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == here
