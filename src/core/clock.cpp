// The steady clock every timing reads, and shell quoting for the commands results record.
#include <chrono>
#include <string>

#include "kvlab/sys.h"

namespace kvlab {

double now_seconds() {
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

std::string shell_quote(const std::string & s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

}  // namespace kvlab
