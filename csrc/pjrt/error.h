// The one error type of the PJRT layer, and the one conversion from
// PJRT_Error* to it. Every PJRT_Error* that reaches us is destroyed here.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "pjrt/c_api.h"

namespace tpj::pjrt {

// absl-style status codes, as PJRT reports them (1..16). Our own errors
// (bad input caught before calling the plugin) use the same codes.
enum class Code : int {
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// What an error says in place of XLA's "Error dispatching computation: "
// prefixes: the program failed because an input is an earlier program's
// failed result (that failure is the one to report).
inline constexpr std::string_view kEarlierFailure =
    "an input of this program is the result of an earlier program that failed (not computed again): ";

class Error : public std::runtime_error {
 public:
  Error(Code code, std::string what) : std::runtime_error(std::move(what)), code_(static_cast<int>(code)) {}
  // A code as the plugin reported it (may be outside Code's range).
  Error(int code, std::string what) : std::runtime_error(std::move(what)), code_(code) {}
  int code() const { return code_; }
  // Whether the plugin ran out of memory: RESOURCE_EXHAUSTED, or the XLA CPU
  // plugin's INTERNAL "Out of memory allocating N bytes" (from its
  // allocator, where a GPU plugin says RESOURCE_EXHAUSTED).
  bool out_of_memory() const;

 private:
  int code_;
};

// Name of an absl status code ("INVALID_ARGUMENT"), or "UNKNOWN".
const char* CodeName(int code);

// If `err` is non-null: read its message and code, destroy it, and throw
// Error("<call>: <CODE>: <message>"). Always frees `err`.
void ThrowIfError(const pjrt_abi::Api* api, pjrt_abi::Error* err, const char* call);

// Frees `err` (null is fine) without reading it.
void DiscardError(const pjrt_abi::Api* api, pjrt_abi::Error* err) noexcept;

// For calls that must not throw (destructors): frees `err` and reports it on
// stderr. Returns true when there was no error.
bool ReportIfError(const pjrt_abi::Api* api, pjrt_abi::Error* err, const char* call) noexcept;

}  // namespace tpj::pjrt
