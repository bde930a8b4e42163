# The extension is built in place (scripts/test: examples/torch/setup.py build_ext --inplace,
# or `pip install examples/torch`); the example module sits beside the package.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "torch"))
