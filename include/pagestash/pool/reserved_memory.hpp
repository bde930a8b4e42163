#pragma once
// Memory reserved as address space and backed in part: a growable pool's arena (PoolConfig's reserve). Addresses are
// the reserve's, so a pointer taken before a grow, and a kernel parameter a CUDA graph captured, stay valid.
//   host    an anonymous mapping without access, backed in 2 MiB chunks (read-write, advised for huge pages, and
//           faulted in at once, so that a lack of memory shows when grow() runs, not in a stash); given back with
//           MADV_DONTNEED and no access again.
//   mapped  the same, each chunk registered for a device (cudaHostRegister, mapped) once backed and unregistered
//   host    before it is given back: a device pool's spill. The device reads it at the host's addresses, which
//           cudaDevAttrCanUseHostPointerForRegisteredMem promises (checked, and each chunk's alias compared).
//   device  CUDA's virtual memory management: a reserved range, physical allocations of the device's granularity
//           (2 MiB on current GPUs) created, mapped and made readable and writable by the device; given back by
//           unmapping and releasing them. The driver's functions come through the runtime (no link to libcuda).

#include <pagestash/cuda/error.hpp>
#include <pagestash/detail/errors.hpp>
#include <pagestash/pool/allocation.hpp>
#include <pagestash/pool/memory_space.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#  include <sys/mman.h>
#  include <unistd.h>
#endif

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

/// The driver's virtual memory functions, found once through the runtime.
struct DriverMemoryApi {
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuDeviceGet) device = nullptr;
  decltype(&cuDeviceGetAttribute) attribute = nullptr;

  static const DriverMemoryApi& get() {
    static const DriverMemoryApi api = [] {
      DriverMemoryApi a;
      const auto find = [](const char* name, auto& fn) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult found{};
        PAGESTASH_CUDA_TRY(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || p == nullptr)
          throw_invalid("pagestash::PagePool", std::string("the CUDA driver has no ") + name);
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
      };
      find("cuMemAddressReserve", a.reserve);
      find("cuMemAddressFree", a.free);
      find("cuMemCreate", a.create);
      find("cuMemRelease", a.release);
      find("cuMemMap", a.map);
      find("cuMemUnmap", a.unmap);
      find("cuMemSetAccess", a.set_access);
      find("cuMemGetAllocationGranularity", a.granularity);
      find("cuDeviceGet", a.device);
      find("cuDeviceGetAttribute", a.attribute);
      return a;
    }();
    return api;
  }
};

/// Throws std::runtime_error for a failed driver call, with its CUresult.
inline void driver_check(CUresult r, const char* call) {
  if (r != CUDA_SUCCESS)
    throw std::runtime_error(std::string("pagestash: ") + call + " failed (CUresult " + std::to_string(int(r)) + ")");
}

class ReservedMemory {
 public:
  ReservedMemory() = default;
  /// `reserve` bytes of address space of `kind` (device: on `device`, which must support virtual memory management;
  /// mapped_host: host memory the pages of which `device` reads at their host addresses).
  ReservedMemory(MemoryKind kind, std::size_t reserve, int device) : kind_(kind), device_(device) {
    if (reserve == 0) return;  // nothing reserved: get() is null
    if (kind == MemoryKind::device) {
      const DriverMemoryApi& api = DriverMemoryApi::get();
      CUdevice dev{};
      int supported = 0;
      driver_check(api.device(&dev, device), "cuDeviceGet");
      driver_check(api.attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
                   "cuDeviceGetAttribute");
      if (!supported)
        throw_invalid("PoolConfig", "a reserve needs virtual memory management, which device " +
                                        std::to_string(device) +
                                        " lacks (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 0)");
      driver_check(DriverMemoryApi::get().granularity(&granularity_, &prop(), CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                   "cuMemGetAllocationGranularity");
      std::size_t free_bytes = 0, total = 0;
      PAGESTASH_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total));  // the pool's device is the current one
      refuse_beyond(reserve, total, "device " + std::to_string(device) + "'s memory");
      reserve_ = round(reserve);
      CUdeviceptr p = 0;
      driver_check(DriverMemoryApi::get().reserve(&p, reserve_, 0, 0, 0), "cuMemAddressReserve (the reserve)");
      base_ = reinterpret_cast<unsigned char*>(p);
      return;
    }
    if (kind == MemoryKind::mapped_host) {
      int same_address = 0;
      PAGESTASH_CUDA_TRY(cudaDeviceGetAttribute(&same_address, cudaDevAttrCanUseHostPointerForRegisteredMem, device));
      if (!same_address)
        throw_invalid("PoolConfig", "host_reserve: device " + std::to_string(device) +
                                        " cannot read registered host memory at its host address "
                                        "(cudaDevAttrCanUseHostPointerForRegisteredMem = 0), which a spill that "
                                        "grows needs; give the pool fixed host_pages instead");
    }
#if defined(__linux__)
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) refuse_beyond(reserve, std::size_t(pages) * std::size_t(page), "the host's memory");
#endif
    reserve_ = round(reserve);
