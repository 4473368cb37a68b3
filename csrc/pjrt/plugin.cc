#include "pjrt/plugin.h"

#include <dlfcn.h>
#include <elf.h>
#include <pthread.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>

namespace tpj::pjrt {
namespace {

// Formatted without iostreams (no locale): the text of plugin attributes is
// read while the plugin loads.
std::string NamedValueText(const pjrt_abi::NamedValue& v) {
  switch (v.type) {
    case pjrt_abi::kString:
      return v.string_value ? std::string(v.string_value, v.value_size) : "";
    case pjrt_abi::kInt64:
      return std::to_string(v.int64_value);
    case pjrt_abi::kInt64List: {
      std::string out;
      for (size_t i = 0; i < v.value_size; ++i) out += (i ? "," : "") + std::to_string(v.int64_array_value[i]);
      return out;
    }
    case pjrt_abi::kFloat: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v.float_value));
      return buf;
    }
    case pjrt_abi::kBool:
      return v.bool_value ? "true" : "false";
  }
  return "";
}

// The bytes a 64-bit ELF file's headers say it holds (its program and
// section header tables and every loaded segment), or 0 when `path` is not
// one that can be read. A file shorter than that was cut (an interrupted
// copy or download): dlopen maps it anyway, and touching a page past the
// end kills the process with SIGBUS instead of returning an error.
uint64_t ElfExtent(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return 0;
  uint64_t extent = 0;
  Elf64_Ehdr eh;
  if (std::fread(&eh, sizeof eh, 1, f) == 1 && std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
      eh.e_ident[EI_CLASS] == ELFCLASS64 && eh.e_phentsize == sizeof(Elf64_Phdr)) {
    extent = std::max<uint64_t>(eh.e_phoff + uint64_t{eh.e_phnum} * eh.e_phentsize,
                                eh.e_shoff + uint64_t{eh.e_shnum} * eh.e_shentsize);
    Elf64_Phdr ph;
    for (int i = 0; i < eh.e_phnum && std::fseek(f, static_cast<long>(eh.e_phoff + i * sizeof ph), SEEK_SET) == 0 &&
                    std::fread(&ph, sizeof ph, 1, f) == 1;
         ++i) {
      if (ph.p_type == PT_LOAD) extent = std::max<uint64_t>(extent, ph.p_offset + ph.p_filesz);
    }
  }
  std::fclose(f);
  return extent;
}

}  // namespace

namespace {
std::atomic<bool> forked_child{false};
}  // namespace

bool InForkedChild() noexcept { return forked_child.load(std::memory_order_relaxed); }

void Plugin::RefuseInForkedChild() {
  if (InForkedChild()) {
    throw Error(Code::kFailedPrecondition,
                "cannot use pjrt in a forked subprocess: the parent had loaded the PJRT plugin, whose threads do "
                "not survive fork(). Start workers with the 'spawn' start method (multiprocessing, "
                "DataLoader(multiprocessing_context='spawn')), or use pjrt only in the parent.");
  }
}

std::shared_ptr<const Plugin> Plugin::Load(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Plugin>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  RefuseInForkedChild();
  if (auto it = loaded.find(path); it != loaded.end()) return it->second;
  static std::once_flag at_fork;
  std::call_once(at_fork, [] { ::pthread_atfork(nullptr, nullptr, [] { forked_child = true; }); });

  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw Error(Code::kNotFound,
                "PJRT plugin not found: '" + path +
                "' is not a file. Set TORCH_PJRT_PLUGIN to a plugin .so, or install a "
                "plugin wheel (pip install xla-cpu-pjrt).");
  }
  if (const uint64_t extent = ElfExtent(path); extent > static_cast<uint64_t>(st.st_size)) {
    throw Error(Code::kInvalidArgument, "cannot load PJRT plugin '" + path + "': the file is truncated (" +
                                            std::to_string(st.st_size) + " bytes; its ELF headers describe " +
                                            std::to_string(extent) + "). Reinstall the plugin wheel or copy it again.");
  }
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    throw Error(Code::kInvalidArgument,
                "cannot load PJRT plugin '" + path + "': " + (why ? why : "dlopen failed") +
                ". Is it a shared library built for this machine?");
  }
  using GetApiFn = const pjrt_abi::Api* (*)();
  auto get_api = reinterpret_cast<GetApiFn>(::dlsym(handle, "GetPjrtApi"));
  if (get_api == nullptr) {
    throw Error(Code::kInvalidArgument,
                "'" + path +
                "' is a shared library but not a PJRT plugin: it has no GetPjrtApi symbol.");
  }
  const pjrt_abi::Api* api = get_api();
  if (api == nullptr || api->struct_size < offsetof(pjrt_abi::Api, PJRT_Error_Destroy)) {
    throw Error(Code::kInvalidArgument, "PJRT plugin '" + path + "' returned no usable API table.");
  }

  std::shared_ptr<Plugin> p(new Plugin());
  p->api_ = api;
  p->path_ = path;
  p->major_ = api->pjrt_api_version.major_version;
  p->minor_ = api->pjrt_api_version.minor_version;
  if (p->major_ != pjrt_abi::kMajor || p->minor_ < pjrt_abi::kMinorSupported) {
    std::ostringstream os;
    os << "PJRT plugin '" << path << "' implements PJRT C API " << p->major_ << "." << p->minor_
       << "; torch-pjrt needs " << pjrt_abi::kMajor << "." << pjrt_abi::kMinorSupported
       << " or newer (and major " << pjrt_abi::kMajor << "). Install a newer plugin wheel.";
    throw Error(Code::kFailedPrecondition, os.str());
  }

  auto init = pjrt_abi::make<pjrt_abi::PluginInitializeArgs>();
  TPJ_CALL(*p, PJRT_Plugin_Initialize, &init);

  if (TPJ_HAS(*p, PJRT_Plugin_Attributes)) {
    auto attrs = pjrt_abi::make<pjrt_abi::PluginAttributesArgs>();
    TPJ_CALL(*p, PJRT_Plugin_Attributes, &attrs);
    for (size_t i = 0; i < attrs.num_attributes; ++i) {
      const auto& v = attrs.attributes[i];
      p->attributes_[std::string(v.name, v.name_size)] = NamedValueText(v);
    }
  }
  loaded[path] = p;
  return p;
}

std::string Plugin::attribute(const std::string& key) const {
  auto it = attributes_.find(key);
  return it == attributes_.end() ? std::string() : it->second;
}

bool Plugin::Has(size_t offset) const {
  if (offset + sizeof(void*) > api_->struct_size) return false;
  void* slot;
  std::memcpy(&slot, reinterpret_cast<const char*>(api_) + offset, sizeof(slot));
  return slot != nullptr;
}

void Plugin::Require(size_t offset, const char* name) const {
  if (!Has(offset)) {
    std::ostringstream os;
    os << "PJRT plugin '" << path_ << "' (API " << major_ << "." << minor_ << ") does not provide "
       << name << ", which torch-pjrt needs for this operation.";
    throw Error(Code::kUnimplemented, os.str());
  }
}

}  // namespace tpj::pjrt
