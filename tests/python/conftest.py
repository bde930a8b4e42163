# The tests import the installed package (`pip install --no-build-isolation .` from the
# repository's root) and the example's module, which sits beside no package.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "torch"))
