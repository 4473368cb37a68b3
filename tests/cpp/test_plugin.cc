#include "test_plugin.h"

#include <vector>

#include "runtime/options.h"

namespace tpj::testing {

std::string PluginPath() {
  std::vector<std::string> dirs;
  std::string all = TPJ_TEST_SEARCH_PATH;
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(':', start);
    if (end == std::string::npos) end = all.size();
    if (end > start) dirs.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return runtime::ChoosePlugin(runtime::Options::FromEnvironment(), "", dirs).path;
}

std::shared_ptr<pjrt::Client> SharedClient() {
  // Never destroyed, like the runtime's client: destroying it at exit would
  // call into the plugin after the plugin's own statics (created lazily, at the
  // first execute, so destroyed before ours) are gone; the API-0.106 build
  // aborts there ("recursive_mutex lock failed").
  static const auto* client = new std::shared_ptr<pjrt::Client>([] {
    auto plugin = pjrt::Plugin::Load(PluginPath());
    std::vector<pjrt::NamedOption> options;
    const std::string dev = runtime::Options::FromEnvironment().device;
    if (dev.empty() || dev == "CPU") {
      options.push_back({"cpu_device_count", int64_t{4}});
    }
    return pjrt::Client::Create(plugin, options);
  }());
  return *client;
}

}  // namespace tpj::testing
