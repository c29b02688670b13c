// Generated tokens to text as it can be released: complete UTF-8 only, stop strings cut
// (the text before the first stop string is the answer; nothing of the stop string or
// after it is ever released, not even a prefix of it that streaming had to hold back).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/text.h"

namespace kvlab::server {

class TextStream {
public:
    TextStream(const Tokenizer & tok, std::vector<std::string> stops);

    // Adds a generated token; returns the text that is now final ("" while a multi-byte
    // character or a possible stop string is still incomplete).
    std::string push(int32_t token);
    // What is still held back, released at the end of generation (nothing once stopped).
    std::string finish();
    bool stopped() const { return stopped_; }
    const std::string & text() const { return released_; }  // everything released so far

private:
    const Tokenizer & tok_;
    std::vector<std::string> stops_;
    std::vector<int32_t> tokens_;
    std::string released_;
    bool stopped_ = false;
};

// Bytes at the end of s that begin an incomplete UTF-8 sequence (0 when s ends whole).
size_t incomplete_utf8_tail(const std::string & s);

}  // namespace kvlab::server
