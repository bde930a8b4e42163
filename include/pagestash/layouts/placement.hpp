#pragma once
// Policy tags of a grouped layout: where the groups sit, and how block scales are arranged. docs/layouts.md,
// "TransformerEngine compatibility", says which TE storage each matches.

#include <pagestash/config.hpp>

PAGESTASH_NAMESPACE_BEGIN

/// Groups back to back, each buffer one matrix for the whole packed sequence: what TE's graph-safe device kernels
/// (grouped quantize, fused requantize) write. Group g starts at the exclusive prefix sum of the counts. For quantized
/// layouts TE requires every count to be a multiple of 128 (`grouped_layout.cuh`), and so does the stash (checked on
/// the device): only then is this TE's per-group storage as well.
struct Packed {
  static constexpr bool packed = true;
  static constexpr bool pads_group_scales = false;
  static constexpr const char* name = "packed";
};

/// Groups back to back, each group's block scales padded on their own to TE's per-tensor scale shape (whole 128x4
/// tiles): TE's host-shape grouped storage (`make_grouped_tensor`) and the offsets its grouped GEMM computes. Data as
/// in Packed. Counts need only be multiples of the quantization block along tokens (1 for rowwise layouts).
struct PackedPadded {
  static constexpr bool packed = true;
  static constexpr bool pads_group_scales = true;
  static constexpr const char* name = "packed_padded";
};

/// `[G, capacity, ...]`: group g owns a fixed block; its live bytes are runs inside it. A single, non-grouped tensor is
/// the G = 1 case.
struct CapacityPadded {
  static constexpr bool packed = false;
  static constexpr bool pads_group_scales = false;
  static constexpr const char* name = "capacity";
};

/// Block scales row-major, as quantized.
struct CompactScales {
  static constexpr bool swizzled = false;
  static constexpr const char* name = "compact";
};

/// Block scales in cuBLAS's GEMM-ready 128x4 tiles (what TE's device grouped path uses). Columnwise scales are swizzled
/// as the transposed matrix: rows = hidden.
struct SwizzledScales {
  static constexpr bool swizzled = true;
  static constexpr const char* name = "swizzled";
};

PAGESTASH_NAMESPACE_END
