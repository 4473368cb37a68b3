// The one error type of the PJRT layer, and the one conversion from
// PJRT_Error* to it. Every PJRT_Error* that reaches us is destroyed here.
#pragma once

#include <stdexcept>
#include <string>

#include "pjrt/c_api.h"

namespace tpj::pjrt {

// absl-style status codes, as PJRT reports them (1..16); 0 is ours for
// "not from the plugin" (bad input we caught before calling it).
class Error : public std::runtime_error {
 public:
  Error(int code, std::string what) : std::runtime_error(std::move(what)), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// Name of an absl status code ("INVALID_ARGUMENT"), or "UNKNOWN".
const char* CodeName(int code);

// If `err` is non-null: read its message and code, destroy it, and throw
// Error("<call>: <CODE>: <message>"). Always frees `err`.
void ThrowIfError(const pjrt_abi::Api* api, pjrt_abi::Error* err, const char* call);

// For calls that must not throw (destructors): frees `err` and reports it on
// stderr. Returns true when there was no error.
bool ReportIfError(const pjrt_abi::Api* api, pjrt_abi::Error* err, const char* call) noexcept;

}  // namespace tpj::pjrt
