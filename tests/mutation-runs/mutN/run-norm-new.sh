#!/bin/sh
cd /work/mutrun/mutN
export PYTHONPATH=$PWD/src
exec /work/main/.venv/bin/python tools/mutate_quick.py --jobs 2 --cpu-limit 300 --build-cache /work/mutcache/mutN \
  --tests tests/codegen/test_mut_norm.py -- $(cat norm-surv.txt)
