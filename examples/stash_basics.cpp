// pagestash's API in one page, on the host reference executor (plain C++, no GPU): stash the
// live rows of an NVFP4 columnwise grouped tensor into a page pool, reload them, read the
// pool's counters. examples/stash_basics.cu does the same with CUDA kernels and a graph.
// The snippets between "// [name]" markers appear verbatim in docs/api.md.

#include <pagestash/pagestash.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  // [layout]
  using Layout = pagestash::ColumnwiseQuantized<pagestash::NVFP4, pagestash::CapacityPadded>;
  using Traits = pagestash::StashTraits<Layout>;  // data + scales paged, amax kept
  // [layout]

  // A grouped tensor of 4 experts with capacity 256 tokens each, hidden 1024, in host memory.
  // [shape]
  const auto shape = pagestash::make_view<Layout>()  // only the shape: no buffers, no counts yet
                         .with_max_tokens(256)       // tokens per expert (capacity-padded)
                         .with_hidden(1024)
                         .with_groups(4);  // experts
  // [shape]
  std::vector<unsigned char> data(static_cast<std::size_t>(shape.buffer_bytes(pagestash::BufferRole::data)), 0x11);
  std::vector<unsigned char> scales(static_cast<std::size_t>(shape.buffer_bytes(pagestash::BufferRole::scales)), 0x22);
  std::vector<float> amax(4, 1.0f);
  std::vector<std::int32_t> counts = {200, 0, 17, 256};  // live tokens per expert

  // [pool]
  pagestash::PoolConfig config;
  config.page_bytes = 64 << 10;
  config.device_pages = 64;  // 4 MiB
  pagestash::PagePool pool(config, pagestash::MemorySpace::host);
  auto record = pagestash::make_record<Traits>(pool, shape);  // allocated once, up front
  // [pool]

  // [stash]
  const auto view = shape.with_data(reinterpret_cast<pagestash::E2M1x2*>(data.data()))
                        .with_scales(reinterpret_cast<pagestash::E4M3*>(scales.data()))
                        .with_amax(amax.data())
                        .with_counts(counts.data());
  pagestash::stash(pagestash::host, pool, view, record);
  // The record now holds the live bytes; the buffers may be reused.
  std::memset(data.data(), 0, data.size());
  // [stash]

  // [reload]
  pagestash::reload(pagestash::host, pool, record, view, pagestash::ReloadOptions{/*zero_tail=*/true});
  const pagestash::RecordStatus status = record.status();
  const pagestash::PoolStats stats = pool.stats();
  std::printf("record %s: %lld live bytes; pool peak %lld pages, overflow %d\n", pagestash::name_of(status.state),
              static_cast<long long>(status.live_bytes), static_cast<long long>(stats.peak_pages_held),
              static_cast<int>(stats.flags.overflow));
  // [reload]

  // NVFP4 columnwise data is transposed, [hidden, tokens / 2] per expert: expert 0's first
  // 100 bytes of row 0 (200 tokens) are back, the rest of the row and all of expert 1 (no
  // live tokens) are zero.
  const auto expert1 = static_cast<std::size_t>(shape.hidden * shape.max_tokens / 2);
  const bool restored = data[0] == 0x11 && data[99] == 0x11 && data[100] == 0 && data[expert1] == 0;
  std::printf("%s\n", restored ? "restored" : "NOT restored");

  // [grow]
  pagestash::PoolConfig growable;
  growable.page_bytes = 64 << 10;
  growable.device_pages = 16;      // backed now
  growable.device_reserve = 1024;  // address space for 64 MiB
  pagestash::PagePool small(growable, pagestash::MemorySpace::host);
  unsigned char* const first_page = small.ref().page(0);
  pagestash::grow(pagestash::host, small, 64, 0);    // 16 -> 64 pages; no id or address moves
  pagestash::shrink(pagestash::host, small, 16, 0);  // after a balanced step: back to 16
  // [grow]
  const bool resized = small.ref().page(0) == first_page && small.stats().device_pages == 16;
  std::printf("grown to 64 pages and shrunk to %lld, addresses kept: %s\n",
              static_cast<long long>(small.config().device_pages), resized ? "yes" : "NO");
  return restored && resized && status.state == pagestash::RecordState::reloaded ? 0 : 1;
}
