#!/bin/sh
cd /work/mutrun/mutM
export PYTHONPATH=$PWD/src
exec /work/main/.venv/bin/python tools/mutate_quick.py --jobs 2 --cpu-limit 300 --build-cache /work/mutcache/mutM \
  --sample 0.10 --sample-seed s13 \
  --tests tests/codegen/test_half.py --tests tests/codegen/test_row_maps.py --tests tests/codegen/test_vectorize.py \
  --tests tests/codegen/test_simdchain.py --tests tests/codegen/test_mut_simdchain.py --tests tests/codegen/test_unbuilt_paths.py \
  -- 'opfuse.codegen.pointwise.*'
