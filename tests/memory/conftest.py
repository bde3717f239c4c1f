import sys
from pathlib import Path

# Hand-built fusion plans live with the code generation tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
