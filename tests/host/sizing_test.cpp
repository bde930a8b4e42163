// The pool sizer (<pagestash/sizing.hpp>) against the real host executor: the pages it
// predicts for a count vector are the pages a stash takes, for every layout; its overflow
// probability for a pool is the overflow frequency of stashing fresh sampled steps into a
// pool of that size. Also the count models, the file reader, the schedules and the statistics.

#include <pagestash/pagestash.hpp>
#include <pagestash/sizing.hpp>
#include <pagestash/reference/byte_runs.hpp>

#include <doctest/doctest.h>

#include "../common/host_tensor.hpp"
#include "../common/layout_list.hpp"
#include "../common/stash_sequence.hpp"

#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace ps = pagestash;
namespace sizing = pagestash::sizing;
using namespace pagestash_test;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) { return e.what(); }
  return "(no std::invalid_argument thrown)";
}

std::vector<std::uint8_t> random_buffer(std::size_t n, std::mt19937& rng) {
  std::vector<std::uint8_t> b(n);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng() | 1);  // never 0: a restored byte is told from a cleared one
  return b;
}

/// For `counts` (with live tokens): the sizer's pages and bytes equal what the host
/// executor's stash takes, and reload brings back every live byte (the rest cleared).
template <class L>
void check_prediction(const ps::GroupedView<L>& shape, const std::vector<std::int32_t>& counts, std::int64_t page_bytes,
                      std::mt19937& rng) {
  using Traits = ps::StashTraits<L>;
  const sizing::SavedTensor tensor = sizing::SavedTensor::of<Traits>(shape);
  const sizing::TensorBytes predicted = tensor.measure(counts, page_bytes);

  ps::PoolConfig config;
  config.page_bytes = page_bytes;
  config.device_pages = 1;
  std::int64_t most = 0;
  {
    ps::PagePool probe(config, ps::MemorySpace::host);
    most = ps::make_record<Traits>(probe, shape).max_pages();
  }
  config.device_pages = most + 3;
  ps::PagePool pool(config, ps::MemorySpace::host);
  auto record = ps::make_record<Traits>(pool, shape);
  HostTensor<L> t(shape.max_tokens, shape.hidden, shape.groups, counts);
  std::vector<std::uint8_t> original[3];
  for (BufferRole role : {BufferRole::data, BufferRole::scales, BufferRole::amax}) {
    const auto bytes = static_cast<std::size_t>(shape.buffer_bytes(role));
    original[static_cast<int>(role)] = random_buffer(bytes, rng);
    if (bytes > 0) std::memcpy(t.bytes(role), original[static_cast<int>(role)].data(), bytes);
  }
  ps::stash(ps::host, pool, t.view, record);
  const ps::RecordStatus s = record.status();
  REQUIRE(s.state == ps::RecordState::stashed);
  CHECK(predicted.pages > 0);
  CHECK(s.pages == predicted.pages);
  CHECK(s.stream_bytes == predicted.stream_bytes);
  CHECK(s.live_bytes == predicted.live_bytes);
  CHECK(pool.stats().device_pages_free == config.device_pages - predicted.pages);
  CHECK(predicted.pages <= most);

  for (BufferRole role : {BufferRole::data, BufferRole::scales, BufferRole::amax}) {
    const auto bytes = static_cast<std::size_t>(shape.buffer_bytes(role));
    if (bytes > 0) std::memset(t.bytes(role), 0, bytes);
  }
  ps::reload(ps::host, pool, record, t.view, ps::ReloadOptions{true});
  CHECK(record.status().state == ps::RecordState::reloaded);
  CHECK(pool.stats().device_pages_free == config.device_pages);
  for (BufferRole role : {BufferRole::data, BufferRole::scales, BufferRole::amax}) {
    const auto bytes = static_cast<std::size_t>(shape.buffer_bytes(role));
    if (bytes == 0 || ps::handling_of<Traits>(role) == ps::Handling::dropped) continue;
    std::vector<std::uint8_t> expected(bytes, 0);
    const auto& from = original[static_cast<int>(role)];
    if (ps::handling_of<Traits>(role) == ps::Handling::kept) expected = from;
    else {
      const ps::BufferGeometry geo = shape.geometry(role);
      for (std::int64_t i = 0; i < ps::run_count(geo); ++i) {
        const ps::ByteRun run = ps::byte_run(geo, i, counts.data());
        std::copy_n(from.begin() + run.offset, run.bytes, expected.begin() + run.offset);
      }
    }
    CAPTURE(ps::name_of(role));
    CHECK(std::vector<std::uint8_t>(t.bytes(role), t.bytes(role) + bytes) == expected);
  }
}

/// Random counts the layout holds, with at least one live token.
template <class L>
std::vector<std::int32_t> live_counts(const ps::GroupedView<L>& shape, std::mt19937& rng) {
  for (;;) {
    std::vector<std::int32_t> c = random_counts(shape, rng);
    if (std::accumulate(c.begin(), c.end(), std::int64_t{0}) > 0) return c;
  }
}

}  // namespace

using namespace pagestash_test::layouts;

