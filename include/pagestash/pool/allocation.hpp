#pragma once
// The memory a pool or a record uses: one RAII allocation in host memory (for the host executor), device memory, or
// pinned host memory mapped into the device's address space; or memory the caller owns (borrowed: never freed here),
// for frameworks that account GPU memory through their own allocator. Allocations happen when a pool or record is made,
// never inside stash or reload.

#include <pagestash/detail/errors.hpp>
#include <pagestash/cuda/error.hpp>
#include <pagestash/pool/memory_space.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#if defined(__linux__)
#  include <sys/mman.h>
#endif

PAGESTASH_NAMESPACE_BEGIN

/// Alignment of every allocation the library makes.
inline constexpr std::size_t memory_alignment = 256;
/// Alignment caller-owned memory handed to a pool or record must have: the copies' 16-byte vectors. Less than a
/// framework's allocator gives, and kept by a copy of the memory that preserves its address modulo 16 or more (as
/// PyTorch's test utilities do).
inline constexpr std::size_t borrowed_alignment = 16;

/// Host allocations of at least this many bytes start on a 2 MiB boundary and are advised for transparent huge pages
/// (Linux, MADV_HUGEPAGE; where they are off, the advice is ignored), as device memory is mapped in 2 MiB pages: a
/// stash's pages, and the live lines it reads, are spread over megabytes, and with 4 KiB pages every few of them costs
/// a TLB miss (docs/benchmarks.md).
inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

inline std::size_t host_alignment(std::size_t bytes) {
  return bytes >= huge_page_bytes ? huge_page_bytes : memory_alignment;
}

/// `bytes` of host memory, aligned to host_alignment(bytes); free with free_host.
inline void* allocate_host(std::size_t bytes) {
  void* p = ::operator new (bytes, std::align_val_t{host_alignment(bytes)});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= huge_page_bytes) madvise(p, bytes, MADV_HUGEPAGE);
#endif
  return p;
}

inline void free_host(void* p, std::size_t bytes) noexcept {
  ::operator delete (p, std::align_val_t{host_alignment(bytes)});
}

namespace detail {

enum class MemoryKind : int { host, device, mapped_host };

class Allocation {
 public:
  Allocation() = default;
  Allocation(MemoryKind kind, std::size_t bytes) : kind_(kind), bytes_(bytes) {
    if (bytes == 0) return;
    switch (kind) {
      case MemoryKind::host: ptr_ = allocate_host(bytes); break;
      case MemoryKind::device: PAGESTASH_CUDA_TRY(cudaMalloc(&ptr_, bytes)); break;
      case MemoryKind::mapped_host: PAGESTASH_CUDA_TRY(cudaHostAlloc(&ptr_, bytes, cudaHostAllocMapped)); break;
    }
  }
  /// Caller-owned memory of `bytes` bytes at `ptr` (never freed here). Throws std::invalid_argument naming `what` when
  /// it is null or not aligned to borrowed_alignment.
  static Allocation borrow(MemoryKind kind, void* ptr, std::size_t bytes, const char* what) {
    if (bytes != 0 && ptr == nullptr) detail::throw_invalid("borrowed memory", std::string(what) + " is null");
    if (reinterpret_cast<std::uintptr_t>(ptr) % borrowed_alignment != 0)
      detail::throw_invalid("borrowed memory",
                            std::string(what) + " is not aligned to " + std::to_string(borrowed_alignment) + " bytes");
    Allocation a;
    a.kind_ = kind;
    a.bytes_ = bytes;
    a.ptr_ = bytes != 0 ? ptr : nullptr;
    a.owned_ = false;
    return a;
  }
  ~Allocation() { release(); }
  Allocation(Allocation&& o) noexcept { *this = std::move(o); }
  Allocation& operator=(Allocation&& o) noexcept {
    if (this != &o) {
      release();
      kind_ = o.kind_;
      bytes_ = o.bytes_;
      owned_ = o.owned_;
      ptr_ = std::exchange(o.ptr_, nullptr);
    }
    return *this;
  }
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  /// The address kernels use (the device alias of mapped host memory).
  void* device_view() const {
    if (kind_ != MemoryKind::mapped_host || ptr_ == nullptr) return ptr_;
    void* d = nullptr;
    PAGESTASH_CUDA_TRY(cudaHostGetDevicePointer(&d, ptr_, 0));
    return d;
  }

 private:
  void release() noexcept {
    if (ptr_ == nullptr || !owned_) return;
    switch (kind_) {
      case MemoryKind::host: free_host(ptr_, bytes_); break;
      case MemoryKind::device: cudaFree(ptr_); break;
      case MemoryKind::mapped_host: cudaFreeHost(ptr_); break;
    }
    ptr_ = nullptr;
  }

  MemoryKind kind_ = MemoryKind::host;
  std::size_t bytes_ = 0;
  void* ptr_ = nullptr;
  bool owned_ = true;
};

/// Copies between a space's memory and the host: plain memcpy, or cudaMemcpy. A copy to the device then synchronises
/// the device: cudaMemcpy from pageable memory may return before the bytes land, and a kernel launched next on a
/// non-blocking CUDA stream must see them.
inline void copy_bytes(MemorySpace space, void* dst, const void* src, std::size_t bytes, bool to_host) {
  if (space == MemorySpace::host) {
    if (bytes != 0) std::memcpy(dst, src, bytes);
    return;
  }
  PAGESTASH_CUDA_TRY(cudaMemcpy(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice));
  if (!to_host) PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
}

}  // namespace detail
PAGESTASH_NAMESPACE_END