#if defined(__linux__)
    void* p = mmap(nullptr, reserve_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      throw_invalid("PoolConfig", "no address space for a reserve of " + std::to_string(reserve_) + " bytes");
    base_ = static_cast<unsigned char*>(p);
#else
    base_ = static_cast<unsigned char*>(::operator new (reserve_, std::align_val_t{granularity_}));  // backed at once
#endif
    if (kind == MemoryKind::mapped_host) {  // its first chunk always: where a pool attached over it finds the alias
      try {
        back(granularity_);
      } catch (...) {
        ReservedMemory unmapped(std::move(*this));
        throw;
      }
    }
  }
  ReservedMemory(ReservedMemory&& o) noexcept { *this = std::move(o); }
  ReservedMemory& operator=(ReservedMemory&& o) noexcept {
    std::swap(kind_, o.kind_), std::swap(device_, o.device_), std::swap(base_, o.base_);
    std::swap(reserve_, o.reserve_), std::swap(backed_, o.backed_), std::swap(granularity_, o.granularity_);
    std::swap(handles_, o.handles_);
    return *this;
  }
  ReservedMemory(const ReservedMemory&) = delete;
  ReservedMemory& operator=(const ReservedMemory&) = delete;
  ~ReservedMemory() {
    if (base_ == nullptr) return;
    if (kind_ != MemoryKind::host) release(0);
    if (kind_ == MemoryKind::device) {
      DriverMemoryApi::get().free(reinterpret_cast<CUdeviceptr>(base_), reserve_);
      return;
    }
#if defined(__linux__)
    munmap(base_, reserve_);
#else
    ::operator delete (base_, std::align_val_t{granularity_});
#endif
  }

  unsigned char* get() const { return base_; }
  std::size_t granularity() const { return granularity_; }
  std::size_t backed() const { return backed_; }
  std::size_t reserved() const { return reserve_; }

  /// Backs the first `bytes` (rounded up to the granularity). Out of memory: what was backed stays, and it throws.
  void back(std::size_t bytes) {
    const std::size_t want = round(bytes);
    if (want > reserve_) throw_invalid("pagestash::grow", "beyond the reserve");
    if (want <= backed_) return;
    if (kind_ == MemoryKind::device) {
      const DriverMemoryApi& api = DriverMemoryApi::get();
      CUmemAccessDesc access{};
      access.location = prop().location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      for (std::size_t at = backed_; at < want; at += granularity_) {
        CUmemGenericAllocationHandle h = 0;
        const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(base_ + at);
        CUresult r = api.create(&h, granularity_, &prop(), 0);
        if (r == CUDA_SUCCESS && (r = api.map(p, granularity_, 0, h, 0)) != CUDA_SUCCESS) api.release(h);
        if (r == CUDA_SUCCESS && (r = api.set_access(p, granularity_, &access, 1)) != CUDA_SUCCESS) {
          api.unmap(p, granularity_);
          api.release(h);
        }
        if (r != CUDA_SUCCESS) {
          while (handles_.size() > backed_ / granularity_) unmap_last();  // the pool stays as it was
          driver_check(r, "grow: cuMemCreate / cuMemMap / cuMemSetAccess (out of device memory?)");
        }
        handles_.push_back(h);
      }
      backed_ = want;
      return;
    }
#if defined(__linux__)
    unsigned char* first = base_ + backed_;
    const std::size_t n = want - backed_;
    bool ok = mprotect(first, n, PROT_READ | PROT_WRITE) == 0;
#  if defined(MADV_HUGEPAGE)
    if (ok) madvise(first, n, MADV_HUGEPAGE);
#  endif
#  if defined(MADV_POPULATE_WRITE)
    if (ok && madvise(first, n, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) ok = false;  // EINVAL: an older kernel
#  endif
    if (!ok) {
      mprotect(first, n, PROT_NONE);
      throw std::runtime_error("pagestash: grow: out of host memory backing " + std::to_string(n) + " bytes");
    }
#endif
    if (kind_ == MemoryKind::mapped_host) {
      for (std::size_t at = backed_; at < want; at += granularity_) {
        const cudaError_t r = register_chunk(base_ + at);
        if (r != cudaSuccess) {  // the pool stays as it was
          while (at > backed_) at -= granularity_, cudaHostUnregister(base_ + at);
#if defined(__linux__)
          madvise(first, n, MADV_DONTNEED);
          mprotect(first, n, PROT_NONE);
#endif
          throw std::runtime_error(std::string("pagestash: grow: registering the spill's host memory for device ") +
                                   std::to_string(device_) + " failed: " + cudaGetErrorString(r));
        }
      }
    }
    backed_ = want;
  }

  /// Gives back what lies past the first `bytes` (rounded up to the granularity; mapped host memory keeps a chunk).
  void give_back(std::size_t bytes) {
    release(kind_ == MemoryKind::mapped_host && bytes < granularity_ ? granularity_ : round(bytes));
  }

 private:
  void release(std::size_t keep) {
    if (keep >= backed_) return;
    if (kind_ == MemoryKind::mapped_host)
      for (std::size_t at = keep; at < backed_; at += granularity_) cudaHostUnregister(base_ + at);
    if (kind_ == MemoryKind::device) {
      while (handles_.size() > keep / granularity_) unmap_last();
      backed_ = keep;
      return;
    }
#if defined(__linux__)
    madvise(base_ + keep, backed_ - keep, MADV_DONTNEED);
    mprotect(base_ + keep, backed_ - keep, PROT_NONE);
#endif
    backed_ = keep;
  }

  /// A reserve no grow could back is a mistake (a unit's, most likely): refused.
  static void refuse_beyond(std::size_t reserve, std::size_t memory, const std::string& what) {
    if (reserve > memory)
      throw_invalid("PoolConfig", "a reserve of " + std::to_string(reserve) + " bytes is more than " + what + " (" +
                                      std::to_string(memory) + " bytes)");
  }
  /// Registers one chunk, mapped, and checks that the device reads it at its host address.
  cudaError_t register_chunk(unsigned char* chunk) const {
    cudaError_t r = cudaHostRegister(chunk, granularity_, cudaHostRegisterMapped | cudaHostRegisterPortable);
    void* alias = nullptr;
    if (r == cudaSuccess && (r = cudaHostGetDevicePointer(&alias, chunk, 0)) == cudaSuccess && alias != chunk)
      r = cudaErrorInvalidDevicePointer;
    if (r != cudaSuccess) {
      cudaHostUnregister(chunk);  // where it was registered
      cudaGetLastError();         // the (not sticky) error these calls left
    }
    return r;
  }
  std::size_t round(std::size_t bytes) const { return (bytes + granularity_ - 1) / granularity_ * granularity_; }
  void unmap_last() {
    const DriverMemoryApi& api = DriverMemoryApi::get();
    api.unmap(reinterpret_cast<CUdeviceptr>(base_ + (handles_.size() - 1) * granularity_), granularity_);
    api.release(handles_.back());
    handles_.pop_back();
  }
  const CUmemAllocationProp& prop() const {
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device_;
    return prop_;
  }

  MemoryKind kind_ = MemoryKind::host;
  int device_ = -1;
  unsigned char* base_ = nullptr;
  std::size_t reserve_ = 0, backed_ = 0, granularity_ = huge_page_bytes;  // the host's chunk
  std::vector<CUmemGenericAllocationHandle> handles_;  ///< device: one per granule backed, in address order
  mutable CUmemAllocationProp prop_{};
};

}  // namespace detail
PAGESTASH_NAMESPACE_END
