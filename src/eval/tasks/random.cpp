// Seeded randomness of the task generators: one mt19937_64 per sample, seeded by a hash of
// what identifies the sample, so that a sample never depends on which others are made.
#include <cstring>

#include "eval/tasks/task.h"

namespace kvlab::eval::tasks {
namespace {

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t fnv1a(uint64_t h, const void * data, size_t n) {
    const auto * p = static_cast<const unsigned char *>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

}  // namespace

std::mt19937_64 sample_rng(uint64_t seed, const std::string & task, int64_t length, double depth, int index) {
    uint64_t depth_bits = 0;
    std::memcpy(&depth_bits, &depth, sizeof depth);
    const int64_t idx = index;
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv1a(h, &seed, sizeof seed);
    h = fnv1a(h, task.data(), task.size());
    h = fnv1a(h, &length, sizeof length);
    h = fnv1a(h, &depth_bits, sizeof depth_bits);
    h = fnv1a(h, &idx, sizeof idx);
    return std::mt19937_64(splitmix64(h));
}

std::string digits(std::mt19937_64 & rng, int n) {
    uint64_t lo = 1;
    for (int i = 1; i < n; ++i) lo *= 10;
    return std::to_string(lo + rng() % (9 * lo));
}

std::string letters(std::mt19937_64 & rng, int n, char first) {
    std::string s(size_t(n), first);
    for (char & c : s) c = char(first + pick(rng, 26));
    return s;
}

}  // namespace kvlab::eval::tasks
