// Choosing at compile time what a stash saves. An NVFP4 columnwise tensor has data, block
// scales and a per-expert amax; here backward needs only the scales (say it recomputes the
// data), so only they are paged, amax is kept whole in the record, and data is dropped.
#include <pagestash/pagestash.hpp>

#include <cstdio>
#include <vector>

using Layout = pagestash::ColumnwiseQuantized<pagestash::NVFP4, pagestash::Packed>;
using ScalesOnly = pagestash::BufferSelection<Layout, pagestash::Handling::dropped,  // data
                                              pagestash::Handling::paged,            // scales
                                              pagestash::Handling::kept>;            // amax

// A selection that pages nothing would not compile:
//   pagestash::BufferSelection<Layout, pagestash::Handling::dropped>
//   -> "StashTraits: nothing is paged; set data or scales to Handling::paged"
static_assert(pagestash::check_stash_traits<ScalesOnly>());
static_assert(pagestash::handling_of<ScalesOnly>(pagestash::BufferRole::data) == pagestash::Handling::dropped);

int main() {
  pagestash::GroupedView<Layout> view;
  view.max_tokens = 1024;
  view.hidden = 256;
  view.groups = 4;
  std::vector<unsigned char> scales(static_cast<std::size_t>(view.buffer_bytes(pagestash::BufferRole::scales)), 0x3C);
  std::vector<float> amax = {1, 2, 3, 4};
  std::vector<std::int32_t> counts = {128, 0, 384, 256};  // Packed, quantized: multiples of 128 (as TE's kernels)
  view.scales = reinterpret_cast<pagestash::E4M3*>(scales.data());
  view.amax = amax.data();
  view.counts = counts.data();  // view.data stays null: the selection drops it

  pagestash::PagePool pool(pagestash::PoolConfig{4096, 64, 0}, pagestash::MemorySpace::host);
  auto record = pagestash::make_record<ScalesOnly>(pool, view);
  pagestash::stash(pagestash::host, pool, view, record);
  const auto stashed = record.status();
  amax.assign(4, 0.0f);
  pagestash::reload(pagestash::host, pool, record, view);

  std::printf("scales only: %lld live bytes paged (data: %lld bytes not saved); amax back: %g\n",
              static_cast<long long>(stashed.live_bytes),
              static_cast<long long>(view.buffer_bytes(pagestash::BufferRole::data)), amax[3]);
  return record.status().state == pagestash::RecordState::reloaded && amax[3] == 4.0f ? 0 : 1;
}
