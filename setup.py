"""Builds the Python package `pagestash`: torch.ops.pagestash (stash, reload, discard, reset,
report), PagePool, Record and the saved-tensor hook, over the header-only library in
include/. From the repository's root, with torch installed:

    pip install --no-build-isolation .

The build needs setuptools >= 77.0.3 (pyproject.toml); a fresh venv's is older:
`pip install "setuptools>=77.0.3"` first.

The host executor (CPU tensors) is compiled with the C++ compiler alone: no nvcc. It needs
CUDA's runtime headers (with crt/) and libcudart and CCCL's headers, taken from CUDA_HOME
when set, else from PyPI's nvidia-cuda-runtime, nvidia-cuda-crt and nvidia-cuda-cccl (a CUDA
build of torch brings the runtime and, through nvshmem, CCCL; `pip install "cuda-toolkit[crt]"`
adds crt/ at the CUDA version torch pinned), else from the CUDA toolkit torch finds. The CUDA
executor (CUDA tensors) is compiled too when nvcc and a CUDA build of torch are present.

Environment:
    PAGESTASH_CUDA        1: build the CUDA executor (fails without nvcc), 0: host executor
                          only; default: 1 when nvcc is on PATH (or in $CUDA_HOME/bin) and
                          torch is a CUDA build.
    TORCH_CUDA_ARCH_LIST  the GPUs to compile the kernels for; default "9.0;10.0+PTX" (H100/H200,
                          B200/GB200, and PTX that later GPUs compile when they load it;
                          "9.0+PTX" with nvcc before 12.8, which has no sm_100).
    MAX_JOBS              parallel compile jobs.
Build files go to build-python/ (setup.cfg), apart from the C++ build folders.
"""

import glob
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import setuptools
from setuptools import setup

# torch's extension builder needs setuptools >= 77.0.3; older ones also lack bdist_wheel.
if tuple(int(n) for n in re.findall(r"\d+", setuptools.__version__)[:3]) < (77, 0, 3):
    sys.exit(f"pagestash: the build needs setuptools >= 77.0.3, this Python has {setuptools.__version__}: "
             "`pip install 'setuptools>=77.0.3'`, then `pip install --no-build-isolation .` again")

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:
    sys.exit("pagestash: install torch first, then `pip install --no-build-isolation .` (the extension builds against it)")

root = Path(__file__).resolve().parent
include = root / "include"
(root / "build-python").mkdir(exist_ok=True)  # setup.cfg's egg_base: setuptools wants it to exist


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


# What the runtime's headers need besides, by PyPI package: crt/ (cuda_runtime_api.h includes
# it) and CCCL, each with its extra of cuda-toolkit (the package by which torch pins CUDA).
PYPI_PARTS = {"nvidia-cuda-crt": ("crt/", "crt"), "nvidia-cuda-cccl": ("CCCL", "cccl")}


def pypi_cuda():
    """(include dirs, library dir, missing packages) of the CUDA runtime, its crt/ headers and
    CCCL from PyPI's nvidia-* packages, in any of the `nvidia` folders on sys.path (a venv's
    and the system's); None without nvidia-cuda-runtime."""
    try:
        import nvidia
    except ImportError:
        return None
    bases = list(map(Path, nvidia.__path__))
    includes = [base / layout / "include" for base in bases for layout in ("cu13", "cuda_runtime")]  # CUDA 13, 12

    def first(dirs, header):
        return next((d for d in dirs if (d / header).exists()), None)

    runtime = first(includes, "cuda_runtime_api.h")
    if runtime is None:
        return None
    crt = first(includes, "crt/host_defines.h")
    cccl = first([*(d / "cccl" for d in includes), *(base / "cuda_cccl" / "include" for base in bases)],
                 "cuda/std/atomic")
    missing = [name for name, found in zip(PYPI_PARTS, (crt, cccl)) if found is None]
    return list(dict.fromkeys(filter(None, [runtime, crt, cccl]))), runtime.parent / "lib", missing


