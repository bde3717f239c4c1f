#!/bin/sh
cd /work/mutrun/mutM
export PYTHONPATH=$PWD/src
exec /work/main/.venv/bin/python tools/mutate_quick.py --jobs 2 --cpu-limit 300 --build-cache /work/mutcache/mutM \
  --tests tests/codegen/test_mut_microkernel.py --tests tests/codegen/test_neon.py \
  --select test_mut_microkernel.py --tests tests/codegen/test_transposed_store.py --tests tests/codegen/test_avx512.py --select test_neon_micro_kernels_give --select test_a_block_past \
  --select test_float_zoo_model_under_qemu --select test_micro_kernel_neon_body_comes_first \
  --select test_register_block_fits --select test_the_neon_c_compiled_for_x86 \
  -- $(cat logs/mk-neon.txt)
