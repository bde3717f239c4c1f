#!/bin/sh
cd /work/mutrun/mutM
export PYTHONPATH=$PWD/src
exec /work/main/.venv/bin/python tools/mutate_quick.py --jobs 2 --cpu-limit 300 --build-cache /work/mutcache/mutM \
  --sample 0.10 --sample-seed s13 \
  --tests tests/codegen/test_avx512.py --tests tests/codegen/test_transposed_store.py \
  --tests tests/codegen/test_transpose_helper.py --tests tests/codegen/test_gemm_paths.py \
  --tests tests/codegen/test_mcu_program.py --tests tests/codegen/test_neon.py \
  --deselect test_neon.py::test_int8_conv_with --deselect test_neon.py::test_int8_conv_without \
  --deselect test_neon.py::test_int8_requant --deselect test_neon.py::test_the_executable_runs \
  --deselect test_neon.py::test_neon_micro_kernels_give --deselect test_neon.py::test_a_block_past \
  --deselect test_neon.py::test_float_zoo --deselect test_neon.py::test_int8_zoo --deselect test_neon.py::test_int8_ds_cnn \
  --deselect test_neon.py::test_the_harness --deselect test_neon.py::test_cli_run_backend \
  -- 'opfuse.codegen.microkernel.*'
