#!/bin/sh
cd /work/mutrun/mutN
export PYTHONPATH=$PWD/src
exec /work/main/.venv/bin/python tools/mutate_quick.py --jobs 2 --cpu-limit 300 --build-cache /work/mutcache/mutN \
  --sample 0.20 --resume mutN-norm-0.10.txt --sample-seed s13 \
  --tests tests/codegen/test_norm_cases.py --tests tests/codegen/test_mut_norm.py --tests tests/codegen/test_log_softmax_nan.py \
  --tests tests/mutation/ops_suites_whole.py --tests tests/codegen/test_fused.py \
  --tests tests/codegen/test_half.py --tests tests/codegen/test_softmax_columns.py \
  --tests tests/codegen/test_parallel_schedule.py --tests tests/codegen/test_zoo.py \
  --select test_norm_cases --select test_mut_norm --select test_log_softmax_nan --select test_reduce_suite --select test_softmax \
  --select layernorm --select test_models_fused_and_unfused --select test_parallel_schedule \
  --select "test_zoo_fused_matches_reference[0]" \
  -- 'opfuse.codegen.norm.x_lower_*' 'opfuse.codegen.norm.x__row_*' 'opfuse.codegen.norm.x__element__*'
