// The compile cache: graph hash + device -> loaded executable.
//
// In memory: bounded, least recently used entries are dropped. On disk
// (optional): one file per entry under <dir>/<plugin fingerprint>/, written
// to a temporary name and renamed (atomic), with a magic, a length and a
// checksum; an entry that fails any check, or that the plugin refuses to
// load, is deleted and reported as a miss. The fingerprint covers the
// plugin's XLA version, PJRT API version, platform version and the plugin
// file's size and time, so another plugin never reads our entries, and the
// XLA_FLAGS in force (the plugin reads them once per process, so the memory
// cache needs no such key; replica count and devices, the rest of the
// compile options, are in every key).
// Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "pjrt/client.h"
#include "pjrt/executable.h"

namespace tpj::runtime {

class CompileCache {
 public:
  explicit CompileCache(size_t capacity = 512) : capacity_(capacity) {}

  std::shared_ptr<pjrt::Executable> Lookup(const std::string& key);
  void Insert(const std::string& key, std::shared_ptr<pjrt::Executable> exe);
  size_t size() const;
  void Clear();

  // Enables the disk cache in `dir` (created if missing). readonly: never
  // write. Throws when the directory cannot be created (or, readonly, does
  // not exist); one we cannot write is used read-only, with a Warn().
  void SetDiskDir(const std::string& dir, bool readonly, const std::string& fingerprint);
  std::string disk_dir() const;

  // Loads `key` from disk, or null. Corrupt entries are removed; *corrupt
  // says whether one was found.
  std::shared_ptr<pjrt::Executable> LoadDisk(const std::string& key, pjrt::Client& client,
                                             const pjrt::CompileOptions& options,
                                             std::vector<pjrt::ArgSpec> args, bool* corrupt);
  void StoreDisk(const std::string& key, const pjrt::Executable& exe);

  // Fingerprint of a plugin and the compiler settings that are not in the
  // program (`compiler_settings`: XLA_FLAGS; and the option overrides every
  // program is compiled with, pjrt/compile_options.h) for disk keys.
  static std::string Fingerprint(const pjrt::Plugin& plugin, const std::string& platform_version,
                                 const std::string& compiler_settings);

 private:
  std::string PathFor(const std::string& key) const;

  mutable std::mutex mu_;
  size_t capacity_;
  std::list<std::string> lru_;  // front = most recent
  std::unordered_map<std::string, std::pair<std::shared_ptr<pjrt::Executable>, std::list<std::string>::iterator>> map_;
  std::string dir_;
  bool readonly_ = false;
};

}  // namespace tpj::runtime
