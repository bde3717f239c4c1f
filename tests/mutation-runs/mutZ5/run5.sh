#!/bin/sh
cd /work/mutrun/mutZ5c
export PYTHONPATH=$PWD/src
exec setsid sh -c 'echo 19 > /proc/self/autogroup; exec nice -n 19 /work/main/.venv/bin/python tools/mutate_quick.py --jobs 1 --cpu-limit 300 --build-cache /work/mutcache/mutZ5c --tests tests/codegen/test_scratch_guards.py --tests tests/codegen/test_pool_cases.py --tests tests/codegen/test_reduce_cases.py -- $(cat all.txt)' > /work/mutrun/mutZ5c/guards-arena.log 2>&1
