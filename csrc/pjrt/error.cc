#include "pjrt/error.h"

#include <cstdio>
#include <string>
#include <string_view>

namespace tpj::pjrt {

bool Error::out_of_memory() const {
  if (code_ == static_cast<int>(Code::kResourceExhausted)) return true;
  return code_ == static_cast<int>(Code::kInternal) && std::string_view(what()).find("Out of memory") != std::string_view::npos;
}

namespace {

struct Taken {
  int code = 2;
  std::string message;
};

// Reads and frees an error. Error_Message and Error_Destroy are mandatory
// entries of every PJRT version, so they are called without a presence check
// beyond non-null.
Taken Take(const pjrt_abi::Api* api, pjrt_abi::Error* err) noexcept {
  Taken t;
  if (api->PJRT_Error_Message) {
    auto m = pjrt_abi::make<pjrt_abi::ErrorMessageArgs>();
    m.error = err;
    api->PJRT_Error_Message(&m);
    if (m.message) t.message.assign(m.message, m.message_size);
  }
  if (api->PJRT_Error_GetCode) {
    auto c = pjrt_abi::make<pjrt_abi::ErrorGetCodeArgs>();
    c.error = err;
    if (api->PJRT_Error_GetCode(&c) == nullptr) t.code = c.code;
  }
  if (api->PJRT_Error_Destroy) {
    auto d = pjrt_abi::make<pjrt_abi::ErrorDestroyArgs>();
    d.error = err;
    api->PJRT_Error_Destroy(&d);
  }
  return t;
}

}  // namespace

const char* CodeName(int code) {
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  return (code >= 0 && code <= 16) ? kNames[code] : "UNKNOWN";
}

// XLA's CPU client fails a program one of whose inputs holds an earlier
// program's error with that error behind "Error dispatching computation: ",
// once per program it went through: a training loop that goes on after a
// failure grew the message by one prefix per step. Said once, with what it
// means.
namespace {
std::string Explained(std::string message) {
  static constexpr std::string_view kDispatch = "Error dispatching computation: ";
  const size_t first = message.find(kDispatch);
  if (first == std::string::npos) return message;
  size_t end = first;
  while (std::string_view(message).substr(end, kDispatch.size()) == kDispatch) end += kDispatch.size();
  message.replace(first, end - first, kEarlierFailure);
  return message;
}
}  // namespace

void ThrowIfError(const pjrt_abi::Api* api, pjrt_abi::Error* err, const char* call) {
  if (err == nullptr) return;
  Taken t = Take(api, err);
  throw Error(t.code, std::string(call) + ": " + CodeName(t.code) + ": " + Explained(std::move(t.message)));
}

void DiscardError(const pjrt_abi::Api* api, pjrt_abi::Error* err) noexcept {
  if (err != nullptr) Take(api, err);
}

bool ReportIfError(const pjrt_abi::Api* api, pjrt_abi::Error* err, const char* call) noexcept {
  if (err == nullptr) return true;
  Taken t = Take(api, err);
  std::fprintf(stderr, "torch_pjrt: %s failed during cleanup: %s: %s\n", call, CodeName(t.code),
               t.message.c_str());
  return false;
}

}  // namespace tpj::pjrt
