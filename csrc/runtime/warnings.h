// Warnings for the user: something torch-pjrt worked around (an unusable
// compile cache or dump directory) and the run goes on.
//
// Warn() may be called anywhere, under any lock: it only queues the message.
// FlushWarnings() delivers the queue to the sink and must be called holding
// no runtime lock, because the sink may take the Python GIL (the bindings
// route warnings to Python's `warnings` module; see docs/environment.md).
// Without a sink, messages go to stderr. Thread-safe.
#pragma once

#include <functional>
#include <string>

namespace tpj::runtime {

void Warn(std::string message);

// Delivers the queued warnings, each once, in order. An exception of the
// sink (Python's `-W error` turns the warning into one) propagates after the
// rest of the queue is dropped.
void FlushWarnings();

// Whether Warn() queued anything not delivered yet (cheap: an atomic read).
bool WarningsQueued();

// The sink lives for the process; null restores stderr.
void SetWarningSink(std::function<void(const std::string&)> sink);

}  // namespace tpj::runtime
