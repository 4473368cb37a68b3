// SPMD: how one storage's contents are split over a mesh of local devices,
// as XLA's partitioner reads it (an HLO sharding string), and the host-side
// split and gather of those pieces.
//
// A sharding of logical shape `dims` cuts dimension d into tiles[d] equal
// pieces; `replicate` > 1 keeps that many copies of each piece
// (last_tile_dim_replicate). tile_devices lists, row-major over
// (tiles..., replicate), the mesh position (partition id) holding each
// piece: mesh position p is local device devices[p].
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tpj::runtime {

struct Sharding {
  std::vector<int> devices;       // local device index of each mesh position
  std::vector<int64_t> dims;      // logical shape, contiguous elements
  std::vector<int64_t> tiles;     // pieces per logical dimension (dims.size() entries)
  int64_t replicate = 1;          // copies of each piece
  std::vector<int> tile_devices;  // mesh position of each (piece, copy), row-major
  std::string hlo;                // "{replicated}", "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"

  int64_t numel() const;
  bool replicated() const;  // every position holds everything
  std::vector<int64_t> ShardDims() const;
  // Offset (in elements, per dimension) of the piece mesh position p holds.
  std::vector<int64_t> ShardOffsets(int p) const;
};

// Checks and completes a sharding (builds hlo). Throws std::invalid_argument
// naming the problem.
std::shared_ptr<const Sharding> MakeSharding(std::vector<int> devices, std::vector<int64_t> dims,
                                             std::vector<int64_t> tiles, int64_t replicate,
                                             std::vector<int> tile_devices);
// Every position holds all of `dims`.
std::shared_ptr<const Sharding> ReplicatedSharding(const std::vector<int>& devices, std::vector<int64_t> dims);

// Host copies: the piece of `full` (dense row-major, `item` bytes per
// element) that position p holds, into `shard` (ShardDims() dense); and the
// reverse, one piece into its place in `full`.
void CopyShardOut(const Sharding& s, int p, size_t item, const void* full, void* shard);
void CopyShardIn(const Sharding& s, int p, size_t item, const void* shard, void* full);
// Positions whose pieces together cover the tensor once (the first copy of each piece).
std::vector<int> CoveringPositions(const Sharding& s);

}  // namespace tpj::runtime
