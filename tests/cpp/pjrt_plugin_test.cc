// Loading plugins, versions, attributes, clients and devices.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "pjrt/discovery.h"
#include "pjrt/error.h"
#include "pjrt/plugin.h"
#include "test_plugin.h"

namespace tpj {
namespace {

TEST(Plugin, LoadsAndReportsVersionAndAttributes) {
  auto p = pjrt::Plugin::Load(testing::PluginPath());
  EXPECT_EQ(p->major_version(), 0);
  EXPECT_GE(p->minor_version(), 57);
  EXPECT_FALSE(p->attribute("xla_version").empty());
  EXPECT_FALSE(p->attribute("stablehlo_current_version").empty());
  EXPECT_FALSE(p->attribute("stablehlo_minimum_version").empty());
  // Loading the same path again returns the same plugin (never reloaded).
  EXPECT_EQ(p.get(), pjrt::Plugin::Load(testing::PluginPath()).get());
}

TEST(Plugin, MissingFileIsAClearError) {
  try {
    pjrt::Plugin::Load("/nonexistent/plugin.so");
    FAIL() << "expected an error";
  } catch (const pjrt::Error& e) {
    EXPECT_EQ(e.code(), static_cast<int>(pjrt::Code::kNotFound));
    EXPECT_NE(std::string(e.what()).find("not found"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pip install"), std::string::npos) << e.what();
  }
}

TEST(Plugin, FileThatIsNotALibraryIsAClearError) {
  const std::string path = ::testing::TempDir() + "/not_a_plugin.so";
  std::ofstream(path) << "this is text, not ELF";
  try {
    pjrt::Plugin::Load(path);
    FAIL() << "expected an error";
  } catch (const pjrt::Error& e) {
    EXPECT_EQ(e.code(), static_cast<int>(pjrt::Code::kInvalidArgument));
    EXPECT_NE(std::string(e.what()).find("cannot load PJRT plugin"), std::string::npos) << e.what();
  }
}

TEST(Plugin, LibraryWithoutEntryPointIsAClearError) {
  // libm is a real shared library with no GetPjrtApi.
  for (const char* path : {"/lib/x86_64-linux-gnu/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6",
                           "/usr/lib/x86_64-linux-gnu/libm.so.6"}) {
    if (!std::ifstream(path)) continue;
    try {
      pjrt::Plugin::Load(path);
      FAIL() << "expected an error";
    } catch (const pjrt::Error& e) {
      EXPECT_NE(std::string(e.what()).find("not a PJRT plugin"), std::string::npos) << e.what();
    }
    return;
  }
  GTEST_SKIP() << "no libm found at the usual paths";
}

TEST(Plugin, TooOldPluginIsRefused) {
  // A fake plugin built from our own declarations that reports API 0.40.
  const char* fake = std::getenv("TPJ_FAKE_OLD_PLUGIN");
  ASSERT_NE(fake, nullptr) << "CTest sets TPJ_FAKE_OLD_PLUGIN";
  try {
    pjrt::Plugin::Load(fake);
    FAIL() << "expected an error";
  } catch (const pjrt::Error& e) {
    EXPECT_EQ(e.code(), static_cast<int>(pjrt::Code::kFailedPrecondition));
    EXPECT_NE(std::string(e.what()).find("0.40"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("0.57 or newer"), std::string::npos) << e.what();
  }
}

TEST(Discovery, ExplicitPathWins) {
  auto c = pjrt::FindPlugin(pjrt::PluginRequest{"/some/where/p.so", "CUDA", "TORCH_PJRT_PLUGIN", {}});
  EXPECT_EQ(c.path, "/some/where/p.so");
  EXPECT_EQ(c.device, "CUDA");
  EXPECT_EQ(c.reason, "TORCH_PJRT_PLUGIN");
}

TEST(Discovery, FindsCpuPluginInSitePackagesLayout) {
  const std::string dir = ::testing::TempDir() + "/site_a";
  ASSERT_EQ(std::system(("mkdir -p " + dir + "/xla_plugins/xla_cpu_pjrt").c_str()), 0);
  std::ofstream(dir + "/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so") << "x";
  auto c = pjrt::FindPlugin("cpu", {"/nonexistent", dir});
  EXPECT_EQ(c.path, dir + "/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so");
  EXPECT_EQ(c.device, "CPU");
}

TEST(Discovery, FindsCudaAndTpuLayouts) {
  const std::string dir = ::testing::TempDir() + "/site_b";
  ASSERT_EQ(std::system(("mkdir -p " + dir + "/jax_plugins/xla_cuda13 " + dir + "/libtpu").c_str()), 0);
  std::ofstream(dir + "/jax_plugins/xla_cuda13/xla_cuda_plugin.so") << "x";
  std::ofstream(dir + "/libtpu/libtpu.so") << "x";
  EXPECT_EQ(pjrt::FindPlugin("CUDA", {dir}).path, dir + "/jax_plugins/xla_cuda13/xla_cuda_plugin.so");
  EXPECT_EQ(pjrt::FindPlugin("TPU", {dir}).path, dir + "/libtpu/libtpu.so");
}

TEST(Discovery, ThreeCpuLayoutsInRuleOrder) {
  const std::string dir = ::testing::TempDir() + "/site_c";
  ASSERT_EQ(std::system(("mkdir -p " + dir + "/fastatomstruct_xla_cpu " + dir + "/lammps_jax_pjrt_cpu").c_str()), 0);
  std::ofstream(dir + "/fastatomstruct_xla_cpu/libpjrt_cpu.so") << "x";
  std::ofstream(dir + "/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so") << "x";
  auto found = pjrt::ListPlugins("CPU", {dir});
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].package, "lammps-jax-pjrt-cpu");
  EXPECT_EQ(found[1].package, "fastatomstruct-xla-cpu");
  pjrt::ProbeApiVersions(found);  // neither is a library: never chosen
  EXPECT_NE(found[0].problem.find("cannot be loaded"), std::string::npos) << found[0].problem;
  EXPECT_EQ(pjrt::PickNewestApi(found), -1);
  EXPECT_EQ(pjrt::DeviceOfKnownLayout(dir + "/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so"), "CPU");
  EXPECT_EQ(pjrt::DeviceOfKnownLayout("/x/libpjrt_cpu.so"), "");
}

TEST(Discovery, NewestSupportedApiWins) {
  std::vector<pjrt::PluginCandidate> c(3);
  c[0].api_major = 0, c[0].api_minor = 81;
  c[1].api_major = 0, c[1].api_minor = 115;
  c[2].api_major = 0, c[2].api_minor = 106;
  EXPECT_EQ(pjrt::PickNewestApi(c), 1);
  c[1].api_major = 1;  // another major: not supported
  EXPECT_EQ(pjrt::PickNewestApi(c), 2);
  c[2].api_minor = 81;  // a tie: the earlier layout
  EXPECT_EQ(pjrt::PickNewestApi(c), 0);
}

TEST(Discovery, RegisteredNameWins) {
  pjrt::RegisterPlugin("myaccel", "/opt/vendor/pjrt_myaccel.so");
  EXPECT_EQ(pjrt::FindPlugin("MYACCEL", {}).path, "/opt/vendor/pjrt_myaccel.so");
}

TEST(Discovery, MissingPluginNamesThePackage) {
  try {
    pjrt::FindPlugin("CUDA", {"/nonexistent"});
    FAIL() << "expected an error";
  } catch (const pjrt::Error& e) {
    EXPECT_EQ(e.code(), static_cast<int>(pjrt::Code::kNotFound));
    EXPECT_NE(std::string(e.what()).find("jax-cuda13-pjrt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("TORCH_PJRT_PLUGIN"), std::string::npos) << e.what();
  }
}

TEST(Client, DevicesAndPlatform) {
  auto c = testing::SharedClient();
  EXPECT_FALSE(c->platform_name().empty());
  EXPECT_EQ(c->process_index(), 0);
  ASSERT_GE(c->devices().size(), 1u);
  ASSERT_EQ(c->addressable_device_ids().size(), c->devices().size());
  if (c->platform_name() == "cpu") {
    EXPECT_EQ(c->devices().size(), 4u);  // cpu_device_count = 4
  }
  for (const auto& d : c->devices()) {
    EXPECT_TRUE(d.addressable);
    EXPECT_FALSE(d.kind.empty());
    EXPECT_GE(d.local_hardware_id, 0);
  }
  try {
    c->device(1000);
    FAIL() << "expected an error";
  } catch (const pjrt::Error& e) {
    EXPECT_EQ(e.code(), static_cast<int>(pjrt::Code::kOutOfRange));
  }
}

TEST(Client, NamedOptionsReachThePlugin) {
  auto plugin = pjrt::Plugin::Load(testing::PluginPath());
  const char* dev = std::getenv("PJRT_DEVICE");
  if (dev != nullptr && std::string(dev) != "CPU") GTEST_SKIP() << "cpu_device_count is a CPU option";
  auto c = pjrt::Client::Create(plugin, {{"cpu_device_count", int64_t{2}}});
  EXPECT_EQ(c->devices().size(), 2u);
}

}  // namespace
}  // namespace tpj
