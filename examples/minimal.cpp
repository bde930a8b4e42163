// The ten lines a user copies: stash the live rows of a BF16 tensor into a page pool and
// reload them (host executor here; pagestash::on(stream) with a device pool on a GPU).
#include <pagestash/pagestash.hpp>

#include <vector>

int main() {
  using Layout = pagestash::Plain<pagestash::BF16>;
  std::vector<pagestash::BF16> rows(4096 * 512, pagestash::BF16::from_float(1.5f));
  std::vector<std::int32_t> live = {1000};  // tokens in use, out of 4096
  const auto view = pagestash::make_view<Layout>()
                        .with_max_tokens(4096)
                        .with_hidden(512)
                        .with_data(rows.data())
                        .with_counts(live.data());

  pagestash::PagePool pool(pagestash::PoolConfig{64 << 10, 32, 0}, pagestash::MemorySpace::host);
  auto record = pagestash::make_record<pagestash::StashTraits<Layout>>(pool, view);
  pagestash::stash(pagestash::host, pool, view, record);
  pagestash::reload(pagestash::host, pool, record, view);

  return record.status().state == pagestash::RecordState::reloaded ? 0 : 1;
}
