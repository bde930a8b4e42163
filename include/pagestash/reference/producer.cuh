#pragma once
// The reference producer as CUDA kernels: the same per-byte function as the host producer
// (produced_byte), with the counts read on the device. Asynchronous on the CUDA stream `stream`;
// the scratch it needs (12 bytes per group) is stream-ordered (cudaMallocAsync).

#include <pagestash/detail/errors.hpp>
#include <pagestash/cuda/error.hpp>
#include <pagestash/reference/producer.hpp>

#include <cuda/std/limits>
#include <cuda_runtime_api.h>

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

/// Group starts and the count check (plan_groups, as on the host); one thread.
template <class Layout>
__global__ void producer_groups_kernel(GroupedView<Layout> v, cuda::std::int64_t* group_rows, float* group_amax,
                                       Flag* status) {
  *status = plan_groups(v, v.counts, group_rows).verdict();
  for (cuda::std::int32_t g = 0; g < v.groups; ++g) group_amax[g] = 0.0f;
}

/// Per-group amax, as abs_max: non-negative floats order like their bit patterns, so
/// atomicMax on ints; a NaN is kept as the positive quiet NaN, whose bits order above
/// infinity's (fmaxf alone would drop it).
template <class Layout>
__global__ void producer_amax_kernel(GroupedView<Layout> v, const BF16* source, const cuda::std::int64_t* group_rows,
                                     float* group_amax, const Flag* status) {
  if (*status != Flag::none) return;
  const cuda::std::int32_t g = static_cast<cuda::std::int32_t>(blockIdx.y);
  const cuda::std::int64_t n = v.counts[g] * v.hidden;
  float amax = 0.0f;
  bool nan = false;
  for (cuda::std::int64_t i = blockIdx.x * cuda::std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += cuda::std::int64_t{gridDim.x} * blockDim.x) {
    const float a = fabsf(source[group_rows[g] * v.hidden + i].to_float());
    nan = nan || a != a;
    amax = fmaxf(amax, a);
  }
  if (nan) amax = cuda::std::numeric_limits<float>::quiet_NaN();
  atomicMax(reinterpret_cast<int*>(group_amax + g), __float_as_int(amax));
}

template <class Layout>
__global__ void producer_bytes_kernel(GroupedView<Layout> v, ProducerInput in, BufferRole role, const Flag* status) {
  if (*status != Flag::none) return;
  const cuda::std::int32_t g = static_cast<cuda::std::int32_t>(blockIdx.y);
  const GroupBlock blk = group_block(v, in.counts, role, g);
  auto* bytes = static_cast<cuda::std::uint8_t*>(v.buffer(role)) + blk.base;
  const cuda::std::int64_t cols = blk.cols();
  for (cuda::std::int64_t i = blockIdx.x * cuda::std::int64_t{blockDim.x} + threadIdx.x; i < blk.rows() * cols;
       i += cuda::std::int64_t{gridDim.x} * blockDim.x) {
    const cuda::std::int64_t r = i / cols, c = i % cols;
    bytes[blk.shape.offset(r, c)] = produced_byte(v, in, role, g, blk.shape, r, c);
  }
}

}  // namespace detail

/// Fills every buffer the layout has, as the host `produce` does, with device pointers
/// throughout (view buffers, view.counts, source). When `status` (device memory) is
/// non-null it receives the count check's verdict: Flag::none, or Flag::bad_counts if a
/// count is negative, too large or breaks the packed alignment; data and scales then keep
/// the poison everywhere (and amax reads 0).
template <class Layout>
void produce_on_device(const GroupedView<Layout>& v, const BF16* source, cuda::std::uint8_t poison, cudaStream_t stream,
                       Flag* status = nullptr) {
  validate_shape(v);
  if (v.counts == nullptr) detail::throw_invalid("produce_on_device", "counts is null");
  void* scratch = nullptr;
  const size_t g = static_cast<size_t>(v.groups);
  PAGESTASH_CUDA_TRY(
      cudaMallocAsync(&scratch, g * (sizeof(cuda::std::int64_t) + sizeof(float)) + sizeof(Flag), stream));
  auto* group_rows = static_cast<cuda::std::int64_t*>(scratch);
  auto* group_amax = reinterpret_cast<float*>(group_rows + g);
  Flag* verdict = status != nullptr ? status : reinterpret_cast<Flag*>(group_amax + g);

  for_each_role([&](BufferRole role) {
    if (Layout::has(role))
      PAGESTASH_CUDA_TRY(cudaMemsetAsync(v.buffer(role), poison, static_cast<size_t>(v.buffer_bytes(role)), stream));
  });
  detail::producer_groups_kernel<<<1, 1, 0, stream>>>(v, group_rows, group_amax, verdict);
  PAGESTASH_CUDA_CHECK_LAUNCH();
  const dim3 grid(64, static_cast<unsigned>(v.groups));
  detail::producer_amax_kernel<<<grid, 256, 0, stream>>>(v, source, group_rows, group_amax, verdict);
  PAGESTASH_CUDA_CHECK_LAUNCH();
  const ProducerInput in{source, v.counts, group_rows, group_amax};
  for_each_token_role([&](BufferRole role) {
    if (!Layout::has(role)) return;
    detail::producer_bytes_kernel<<<grid, 256, 0, stream>>>(v, in, role, verdict);
    PAGESTASH_CUDA_CHECK_LAUNCH();
  });
  if (Layout::has(BufferRole::amax))
    PAGESTASH_CUDA_TRY(cudaMemcpyAsync(v.amax, group_amax, g * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  PAGESTASH_CUDA_TRY(cudaFreeAsync(scratch, stream));
}

PAGESTASH_NAMESPACE_END
