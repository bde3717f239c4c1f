#!/bin/sh
cd /work/mutrun/mutZ5b
export PYTHONPATH=$PWD/src
exec setsid sh -c 'echo 19 > /proc/self/autogroup; exec nice -n 19 /work/main/.venv/bin/python tools/mutate_quick.py --jobs 1 --cpu-limit 200 --build-cache /work/mutcache/mutZ5b --tests tests/codegen/test_reduce_cases.py -- $(cat r.txt)' > /work/mutrun/mutZ5b/reduce-new.log 2>&1
