#!/bin/sh
cd /work/mutrun/mutM
export PYTHONPATH=$PWD/src
exec /work/main/.venv/bin/python tools/mutate_quick.py --jobs 2 --cpu-limit 300 --timeout 300 --build-cache /work/mutcache/mutM \
  --tests tests/codegen/test_mut_microkernel.py --tests tests/codegen/test_mut_pointwise.py \
  --select test_a_transposed_and_a_row --select test_an_inline_concat \
  -- opfuse.codegen.microkernel.x_microkernel__mutmut_130 opfuse.codegen.pointwise.x_lower_pointwise__mutmut_190 \
     opfuse.codegen.pointwise.x_lower_pointwise__mutmut_193 opfuse.codegen.pointwise.x_lower_pointwise__mutmut_201 \
     opfuse.codegen.pointwise.x_lower_pointwise__mutmut_208 opfuse.codegen.pointwise.x_broadcast_masks__mutmut_35 \
     opfuse.codegen.pointwise.x_broadcast_masks__mutmut_63
