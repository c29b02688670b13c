// Errors in three tiers (docs/design.md, "Style"): user and I/O errors throw kvlab::Error whose
// message starts with the component ("[gguf] ..."); broken invariants use
// KVLAB_ASSERT (always on); the library never calls exit().
#pragma once

#include <stdexcept>
#include <string>

namespace kvlab {

class Error : public std::runtime_error {
public:
    Error(const std::string & component, const std::string & message)
        : std::runtime_error("[" + component + "] " + message) {}
};

// Work refused up front because the machine lacks the memory it needs (require_memory in
// kvlab/sys.h): "[memory] <what> needs N bytes ...".
class MemoryError : public Error {
public:
    explicit MemoryError(const std::string & message) : Error("memory", message) {}
};

[[noreturn]] void assert_fail(const char * expr, const char * file, int line, const char * msg);

}  // namespace kvlab

#define KVLAB_ASSERT(cond, msg)                                              \
    do {                                                                     \
        if (!(cond)) ::kvlab::assert_fail(#cond, __FILE__, __LINE__, (msg)); \
    } while (0)
