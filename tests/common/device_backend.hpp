#pragma once
// The GPU tests' backend of the executor suite (tests/common/executor_suite.hpp): device
// memory and the CUDA executor, through the instantiations' entry points (stash_kernels.hpp).

#include <pagestash/pagestash.hpp>

#include "device_buffer.hpp"
#include "stash_kernels.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

namespace pagestash_test {

/// Device memory and the CUDA executor on the per-thread stream, synchronised after each
/// operation so that the bodies can check the results; an upload synchronises the device,
/// so that work on any stream (a non-blocking one too) sees it. Buffers have `Slack` bytes
/// past their end (0: allocated to the exact byte). Streams are non-blocking CUDA streams;
/// a graph is captured on one and instantiated.
template <std::size_t Slack>
struct DeviceBackendWith {
  static constexpr ps::MemorySpace space = ps::MemorySpace::device;

  struct Bytes {
    DeviceBuffer<std::uint8_t> buffer;
    explicit Bytes(std::size_t n) : buffer(n, Slack) {}
    std::uint8_t* ptr() const { return buffer.ptr; }
    void upload(const std::vector<std::uint8_t>& b) {
      REQUIRE(b.size() == buffer.count);
      buffer.upload(b);
      // From pageable memory cudaMemcpy may return before the copy lands, and a
      // non-blocking stream does not wait for the legacy one.
      PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
    }
    std::vector<std::uint8_t> download() const { return buffer.download(); }
  };

  static void sync() { PAGESTASH_CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread)); }
  template <class Tr>
  static void stash(ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& v, ps::StashRecord<Tr>& rec) {
    stash_on(cudaStreamPerThread, pool, v, rec);
    sync();
  }
  template <class Tr>
  static void reload(ps::PagePool& pool, ps::StashRecord<Tr>& rec, const ps::GroupedView<typename Tr::layout>& dest,
                     bool zero_tail, bool poison = true) {
    reload_on(cudaStreamPerThread, pool, rec, dest, ps::ReloadOptions{zero_tail, poison});
    sync();
  }
  template <class Tr>
  static void discard(ps::PagePool& pool, ps::StashRecord<Tr>& rec) {
    discard_on(cudaStreamPerThread, pool, rec);
    sync();
  }
  static void reset(ps::PagePool& pool) {
    reset_on(cudaStreamPerThread, pool);
    sync();
  }
  static void end_step(ps::PagePool& pool) {
    end_step_on(cudaStreamPerThread, pool);
    sync();
  }
  static void grow(ps::PagePool& pool, std::int64_t device_pages, std::int64_t host_pages) {
    grow_on(cudaStreamPerThread, pool, device_pages, host_pages);
    sync();
  }
  static void shrink(ps::PagePool& pool, std::int64_t device_pages, std::int64_t host_pages) {
    shrink_on(cudaStreamPerThread, pool, device_pages, host_pages);
  }

  class Streams {
   public:
    explicit Streams(int n) : s_(static_cast<std::size_t>(n)) {
      for (auto& x : s_) PAGESTASH_CUDA_TRY(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
    }
    ~Streams() {
      for (auto x : s_) cudaStreamDestroy(x);
    }
    Streams(const Streams&) = delete;
    Streams& operator=(const Streams&) = delete;
    template <class Tr>
    void stash(int k, ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& v, ps::StashRecord<Tr>& rec) {
      stash_on(s_[static_cast<std::size_t>(k)], pool, v, rec);
    }
    template <class Tr>
    void reload(int k, ps::PagePool& pool, ps::StashRecord<Tr>& rec, const ps::GroupedView<typename Tr::layout>& dest,
                bool zero_tail) {
      reload_on(s_[static_cast<std::size_t>(k)], pool, rec, dest, ps::ReloadOptions{zero_tail});
    }
    void synchronize() { PAGESTASH_CUDA_TRY(cudaDeviceSynchronize()); }

   private:
    std::vector<cudaStream_t> s_;
  };

  /// Captured (cudaStreamBeginCapture) from construction on a stream of its own.
  class Graph {
   public:
    Graph() {
      PAGESTASH_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      PAGESTASH_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    }
    ~Graph() {
      if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
      if (graph_ != nullptr) cudaGraphDestroy(graph_);
      cudaStreamDestroy(stream_);
    }
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    template <class Tr>
    void stash(ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& v, ps::StashRecord<Tr>& rec) {
      stash_on(stream_, pool, v, rec);
    }
    template <class Tr>
    void reload(ps::PagePool& pool, ps::StashRecord<Tr>& rec, const ps::GroupedView<typename Tr::layout>& dest,
                bool zero_tail) {
      reload_on(stream_, pool, rec, dest, ps::ReloadOptions{zero_tail});
    }
    void instantiate() {
      PAGESTASH_CUDA_TRY(cudaStreamEndCapture(stream_, &graph_));
      PAGESTASH_CUDA_TRY(cudaGraphInstantiate(&exec_, graph_, 0));
    }
    void launch() {
      PAGESTASH_CUDA_TRY(cudaGraphLaunch(exec_, stream_));
      PAGESTASH_CUDA_TRY(cudaStreamSynchronize(stream_));
    }

   private:
    cudaStream_t stream_ = nullptr;
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t exec_ = nullptr;
  };
};
using DeviceBackend = DeviceBackendWith<1>;
using ExactDeviceBackend = DeviceBackendWith<0>;

}  // namespace pagestash_test
