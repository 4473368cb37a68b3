// The environment -> options mapping (runtime/options.h): every variable
// parses, malformed values are errors naming the variable, and the plugin
// choice and client options follow the documented rules.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "pjrt/error.h"
#include "runtime/options.h"

namespace tpj::runtime {
namespace {

// Sets variables for one test and restores the environment afterwards.
class Env {
 public:
  ~Env() {
    for (const auto& [name, old] : saved_) {
      if (old.second) {
        ::setenv(name.c_str(), old.first.c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  void Set(const std::string& name, const std::string& value) {
    if (!saved_.count(name)) {
      const char* v = std::getenv(name.c_str());
      saved_[name] = {v ? v : "", v != nullptr};
    }
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  void Unset(const std::string& name) {
    Set(name, "");  // saves the old value
    ::unsetenv(name.c_str());
  }

 private:
  std::map<std::string, std::pair<std::string, bool>> saved_;
};

TEST(Options, EveryVariableIsListedOnce) {
  std::set<std::string> names;
  for (const auto& v : EnvironmentVariables()) {
    EXPECT_TRUE(names.insert(v.name).second) << v.name;
    EXPECT_STRNE(v.meaning, "") << v.name;
  }
  for (const char* n : {"PJRT_DEVICE", "TORCH_PJRT_PLUGIN", "CPU_NUM_DEVICES", "TORCH_PJRT_CACHE_DIR",
                        "TORCH_PJRT_DUMP_DIR", "TORCH_PJRT_DEBUG", "TORCH_PJRT_FALLBACK", "RANK", "WORLD_SIZE"}) {
    EXPECT_TRUE(names.count(n)) << n;
  }
}

TEST(Options, ParsesValues) {
  Env env;
  env.Set("PJRT_DEVICE", "cuda");
  env.Set("CPU_NUM_DEVICES", "8");
  env.Set("TORCH_PJRT_SEARCH_PATH", "/a::/b");
  env.Set("TORCH_PJRT_FALLBACK", "warn");
  env.Set("TORCH_PJRT_DEBUG", "0");
  env.Set("TORCH_PJRT_DIST_TIMEOUT", "2.5");
  env.Set("RANK", "1");
  env.Set("WORLD_SIZE", "2");
  const Options o = Options::FromEnvironment();
  EXPECT_EQ(o.device, "CUDA");
  EXPECT_EQ(o.cpu_device_count, 8);
  EXPECT_EQ(o.search_path, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(o.fallback, FallbackMode::kWarn);
  EXPECT_FALSE(o.debug);
  EXPECT_DOUBLE_EQ(o.dist_timeout_s, 2.5);
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.world_size, 2);
}

TEST(Options, SizesNotGivenAreTheSmallestConsistentWithTheRank) {
  // Lightning's spawn strategies set LOCAL_RANK and RANK but no sizes.
  Env env;
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) env.Unset(name);
  env.Set("LOCAL_RANK", "1");
  env.Set("RANK", "3");
  const Options o = Options::FromEnvironment();
  EXPECT_EQ(o.local_world_size, 2);
  EXPECT_EQ(o.world_size, 4);
  env.Set("LOCAL_WORLD_SIZE", "1");  // given, and inconsistent: still an error
  EXPECT_THROW(Options::FromEnvironment(), pjrt::Error);
}

void ExpectInvalid(const std::string& name, const std::string& value) {
  Env env;
  env.Set(name, value);
  try {
    Options::FromEnvironment();
    ADD_FAILURE() << name << "=" << value << " was accepted";
  } catch (const pjrt::Error& e) {
    EXPECT_EQ(e.code(), static_cast<int>(pjrt::Code::kInvalidArgument));
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(Options, MalformedValuesNameTheVariable) {
  ExpectInvalid("CPU_NUM_DEVICES", "four");
  ExpectInvalid("CPU_NUM_DEVICES", "0");
  ExpectInvalid("CPU_NUM_DEVICES", "3x");
  ExpectInvalid("TORCH_PJRT_FALLBACK", "sometimes");
  ExpectInvalid("TORCH_PJRT_DIST_TIMEOUT", "-1");
  ExpectInvalid("WORLD_SIZE", "0");
  ExpectInvalid("RANK", "-1");
  ExpectInvalid("TORCH_PJRT_COMPILE_PROGRESS", "-1");
  ExpectInvalid("TORCH_PJRT_COMPILE_PROGRESS", "soon");
  ExpectInvalid("TORCH_PJRT_GPU_PREALLOCATE", "yes");
}

TEST(Options, CompileProgressOnlyWhenAskedFor) {
  Env env;
  env.Set("TORCH_PJRT_COMPILE_PROGRESS", "2.5");
  env.Set("TORCH_PJRT_DEBUG", "");
  env.Set("TORCH_PJRT_LOG_LEVEL", "");
  EXPECT_LT(Options::FromEnvironment().compile_progress_s, 0);  // off: no watcher
  env.Set("TORCH_PJRT_DEBUG", "1");
  EXPECT_DOUBLE_EQ(Options::FromEnvironment().compile_progress_s, 2.5);
  env.Set("TORCH_PJRT_DEBUG", "0");
  env.Set("TORCH_PJRT_LOG_LEVEL", "info");
  EXPECT_DOUBLE_EQ(Options::FromEnvironment().compile_progress_s, 2.5);
  env.Set("TORCH_PJRT_COMPILE_PROGRESS", "");
  EXPECT_DOUBLE_EQ(Options::FromEnvironment().compile_progress_s, 5);
}

TEST(Options, InconsistentTopologyIsAnError) {
  Env env;
  env.Set("RANK", "2");
  env.Set("WORLD_SIZE", "2");
  EXPECT_THROW(Options::FromEnvironment(), pjrt::Error);
}

TEST(Options, ExplicitPluginWinsOverDevice) {
  Options o;
  o.plugin = "/some/where/p.so";
  o.device = "CPU";
  const pjrt::PluginChoice c = ChoosePlugin(o, "CUDA", {});
  EXPECT_EQ(c.path, "/some/where/p.so");
  EXPECT_EQ(c.reason, "TORCH_PJRT_PLUGIN");
}

TEST(Options, ClientOptionsFollowThePlugin) {
  Options o;
  o.cpu_device_count = 3;
  auto cpu = ClientOptions(o, {"x.so", "CPU", ""});
  ASSERT_EQ(cpu.size(), 1u);
  EXPECT_EQ(cpu[0].name, "cpu_device_count");
  EXPECT_EQ(std::get<int64_t>(cpu[0].value), 3);
  // One process: all devices, allocated as they go (eager CUDA keeps room).
  auto one = ClientOptions(o, {"x.so", "CUDA", ""});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].name, "preallocate");
  EXPECT_FALSE(std::get<bool>(one[0].value));
  o.gpu_preallocate = true;
  EXPECT_TRUE(std::get<bool>(ClientOptions(o, {"x.so", "ROCM", ""})[0].value));
  o.world_size = 2;
  o.local_rank = 1;
  auto gpu = ClientOptions(o, {"x.so", "CUDA", ""});
  ASSERT_EQ(gpu.size(), 2u);
  EXPECT_EQ(gpu[1].name, "visible_devices");
  EXPECT_EQ(std::get<std::vector<int64_t>>(gpu[1].value), (std::vector<int64_t>{1}));
  EXPECT_TRUE(ClientOptions(o, {"x.so", "TPU", ""}).empty());
}

}  // namespace
}  // namespace tpj::runtime
