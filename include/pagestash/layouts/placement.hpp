#pragma once
// Policy tags of a grouped layout: where the groups sit, and how block scales are arranged.

#include <pagestash/config.hpp>

PAGESTASH_NAMESPACE_BEGIN

/// Groups back to back (TransformerEngine): group g starts where g - 1 ends, at the exclusive
/// prefix sum of the counts. The live bytes of every buffer are then one prefix, provided each
/// count is a multiple of the layout's count alignment (checked on the device by the stash).
struct Packed {
  static constexpr bool packed = true;
  static constexpr const char* name = "packed";
};

/// `[G, capacity, ...]`: group g owns a fixed block; its live bytes are runs inside it.
/// A single, non-grouped tensor is the G = 1 case.
struct CapacityPadded {
  static constexpr bool packed = false;
  static constexpr const char* name = "capacity-padded";
};

/// Block scales row-major, as quantized.
struct CompactScales {
  static constexpr bool swizzled = false;
  static constexpr const char* name = "compact";
};

/// Block scales in cuBLAS's GEMM-ready 128x4 tiles (what TE's device grouped path uses).
/// Columnwise scales are swizzled as the transposed matrix: rows = hidden.
struct SwizzledScales {
  static constexpr bool swizzled = true;
  static constexpr const char* name = "swizzled";
};

PAGESTASH_NAMESPACE_END
