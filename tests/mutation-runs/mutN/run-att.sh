#!/bin/sh
cd /work/mutrun/mutN
export PYTHONPATH=$PWD/src
exec /work/main/.venv/bin/python tools/mutate_quick.py --jobs 2 --cpu-limit 300 --build-cache /work/mutcache/mutN \
  --sample 0.10 --sample-seed s13 \
  --tests tests/codegen/test_attention_cases.py --tests tests/codegen/test_fused.py \
  --tests tests/codegen/test_vecmath.py --tests tests/codegen/test_zoo.py \
  --select test_attention --select "test_zoo_fused_matches_reference[0]" --select "test_zoo_fused_with_the_size_thresholds_lowered[0]" \
  -- 'opfuse.codegen.attention.*'
