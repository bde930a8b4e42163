"""Builds the Python package `pagestash`: torch.ops.pagestash (stash, reload, discard, reset,
report), PagePool, Record and the saved-tensor hook, over the header-only library in
include/. From the repository's root, with torch installed:

    pip install --no-build-isolation .

The host executor (CPU tensors) is compiled with the C++ compiler alone: no nvcc. It needs
CUDA's runtime headers and libcudart and CCCL's headers, taken from CUDA_HOME when set,
else from the PyPI packages a CUDA build of torch brings (nvidia-cuda-runtime,
nvidia-cuda-cccl), else from the CUDA toolkit torch finds. The CUDA executor (CUDA tensors)
is compiled too when nvcc and a CUDA build of torch are present.

Environment:
    PAGESTASH_CUDA        1: build the CUDA executor (fails without nvcc), 0: host executor
                          only; default: 1 when nvcc is on PATH (or in $CUDA_HOME/bin) and
                          torch is a CUDA build.
    TORCH_CUDA_ARCH_LIST  the GPUs to compile the kernels for; default "9.0" (H100/H200).
    MAX_JOBS              parallel compile jobs.
Build files go to build-python/ (setup.cfg), apart from the C++ build folders.
"""

import glob
import os
import re
import shutil
import sys
from pathlib import Path

from setuptools import setup

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:
    sys.exit("pagestash: install torch first, then `pip install --no-build-isolation .` (the extension builds against it)")

root = Path(__file__).resolve().parent
include = root / "include"


def version():
    text = (include / "pagestash" / "version.hpp").read_text()
    return ".".join(re.search(rf"PAGESTASH_VERSION_{part} (\d+)", text).group(1) for part in ("MAJOR", "MINOR", "PATCH"))


def find_nvcc():
    """nvcc on PATH, or in an explicitly given CUDA_HOME / CUDA_PATH."""
    on_path = shutil.which("nvcc")
    if on_path:
        return Path(on_path).resolve()
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").exists():
            return Path(home) / "bin" / "nvcc"
    return None


def pypi_cuda():
    """(include dirs, library dir) of the CUDA runtime and CCCL from PyPI's nvidia-* packages."""
    try:
        import nvidia
    except ImportError:
        return None
    for base in map(Path, nvidia.__path__):
        for runtime in [base / "cu13", base / "cuda_runtime"]:  # CUDA 13 layout, CUDA 12 layout
            if not (runtime / "include" / "cuda_runtime_api.h").exists():
                continue
            cccl = [p for p in [runtime / "include" / "cccl", base / "cuda_cccl" / "include"]
                    if (p / "cuda" / "std" / "atomic").exists()]
            if cccl:
                return [runtime / "include", cccl[0]], runtime / "lib"
    return None


def cuda_paths(with_cuda):
    """Where CUDA's runtime headers, CCCL and libcudart are: (include dirs, library dir)."""
    homes = [os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")]
    if not with_cuda:
        found = None if homes[0] else pypi_cuda()
        if found:
            return found
    homes.append(cpp_extension.CUDA_HOME)
    for home in filter(None, homes):
        home = Path(home)
        if (home / "include" / "cuda_runtime_api.h").exists():
            lib = next((home / d for d in ("lib64", "lib") if glob.glob(str(home / d / "libcudart.so*"))), home / "lib64")
            return [home / "include", home / "include" / "cccl"], lib
    sys.exit("pagestash: CUDA's runtime headers and CCCL are needed even for CPU tensors: set CUDA_HOME, or "
             "`pip install nvidia-cuda-runtime nvidia-cuda-cccl`")


nvcc = find_nvcc()
choice = os.environ.get("PAGESTASH_CUDA", "auto")
if choice not in ("0", "1", "auto"):
    sys.exit(f"pagestash: PAGESTASH_CUDA={choice!r}: use 1, 0, or leave it unset")
with_cuda = choice == "1" or (choice == "auto" and nvcc is not None and torch.version.cuda is not None)
if with_cuda and nvcc is None:
    sys.exit("pagestash: PAGESTASH_CUDA=1 but nvcc is neither on PATH nor in $CUDA_HOME/bin")
if with_cuda:
    os.environ.setdefault("CUDA_HOME", str(nvcc.parent.parent))
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")

cuda_includes, cuda_lib = cuda_paths(with_cuda)
csrc = root / "python" / "csrc"
# Relative sources: setuptools wants them so; the absolute paths are for the compiler.
sources = ["python/csrc/ops.cpp"] + (["python/csrc/ops_cuda.cu"] if with_cuda else [])
libcudart = sorted(glob.glob(str(cuda_lib / "libcudart.so*")))
link = dict(library_dirs=[str(cuda_lib)], extra_link_args=[f"-Wl,-rpath,{cuda_lib}"])
if libcudart and not (cuda_lib / "libcudart.so").exists():  # PyPI ships only libcudart.so.<major>
    link["extra_link_args"].append(f"-l:{Path(libcudart[0]).name}")
else:
    link["libraries"] = ["cudart"]
common = dict(include_dirs=[str(csrc), str(include), *map(str, cuda_includes)], **link)
# PyTorch's own -std (C++20 for torch >= 2.10); pagestash needs C++17 or later.
if with_cuda:
    extension = cpp_extension.CUDAExtension(
        "pagestash._C", sources, define_macros=[("PAGESTASH_TORCH_CUDA", "1")],
        extra_compile_args={"cxx": ["-O2"], "nvcc": ["-O2"]}, **common)
else:
    extension = cpp_extension.CppExtension("pagestash._C", sources, extra_compile_args={"cxx": ["-O2"]}, **common)
print(f"pagestash: building the host executor{' and the CUDA executor' if with_cuda else ' only (no nvcc)'}; "
      f"CUDA headers from {cuda_includes[0]}", file=sys.stderr)

setup(
    name="pagestash",
    version=version(),
    description="Paged stashing of grouped MoE activations for PyTorch: torch.ops.pagestash and a saved-tensor hook",
    long_description=(root / "docs" / "python.md").read_text(),
    long_description_content_type="text/markdown",
    packages=["pagestash"],
    package_dir={"": "python"},
    package_data={"pagestash": ["py.typed", "*.pyi"]},
    ext_modules=[extension],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    python_requires=">=3.9",
    install_requires=["torch>=2.4"],
)
