// A loaded PJRT plugin: its API table, version and attributes.
//
// A plugin is loaded once per path with RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE
// and never unloaded (plugins keep static registries). Plugin objects are
// shared and immutable after Load(); they are safe to use from any thread.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "pjrt/c_api.h"
#include "pjrt/error.h"

namespace tpj::pjrt {

// True in a process forked after a plugin was loaded.
bool InForkedChild() noexcept;

class Plugin {
 public:
  // Loads (or returns the already loaded) plugin at `path`, checks the API
  // version (major 0, minor >= 57) and calls PJRT_Plugin_Initialize once.
  // Throws Error with a sentence a user can act on.
  static std::shared_ptr<const Plugin> Load(const std::string& path);

  const pjrt_abi::Api* api() const { return api_; }
  const std::string& path() const { return path_; }
  int major_version() const { return major_; }
  int minor_version() const { return minor_; }

  // Plugin attributes rendered as text (lists joined by ','). Empty if the
  // plugin has none.
  const std::map<std::string, std::string>& attributes() const { return attributes_; }
  std::string attribute(const std::string& key) const;  // "" when absent

  // True when the table has a non-null entry at `offset` that its
  // struct_size covers.
  bool Has(size_t offset) const;

  // Calls one entry of the table: refuses (by name) an entry the plugin does
  // not provide, converts and frees the returned error.
  //
  // In a child forked after a plugin was loaded, the plugin's threads and
  // locks did not survive the fork: Call throws (kFailedPrecondition) and
  // CallNoThrow does nothing, so objects inherited from the parent are
  // dropped without touching the plugin.
  template <class A>
  void Call(pjrt_abi::Fn<A> pjrt_abi::Api::*member, size_t offset, const char* name,
            A* args) const {
    RefuseInForkedChild();
    Require(offset, name);
    ThrowIfError(api_, (api_->*member)(args), name);
  }
  // The same for calls in destructors: never throws, reports on stderr.
  template <class A>
  void CallNoThrow(pjrt_abi::Fn<A> pjrt_abi::Api::*member, size_t offset, const char* name,
                   A* args) const noexcept {
    if (InForkedChild() || !Has(offset)) return;
    ReportIfError(api_, (api_->*member)(args), name);
  }

  void Require(size_t offset, const char* name) const;
  static void RefuseInForkedChild();

 private:
  Plugin() = default;
  const pjrt_abi::Api* api_ = nullptr;
  std::string path_;
  int major_ = 0;
  int minor_ = 0;
  std::map<std::string, std::string> attributes_;
};

}  // namespace tpj::pjrt

// TPJ_CALL(plugin, PJRT_Client_Create, &args): the checked call of one entry.
#define TPJ_CALL(plugin, name, args) \
  (plugin).Call(&pjrt_abi::Api::name, offsetof(pjrt_abi::Api, name), #name, args)
#define TPJ_CALL_NOTHROW(plugin, name, args) \
  (plugin).CallNoThrow(&pjrt_abi::Api::name, offsetof(pjrt_abi::Api, name), #name, args)
#define TPJ_HAS(plugin, name) (plugin).Has(offsetof(pjrt_abi::Api, name))
