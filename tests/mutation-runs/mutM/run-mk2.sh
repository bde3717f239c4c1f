#!/bin/sh
cd /work/mutrun/mutM
export PYTHONPATH=$PWD/src
exec /work/main/.venv/bin/python tools/mutate_quick.py --jobs 2 --cpu-limit 300 --build-cache /work/mutcache/mutM \
  --tests tests/codegen/test_vector_epilogue.py --tests tests/codegen/test_column_bias_epilogue.py \
  --tests tests/codegen/test_conv_direct.py --tests tests/codegen/test_gemm_tile_edges.py \
  -- $(cat logs/mk-x86.txt)