def installed(distribution):
    """The installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def toolkit(home):
    """(include dirs, library dir) of a CUDA toolkit, or None where it has no runtime headers."""
    home = Path(home)
    if not (home / "include" / "cuda_runtime_api.h").exists():
        return None
    lib = next((home / d for d in ("lib64", "lib") if glob.glob(str(home / d / "libcudart.so*"))), home / "lib64")
    return [home / "include", home / "include" / "cccl"], lib


def cuda_paths(with_cuda):
    """Where CUDA's runtime headers, CCCL and libcudart are: (include dirs, library dir)."""
    pypi = pypi_cuda()
    use_pypi = pypi and not pypi[2] and not with_cuda
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home:
            found = toolkit(home)
            if found:
                return found
            also = " (or unset it: PyPI's packages have every part)" if use_pypi else ""
            what = "has no include/cuda_runtime_api.h" if Path(home).exists() else "does not exist"
            sys.exit(f"pagestash: {var}={home} {what}: point {var} at a CUDA toolkit{also}")
    if use_pypi:
        return pypi[:2]
    found = cpp_extension.CUDA_HOME and toolkit(cpp_extension.CUDA_HOME)
    if found:
        return found
    if pypi:  # a CUDA build of torch brought the runtime: the rest at the CUDA version it pinned
        if installed("cuda-toolkit"):
            command = f"pip install 'cuda-toolkit[{','.join(PYPI_PARTS[name][1] for name in pypi[2])}]'"
        else:  # the runtime's own version (CUDA 12's package has another name: unpinned)
            pin = f"=={installed('nvidia-cuda-runtime')}" if installed("nvidia-cuda-runtime") else ""
            command = "pip install " + " ".join(f"'{name}{pin}'" for name in pypi[2])
        lack = " and ".join(f"{PYPI_PARTS[name][0]} ({name})" for name in pypi[2])
        sys.exit(f"pagestash: CUDA's runtime headers in {pypi[0][0]} lack {lack}, and no CUDA toolkit was found: "
                 f"`{command}`")
    sys.exit("pagestash: CUDA's runtime headers and CCCL are needed even for CPU tensors: set CUDA_HOME to a CUDA "
             "toolkit, or `pip install nvidia-cuda-runtime nvidia-cuda-crt nvidia-cuda-cccl`")


nvcc = find_nvcc()
choice = os.environ.get("PAGESTASH_CUDA", "auto")
if choice not in ("0", "1", "auto"):
    sys.exit(f"pagestash: PAGESTASH_CUDA={choice!r}: use 1, 0, or leave it unset")
with_cuda = choice == "1" or (choice == "auto" and nvcc is not None and torch.version.cuda is not None)
if with_cuda and nvcc is None:
    sys.exit("pagestash: PAGESTASH_CUDA=1 but nvcc is neither on PATH nor in $CUDA_HOME/bin")
if with_cuda:
    os.environ.setdefault("CUDA_HOME", str(nvcc.parent.parent))
    # sm_100 needs CUDA 12.8 or later: an older nvcc builds sm_90 and its PTX.
    release = re.search(r"release (\d+)\.(\d+)", subprocess.run([str(nvcc), "--version"], capture_output=True,
                                                              text=True).stdout)
    blackwell = release is not None and (int(release[1]), int(release[2])) >= (12, 8)
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0;10.0+PTX" if blackwell else "9.0+PTX")

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
# PyTorch's own -std (C++20 for torch >= 2.10); pagestash needs C++17 or later. -g0 overrides
# Python's -g: debug info for every recipe's instantiations nearly doubles the compile.
cxx = ["-O2", "-g0"]
if with_cuda:
    extension = cpp_extension.CUDAExtension(
        "pagestash._C", sources, define_macros=[("PAGESTASH_TORCH_CUDA", "1")],
        extra_compile_args={"cxx": cxx, "nvcc": ["-O2"]}, **common)
else:
    extension = cpp_extension.CppExtension("pagestash._C", sources, extra_compile_args={"cxx": cxx}, **common)
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
