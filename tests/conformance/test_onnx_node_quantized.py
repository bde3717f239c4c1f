"""ONNX backend node tests of the quantized ops the importer rewrites (no OpSpec of their own, so
``selected_tests`` does not pick them): QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger."""
import pytest

from node_suite import all_node_tests, run_case

QUANTIZED_OPS = ("qlinearconv", "qlinearmatmul", "convinteger", "matmulinteger")


def quantized_tests() -> list[str]:
    return sorted(n for n in all_node_tests() if any(n.startswith(f"test_{op}") for op in QUANTIZED_OPS))


def test_every_quantized_op_has_tests():
    names = quantized_tests()
    assert all(any(n.startswith(f"test_{op}") for n in names) for op in QUANTIZED_OPS)


@pytest.mark.parametrize("name", quantized_tests())
def test_quantized_node(name):
    assert run_case(name) == []
