// A shared library that looks like a PJRT plugin of API 0.40: used to test
// that torch-pjrt refuses plugins older than 0.57 with a clear error.
#include "pjrt/c_api.h"

extern "C" __attribute__((visibility("default"))) const pjrt_abi::Api* GetPjrtApi() {
  static pjrt_abi::Api api = [] {
    pjrt_abi::Api a{};
    a.struct_size = sizeof(a);
    a.pjrt_api_version.struct_size = sizeof(a.pjrt_api_version);
    a.pjrt_api_version.major_version = 0;
    a.pjrt_api_version.minor_version = 40;
    return a;
  }();
  return &api;
}
