#include "runtime/sharding.h"

#include <cstring>
#include <set>
#include <stdexcept>

namespace tpj::runtime {

int64_t Sharding::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

bool Sharding::replicated() const {
  for (int64_t t : tiles) {
    if (t != 1) return false;
  }
  return true;
}

std::vector<int64_t> Sharding::ShardDims() const {
  std::vector<int64_t> out(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) out[d] = dims[d] / tiles[d];
  return out;
}

std::vector<int64_t> Sharding::ShardOffsets(int p) const {
  size_t at = 0;
  while (at < tile_devices.size() && tile_devices[at] != p) ++at;
  if (at == tile_devices.size()) throw std::invalid_argument("mesh position " + std::to_string(p) + " holds no piece");
  size_t piece = at / static_cast<size_t>(replicate);  // row-major index over tiles
  std::vector<int64_t> off(dims.size(), 0);
  const std::vector<int64_t> shard = ShardDims();
  for (size_t d = dims.size(); d-- > 0;) {
    const auto t = static_cast<size_t>(tiles[d]);
    off[d] = static_cast<int64_t>(piece % t) * shard[d];
    piece /= t;
  }
  return off;
}

std::shared_ptr<const Sharding> MakeSharding(std::vector<int> devices, std::vector<int64_t> dims,
                                             std::vector<int64_t> tiles, int64_t replicate,
                                             std::vector<int> tile_devices) {
  auto s = std::make_shared<Sharding>();
  if (devices.empty()) throw std::invalid_argument("a mesh needs at least one device");
  if (std::set<int>(devices.begin(), devices.end()).size() != devices.size()) {
    throw std::invalid_argument("a mesh lists a device twice");
  }
  if (tiles.size() != dims.size()) throw std::invalid_argument("a sharding needs one tile count per dimension");
  int64_t pieces = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (tiles[d] < 1 || dims[d] % tiles[d] != 0) {
      throw std::invalid_argument("dimension " + std::to_string(d) + " of size " + std::to_string(dims[d]) +
                                  " does not split into " + std::to_string(tiles[d]) + " equal pieces");
    }
    pieces *= tiles[d];
  }
  if (replicate < 1 || pieces * replicate != static_cast<int64_t>(devices.size()) ||
      tile_devices.size() != devices.size()) {
    throw std::invalid_argument("a sharding must place each of its " + std::to_string(pieces) + " piece(s) x " +
                                std::to_string(replicate) + " copies on the mesh's " +
                                std::to_string(devices.size()) + " device(s) once");
  }
  std::set<int> seen;
  for (int p : tile_devices) {
    if (p < 0 || p >= static_cast<int>(devices.size()) || !seen.insert(p).second) {
      throw std::invalid_argument("a sharding's tile assignment must list every mesh position once");
    }
  }
  s->devices = std::move(devices);
  s->dims = std::move(dims);
  s->tiles = std::move(tiles);
  s->replicate = replicate;
  s->tile_devices = std::move(tile_devices);
  if (pieces == 1) {
    s->hlo = "{replicated}";
  } else {
    std::string h = "{devices=[";
    for (size_t d = 0; d < s->tiles.size(); ++d) h += (d ? "," : "") + std::to_string(s->tiles[d]);
    if (replicate > 1) h += "," + std::to_string(replicate);
    h += "]";
    for (size_t i = 0; i < s->tile_devices.size(); ++i) h += (i ? "," : "") + std::to_string(s->tile_devices[i]);
    if (replicate > 1) h += " last_tile_dim_replicate";
    s->hlo = h + "}";
  }
  return s;
}

std::shared_ptr<const Sharding> ReplicatedSharding(const std::vector<int>& devices, std::vector<int64_t> dims) {
  std::vector<int> order(devices.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::vector<int64_t> tiles(dims.size(), 1);
  return MakeSharding(devices, std::move(dims), std::move(tiles), static_cast<int64_t>(devices.size()),
                      std::move(order));
}

namespace {

// Calls f(full_offset_bytes, shard_offset_bytes, run_bytes) for each
// contiguous run (the last dimension's extent) of position p's piece.
template <class F>
void ForRuns(const Sharding& s, int p, size_t item, F&& f) {
  const std::vector<int64_t> shard = s.ShardDims();
  const std::vector<int64_t> off = s.ShardOffsets(p);
  const size_t rank = s.dims.size();
  if (rank == 0) {
    f(0, 0, item);
    return;
  }
  for (int64_t d : shard) {
    if (d == 0) return;
  }
  std::vector<int64_t> strides(rank, 1);  // of the full tensor, in elements
  for (size_t d = rank - 1; d-- > 0;) strides[d] = strides[d + 1] * s.dims[d + 1];
  const size_t run = static_cast<size_t>(shard[rank - 1]) * item;
  std::vector<int64_t> idx(rank, 0);  // over the leading rank-1 dims of the piece
  size_t shard_at = 0;
  while (true) {
    int64_t full_at = off[rank - 1];
    for (size_t d = 0; d + 1 < rank; ++d) full_at += (off[d] + idx[d]) * strides[d];
    f(static_cast<size_t>(full_at) * item, shard_at, run);
    shard_at += run;
    size_t d = rank - 1;
    while (d > 0) {
      --d;
      if (++idx[d] < shard[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (rank == 1) return;
  }
}

}  // namespace

void CopyShardOut(const Sharding& s, int p, size_t item, const void* full, void* shard) {
  ForRuns(s, p, item, [&](size_t f, size_t sh, size_t n) {
    std::memcpy(static_cast<char*>(shard) + sh, static_cast<const char*>(full) + f, n);
  });
}

void CopyShardIn(const Sharding& s, int p, size_t item, const void* shard, void* full) {
  ForRuns(s, p, item, [&](size_t f, size_t sh, size_t n) {
    std::memcpy(static_cast<char*>(full) + f, static_cast<const char*>(shard) + sh, n);
  });
}

std::vector<int> CoveringPositions(const Sharding& s) {
  std::vector<int> out;
  for (size_t i = 0; i < s.tile_devices.size(); i += static_cast<size_t>(s.replicate)) out.push_back(s.tile_devices[i]);
  return out;
}

}  // namespace tpj::runtime
