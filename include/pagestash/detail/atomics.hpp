#pragma once
// Device-scope atomics, fences and spinning, as the pool and launch steps use them: not public API, but for the host
// observer (AtomicAccess, ObserverSlot, atomic_observer, observe_atomic).
//
// On the host (the host executor, the tests' grid emulator) every atomic access and fence can be reported to an
// observer, so that a test or a benchmark counts what a launch costs on the device (atomics per 128-byte line, fences)
// without a GPU. With no observer set, that is one load and a branch per access; device code has none of it.

#include <pagestash/config.hpp>

#include <cuda/atomic>
#include <cuda/std/cstdint>

#if !defined(__CUDA_ARCH__)
#  include <atomic>
#  include <thread>
#endif

PAGESTASH_NAMESPACE_BEGIN

enum class AtomicAccess : int {
  load,   ///< an atomic load
  store,  ///< an atomic store
  rmw,    ///< a read-modify-write: fetch_add, exchange, compare-exchange
  fence,  ///< a fence (address null)
  pause,  ///< a spin-wait's pause (address null): the thread waits for another's write
  /// A plain load of a launch's bookkeeping (the record's header, counts, items and page ids, the pool's counters and
  /// stacks): not an atomic, but a round trip a launch's critical path waits on (note_load). Not a preemption point.
  plain_load,
  round_begin,  ///< (address null) the accesses up to round_end are issued together: one round trip (OneRound)
  round_end,    ///< (address null)
};

#if !defined(__CUDA_ARCH__)
/// A process-wide observer on the host: a function and what it is called with. Set it only while no operation runs.
template <class F>
struct ObserverSlot {
  std::atomic<F> observer{nullptr};
  void* context = nullptr;
  void set(F f, void* c) {
    context = c;
    observer.store(f);
  }
  void clear() {
    observer.store(nullptr);
    context = nullptr;
  }
};

using AtomicObserver = void (*)(const void* address, AtomicAccess access, void* context);
using AtomicObserverSlot = ObserverSlot<AtomicObserver>;

/// The process's observer (null: none), which observe_atomic tells of each access the library's atomics make on the
/// host. Set it only while no operation runs.
inline AtomicObserverSlot& atomic_observer() {
  static AtomicObserverSlot slot;
  return slot;
}

inline void observe_atomic(const void* address, AtomicAccess access) {
  AtomicObserverSlot& slot = atomic_observer();
  if (const AtomicObserver f = slot.observer.load(std::memory_order_relaxed)) f(address, access, slot.context);
}
#endif

namespace detail {

/// cuda::atomic_ref at device scope, with the accesses this library makes.
template <class T>
class device_atomic {
 public:
  PAGESTASH_HOST_DEVICE explicit device_atomic(T& x) : ref_(x) {
#if !defined(__CUDA_ARCH__)
    address_ = &x;
#endif
  }

  PAGESTASH_HOST_DEVICE T load(cuda::std::memory_order order) const {
    observe(AtomicAccess::load);
    return ref_.load(order);
  }
  PAGESTASH_HOST_DEVICE void store(T x, cuda::std::memory_order order) const {
    observe(AtomicAccess::store);
    ref_.store(x, order);
  }
  PAGESTASH_HOST_DEVICE T fetch_add(T x, cuda::std::memory_order order) const {
    observe(AtomicAccess::rmw);
    return ref_.fetch_add(x, order);
  }
  PAGESTASH_HOST_DEVICE T fetch_and(T x, cuda::std::memory_order order) const {
    observe(AtomicAccess::rmw);
    return ref_.fetch_and(x, order);
  }
  PAGESTASH_HOST_DEVICE T exchange(T x, cuda::std::memory_order order) const {
    observe(AtomicAccess::rmw);
    return ref_.exchange(x, order);
  }
  PAGESTASH_HOST_DEVICE bool compare_exchange_strong(T& expected, T desired, cuda::std::memory_order success,
                                                     cuda::std::memory_order failure) const {
    observe(AtomicAccess::rmw);
    return ref_.compare_exchange_strong(expected, desired, success, failure);
  }

 private:
  PAGESTASH_HOST_DEVICE void observe(AtomicAccess access) const {
#if !defined(__CUDA_ARCH__)
    observe_atomic(address_, access);
#else
    (void)access;
#endif
  }
#if !defined(__CUDA_ARCH__)
  const void* address_;
#endif
  cuda::atomic_ref<T, cuda::thread_scope_device> ref_;
};

/// An acquire fence at device scope: after polling with relaxed loads, one fence makes what the writer released visible
/// (one L1 invalidation, instead of one per poll). On the host the polls acquire already (poll_order), so it is only
/// counted.
PAGESTASH_HOST_DEVICE inline void acquire_fence() {
#if defined(__CUDA_ARCH__)
  cuda::atomic_thread_fence(cuda::std::memory_order_acquire, cuda::thread_scope_device);
#else
  observe_atomic(nullptr, AtomicAccess::fence);
#endif
}

/// Tells the host observer of a plain load of a launch's bookkeeping (AtomicAccess::plain_load); nothing on the device.
PAGESTASH_HOST_DEVICE inline void note_load(const void* address) {
#if defined(__CUDA_ARCH__)
  (void)address;
#else
  observe_atomic(address, AtomicAccess::plain_load);
#endif
}

/// While it lives, the thread's accesses are issued together, none waiting for another: one round trip. On the host
/// the observer hears round_begin and round_end (AtomicAccess); nothing on the device.
struct OneRound {
  PAGESTASH_HOST_DEVICE OneRound() {
#if !defined(__CUDA_ARCH__)
    observe_atomic(nullptr, AtomicAccess::round_begin);
#endif
  }
  PAGESTASH_HOST_DEVICE ~OneRound() {
#if !defined(__CUDA_ARCH__)
    observe_atomic(nullptr, AtomicAccess::round_end);
#endif
  }
  OneRound(const OneRound&) = delete;
  OneRound& operator=(const OneRound&) = delete;
};

/// Polite spinning while another team finishes a short critical section.
PAGESTASH_HOST_DEVICE inline void spin_pause() {
#if defined(__CUDA_ARCH__)
  __nanosleep(64);
#else
  observe_atomic(nullptr, AtomicAccess::pause);
  std::this_thread::yield();
#endif
}

/// The order of a poll, that acquire_fence() completes: relaxed on the device (an acquire load
/// invalidates the SM's L1 each time); acquire on the host, where it costs nothing and ThreadSanitizer, which does not
/// model fences, sees the synchronisation.
#if defined(__CUDA_ARCH__)
inline constexpr cuda::std::memory_order poll_order = cuda::std::memory_order_relaxed;
#else
inline constexpr cuda::std::memory_order poll_order = cuda::std::memory_order_acquire;
#endif

/// Spins until pred(x.load(poll_order)) holds and returns that value; the caller then fences once (acquire_fence).
template <class T, class Pred>
PAGESTASH_HOST_DEVICE T spin_until(const device_atomic<T>& x, const Pred& pred) {
  for (;;) {
    const T v = x.load(poll_order);
    if (pred(v)) return v;
    spin_pause();
  }
}

}  // namespace detail
PAGESTASH_NAMESPACE_END