TEST_CASE("the sizer's pages for a count vector are the pages the host executor's stash takes, for every layout") {
  std::mt19937 rng(2401);
  int layouts = 0, checked = 0;
#define PAGESTASH_PREDICT(L)                                                  \
  {                                                                           \
    using Layout = PAGESTASH_LAYOUT(L);                                       \
    CAPTURE(#L);                                                              \
    ++layouts;                                                                \
    for (bool odd : {false, true}) {                                          \
      const auto shape = sequence_shape<Layout>(odd);                         \
      for (std::int64_t page_bytes : {std::int64_t{256}, std::int64_t{4096}}) \
        for (int k = 0; k < 4; ++k, ++checked) {                              \
          const auto counts = live_counts(shape, rng);                        \
          CAPTURE(page_bytes);                                                \
          check_prediction(shape, counts, page_bytes, rng);                   \
        }                                                                     \
    }                                                                         \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_PREDICT)
#undef PAGESTASH_PREDICT
  CHECK(layouts == layout_count);
  CHECK(checked == 16 * layout_count);
}

TEST_CASE("a layer pads its counts to the largest alignment of its tensors, and refuses what it cannot hold") {
  using Packed = ps::ColumnwiseQuantized<ps::MXFP8_E4M3, ps::Packed, ps::SwizzledScales>;
  using Rows = ps::RowwiseUnquantized<ps::BF16, ps::CapacityPadded>;
  const auto packed =
      sizing::SavedTensor::of<ps::StashTraits<Packed>>(ps::make_view<Packed>().with_hidden(256).with_groups(4));
  const auto rows =
      sizing::SavedTensor::of<ps::StashTraits<Rows>>(ps::make_view<Rows>().with_hidden(64).with_groups(4));
  CHECK(packed.count_alignment() == 128);
  CHECK(sizing::Layer::capacity_alignment({packed, rows}) == 128);
  const sizing::Layer layer({packed, rows}, 256);
  CHECK(layer.count_alignment() == 128);
  CHECK(layer.tensors()[0].capacity() == 256);
  CHECK(layer.padded({0, 1, 128, 200}) == std::vector<std::int32_t>{0, 128, 128, 256});
  const sizing::TensorBytes b = layer.measure({0, 1, 128, 200}, 4096);
  CHECK(b.pages == packed.with_capacity(256).pages({0, 128, 128, 256}, 4096) +
                       rows.with_capacity(256).pages({0, 128, 128, 256}, 4096));
  CHECK(error_of([&] { layer.measure({0, 0, 0, 257}, 4096); }).find("outside [0, capacity 256]") != std::string::npos);
  CHECK(error_of([&] { layer.measure({0, 0, 0}, 4096); }).find("3 counts for 4 experts") != std::string::npos);
  CHECK(error_of([&] { sizing::Layer({packed}, 100); }).find("not a positive multiple of 128") != std::string::npos);
  CHECK(sizing::capacity_for(512, 8, 32, 2.0, 128) == 256);
  CHECK(sizing::capacity_for(512, 8, 32, 1.01, 128) == 256);
  CHECK(sizing::capacity_for(10, 1, 8, 1.0, 32) == 32);
  CHECK(error_of([] { sizing::recipe_layer("fp8", 1024, 8, 1024, 2, 1.5); }).find("unknown recipe 'fp8'") !=
        std::string::npos);
  CHECK(ps::recipe_name("mxfp8", "packed_padded", "compact") == "mxfp8/packed_padded/compact");
  CHECK(ps::recipe_name("bf16", "packed", "swizzled") == "bf16/packed");  // no scales: `scales` is not asked
  CHECK(error_of([] { ps::recipe_name("bf16", "packed_padded"); }).find("unknown recipe 'bf16'") != std::string::npos);
}

// Every recipe of the registry is plannable by its name (adding one there is all it takes).
TEST_CASE("sizing: every recipe's layer, by its name") {
  int recipes = 0;
  for (const std::string& recipe : ps::recipe_names()) {
    CAPTURE(recipe);
    const std::int64_t ffn_hidden = recipe == "plain" ? 0 : 512;  // Plain: one group, one tensor
    const std::int32_t experts = recipe == "plain" ? 1 : 8;
    const sizing::Layer l = sizing::recipe_layer(recipe, 1024, experts, 1024, experts == 1 ? 1 : 2, 1.5, ffn_hidden);
    CHECK(l.tensors().size() == (ffn_hidden > 0 ? 2u : 1u));
    CHECK(l.tensors()[0].name() == recipe + " fc1 input");
    CHECK(l.capacity() >= 384);
    CHECK(l.measure(std::vector<std::int32_t>(static_cast<std::size_t>(experts), 1), 65536).pages >= 1);
    ++recipes;
  }
  int listed = 0;
  ps::for_each_recipe([&](auto) { ++listed; });
  CHECK(recipes == listed);
}

namespace {

using Small = ps::ColumnwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::CompactScales>;
using SmallTraits = ps::StashTraits<Small>;

}  // namespace

TEST_CASE("the planned overflow probability of a pool is the overflow frequency of real stashes into it") {
  const auto shape0 = ps::make_view<Small>().with_hidden(128).with_groups(4);
  const sizing::SavedTensor tensor = sizing::SavedTensor::of<SmallTraits>(shape0);
  sizing::Routing r;
  r.experts = 4;
  r.top_k = 2;
  r.tokens = 96;
  r.alpha = 1.0;
  r.capacity = sizing::capacity_for(r.tokens, r.top_k, r.experts, 1.5, sizing::Layer::capacity_alignment({tensor}));
  const sizing::Layer layer({tensor}, r.capacity);
  const sizing::DirichletRouting counts(r);
  const sizing::Schedule schedule = sizing::Schedule::explicit_list({2, 1});  // 3 stashes alive
  sizing::SizingSettings settings;
  settings.page_bytes = 1024;
  settings.samples = 20000;
  settings.seed = 11;
  settings.overflow = 0.1;
  const sizing::PoolSizing p = sizing::size_pool(layer, schedule, counts, settings);
  const std::int64_t pool_pages = p.pages.value;
  const double predicted = p.peaks.overflow_probability(pool_pages);
  CAPTURE(pool_pages);
  CAPTURE(predicted);
  REQUIRE(predicted > 0.03);  // a pool near the 0.1 quantile: enough overflows to compare
  REQUIRE(predicted <= 0.1);
  CHECK(p.overflow_probability == predicted);

  // Fresh steps, an independent seed, through the host executor into a pool of that size.
  ps::PoolConfig config;
  config.page_bytes = settings.page_bytes;
  config.device_pages = pool_pages;
  ps::PagePool pool(config, ps::MemorySpace::host);
  const auto shape = shape0.with_max_tokens(r.capacity);  // capacity-padded: tokens per expert
  std::vector<ps::StashRecord<SmallTraits>> records;
  for (int i = 0; i < 3; ++i) records.push_back(ps::make_record<SmallTraits>(pool, shape));
  HostTensor<Small> t(shape.max_tokens, shape.hidden, shape.groups, std::vector<std::int32_t>(4, 0));
  std::mt19937 bytes_rng(5);
  for (BufferRole role : {BufferRole::data, BufferRole::scales})
    std::memcpy(t.bytes(role), random_buffer(static_cast<std::size_t>(shape.buffer_bytes(role)), bytes_rng).data(),
                static_cast<std::size_t>(shape.buffer_bytes(role)));
  std::mt19937_64 rng(987654321);
  const int steps = 3000;
  int overflowed = 0, agreed = 0;
  std::vector<std::int32_t> c;
  for (int step = 0; step < steps; ++step) {
    ps::reset(ps::host, pool);
    std::int64_t step_pages = 0;
    for (auto& record : records) {
      counts.draw(rng, c);
      t.counts = c;
      t.view.counts = t.counts.data();
      step_pages += layer.measure(c, settings.page_bytes).pages;
      ps::stash(ps::host, pool, t.view, record);
    }
    const bool overflow = pool.stats().flags.overflow;
    overflowed += overflow ? 1 : 0;
    agreed += overflow == (step_pages > pool_pages) ? 1 : 0;  // the exact pages decide, step by step
  }
  CHECK(agreed == steps);
  const double observed = static_cast<double>(overflowed) / steps;
  const double sigma =
      std::sqrt(predicted * (1 - predicted) * (1.0 / steps + 1.0 / static_cast<double>(settings.samples)));
  CAPTURE(observed);
  CHECK(std::abs(observed - predicted) <= 4 * sigma);
}

TEST_CASE("Dirichlet routing: at most tokens x top_k, none above capacity, drops, reproducible by seed") {
  for (auto sampler : {sizing::RoutingSampler::per_token, sizing::RoutingSampler::multinomial}) {
    CAPTURE(static_cast<int>(sampler));
    sizing::Routing r;
    r.experts = 16;
    r.top_k = 4;
    r.tokens = 256;
    r.alpha = 0.5;
    r.capacity = 64;  // the mean: popular experts drop tokens
    r.sampler = sampler;
    const sizing::DirichletRouting model(r);
    std::mt19937_64 rng(77);
    std::int64_t dropped = 0;
    std::vector<std::int32_t> c;
    std::vector<std::vector<std::int32_t>> first;
    for (int i = 0; i < 200; ++i) {
      const std::int64_t d = model.draw(rng, c);
      first.push_back(c);
      REQUIRE(c.size() == 16);
      const std::int64_t sum = std::accumulate(c.begin(), c.end(), std::int64_t{0});
      CHECK(sum + d <= r.tokens * r.top_k);
      if (sampler == sizing::RoutingSampler::per_token) CHECK(sum + d == r.tokens * r.top_k);
      for (std::int32_t x : c) {
        CHECK(x >= 0);
        CHECK(x <= r.capacity);
      }
      dropped += d;
    }
    CHECK(dropped > 0);
    std::mt19937_64 again(77), other(78);
    model.draw(again, c);
    CHECK(c == first[0]);
    model.draw(other, c);
    CHECK(c != first[0]);
  }
  // The multinomial sampler's kept tokens agree with the exact per-token routing's on
  // average: within 3% for few experts and a tight capacity (8 experts, top-2), 0.5% for
  // DeepSeek-V3's rank (32 experts, top-8); its inclusion probabilities are approximate.
  for (int shape = 0; shape < 2; ++shape) {
    sizing::Routing r;
    r.experts = shape == 0 ? 8 : 32;
    r.top_k = shape == 0 ? 2 : 8;
    r.tokens = 512;
    r.alpha = 1.0;
    r.capacity = shape == 0 ? 160 : 256;
    double kept[2] = {0, 0};
    for (int s = 0; s < 2; ++s) {
      r.sampler = s == 0 ? sizing::RoutingSampler::per_token : sizing::RoutingSampler::multinomial;
      const sizing::DirichletRouting model(r);
      std::mt19937_64 rng(9);
      std::vector<std::int32_t> c;
      for (int i = 0; i < 1000; ++i) {
        model.draw(rng, c);
        kept[s] += static_cast<double>(std::accumulate(c.begin(), c.end(), 0));
      }
    }
    CAPTURE(shape);
    CHECK(std::abs(kept[1] / kept[0] - 1) < (shape == 0 ? 0.03 : 0.005));
  }
  CHECK(error_of([] {
          sizing::Routing bad;
          bad.top_k = 9;
          bad.experts = 8;
          bad.capacity = 1;
          sizing::DirichletRouting m(bad);
        }).find("1 <= top_k <= experts") != std::string::npos);
}

TEST_CASE("model shapes: the one table the commands' --shape reads, every name found, an unknown one listing them") {
  std::string names;
  for (const sizing::ModelShape& s : sizing::model_shapes) {
    CAPTURE(s.name);
    CHECK(&sizing::model_shape(s.name) == &s);  // the names are unique
    names += (names.empty() ? "" : "|") + std::string(s.name);
    // What its header says: a mean of 128 tokens per expert; and a router the commands can build.
    CHECK(s.tokens * s.top_k == 128 * std::int64_t{s.experts});
    sizing::Routing r;
    r.experts = s.experts;
    r.top_k = s.top_k;
    r.tokens = s.tokens;
    r.capacity = 2 * 128;
    std::vector<std::int32_t> c;
    std::mt19937_64 rng(1);
    const std::int64_t dropped = sizing::DirichletRouting(r).draw(rng, c);
    CHECK(std::accumulate(c.begin(), c.end(), std::int64_t{0}) + dropped <= s.tokens * s.top_k);
  }
  CHECK(sizing::model_shape_names("|") == names);
  CHECK(names.find("deepseek-v3") != std::string::npos);  // docs/sizing.md and README run these two
  CHECK(names.find("qwen3-moe") != std::string::npos);
  const std::string unknown = error_of([] { sizing::model_shape("gpt"); });
  CHECK(unknown.find("unknown model shape 'gpt' (" + sizing::model_shape_names() + ")") != std::string::npos);
}

TEST_CASE("measured counts: the reader parses whitespace and commas, skips comments, rejects bad lines") {
  std::istringstream in("1 2 3 4\n# a comment\n\n5,6,7,8  # a trailing comment\n 9, 10 ,11\t12\n300 0 0 0\n");
  const sizing::MeasuredCounts m = sizing::MeasuredCounts::parse(in, 4, 100, "steps.txt", sizing::Excess::cap);
  REQUIRE(m.lines().size() == 4);
  CHECK(m.lines()[1] == std::vector<std::int32_t>{5, 6, 7, 8});
  CHECK(m.lines()[2] == std::vector<std::int32_t>{9, 10, 11, 12});
  std::mt19937_64 rng(3);
  std::vector<std::int32_t> c;
  std::int64_t dropped = 0;
  for (int i = 0; i < 100; ++i) {
    dropped += m.draw(rng, c);
    for (std::int32_t x : c) CHECK(x <= 100);
  }
  CHECK(dropped > 0);  // line 4 exceeds the capacity
  const auto parse_error = [](const std::string& text) {
    return error_of([&] {
      std::istringstream s(text);
      sizing::MeasuredCounts::parse(s, 4, 100, "f");
    });
  };
  CHECK(parse_error("1 2 3 4\n1 2 x 4\n") == "pagestash::sizing: f:2: 'x' is not an integer");
  CHECK(parse_error("1 2 3 4\n1 2 3\n") == "pagestash::sizing: f:2: 3 counts, expected one per expert (4)");
  CHECK(parse_error("1 -2 3 4\n") == "pagestash::sizing: f:1: count -2 is outside [0, 2^31)");
  CHECK(parse_error("1 2 3 4.5\n") == "pagestash::sizing: f:1: '4.5' is not an integer");
  CHECK(parse_error("# nothing\n") == "pagestash::sizing: f: no count vectors");
  CHECK(
      parse_error("1 2 3 4 # four\n1 2 3 4\n0 0 101 0\n").find("f:3: count 101 of expert 2 exceeds the capacity 100") !=
      std::string::npos);  // refused unless capped: a capacity other than training's
  CHECK(parse_error("1 2 3 4\nstep\n1 2 3 4\n").find("f:2: a step after count vectors outside any (from line 1)") !=
        std::string::npos);
  CHECK(parse_error("step\n1 2 3 4\n1 2 3 4\nstep 2\n1 2 3 4\n").find("step 2 has 1 count vectors, step 1 2") !=
        std::string::npos);
  CHECK(parse_error("step\nstep\n1 2 3 4\n").find("f:2: the step before has no count vectors") != std::string::npos);
  CHECK(error_of([] {
          sizing::MeasuredCounts({{1, 2}, {3, 200}}, 100, "v");
        }).find("v: vector 2, expert 1: count 200 exceeds") != std::string::npos);
  // Whole steps: a step's vectors by stash index, drawn together.
  std::istringstream steps_in("step 0\n1 0 0 0\n2 0 0 0\nstep 1 # the second\n3 0 0 0\n4 0 0 0\n");
  const sizing::MeasuredCounts steps = sizing::MeasuredCounts::parse(steps_in, 4, 100, "s");
  CHECK(steps.steps() == 2);
  CHECK(steps.stashes_per_step() == 2);
  sizing::StepState state;
  for (int i = 0; i < 20; ++i) {
    steps.start_step(rng, state);
    std::vector<std::int32_t> second;
    steps.draw_stash(rng, state, 0, c);
    steps.draw_stash(rng, state, 1, second);
    CHECK(second[0] == c[0] + 1);  // the same measured step
  }
  CHECK(error_of([] {
          sizing::MeasuredCounts::read("/nonexistent/counts.txt", 4, 10);
        }).find("cannot open counts file") != std::string::npos);
}

TEST_CASE("schedules: stashes alive at the peak") {
  CHECK(sizing::Schedule::parse("lifo", 4, 8).alive_stashes() == 32);
  CHECK(sizing::Schedule::parse("1f1b:4", 4, 8).alive_stashes() == 16);
  CHECK(sizing::Schedule::parse("1f1b:4", 4, 2).alive_stashes() == 8);  // fewer microbatches than stages
  // Interleaved: min(v p + p - 1, v M) = 11 chunk-microbatches of 2 layers each.
  const sizing::Schedule v2 = sizing::Schedule::parse("1f1b:4:2", 4, 8);
  CHECK(v2.alive_stashes() == 22);
  CHECK(v2.microbatches_per_layer() == std::vector<std::int64_t>{7, 7, 4, 4});  // chunk 0's group of 4, then 3 more
  CHECK(sizing::Schedule::parse("1f1b:4:2", 4, 1).alive_stashes() == 4);
  CHECK(sizing::Schedule::parse("list:3,2,1", 4, 8).alive_stashes() == 6);
  // The peaks of a step: one under lifo, M - P + 1 under 1F1B.
  CHECK(sizing::Schedule::parse("lifo", 4, 8).peak_moments() == 1);
  CHECK(sizing::Schedule::parse("1f1b:4", 4, 8).peak_moments() == 5);
  CHECK(sizing::Schedule::parse("1f1b:4", 4, 3).peak_moments() == 1);
  CHECK(sizing::Schedule::parse("1f1b:4:2", 4, 8).events().size() == 2 * 4 * 8);
  CHECK(error_of([] { sizing::Schedule::parse("1f1b:4:", 4, 8); }).find("'' is not a number") != std::string::npos);
  CHECK(error_of([] { sizing::Schedule::parse("list:0,0", 4, 8); }).find("list:0,0 holds no stash") !=
        std::string::npos);
  CHECK(error_of([] { sizing::Schedule::parse("1f1b:4:3", 4, 8); }).find("divisible") != std::string::npos);
  CHECK(error_of([] { sizing::Schedule::parse("1f1b:x", 4, 8); }).find("'x' is not a number") != std::string::npos);
  CHECK(error_of([] { sizing::Schedule::parse("gpipe", 4, 8); }).find("unknown schedule") != std::string::npos);
  CHECK(error_of([] { sizing::Schedule::parse("list:1,-1", 4, 8); }).find("list entry 1 = -1 is outside") !=
        std::string::npos);
}

TEST_CASE("schedules: a step's own order (order:) sizes as the schedule it writes out, event by event") {
  // Each modelled schedule written out as an order: the same events, peak and peak moments.
  for (const char* name : {"lifo", "1f1b:4", "1f1b:4:2", "list:3,0,1"}) {
    CAPTURE(name);
    const sizing::Schedule s = sizing::Schedule::parse(name, 4, 6);
    std::string order;
    for (const sizing::StashEvent& e : s.events())
      order += (order.empty() ? "" : ",") + std::string(e.stash ? "S" : "R") + std::to_string(e.layer) + "." +
               std::to_string(e.microbatch);
    const sizing::Schedule o = sizing::Schedule::parse("order:" + order, 1, 1);
    CHECK(o.alive_stashes() == s.alive_stashes());
    CHECK(o.peak_moments() == s.peak_moments());
    REQUIRE(o.events().size() == s.events().size());
    for (std::size_t i = 0; i < o.events().size(); ++i)
      CHECK((o.events()[i].stash == s.events()[i].stash && o.events()[i].layer == s.events()[i].layer &&
             o.events()[i].microbatch == s.events()[i].microbatch));
  }
  CHECK(sizing::Schedule::parse("order:S0.0,S1.0,R1.0,S1.1,R1.1,R0.0", 9, 9).alive_stashes() == 2);
  CHECK(sizing::Schedule::parse("order:S0.0,S1.0,R1.0,S1.1,R1.1,R0.0", 9, 9).peak_moments() == 2);
  for (const char* bad : {"order:S0.0,S0.0,R0.0", "order:R0.0", "order:S0.0", "order:S0.x,R0.0", "order:", "order:S.0"})
    CHECK(!error_of([bad] { sizing::Schedule::parse(bad, 1, 1); }).empty());
}

TEST_CASE("statistics: quantiles and their intervals on distributions with known answers") {
  CHECK(std::abs(sizing::normal_quantile(0.975) - 1.959964) < 1e-6);
  CHECK(std::abs(sizing::normal_quantile(0.001) + 3.090232) < 1e-6);
  const sizing::Interval w = sizing::wilson_interval(5, 10);
  CHECK(std::abs(w.low - 0.236593) < 1e-5);
  CHECK(std::abs(w.high - 0.763407) < 1e-5);
  CHECK(std::abs(sizing::wilson_interval(0, 10).high - 0.277533) < 1e-5);
  const std::vector<double> cdf = sizing::binomial_cdf(10, 0.5);
  CHECK(std::abs(cdf[4] - 386.0 / 1024) < 1e-12);
  CHECK(std::abs(cdf[10] - 1) < 1e-12);

  // 1..1000: the 0.9 quantile is 900; its ranks are Binomial(1000, 0.9), sd 9.49.
  std::vector<std::int64_t> ramp(1000);
  std::iota(ramp.begin(), ramp.end(), 1);
  const sizing::QuantileEstimate q = sizing::quantile_estimate(ramp, 0.9);
  CHECK(q.value == 900);
  CHECK(q.low >= 879);
  CHECK(q.low <= 883);
  CHECK(q.high >= 917);
  CHECK(q.high <= 921);
  CHECK(sizing::quantile_estimate(ramp, 0.9995).high_bounded == false);  // too few samples above
  const sizing::PeakDistribution d(ramp);
  CHECK(d.pool_for(0.1).value == 900);
  CHECK(d.overflow_probability(900) == doctest::Approx(0.1));
  CHECK(d.overflow_probability(0) == 1);
  CHECK(d.overflow_probability(1000) == 0);
  const auto curve = d.curve(11);
  CHECK(curve.front().overflow == 1);
  CHECK(curve.back().overflow == 0);

  // Coverage: the interval holds the true quantile (uniform 0..9999: 0.99 quantile 9899)
  // about 95% of the time.
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<std::int64_t> uniform(0, 9999);
  int covered = 0;
  const int trials = 400;
  for (int t = 0; t < trials; ++t) {
    std::vector<std::int64_t> x(2000);
    for (auto& v : x) v = uniform(rng);
    std::sort(x.begin(), x.end());
    const sizing::QuantileEstimate e = sizing::quantile_estimate(x, 0.99);
    covered += e.low <= 9899 && 9899 <= e.high ? 1 : 0;
  }
  CHECK(covered >= 0.92 * trials);

  // Warm-up sizing on a ramp: factor 1 from the median step (500) overflows half the steps.
  const auto warm = sizing::compare_warmup(d, {1.0, 2.0}, 0.01);
  CHECK(warm[0].median_pages == 501);
  CHECK(warm[0].overflow_at_median == doctest::Approx(0.499));
  CHECK(warm[1].median_pages == 1002);
  CHECK(warm[1].overflow_at_median == 0);
  CHECK(warm[0].mean_overflow == doctest::Approx(0.4995).epsilon(0.01));
}

// ---- A step is the schedule's whole event sequence -------------------------------------

namespace {

/// The events of a step as the test orders them, apart from sizing::Schedule: lifo, or
/// Megatron-LM's 1F1B on its first stage written from its virtual-microbatch formulas
/// (chunk (k mod p v) / p, microbatch (k / p v) p + k mod p; M a multiple of p), a forward
/// stashing its chunk's layers in order, a backward reloading them in reverse.
std::vector<sizing::StashEvent> test_order(const std::string& kind, int layers, int m, int p = 1, int v = 1) {
  std::vector<sizing::StashEvent> out;
  const int per_chunk = layers / v;
  const auto pass = [&](int mb, int chunk, bool forward) {
    for (int i = 0; i < per_chunk; ++i) {
      const int l = chunk * per_chunk + (forward ? i : per_chunk - 1 - i);
      out.push_back({forward, l, mb});
    }
  };
  if (kind == "lifo") {
    for (int mb = 0; mb < m; ++mb) pass(mb, 0, true);
    for (int mb = m - 1; mb >= 0; --mb) pass(mb, 0, false);
    return out;
  }
  const int total = m * v;
  const auto run = [&](int k, bool forward) {
    const int chunk = (k % (p * v)) / p;
    pass((k / (p * v)) * p + k % p, forward ? chunk : v - 1 - chunk, forward);
  };
  const int warmup = v == 1 ? std::min(p - 1, m) : (m == p ? total : std::min((p - 1) * 2 + (v - 1) * p, total));
  for (int k = 0; k < warmup; ++k) run(k, true);
  for (int k = 0; k + warmup < total; ++k) {
    run(k + warmup, true);
    run(k, false);
  }
  for (int k = total - warmup; k < total; ++k) run(k, false);
  return out;
}

/// Fresh steps through the host executor into a pool of `pool_pages`, in `order`: a record
/// per (layer, microbatch), stashed and reloaded as the order says; a step overflows if any
/// stash finds the pool short. `draw` fills a step's count vectors (by stash index
/// microbatch * layers + layer). Also checks, step by step, that the executor overflows
/// exactly when the pages held (the sizer's per-stash pages) exceed the pool.
template <class L>
int replay_overflows(const ps::GroupedView<L>& shape, const sizing::Layer& layer,
                     const std::vector<sizing::StashEvent>& order, int layers, int microbatches,
                     std::int64_t pool_pages, std::int64_t page_bytes, int steps,
                     const std::function<void(std::vector<std::vector<std::int32_t>>&)>& draw) {
  using Traits = ps::StashTraits<L>;
  ps::PoolConfig config;
  config.page_bytes = page_bytes;
  config.device_pages = pool_pages;
  ps::PagePool pool(config, ps::MemorySpace::host);
  const auto stashes = static_cast<std::size_t>(layers * microbatches);
  std::vector<ps::StashRecord<Traits>> records;
  for (std::size_t i = 0; i < stashes; ++i) records.push_back(ps::make_record<Traits>(pool, shape));
  const std::vector<std::int32_t> zero(static_cast<std::size_t>(shape.groups), 0);
  HostTensor<L> src(shape.max_tokens, shape.hidden, shape.groups, zero),
      dst(shape.max_tokens, shape.hidden, shape.groups, zero);
  std::mt19937 bytes_rng(5);
  for (BufferRole role : {BufferRole::data, BufferRole::scales}) {
    const auto n = static_cast<std::size_t>(shape.buffer_bytes(role));
    if (n > 0) std::memcpy(src.bytes(role), random_buffer(n, bytes_rng).data(), n);
  }
  std::vector<std::vector<std::int32_t>> counts(stashes);
  std::vector<std::int64_t> pages(stashes);
  int overflowed = 0, agreed = 0;
  for (int step = 0; step < steps; ++step) {
    ps::reset(ps::host, pool);
    draw(counts);
    std::int64_t held = 0, peak = 0;
    for (const sizing::StashEvent& e : order) {
      const auto i = static_cast<std::size_t>(e.microbatch * layers + e.layer);
      if (e.stash) {
        src.counts = counts[i];
        src.view.counts = src.counts.data();
        ps::stash(ps::host, pool, src.view, records[i]);
        pages[i] = layer.measure(counts[i], page_bytes).pages;
        peak = std::max(peak, held += pages[i]);
      } else {
        dst.counts = counts[i];
        dst.view.counts = dst.counts.data();
        ps::reload(ps::host, pool, records[i], dst.view, ps::ReloadOptions{false});
        held -= pages[i];
      }
    }
    const bool overflow = pool.stats().flags.overflow;
    overflowed += overflow ? 1 : 0;
    agreed += overflow == (peak > pool_pages) ? 1 : 0;
  }
  CHECK(agreed == steps);
  return overflowed;
}

/// |observed - planned| within 4 standard errors of the two binomial estimates.
void check_frequency(int overflowed, int steps, double planned, std::int64_t samples) {
  const double observed = static_cast<double>(overflowed) / steps;
  const double sigma = std::sqrt(planned * (1 - planned) * (1.0 / steps + 1.0 / static_cast<double>(samples)));
  CAPTURE(planned);
  CAPTURE(observed);
  CHECK(std::abs(observed - planned) <= 4 * sigma + 1e-12);
}

using Rows = ps::RowwiseUnquantized<ps::BF16, ps::CapacityPadded>;

/// A layout's small layer (4 experts, top-2 of 96 tokens, capacity factor 1.5) and its router.
template <class L>
struct SmallLayer {
  ps::GroupedView<L> shape;
  sizing::Routing routing;
  sizing::Layer layer;
  explicit SmallLayer(std::int64_t hidden, double correlation = 0)
      : shape(ps::make_view<L>().with_hidden(hidden).with_groups(4)), routing(make_routing(shape, correlation)),
        layer({sizing::SavedTensor::of<ps::StashTraits<L>>(shape)}, routing.capacity) {
    shape = shape.with_max_tokens(routing.capacity);
  }
  static sizing::Routing make_routing(const ps::GroupedView<L>& shape, double correlation) {
    sizing::Routing r;
    r.experts = 4;
    r.top_k = 2;
    r.tokens = 96;
    r.alpha = 1.0;
    r.correlation = correlation;
    r.capacity =
        sizing::capacity_for(r.tokens, r.top_k, r.experts, 1.5,
                             sizing::Layer::capacity_alignment({sizing::SavedTensor::of<ps::StashTraits<L>>(shape)}));
    return r;
  }
};

template <class L>
void check_schedules_replay(std::int64_t hidden) {
  const SmallLayer<L> s(hidden);
  const sizing::DirichletRouting counts(s.routing);
  // Lean under sanitizers (ASan runs every ctest): the same checks, fewer steps.
#if defined(__SANITIZE_ADDRESS__) || defined(PAGESTASH_PLAN_TEST_LEAN)
  const int steps = 800;
#else
  const int steps = 2000;
#endif
  struct Case {
    const char* schedule;
    int layers, microbatches, p, v;
  };
  for (const Case& c : {Case{"lifo", 2, 3, 1, 1}, Case{"1f1b:2", 2, 6, 2, 1}, Case{"1f1b:2:2", 2, 4, 2, 2}}) {
    const std::string name = c.schedule;
    CAPTURE(name);
    const sizing::Schedule schedule = sizing::Schedule::parse(c.schedule, c.layers, c.microbatches);
    const std::string kind = std::string(c.schedule) == "lifo" ? "lifo" : "1f1b";
    const std::vector<sizing::StashEvent> order = test_order(kind, c.layers, c.microbatches, c.p, c.v);
    sizing::SizingSettings settings;
    settings.page_bytes = 1024;
    settings.samples = 20000;
    settings.seed = 11;
    settings.overflow = 0.1;
    const sizing::PoolSizing p = sizing::size_pool(s.layer, schedule, counts, settings);
    // The pages are whole: near the 0.1 quantile, the largest pool overflowing in at least
    // 5% of the sampled steps, enough overflows to compare.
    std::int64_t pages = p.pages.value;
    while (p.peaks.overflow_probability(pages) < 0.05) --pages;
    const double planned = p.peaks.overflow_probability(pages);
    CAPTURE(pages);
    std::mt19937_64 rng(987654321);
    const int overflowed = replay_overflows(s.shape, s.layer, order, c.layers, c.microbatches, pages,
                                            settings.page_bytes, steps, [&](auto& step) {
                                              for (auto& v : step) counts.draw(rng, v);
                                            });
    check_frequency(overflowed, steps, planned, settings.samples);
  }
}

}  // namespace

TEST_CASE("schedules: the events are Megatron-LM's order (1F1B, interleaved) and lifo's, every stash reloaded once") {
  struct Case {
    const char* schedule;
    int layers, microbatches, p, v;
  };
  for (const Case& c : {Case{"lifo", 3, 5, 1, 1}, Case{"1f1b:4", 4, 8, 4, 1}, Case{"1f1b:4", 2, 3, 4, 1},
                        Case{"1f1b:4:2", 4, 8, 4, 2}, Case{"1f1b:2:3", 6, 4, 2, 3}, Case{"1f1b:3:2", 2, 3, 3, 2}}) {
    const std::string name = c.schedule;
    CAPTURE(name);
    CAPTURE(c.microbatches);
    const sizing::Schedule s = sizing::Schedule::parse(c.schedule, c.layers, c.microbatches);
    const auto expected =
        test_order(std::string(c.schedule) == "lifo" ? "lifo" : "1f1b", c.layers, c.microbatches, c.p, c.v);
    REQUIRE(s.events().size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      CAPTURE(i);
      CHECK(s.events()[i].stash == expected[i].stash);
      CHECK(s.events()[i].layer == expected[i].layer);
      CHECK(s.events()[i].microbatch == expected[i].microbatch);
    }
  }
}

TEST_CASE("a step's overflow is the sizer's under every schedule: fresh steps replayed through the host executor") {
  // Per-step: with M > P (1F1B) and interleaved, a step holds P microbatches at several
  // moments; a sizer that sized one window would see 2 to 3 times fewer overflows.
  SUBCASE("NVFP4 columnwise, compact scales") { check_schedules_replay<Small>(128); }
  SUBCASE("BF16 rowwise") { check_schedules_replay<Rows>(64); }
}

// ---- Correlated routing -----------------------------------------------------------------

namespace {

/// A router whose steps are correlated, apart from the sizer's code: expert e's weight in
/// a stash is a gamma(c alpha) drawn once per step plus a gamma((1 - c) alpha) of the stash;
/// each token picks top_k distinct experts by those weights (std::discrete_distribution,
/// as examples/moe_stash_demo routes); counts capped at the capacity.
struct CorrelatedRouter {
  sizing::Routing r;
  std::mt19937 rng;
  CorrelatedRouter(const sizing::Routing& routing, unsigned seed) : r(routing), rng(seed) {}
  void step(std::vector<std::vector<std::int32_t>>& stashes) {
    std::vector<double> shared(static_cast<std::size_t>(r.experts), 0.0);
    if (r.correlation > 0)
      for (double& x : shared) x = std::gamma_distribution<double>(r.correlation * r.alpha)(rng);
    for (auto& counts : stashes) {
      std::vector<double> w = shared;
      if (r.correlation < 1)
        for (double& x : w) x += std::gamma_distribution<double>((1 - r.correlation) * r.alpha)(rng);
      counts.assign(w.size(), 0);
      for (std::int64_t t = 0; t < r.tokens; ++t) {
        std::vector<double> left = w;
        for (int k = 0; k < r.top_k; ++k) {
          const auto e = std::discrete_distribution<std::size_t>(left.begin(), left.end())(rng);
          left[e] = 0;
          ++counts[e];
        }
      }
      for (auto& c : counts) c = std::min<std::int32_t>(c, static_cast<std::int32_t>(r.capacity));
    }
  }
};

#if defined(__SANITIZE_ADDRESS__) || defined(PAGESTASH_PLAN_TEST_LEAN)
constexpr int correlated_steps = 600;
#else
constexpr int correlated_steps = 1500;
#endif

}  // namespace

TEST_CASE("correlated routing: the Dirichlet correlation knob against a router whose steps are correlated") {
  const SmallLayer<Rows> s(64, 0.7);
  sizing::Routing routing = s.routing;
  routing.sampler = sizing::RoutingSampler::per_token;
  const int layers = 2, microbatches = 4;
  const sizing::Schedule schedule = sizing::Schedule::one_f_one_b(layers, microbatches, 2);
  const auto order = test_order("1f1b", layers, microbatches, 2, 1);
  sizing::SizingSettings settings;
  settings.page_bytes = 1024;
  settings.samples = 20000;
  settings.seed = 5;
  settings.overflow = 0.1;
  for (double correlation : {0.7, 0.0}) {
    CAPTURE(correlation);
    routing.correlation = correlation;
    const sizing::PoolSizing p = sizing::size_pool(s.layer, schedule, sizing::DirichletRouting(routing), settings);
    std::int64_t pages = p.pages.value;
    while (p.peaks.overflow_probability(pages) < 0.05) --pages;
    const double planned = p.peaks.overflow_probability(pages);
    CorrelatedRouter router(s.routing, 2024);  // correlation 0.7, always
    const int overflowed = replay_overflows(s.shape, s.layer, order, layers, microbatches, pages, settings.page_bytes,
                                            correlated_steps, [&](auto& step) { router.step(step); });
    if (correlation > 0) check_frequency(overflowed, correlated_steps, planned, settings.samples);
    else CHECK(overflowed > 2 * planned * correlated_steps);  // independent stashes: far too small a pool
  }
}

TEST_CASE(
    "measured whole steps keep their correlation, and the interval covers the file's error (bootstrap over steps)") {
  const SmallLayer<Rows> s(64, 0.7);
  const int layers = 2, microbatches = 2;
  const sizing::Schedule schedule = sizing::Schedule::one_f_one_b(layers, microbatches, 2);
  CorrelatedRouter router(s.routing, 77);
  std::vector<std::vector<std::int32_t>> step(static_cast<std::size_t>(layers * microbatches));
  std::ostringstream whole, flat;
  for (int i = 0; i < 150; ++i) {  // a short measurement: its own error is as large as Monte Carlo's
    router.step(step);
    whole << "step " << i << "\n";
    for (const auto& v : step) {
      for (std::int32_t c : v) (whole << c << " "), (flat << c << " ");
      whole << "# a vector\n";
      flat << "\n";
    }
  }
  std::istringstream whole_in(whole.str()), flat_in(flat.str());
  const auto steps = sizing::MeasuredCounts::parse(whole_in, 4, s.routing.capacity, "whole");
  const auto vectors = sizing::MeasuredCounts::parse(flat_in, 4, s.routing.capacity, "flat");
  REQUIRE(steps.steps() == 150);
  sizing::SizingSettings settings;
  settings.page_bytes = 256;  // fine pages: the peaks spread over many sizes
  settings.samples = 20000;
  settings.overflow = 0.05;
  const sizing::PoolSizing p = sizing::size_pool(s.layer, schedule, steps, settings);
  const sizing::PoolSizing independent = sizing::size_pool(s.layer, schedule, vectors, settings);
  CHECK(p.bootstrap_replicates == 200);
  CHECK(p.pages_interval.high - p.pages_interval.low >
        static_cast<double>(p.pages.high - p.pages.low));  // the file's error counts

  // The true pool: the same quantile of many fresh steps of the router.
  std::vector<std::int64_t> fresh;
  std::vector<sizing::StepDraw> held;
  for (int i = 0; i < 20000; ++i) {
    router.step(step);
    fresh.push_back(
        sizing::walk_step(schedule, held, [&](std::int64_t stash) {
          return sizing::StepDraw{s.layer.measure(step[static_cast<std::size_t>(stash)], settings.page_bytes), 0};
        }).bytes.pages);
  }
  std::sort(fresh.begin(), fresh.end());
  const auto truth = static_cast<double>(sizing::quantile_value(fresh, 1 - settings.overflow));
  CAPTURE(truth);
  CAPTURE(p.pages.value);
  CAPTURE(p.pages_interval.low);
  CAPTURE(p.pages_interval.high);
  CAPTURE(independent.pages.value);
  CHECK(p.pages_interval.low <= truth);
  CHECK(truth <= p.pages_interval.high);
  CHECK(independent.pages.value < p.pages.value);  // vectors drawn apart lose the step's hot experts
}

TEST_CASE("a hot expert takes its share of the tokens, and a drift's reserve holds every phase's pool") {
  for (auto sampler : {sizing::RoutingSampler::per_token, sizing::RoutingSampler::multinomial}) {
    CAPTURE(static_cast<int>(sampler));
    sizing::Routing r;
    r.experts = 8;
    r.top_k = 2;
    r.tokens = 1000;
    r.capacity = 1000;  // none dropped: the counts are the routing's
    r.sampler = sampler;
    r.hot_share = 0.4;
    const sizing::DirichletRouting model(r);
    std::mt19937_64 rng(3);
    std::vector<std::int32_t> c;
    double hot = 0;
    for (int i = 0; i < 400; ++i) {
      model.draw(rng, c);
      hot += c[0];
      if (sampler == sizing::RoutingSampler::per_token)
        CHECK(std::accumulate(c.begin(), c.end(), std::int64_t{0}) == r.tokens * r.top_k);
    }
    CHECK(std::abs(hot / 400 / static_cast<double>(r.tokens) - r.hot_share) < 0.005);  // binomial: sd 0.0012
    r.hot_share = 1;  // every token picks it, and one other
    CHECK(sizing::DirichletRouting(r).draw(rng, c) == 0);
    CHECK(c[0] == r.tokens);
  }
  sizing::Routing bad;
  bad.capacity = 1;
  bad.hot_share = 1.5;
  CHECK(error_of([&] { sizing::DirichletRouting m(bad); }).find("hot_share = 1.500000 must be in [0, 1]") !=
        std::string::npos);
  bad.hot_share = 0.5;
  bad.top_k = bad.experts;  // a token passing it over has too few others
  CHECK(error_of([&] { sizing::DirichletRouting m(bad); }).find("needs top_k = 8 experts besides the hot one, of 7") !=
        std::string::npos);

  const sizing::Drift drift = sizing::Drift::parse("hot:0,0.6,0.9");
  CHECK(drift.parameter == "hot");
  CHECK(drift.values == std::vector<double>{0, 0.6, 0.9});
  CHECK(error_of([] { sizing::Drift::parse("heat:1"); }).find("unknown parameter 'heat'") != std::string::npos);
  CHECK(error_of([] { sizing::Drift::parse("alpha:1,x"); }).find("'x' is not a number") != std::string::npos);
  CHECK(error_of([] { sizing::Drift::parse("alpha:"); }).find("no phases") != std::string::npos);
  CHECK(error_of([] { sizing::Drift::parse("alpha:1,0"); }).find("phase 2 (alpha 0): DirichletRouting: alpha") !=
        std::string::npos);
  CHECK(error_of([] { sizing::Drift::parse("tokens:1.5"); }).find("whole number") != std::string::npos);

  // The command's default layer (MXFP8, 8 experts, top-2 of 1024 tokens, capacity 512): a hot expert within the
  // capacity (0.4: 410 tokens) leaves the others fewer to drop, past it (0.7: 717) drops the excess itself.
  const sizing::Layer layer = sizing::recipe_layer("mxfp8/capacity/swizzled", 1024, 8, 1024, 2, 2.0);
  sizing::Routing base;
  base.experts = 8;
  base.top_k = 2;
  base.tokens = 1024;
  base.capacity = layer.capacity();
  CHECK(sizing::Drift::parse("tokens:64,128").phase(base, 1).tokens == 128);
  const sizing::Drift hot = sizing::Drift::parse("hot:0,0.4,0.7");
  const sizing::Schedule schedule = sizing::Schedule::forward_then_backward(4, 8);
  sizing::SizingSettings settings;  // 64 KiB pages: 32 to a granule of 2 MiB
  settings.samples = 2000;
  const sizing::DriftSizing d = sizing::size_drift(layer, schedule, base, hot, settings);
  REQUIRE(d.phases.size() == 3);
  std::vector<std::int64_t> pages;
  for (std::size_t i = 0; i < 3; ++i) {
    const auto alone = sizing::size_pool(layer, schedule, sizing::DirichletRouting(hot.phase(base, i)), settings);
    CHECK(d.phases[i].pages.value == alone.pages.value);  // each phase sized as size_pool sizes it
    pages.push_back(d.phases[i].device_pages);
  }
  CAPTURE(pages[0]);
  CAPTURE(pages[1]);
  CAPTURE(pages[2]);
  CHECK(d.phases[1].pages_interval.low > d.phases[0].pages_interval.high);
  CHECK(d.phases[2].pages_interval.high < d.phases[0].pages_interval.low);
  CHECK(d.largest() == 1);
  CHECK(d.reserve_pages() == pages[1]);
  CHECK(d.granule_pages() == 32);
  CHECK(d.reserve_bytes() == (pages[1] + 31) / 32 * (std::int64_t{2} << 20));  // whole granules
  CHECK(d.first_lacks_at_last() == 0);  // the last phase needs fewer than the first
  CHECK(sizing::device_granule_bytes == 2 << 20);
}
