#pragma once
// Which way a quantized tensor's blocks run: along each row (rowwise: one scale per row and
// block of columns) or along each column (columnwise: one scale per column and block of
// rows). The layouts name their buffers by it.

#include <pagestash/config.hpp>

PAGESTASH_NAMESPACE_BEGIN

enum class Direction { rowwise, columnwise };

PAGESTASH_NAMESPACE_END
