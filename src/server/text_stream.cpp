#include "server/text_stream.h"

#include <algorithm>

namespace kvlab::server {

size_t incomplete_utf8_tail(const std::string & s) {
    // look back at most 3 bytes for the lead byte of the last sequence
    for (size_t back = 1; back <= std::min<size_t>(4, s.size()); ++back) {
        const auto c = static_cast<unsigned char>(s[s.size() - back]);
        if ((c & 0xC0) == 0x80) continue;  // a continuation byte
        const size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

TextStream::TextStream(const Tokenizer & tok, std::vector<std::string> stops) : tok_(tok) {
    for (auto & s : stops)
        if (!s.empty()) stops_.push_back(std::move(s));
}

std::string TextStream::push(int32_t token) {
    if (stopped_) return "";
    tokens_.push_back(token);
    const std::string full = tok_.decode(tokens_);
    // a stop string may start inside text already released only if it was held back: search
    // from the first byte that could begin one
    size_t longest = 0;
    for (const auto & s : stops_) longest = std::max(longest, s.size());
    const size_t from = released_.size() > longest ? released_.size() - longest : 0;
    size_t cut = std::string::npos;
    for (const auto & s : stops_) cut = std::min(cut, full.find(s, from));
    if (cut != std::string::npos) {
        stopped_ = true;
        const std::string out = cut > released_.size() ? full.substr(released_.size(), cut - released_.size()) : "";
        released_ += out;
        return out;
    }
    // hold back an incomplete character and the longest tail that begins a stop string
    size_t hold = incomplete_utf8_tail(full);
    for (const auto & s : stops_)
        for (size_t k = std::min(s.size() - 1, full.size()); k > hold; --k)
            if (full.compare(full.size() - k, k, s, 0, k) == 0) {
                hold = k;
                break;
            }
    const size_t end = full.size() - hold;
    if (end <= released_.size()) return "";
    std::string out = full.substr(released_.size(), end - released_.size());
    released_ += out;
    return out;
}

std::string TextStream::finish() {
    if (stopped_) return "";
    const std::string full = tok_.decode(tokens_);
    if (full.size() <= released_.size()) return "";
    std::string out = full.substr(released_.size());
    released_ += out;
    return out;
}

}  // namespace kvlab::server
