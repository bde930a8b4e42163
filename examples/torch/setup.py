"""Builds pagestash_torch: torch.ops.pagestash (stash, reload, discard, reset, report) over
the header-only pagestash library.

    pip install --no-build-isolation examples/torch        # or, in place:
    cd examples/torch && python setup.py build_ext --inplace

Environment:
    PAGESTASH_INCLUDE_DIR  the installed headers (`cmake --install` puts them in
                           <prefix>/include); default: this repository's include/.
    PAGESTASH_TORCH_CUDA   1: build the CUDA executor with nvcc (CUDA tensors), 0: only the
                           host executor (CPU tensors); default: 1 when nvcc is found.
    TORCH_CUDA_ARCH_LIST   the GPUs to compile for; default "9.0" (H100/H200).
"""

import os
from pathlib import Path

from setuptools import setup
from torch.utils import cpp_extension

here = Path(__file__).resolve().parent
include = Path(os.environ.get("PAGESTASH_INCLUDE_DIR", here.parent.parent / "include")).resolve()
if not (include / "pagestash" / "pagestash.hpp").exists():
    raise SystemExit(f"pagestash headers not found in {include}: set PAGESTASH_INCLUDE_DIR")

cuda_home = cpp_extension.CUDA_HOME
nvcc = cuda_home is not None and (Path(cuda_home) / "bin" / "nvcc").exists()
with_cuda = os.environ.get("PAGESTASH_TORCH_CUDA", "1" if nvcc else "0") == "1"
if with_cuda and not nvcc:
    raise SystemExit("PAGESTASH_TORCH_CUDA=1 but nvcc was not found (set CUDA_HOME)")
if cuda_home is None:
    raise SystemExit("pagestash needs the CUDA toolkit's headers and libcudart even for CPU tensors (set CUDA_HOME)")
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")

cuda_include = Path(cuda_home) / "include"
cuda_lib = Path(cuda_home) / "lib64"
include_dirs = [str(here / "csrc"), str(include), str(cuda_include), str(cuda_include / "cccl")]
cxx = ["-O2"]  # PyTorch's own -std (C++20 for torch >= 2.10); pagestash needs C++17 or later
sources = ["csrc/ops.cpp"]
kwargs = dict(
    include_dirs=include_dirs,
    library_dirs=[str(cuda_lib)],
    libraries=["cudart"],
    extra_link_args=[f"-Wl,-rpath,{cuda_lib}"],
)
if with_cuda:
    sources.append("csrc/ops_cuda.cu")
    extension = cpp_extension.CUDAExtension(
        "pagestash_torch._C",
        sources,
        define_macros=[("PAGESTASH_TORCH_CUDA", "1")],
        extra_compile_args={"cxx": cxx, "nvcc": ["-O2"]},
        **kwargs,
    )
else:
    extension = cpp_extension.CppExtension(
        "pagestash_torch._C", sources, extra_compile_args={"cxx": cxx}, **kwargs
    )

setup(
    name="pagestash_torch",
    version="0.1.0",
    description="PyTorch ops and a saved-tensor hook for pagestash (paged stashing of MoE activations)",
    packages=["pagestash_torch"],
    ext_modules=[extension],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    python_requires=">=3.9",
    install_requires=["torch>=2.4"],
)
