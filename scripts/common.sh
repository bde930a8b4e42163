# Sourced by the scripts: toolchain on PATH, ccache when present, cores to use.
export PATH="$PATH:/usr/local/cuda/bin"
jobs=$(nproc)
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
