#!/bin/sh
cd /work/mutrun/mutM
export PYTHONPATH=$PWD/src
M=opfuse.codegen.microkernel
/work/main/.venv/bin/python tools/mutate_quick.py --jobs 2 --cpu-limit 300 --timeout 300 --build-cache /work/mutcache/mutM \
  --tests tests/codegen/test_mut_microkernel.py --select test_scalar_accumulators -- $M.x__plain_scalars__mutmut_7
# the two NEON mutants the new tests killed first: against test_neon's own qemu tests alone
/work/main/.venv/bin/python tools/mutate_quick.py --jobs 2 --cpu-limit 300 --build-cache /work/mutcache/mutM \
  --tests tests/codegen/test_neon.py --select test_neon_micro_kernels_give --select test_a_block_past \
  --select test_float_zoo_model_under_qemu -- $M.x__neon__mutmut_32 $M.x__neon_body__mutmut_99
