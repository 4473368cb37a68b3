#include "runtime/cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "pjrt/compile_options.h"
#include "runtime/warnings.h"

namespace tpj::runtime {
namespace {

constexpr char kMagic[4] = {'T', 'P', 'J', 'C'};
// Format 2: the entry names its own key, so that a file copied over another
// entry's (a merged cache directory) is never run for the other program.
constexpr uint32_t kFormat = 2;

uint64_t Fnv(const char* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<uint8_t>(p[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool MakeDirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty()) {
        struct stat st;
        if (::stat(cur.c_str(), &st) != 0 && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
      }
    }
    if (i < path.size()) cur.push_back(path[i]);
  }
  return true;
}

}  // namespace

std::shared_ptr<pjrt::Executable> CompileCache::Lookup(const std::string& key) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.second);
  return it->second.first;
}

void CompileCache::Insert(const std::string& key, std::shared_ptr<pjrt::Executable> exe) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = map_.find(key);
  if (it != map_.end()) {
    it->second.first = std::move(exe);
    lru_.splice(lru_.begin(), lru_, it->second.second);
    return;
  }
  lru_.push_front(key);
  map_[key] = {std::move(exe), lru_.begin()};
  while (map_.size() > capacity_) {
    map_.erase(lru_.back());
    lru_.pop_back();
  }
}

size_t CompileCache::size() const {
  std::lock_guard<std::mutex> l(mu_);
  return map_.size();
}

void CompileCache::Clear() {
  std::lock_guard<std::mutex> l(mu_);
  map_.clear();
  lru_.clear();
}

void CompileCache::SetDiskDir(const std::string& dir, bool readonly, const std::string& fingerprint) {
  std::lock_guard<std::mutex> l(mu_);
  if (dir.empty()) {
    dir_.clear();
    return;
  }
  const std::string full = dir + "/" + fingerprint;
  if (!readonly && !MakeDirs(full)) {
    throw pjrt::Error(pjrt::Code::kPermissionDenied, "cannot create the compile cache directory '" + full + "'");
  }
  struct stat st;
  if (::stat(full.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw pjrt::Error(pjrt::Code::kNotFound, "the compile cache directory '" + full + "' does not exist");
  }
  if (!readonly && ::access(full.c_str(), W_OK) != 0) {
    Warn("the compile cache directory '" + full + "' is read-only: programs are read from it, new ones are not written");
    readonly = true;
  }
  dir_ = full;
  readonly_ = readonly;
}

std::string CompileCache::disk_dir() const {
  std::lock_guard<std::mutex> l(mu_);
  return dir_;
}

std::string CompileCache::PathFor(const std::string& key) const { return dir_ + "/" + key + ".pjrtexe"; }

std::shared_ptr<pjrt::Executable> CompileCache::LoadDisk(const std::string& key, pjrt::Client& client,
                                                         const pjrt::CompileOptions& options,
                                                         std::vector<pjrt::ArgSpec> args, bool* corrupt) {
  *corrupt = false;
  std::string path;
  bool readonly;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (dir_.empty()) return nullptr;
    path = PathFor(key);
    readonly = readonly_;
  }
  // A bad entry is recompiled; deleted too, unless the cache is read-only.
  auto drop = [&] {
    *corrupt = true;
    if (!readonly) std::remove(path.c_str());
    return nullptr;
  };
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return nullptr;
  if (!S_ISREG(st.st_mode)) {  // a directory or a FIFO (whose open would block) is no entry
    *corrupt = true;
    return nullptr;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return nullptr;
  std::string data;
  try {
    data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception&) {  // a read error
    return drop();
  }
  const size_t header = 4 + 4 + 8 + 8;
  if (data.size() < header || std::memcmp(data.data(), kMagic, 4) != 0) return drop();
  uint32_t format;
  uint64_t len, sum;
  std::memcpy(&format, data.data() + 4, 4);
  std::memcpy(&len, data.data() + 8, 8);
  std::memcpy(&sum, data.data() + 16, 8);
  if (format != kFormat || len != data.size() - header || Fnv(data.data() + header, len) != sum) return drop();
  // the body: the key's length (4 bytes), the key, the serialized executable
  uint32_t key_len;
  if (len < 4) return drop();
  std::memcpy(&key_len, data.data() + header, 4);
  if (key_len != key.size() || len < 4 + key_len || data.compare(header + 4, key_len, key) != 0) return drop();
  try {
    return std::shared_ptr<pjrt::Executable>(
        client.Deserialize(data.substr(header + 4 + key_len), options, std::move(args)));
  } catch (const pjrt::Error&) {
    return drop();
  }
}

void CompileCache::StoreDisk(const std::string& key, const pjrt::Executable& exe) {
  std::string path;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (dir_.empty() || readonly_) return;
    path = PathFor(key);
  }
  const uint32_t key_len = static_cast<uint32_t>(key.size());
  std::string payload(reinterpret_cast<const char*>(&key_len), 4);
  payload += key;
  payload += exe.Serialize();
  std::string out(kMagic, 4);
  const uint64_t len = payload.size(), sum = Fnv(payload.data(), payload.size());
  out.append(reinterpret_cast<const char*>(&kFormat), 4);
  out.append(reinterpret_cast<const char*>(&len), 8);
  out.append(reinterpret_cast<const char*>(&sum), 8);
  out += payload;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;  // an unwritable cache is not an error: we compiled anyway
    f.write(out.data(), static_cast<std::streamsize>(out.size()));
    if (!f) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

std::string CompileCache::Fingerprint(const pjrt::Plugin& plugin, const std::string& platform_version,
                                      const std::string& compiler_settings) {
  std::ostringstream os;
  os << plugin.attribute("xla_version") << "|" << plugin.major_version() << "." << plugin.minor_version() << "|"
     << platform_version << "|";
  struct stat st;
  if (::stat(plugin.path().c_str(), &st) == 0) {
    os << st.st_size << "|" << st.st_mtime;
  }
  if (!compiler_settings.empty()) os << "|flags:" << compiler_settings;  // empty: the keys of earlier releases
  // the fixed part of every program's compile options (the per-program
  // part, replicas and devices, is in each key)
  const std::string fixed = pjrt::EncodeCompileOptions(pjrt::CompileOptions{});
  os << "|options:" << Hex(Fnv(fixed.data(), fixed.size()));
  const std::string s = os.str();
  return "xla" + plugin.attribute("xla_version") + "-" + Hex(Fnv(s.data(), s.size()));
}

}  // namespace tpj::runtime
