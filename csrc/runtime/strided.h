// Strided views over a flat storage value, in IR.
//
// Every torch-pjrt storage holds its contents as one flat IR value (or device
// buffer) of `numel` elements. A tensor is (sizes, strides, offset) over it,
// exactly as PyTorch describes CPU tensors, so PyTorch's own view machinery
// (as_strided, view, transpose, select, slice, expand, ...) works unchanged.
// This file turns such a description into IR that reads the view out of the
// flat value, and IR that writes a new view value back into it.
//
// Plan: drop size-1 dims, treat stride-0 dims as broadcasts, order the rest by
// stride. If each stride divides the next larger one and no index carries into
// the next dimension, the view is a static slice of the flat value reshaped
// to mixed-radix dims, then a transpose and a broadcast; writes are a
// dynamic_update_slice of the same shape. Anything else (overlapping windows,
// odd strides) is a gather / scatter with computed indices: always correct,
// slower.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace tpj::runtime {

struct StridedView {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;
};

// True when the view is the whole storage in row-major order.
bool CoversStorage(const StridedView& v, int64_t storage_numel);
// True when the view is the whole storage with its dims in some order: a
// permutation of row-major order (channels_last, a transposed copy).
bool CoversStoragePermuted(const StridedView& v, int64_t storage_numel);
// The flat storage value (rank 1) of a view that covers its storage
// (CoversStoragePermuted) when the view's value is `update`.
ir::Value FlatOfCover(ir::Builder& b, const StridedView& v, ir::Value update);

// The view's value, with shape v.sizes, read from `flat` (rank 1). With
// `offset` (an i64 scalar holding v.offset, e.g. a host-fed parameter) the
// offset is read from it rather than written into the program as constants,
// so views at other offsets of the same layout (a data set's mini-batches
// x[i:i+b]) share one program.
ir::Value ReadStrided(ir::Builder& b, ir::Value flat, const StridedView& v, const ir::Value* offset = nullptr);

// `flat` with the elements addressed by `v` replaced by `update` (shape
// v.sizes, same dtype); `offset` as for ReadStrided (a replay buffer or a
// queue written at a moving position keeps one program). Throws ir::Error
// when two view elements share one storage element (an expanded view cannot
// be written).
ir::Value WriteStrided(ir::Builder& b, ir::Value flat, const StridedView& v, ir::Value update,
                       const ir::Value* offset = nullptr);

// For tests: whether ReadStrided/WriteStrided use the slice plan (true) or
// the gather/scatter fallback (false).
bool UsesSlicePlan(const StridedView& v, int64_t storage_numel);

}  // namespace tpj::runtime
