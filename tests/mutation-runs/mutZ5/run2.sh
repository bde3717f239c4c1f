#!/bin/sh
cd /work/mutrun/mutZ5
export PYTHONPATH=$PWD/src
exec setsid sh -c 'echo 19 > /proc/self/autogroup; exec nice -n 19 /work/main/.venv/bin/python tools/mutate_quick.py --jobs 1 --cpu-limit 120 --build-cache /work/mutcache/mutZ5 --sample 0.20 --sample-seed s13 --tests tests/codegen/test_reduce_cases.py --tests tests/codegen/test_numerics.py --tests tests/mutation/ops_suites_whole.py --tests tests/codegen/test_half.py -- "opfuse.codegen.reduce.*"' > /work/mutrun/mutZ5/reduce1.log 2>&1
