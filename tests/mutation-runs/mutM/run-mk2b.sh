#!/bin/sh
cd /work/mutrun/mutM
export PYTHONPATH=$PWD/src
M=opfuse.codegen.microkernel
exec /work/main/.venv/bin/python tools/mutate_quick.py --jobs 2 --cpu-limit 300 --build-cache /work/mutcache/mutM \
  --tests tests/codegen/test_vector_epilogue.py --tests tests/codegen/test_column_bias_epilogue.py \
  --tests tests/codegen/test_conv_direct.py \
  --select test_wide_block_same_bits --select test_register_epilogue_activations --select test_matmul_bias_gelu \
  --select test_column_bias_in_registers --select test_register_activation_plain_c_body \
  -- $M.x__vector_body__mutmut_20 $M.x__vector_body__mutmut_269 $M.x__vector_body__mutmut_276 \
     $M.x_valid_epilogue__mutmut_9 $M.x_valid_epilogue__mutmut_3 $M.x_microkernel__mutmut_75 $M.x_microkernel__mutmut_46
