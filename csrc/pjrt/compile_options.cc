#include "pjrt/compile_options.h"

#include <cstdint>

#include "pjrt/error.h"

namespace tpj::pjrt {
namespace {

void Varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void VarintField(std::string& out, int field, int64_t v) {
  Varint(out, static_cast<uint64_t>(field) << 3 | 0);
  Varint(out, static_cast<uint64_t>(v));
}

void BytesField(std::string& out, int field, const std::string& bytes) {
  Varint(out, static_cast<uint64_t>(field) << 3 | 2);
  Varint(out, bytes.size());
  out += bytes;
}

}  // namespace

std::string EncodeCompileOptions(const CompileOptions& o) {
  if (o.num_replicas < 1 || o.num_partitions < 1) {
    throw Error(Code::kInvalidArgument, "compile options need num_replicas >= 1 and num_partitions >= 1");
  }
  const size_t n = static_cast<size_t>(o.num_replicas) * o.num_partitions;
  if (!o.device_ids.empty() && o.device_ids.size() != n) {
    throw Error(Code::kInvalidArgument,
                "compile options list " + std::to_string(o.device_ids.size()) +
                " device ids for " + std::to_string(n) + " replica x partition slots");
  }
  std::string build;
  VarintField(build, 4, o.num_replicas);
  VarintField(build, 5, o.num_partitions);
  if (o.use_spmd_partitioning) VarintField(build, 6, 1);
  if (!o.device_ids.empty()) {
    // One computation (partition) entry per partition, each listing the
    // device of every replica.
    std::string assignment;
    VarintField(assignment, 1, o.num_replicas);
    VarintField(assignment, 2, o.num_partitions);
    for (int p = 0; p < o.num_partitions; ++p) {
      std::string ids;
      for (int r = 0; r < o.num_replicas; ++r) Varint(ids, o.device_ids[r * o.num_partitions + p]);
      std::string computation;
      BytesField(computation, 1, ids);  // packed repeated int64
      BytesField(assignment, 3, computation);
    }
    BytesField(build, 9, assignment);
  }
  std::string out;
  BytesField(out, 3, build);
  std::string no, entry;
  VarintField(no, 2, 0);  // bool_field = false
  BytesField(entry, 1, "xla_allow_excess_precision");
  BytesField(entry, 2, no);
  BytesField(out, 7, entry);
  return out;
}

}  // namespace tpj::pjrt
