// The pool sizer in one page (plain C++, no GPU): size a pool for a DeepSeek-V3-like
// rank saving MXFP8 activations under 1F1B, for one overflow in a thousand steps.
// The snippet between "// [name]" markers appears verbatim in docs/sizing.md.

#include <pagestash/sizing.hpp>

#include <cstdio>

int main() {
  namespace sizing = pagestash::sizing;
  // [sizing]
  // What each layer saves: MXFP8 columnwise data + swizzled scales, [32 experts, capacity, 7168].
  const sizing::Layer layer = sizing::recipe_layer("mxfp8/capacity/swizzled", /*hidden=*/7168, /*experts=*/32,
                                                   /*tokens=*/512, /*top_k=*/8, /*capacity_factor=*/2.0);
  // Or any layout: sizing::Layer({sizing::SavedTensor::of<Traits>(shape), ...}, capacity).

  sizing::Routing routing;  // the router: Dirichlet(alpha) popularity, top-k of T tokens, capacity
  routing.experts = 32;
  routing.top_k = 8;
  routing.tokens = 512;
  routing.alpha = 1.0;
  routing.capacity = layer.capacity();
  const sizing::DirichletRouting counts(routing);

  // 4 MoE layers on this rank, 8 microbatches, 4 pipeline stages: 16 stashes held at each of 5 peaks.
  const sizing::Schedule schedule = sizing::Schedule::one_f_one_b(/*layers=*/4, /*microbatches=*/8, /*stages=*/4);

  sizing::SizingSettings settings;  // 64 KiB pages, 20000 sampled steps, seed 1
  settings.overflow = 1e-3;         // at most one step in a thousand overflows
  settings.samples = 5000;          // (fewer for this example: an interval shows what that costs)
  const sizing::PoolSizing p = sizing::size_pool(layer, schedule, counts, settings);

  std::printf("pool: %lld pages (95%% CI %lld..%lld), %.1f MiB; saves %.1f%% against full buffers\n",
              static_cast<long long>(p.pages.value), static_cast<long long>(p.pages.low),
              static_cast<long long>(p.pages.high), static_cast<double>(p.bytes()) / (1 << 20),
              100 * p.saved_fraction());
  std::printf("a pool of %lld pages overflows %.4f of the steps\n", static_cast<long long>(p.pages.value - 20),
              p.peaks.overflow_probability(p.pages.value - 20));
  // [sizing]
  return p.pages.value > p.peaks.min() && p.pages.value <= p.peaks.max() ? 0 : 1;
}
