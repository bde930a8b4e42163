// A BF16 grouped tensor in capacity-padded storage ([experts, capacity, hidden], one buffer), the
// most common MoE activation, stashed and reloaded on the host reference executor: the buffer's
// size, the int32 counts, the pool's size and ReloadOptions' defaults. docs/api.md, "A BF16
// capacity-padded tensor", quotes the snippet between the "// [name]" markers verbatim.

#include <pagestash/pagestash.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  // [bf16_capacity]
  using Layout = pagestash::RowwiseUnquantized<pagestash::BF16, pagestash::CapacityPadded>;
  using Traits = pagestash::StashTraits<Layout>;  // the data buffer paged (BF16 has no scales)

  const std::int64_t experts = 8, capacity = 512, hidden = 2048;
  const auto shape = pagestash::make_view<Layout>().with_groups(experts).with_max_tokens(capacity).with_hidden(hidden);
  // The buffer: experts * capacity * hidden BF16 values, expert e's token t at row e * capacity + t.
  const std::int64_t buffer_bytes = shape.buffer_bytes(pagestash::BufferRole::data);  // 16 MiB
  std::vector<pagestash::BF16> data(static_cast<std::size_t>(experts * capacity * hidden),
                                    pagestash::BF16::from_float(1.0f));
  // One int32 per expert: its live tokens, 0..capacity (device memory for the CUDA executor, written by the
  // router's kernel; host memory here). Only the rows below each count are paged.
  std::vector<std::int32_t> counts = {512, 300, 0, 17, 128, 64, 256, 1};

  // A pool for one such stash at most: the record says how many pages its largest stash takes.
  pagestash::PoolConfig config;  // page_bytes: 64 KiB by default
  pagestash::PagePool probe(pagestash::PoolConfig{config.page_bytes, 1, 0}, pagestash::MemorySpace::host);
  config.device_pages = pagestash::make_record<Traits>(probe, shape).max_pages();  // 256 pages: the whole buffer
  pagestash::PagePool pool(config, pagestash::MemorySpace::host);
  auto record = pagestash::make_record<Traits>(pool, shape);

  const auto view = shape.with_data(data.data()).with_counts(counts.data());
  pagestash::stash(pagestash::host, pool, view, record);                // 1278 live rows: 5 MiB of 16
  std::memset(data.data(), 0, static_cast<std::size_t>(buffer_bytes));  // the buffer is free for other use

  // ReloadOptions{} (the default): zero_tail = false, the rows past each count keep whatever the buffer holds
  // now; poison = true, a reload that cannot restore (its stash overflowed) fills the buffer with 0xFF (NaN).
  // ReloadOptions{true}: the rows past each count are zeroed too, as a freshly zeroed buffer would hold them.
  pagestash::reload(pagestash::host, pool, record, view, pagestash::ReloadOptions{/*zero_tail=*/true});
  pagestash::end_step(pagestash::host, pool);  // every page back: pool.stats().pages_held_at_step_end == 0
  // [bf16_capacity]

  // Expert 1's token 299 is live (restored), its token 300 is not (zeroed); every page is back.
  const auto at = [&](std::int64_t e, std::int64_t t) {
    return data[static_cast<std::size_t>((e * capacity + t) * hidden)];
  };
  const pagestash::PoolStats stats = pool.stats();
  const bool ok = at(1, 299).to_float() == 1.0f && at(1, 300).to_float() == 0.0f && at(2, 0).to_float() == 0.0f &&
                  at(7, 0).to_float() == 1.0f && record.status().state == pagestash::RecordState::reloaded &&
                  stats.pages_held_at_step_end == 0 && config.device_pages == 256 && buffer_bytes == (16 << 20) &&
                  record.status().live_bytes == 1278 * hidden * 2;
  std::printf("bf16 capacity-padded: %lld pages for %lld live bytes of a %lld-byte buffer, reloaded: %s\n",
              static_cast<long long>(stats.peak_pages_held), static_cast<long long>(record.status().live_bytes),
              static_cast<long long>(buffer_bytes), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
