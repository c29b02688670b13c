// Evaluation tasks: needle-in-a-haystack, passkey retrieval and RULER's synthetic tasks,
// each sample generated from its own seed (seed, task, length, depth, index), fitted to the
// target length by binary search on the filler; and the JSONL loader of QA datasets.
#include "eval/tasks.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "kvlab/error.h"

namespace kvlab::eval {
namespace {

using json = nlohmann::json;

constexpr int64_t kMinTokens = 64;  // shorter contexts cannot hold the needles and some filler

// ---- deterministic randomness (libstdc++'s mt19937_64 is specified; distributions are not,
// so integers come from rng() % n and doubles from the top 53 bits)

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

size_t pick(std::mt19937_64 & rng, size_t n) {
    return size_t(rng() % n);
}
double uniform01(std::mt19937_64 & rng) {
    return double(rng() >> 11) * 0x1.0p-53;
}

template <class T>
void shuffle(std::vector<T> & v, std::mt19937_64 & rng) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[pick(rng, i)]);
}

std::string digits(std::mt19937_64 & rng, int n) {  // n decimal digits, the first not 0
    uint64_t lo = 1;
    for (int i = 1; i < n; ++i) lo *= 10;
    return std::to_string(lo + rng() % (9 * lo));
}

std::string letters(std::mt19937_64 & rng, int n, char first) {
    std::string s(size_t(n), first);
    for (char & c : s) c = char(first + pick(rng, 26));
    return s;
}

// ---- words for keys (RULER: adjective-noun) and for common-words extraction

constexpr const char * kAdjectives[] = {
    "ancient", "angry",  "bitter",  "brave",   "bright",  "broad",  "calm",    "careful", "cheerful", "clever",
    "cloudy",  "crisp",  "curious", "damp",    "dark",    "deep",   "distant", "dusty",   "eager",    "elegant",
    "empty",   "fancy",  "fierce",  "fragile", "fresh",   "frozen", "gentle",  "giant",   "glossy",   "golden",
    "grumpy",  "happy",  "heavy",   "hidden",  "hollow",  "honest", "humble",  "hungry",  "icy",      "jolly",
    "juicy",   "lazy",   "little",  "lively",  "lonely",  "loud",   "lucky",   "mellow",  "mighty",   "misty",
    "modern",  "muddy",  "narrow",  "nervous", "noble",   "noisy",  "orange",  "patient", "plain",    "polite",
    "proud",   "purple", "quiet",   "rapid",   "rough",   "royal",  "rusty",   "salty",   "scarlet",  "shiny",
    "silent",  "silly",  "silver",  "simple",  "sleepy",  "slow",   "smooth",  "solid",   "sour",     "spicy",
    "steady",  "sticky", "stormy",  "strange", "strong",  "sunny",  "sweet",   "swift",   "tall",     "tender",
    "thick",   "tidy",   "tiny",    "tough",   "tricky",  "vivid",  "warm",    "wary",    "wild",     "windy",
    "wise",    "witty",  "wooden",  "young",   "zealous", "brisk",  "breezy",  "bumpy",   "chilly",   "crooked",
    "dizzy",   "fluffy", "fuzzy",   "gloomy",  "greasy",  "hasty",  "jagged",  "keen",    "lanky",    "mild",
    "neat",    "pale",   "plump",   "quick",   "rigid",   "rowdy",  "rustic",  "sharp",   "sleek",    "snug",
    "sturdy",  "tame",   "vast",    "wavy",    "weary",   "zany",
};

constexpr const char * kNouns[] = {
    "apple",    "anchor",   "arrow",   "badger",  "balloon",  "banana",   "basket",  "beacon",  "beetle",  "blanket",
    "bottle",   "bridge",   "bucket",  "butter",  "cabin",    "camel",    "candle",  "canyon",  "carpet",  "castle",
    "cherry",   "chimney",  "circus",  "clover",  "coconut",  "comet",    "compass", "cookie",  "copper",  "cotton",
    "cricket",  "crystal",  "curtain", "dolphin", "donkey",   "dragon",   "drum",    "eagle",   "engine",  "falcon",
    "feather",  "fiddle",   "forest",  "fossil",  "fountain", "garden",   "garlic",  "giraffe", "glacier", "goblin",
    "granite",  "guitar",   "hammer",  "harbor",  "helmet",   "hornet",   "island",  "jacket",  "jaguar",  "jelly",
    "kettle",   "kitten",   "ladder",  "lantern", "lemon",    "leopard",  "lizard",  "lobster", "magnet",  "mango",
    "marble",   "meadow",   "mirror",  "monkey",  "mountain", "muffin",   "nugget",  "ocean",   "olive",   "orchid",
    "otter",    "oyster",   "paddle",  "panda",   "parrot",   "peach",    "pebble",  "pencil",  "pepper",  "piano",
    "pillow",   "pirate",   "planet",  "pocket",  "potato",   "pumpkin",  "puzzle",  "rabbit",  "radish",  "raven",
    "ribbon",   "river",    "rocket",  "saddle",  "salmon",   "sandal",   "scooter", "shadow",  "shovel",  "spider",
    "sponge",   "squirrel", "statue",  "summit",  "sunset",   "teapot",   "temple",  "thunder", "tiger",   "tomato",
    "tractor",  "trumpet",  "tulip",   "tunnel",  "turtle",   "umbrella", "valley",  "velvet",  "violin",  "volcano",
    "wagon",    "walnut",   "walrus",  "whistle", "willow",   "window",   "wizard",  "zebra",   "acorn",   "almond",
    "avocado",  "bamboo",   "barrel",  "biscuit", "blossom",  "bonnet",   "buffalo", "cactus",  "canoe",   "carrot",
    "cedar",    "cobra",    "coral",   "cradle",  "crayon",   "dagger",   "desert",  "diamond", "domino",  "elbow",
    "emerald",  "ferry",    "flute",   "fridge",  "galaxy",   "garnet",   "glove",   "gopher",  "hamster", "hazel",
    "hedge",    "igloo",    "ivory",   "jasmine", "kayak",    "koala",    "lagoon",  "lily",    "llama",   "locket",
    "maple",    "marsh",    "mitten",  "moose",   "napkin",   "nectar",   "noodle",  "orbit",   "pasta",   "pelican",
    "penguin",  "pigeon",   "plum",    "pond",    "quartz",   "quilt",    "raccoon", "reef",    "robin",   "ruby",
    "sapphire", "scarf",    "seagull", "shell",   "sled",     "snail",    "sparrow", "spruce",  "stove",   "swan",
    "tablet",   "thimble",  "toaster", "torch",   "trout",    "tuba",     "vase",    "viper",   "waffle",  "wheat",
    "yacht",    "yogurt",
};

struct Vocabulary {
    std::vector<std::string> adjectives, nouns, all;  // no word contains another as a substring
};

// Drops every word that contains another word of either list, so that no key or answer is
// found inside another one by a substring match.
const Vocabulary & vocabulary() {
    static const Vocabulary v = [] {
        std::vector<std::string> every(std::begin(kAdjectives), std::end(kAdjectives));
        every.insert(every.end(), std::begin(kNouns), std::end(kNouns));
        auto keep = [&](const std::string & w) {
            for (const auto & o : every)
                if (o != w && w.find(o) != std::string::npos) return false;
            return true;
        };
        Vocabulary r;
        std::set<std::string> seen;
        for (const char * w : kAdjectives)
            if (keep(w) && seen.insert(w).second) r.adjectives.push_back(w);
        for (const char * w : kNouns)
            if (keep(w) && seen.insert(w).second) r.nouns.push_back(w);
        r.all = r.adjectives;
        r.all.insert(r.all.end(), r.nouns.begin(), r.nouns.end());
        return r;
    }();
    return v;
}

// ---- filler text

const char * const kNoise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

std::vector<std::string> split_words(const std::string & text) {
    std::vector<std::string> words;
    std::istringstream in(text);
    for (std::string w; in >> w;) words.push_back(w);
    return words;
}

bool ends_sentence(const std::string & w) {
    size_t n = w.size();
    while (n > 0 && std::strchr("\"')]", w[n - 1])) --n;
    return n > 0 && std::strchr(".?!", w[n - 1]);
}

// The essays lost some line breaks ("broken.The"): a space goes back between a lower-case
// letter's sentence end and the next capital.
std::vector<std::string> essay_words(const std::string & text) {
    std::string t;
    t.reserve(text.size() + text.size() / 64);
    for (size_t i = 0; i < text.size(); ++i) {
        t += text[i];
        if (i > 0 && i + 1 < text.size() && std::strchr(".?!", text[i]) && std::islower((unsigned char)text[i - 1]) &&
            std::isupper((unsigned char)text[i + 1]))
            t += ' ';
    }
    return split_words(t);
}

struct Filler {
    const std::vector<std::string> * words = nullptr;  // one cycle, repeated as needed
    size_t start = 0;                                  // first word
    bool sentence_cuts = false;                        // end after a whole sentence (noise), else after any word
};

struct FillerText {
    std::string text;
    std::vector<size_t> sentence_starts;  // character offsets where a sentence starts (0 included)
    std::vector<size_t> word_starts;
};

// The first n words of the filler, one space apart (fewer: cut back to a sentence end).
FillerText filler_text(const Filler & f, size_t n) {
    FillerText r;
    size_t cut_len = 0, cut_sentences = 0, cut_words = 0;
    bool prev_end = true;
    const auto & w = *f.words;
    for (size_t i = 0; i < n; ++i) {
        const std::string & word = w[(f.start + i) % w.size()];
        if (!r.text.empty()) r.text += ' ';
        if (prev_end) r.sentence_starts.push_back(r.text.size());
        r.word_starts.push_back(r.text.size());
        r.text += word;
        prev_end = ends_sentence(word);
        if (prev_end)
            cut_len = r.text.size(), cut_sentences = r.sentence_starts.size(), cut_words = r.word_starts.size();
    }
    if (f.sentence_cuts) {
        r.text.resize(cut_len);
        r.sentence_starts.resize(cut_sentences);
        r.word_starts.resize(cut_words);
    }
    if (r.sentence_starts.empty()) r.sentence_starts.push_back(0);
    return r;
}

struct Insert {
    size_t pos;  // a word start of the filler, or its end
    std::string text;
    double rank = 0;  // orders the inserts at one position
};

// The filler with the inserts at their positions, one space between pieces; offsets[i]: where
// inserts[i] starts in the result (inserts at one position keep their order).
std::string assemble(const std::string & filler, const std::vector<Insert> & ins, std::vector<size_t> & offsets) {
    std::vector<size_t> order(ins.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return ins[a].pos != ins[b].pos ? ins[a].pos < ins[b].pos : ins[a].rank < ins[b].rank;
    });
    std::string out;
    size_t extra = 0;
    for (const auto & i : ins) extra += i.text.size() + 1;
    out.reserve(filler.size() + extra);
    offsets.assign(ins.size(), 0);
    size_t cur = 0;
    for (size_t k : order) {
        const Insert & in = ins[k];
        KVLAB_ASSERT(in.pos >= cur && in.pos <= filler.size(), "insert outside the filler");
        out.append(filler, cur, in.pos - cur);
        cur = in.pos;
        if (!out.empty() && out.back() != ' ') out += ' ';
        offsets[k] = out.size();
        out += in.text;
        if (in.pos < filler.size()) out += ' ';
    }
    out.append(filler, cur, std::string::npos);
    return out;
}

// The candidate position (a sentence start, or the end) whose offset_of is nearest target;
// a word start instead when no sentence boundary lies within tol.
template <class OffsetOf>
size_t place(const FillerText & f, double target, double tol, const OffsetOf & offset_of) {
    auto best_of = [&](const std::vector<size_t> & cands, size_t & best, double & miss) {
        best = f.text.size();
        miss = std::fabs(double(offset_of(best)) - target);
        for (size_t c : cands) {
            const double m = std::fabs(double(offset_of(c)) - target);
            if (m < miss) best = c, miss = m;
        }
    };
    size_t best;
    double miss;
    best_of(f.sentence_starts, best, miss);
    if (miss > tol) best_of(f.word_starts, best, miss);
    return best;
}

struct Needles {
    std::string prefix;               // instructions before the filler
    std::string primary;              // at the requested depth of the whole context; empty: none
    double depth = 0.5;               // of the primary
    std::vector<std::string> others;  // at their fractions of the filler (in the order given)
    std::vector<double> fractions;
};

struct Built {
    std::string context;
    size_t primary_offset = 0;
    std::vector<size_t> other_offsets;
    json facts;  // what a builder derived (cwe and fwe: the answers)
};

constexpr double kDepthTolerance = 0.05;  // a sentence boundary this near (fraction of the context) wins

Built build_needles(const Filler & filler, size_t n_words, const Needles & nd) {
    const FillerText f = filler_text(filler, n_words);
    std::vector<size_t> pos;  // the others need no precision: always at a sentence boundary
    for (double fr : nd.fractions)
        pos.push_back(place(f, fr * double(f.text.size()), HUGE_VAL, [](size_t p) { return p; }));
    std::sort(pos.begin(), pos.end());  // keeps the others in order (vt's chain)
    std::vector<Insert> ins;
    size_t others_len = 0;
    for (size_t i = 0; i < nd.others.size(); ++i) {
        ins.push_back({pos[i], nd.others[i], double(i)});
        others_len += nd.others[i].size() + 1;
    }
    if (!nd.primary.empty()) {
        const size_t F = f.text.size();
        const double total = double(nd.prefix.size() + F + others_len + nd.primary.size() + 1);
        const double target = nd.depth * total;
        // where the primary lands at position p after the first m others there, for the best m
        auto at = [&](size_t p) {
            size_t before = 0, best_off = 0, best_m = 0;
            std::vector<size_t> tied;  // lengths of the others at p, in order
            for (const auto & in : ins) {
                if (in.pos < p) before += in.text.size() + 1;
                if (in.pos == p) tied.push_back(in.text.size() + 1);
            }
            for (size_t m = 0; m <= tied.size(); ++m) {
                if (m > 0) before += tied[m - 1];
                const size_t off = nd.prefix.size() + p + before + (p == F && (F > 0 || before > 0) ? 1 : 0);
                if (m == 0 || std::fabs(double(off) - target) < std::fabs(double(best_off) - target))
                    best_off = off, best_m = m;
            }
            return std::pair<size_t, size_t>(best_off, best_m);
        };
        const size_t p = place(f, target, kDepthTolerance * total, [&](size_t q) { return at(q).first; });
        size_t first_tied = 0;
        while (first_tied < pos.size() && pos[first_tied] < p) ++first_tied;
        ins.push_back({p, nd.primary, double(first_tied + at(p).second) - 0.5});
    }
    std::vector<size_t> offsets;
    Built b;
    b.context = nd.prefix + assemble(f.text, ins, offsets);
    for (size_t & o : offsets) o += nd.prefix.size();
    if (!nd.primary.empty()) b.primary_offset = offsets.back(), offsets.pop_back();
    b.other_offsets = offsets;
    return b;
}

// ---- fitting a context to its target length

struct Job {
    std::string task;
    int64_t length;
    double depth;  // < 0: the task has no depth
    const TokenCounter & count;
    const std::vector<std::string> & essay;  // the haystack's words (empty for tasks that don't use it)
    const std::vector<size_t> & essay_sentences;
    const std::vector<std::string> & noise;
    std::mt19937_64 rng;
};

// The build with the largest n (from min_n) whose context has at most job.length tokens.
// make(n) must grow with n; its token count need not be exactly monotone.
template <class Make>
std::pair<Built, int64_t> fit(const Job & job, size_t min_n, const Make & make) {
    auto tokens = [&](const Built & b) { return job.count(b.context); };
    Built best = make(min_n);
    int64_t best_tokens = tokens(best);
    if (best_tokens > job.length)
        throw Error("eval",
                    job.task + ": length " + std::to_string(job.length) +
                        " is too small: the task's smallest context (instructions, needles, shortest list) takes " +
                        std::to_string(best_tokens) + " tokens");
    size_t lo = min_n, hi = std::max<size_t>(min_n + 1, size_t(job.length));
    for (;;) {  // grow hi until it overflows the target
        Built b = make(hi);
        const int64_t t = tokens(b);
        if (t > job.length) break;
        lo = hi, best = std::move(b), best_tokens = t;
        if (hi > (size_t(1) << 40)) return {best, best_tokens};
        hi *= 2;
    }
    while (hi - lo > 1) {
        const size_t mid = lo + (hi - lo) / 2;
        Built b = make(mid);
        const int64_t t = tokens(b);
        if (t <= job.length)
            lo = mid, best = std::move(b), best_tokens = t;
        else
            hi = mid;
    }
    return {best, best_tokens};
}

Filler essay_filler(Job & job) {
    if (job.essay.empty()) throw Error("eval", job.task + ": the haystack is empty");
    return {&job.essay, job.essay_sentences[pick(job.rng, job.essay_sentences.size())], false};
}

Sample needle_sample(Job & job, const Filler & filler, const Needles & nd) {
    auto [b, n_tokens] = fit(job, 0, [&](size_t n) { return build_needles(filler, n, nd); });
    Sample s;
    s.context = std::move(b.context);
    const size_t off = nd.primary.empty() ? b.other_offsets.at(0) : b.primary_offset;
    s.meta = {{"context_tokens", n_tokens},
              {"needle_offset", off},
              {"needle_depth", s.context.empty() ? 0.0 : double(off) / double(s.context.size())}};
    s.meta["other_offsets"] = b.other_offsets;
    return s;
}

// ---- the tasks

Sample gen_niah(Job & job) {
    const std::string needle =
        "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.";
    Needles nd;
    nd.primary = needle;
    nd.depth = job.depth;
    Sample s = needle_sample(job, essay_filler(job), nd);
    s.meta.erase("other_offsets");
    s.meta["needle"] = needle;
    s.metric = "string_match_all";
    s.questions = {{"What is the best thing to do in San Francisco?", {"eat a sandwich", "Dolores Park"}}};
    return s;
}

Sample gen_passkey(Job & job) {
    const std::string key = digits(job.rng, 5);
    Needles nd;
    nd.prefix =
        "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize "
        "it. I will quiz you about it.\n\n";
    nd.primary = "The pass key is " + key + ". Remember it. " + key + " is the pass key.";
    nd.depth = job.depth;
    Sample s = needle_sample(job, Filler{&job.noise, 0, true}, nd);
    s.meta.erase("other_offsets");
    s.meta["needle"] = nd.primary;
    s.meta["passkey"] = key;
    s.metric = "string_match_all";
    s.questions = {{"What is the pass key?", {key}}};
    return s;
}

std::string magic_needle(const std::string & key, const std::string & value) {
    return "One of the special magic numbers for " + key + " is: " + value + ".";
}

// RULER's niah variants: n_keys keys (the first asked, unless all are), n_values values each.
Sample ruler_niah(Job & job, size_t n_keys, size_t n_values, bool ask_all_keys) {
    const Vocabulary & v = vocabulary();
    std::vector<std::string> keys;
    while (keys.size() < n_keys) {
        std::string k = v.adjectives[pick(job.rng, v.adjectives.size())] + "-" + v.nouns[pick(job.rng, v.nouns.size())];
        if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    }
    std::vector<std::vector<std::string>> values(n_keys);
    std::set<std::string> used;
    for (auto & vs : values)
        while (vs.size() < n_values) {
            std::string val = digits(job.rng, 7);
            if (used.insert(val).second) vs.push_back(val);
        }
    Needles nd;
    nd.primary = magic_needle(keys[0], values[0][0]);
    nd.depth = job.depth;
    // the others keep their order in the text (sorted random positions): shuffle that order
    std::vector<std::pair<size_t, size_t>> order;  // (key, value) of each other needle
    for (size_t k = 0; k < n_keys; ++k)
        for (size_t j = 0; j < n_values; ++j)
            if (k || j) order.emplace_back(k, j);
    shuffle(order, job.rng);
    for (const auto & [k, j] : order) {
        nd.others.push_back(magic_needle(keys[k], values[k][j]));
        nd.fractions.push_back(uniform01(job.rng));
    }
    Sample s = needle_sample(job, essay_filler(job), nd);
    json all = json::array({{{"key", keys[0]}, {"value", values[0][0]}, {"offset", s.meta["needle_offset"]}}});
    for (size_t i = 0; i < order.size(); ++i) {
        const auto [k, j] = order[i];
        all.push_back({{"key", keys[k]}, {"value", values[k][j]}, {"offset", s.meta["other_offsets"][i]}});
    }
    s.meta.erase("other_offsets");
    s.meta["needles"] = all;
    s.metric = "string_match_all";
    if (ask_all_keys) {
        std::string list;
        std::vector<std::string> answers;
        for (size_t k = 0; k < n_keys; ++k) {
            list += (k == 0 ? "" : k + 1 == n_keys ? ", and " : ", ") + keys[k];
            answers.insert(answers.end(), values[k].begin(), values[k].end());
        }
        s.meta["keys"] = keys;
        s.questions = {
            {"What are all the special magic numbers for " + list + " mentioned in the provided text?", answers}};
    } else {
        s.meta["key"] = keys[0];
        if (n_keys > 1) s.meta["distractor_keys"] = std::vector<std::string>(keys.begin() + 1, keys.end());
        const std::string q = n_values > 1 ? "What are all the special magic numbers for " + keys[0]
                                           : "What is the special magic number for " + keys[0];
        s.questions = {{q + " mentioned in the provided text?", values[0]}};
    }
    s.meta["values"] = values;
    return s;
}

// Variable tracking: one chain of 4 hops, VAR A = N, VAR B = VAR A, ..., in order in the noise.
Sample gen_vt(Job & job) {
    constexpr size_t kVars = 5;
    const std::string value = digits(job.rng, 5);
    std::vector<std::string> names;
    while (names.size() < kVars) {
        std::string n = letters(job.rng, 5, 'A');
        if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
    Needles nd;
    nd.prefix = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
    for (size_t i = 0; i < kVars; ++i) {
        nd.others.push_back("VAR " + names[i] + " = " + (i == 0 ? value : "VAR " + names[i - 1]) + ".");
        nd.fractions.push_back(uniform01(job.rng));
    }
    Sample s = needle_sample(job, Filler{&job.noise, 0, true}, nd);
    s.meta["chain"] = names;
    s.meta["value"] = value;
    s.meta["line_offsets"] = s.meta["other_offsets"];
    s.meta.erase("other_offsets");
    s.metric = "string_match_all";
    s.questions = {{"Find all variables that are assigned the value " + value + " in the text above.", names}};
    return s;
}

// Common-words extraction: a numbered list where 10 words appear freq_cw times and the rest
// freq_ucw times (RULER: 30 and 3; fewer in short lists, more when the vocabulary runs out).
Built cwe_list(std::mt19937_64 rng, const std::string & prefix, size_t n) {
    std::vector<std::string> words = vocabulary().all;
    shuffle(words, rng);
    constexpr size_t kCommon = 10;
    const size_t n_uncommon_words = words.size() - kCommon;
    size_t fc = std::clamp<size_t>(n * 3 / 100, 2, 30);
    const size_t fu0 = std::clamp<size_t>(fc / 3, 1, 3);
    auto need_fu = [&](size_t fc_) {
        const size_t u = n > kCommon * fc_ ? n - kCommon * fc_ : 0;
        return std::max(fu0, (u + n_uncommon_words - 1) / n_uncommon_words);
    };
    size_t fu = need_fu(fc);
    while (fu >= fc) fc = 2 * fu, fu = need_fu(fc);
    std::vector<std::string> list;
    for (size_t i = 0; i < kCommon; ++i) list.insert(list.end(), fc, words[i]);
    for (size_t j = kCommon; list.size() < n; ++j) {
        KVLAB_ASSERT(j < words.size(), "cwe vocabulary exhausted");
        for (size_t r = 0; r < fu && list.size() < n; ++r) list.push_back(words[j]);
    }
    shuffle(list, rng);
    Built b;
    b.context = prefix;
    for (size_t i = 0; i < list.size(); ++i) b.context += (i ? "\n" : "") + std::to_string(i + 1) + ". " + list[i];
    b.facts = {{"common_words", std::vector<std::string>(words.begin(), words.begin() + kCommon)},
               {"freq_common", fc},
               {"freq_uncommon", fu},
               {"n_words", list.size()}};
    return b;
}

Sample gen_cwe(Job & job) {
    const std::string prefix =
        "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
        "that appear most often.\n\n";
    auto [b, n_tokens] = fit(job, 30, [&](size_t n) { return cwe_list(job.rng, prefix, n); });
    Sample s;
    s.context = std::move(b.context);
    s.meta = b.facts;
    s.meta["context_tokens"] = n_tokens;
    s.metric = "string_match_all";
    s.questions = {{"What are the 10 most common words in the list above?", b.facts["common_words"]}};
    return s;
}

// Frequent-words extraction: coded words with Zipf counts C/r (r = 1..K), then words once each.
Built fwe_text(std::mt19937_64 rng, const std::string & prefix, size_t n) {
    size_t k = 10;
    double h = 0;
    for (size_t r = 1; r <= k; ++r) h += 1.0 / double(r);
    while (k < 20000 && double(k + 1) * (h + 1.0 / double(k + 1)) <= double(n)) ++k, h += 1.0 / double(k);
    const size_t c = size_t(double(n) / h);  // >= k for n >= 60, so every count C/r >= 1
    std::vector<size_t> counts;
    size_t total = 0;
    for (size_t r = 1; r <= k; ++r) counts.push_back(std::max<size_t>(1, c / r)), total += counts.back();
    while (total < n) counts.push_back(1), ++total;
    KVLAB_ASSERT(counts.size() > 3 && counts[2] > counts[3] && total == n, "fwe counts");
    std::vector<std::string> vocab;
    std::set<std::string> seen;
    while (vocab.size() < counts.size()) {
        std::string w = letters(rng, 5, 'a');
        if (seen.insert(w).second) vocab.push_back(w);
    }
    std::vector<std::string> text;
    text.reserve(n);
    for (size_t r = 0; r < counts.size(); ++r) text.insert(text.end(), counts[r], vocab[r]);
    shuffle(text, rng);
    Built b;
    b.context = prefix;
    for (size_t i = 0; i < text.size(); ++i) b.context += (i ? " " : "") + text[i];
    b.facts = {{"top_words", std::vector<std::string>(vocab.begin(), vocab.begin() + 3)},
               {"top_counts", std::vector<size_t>(counts.begin(), counts.begin() + 3)},
               {"vocab_size", vocab.size()},
               {"n_words", n}};
    return b;
}

Sample gen_fwe(Job & job) {
    const std::string prefix =
        "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
        "appearing coded words.\n\n";
    auto [b, n_tokens] = fit(job, 60, [&](size_t n) { return fwe_text(job.rng, prefix, n); });
    Sample s;
    s.context = std::move(b.context);
    s.meta = b.facts;
    s.meta["context_tokens"] = n_tokens;
    s.metric = "string_match_all";
    s.questions = {
        {"What are the three most frequently appearing coded words in the text above?", b.facts["top_words"]}};
    return s;
}

struct TaskDef {
    const char * name;
    const char * description;
    Sample (*gen)(Job &);
    bool has_depth;
    bool uses_essays;
};

constexpr TaskDef kTasks[] = {
    {"niah", "a needle sentence at each depth of the essays (the San Francisco sandwich)", gen_niah, true, true},
    {"passkey", "a 5-digit pass key at each depth of repeated filler text", gen_passkey, true, false},
    {"ruler_niah_single", "RULER: one special magic number (7 digits) for a word-pair key in the essays",
     [](Job & j) { return ruler_niah(j, 1, 1, false); }, true, true},
    {"ruler_niah_multikey", "RULER: the magic number of one key among 3 distractor keys",
     [](Job & j) { return ruler_niah(j, 4, 1, false); }, true, true},
    {"ruler_niah_multivalue", "RULER: one key with 4 magic numbers, all asked for",
     [](Job & j) { return ruler_niah(j, 1, 4, false); }, true, true},
    {"ruler_niah_multiquery", "RULER: 4 keys with a magic number each, all asked at once",
     [](Job & j) { return ruler_niah(j, 4, 1, true); }, true, true},
    {"ruler_vt", "RULER variable tracking: the 5 variables of a 4-hop chain VAR B = VAR A = N", gen_vt, false, false},
    {"ruler_cwe", "RULER common-words extraction: the 10 most common words of a numbered list", gen_cwe, false, false},
    {"ruler_fwe", "RULER frequent-words extraction: the 3 most frequent coded words (Zipf counts)", gen_fwe, false,
     false},
};

std::string depth_label(double d) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", d);
    if (std::fabs(std::strtod(buf, nullptr) - d) > 1e-12) std::snprintf(buf, sizeof buf, "%.6g", d);
    return buf;
}

std::string known_tasks() {
    std::string s;
    for (const auto & t : kTasks) s += (s.empty() ? "" : ", ") + std::string(t.name);
    return s;
}

}  // namespace

Haystack load_haystack(const std::vector<std::string> & files) {
    Haystack h;
    for (const auto & f : files) {
        std::ifstream in(f, std::ios::binary);
        if (!in || !std::filesystem::is_regular_file(f)) throw Error("eval", "cannot read haystack file " + f);
        std::stringstream ss;
        ss << in.rdbuf();
        if (!h.text.empty()) h.text += "\n\n";
        h.text += ss.str();
        h.source += (h.source.empty() ? "" : ", ") + f;
    }
    return h;
}

std::vector<std::pair<std::string, std::string>> task_names() {
    std::vector<std::pair<std::string, std::string>> r;
    for (const auto & t : kTasks) r.emplace_back(t.name, t.description);
    return r;
}

std::vector<Sample> make_task(const std::string & name, const TaskOptions & opts, const Haystack & hay,
                              const TokenCounter & count_tokens) {
    const TaskDef * def = nullptr;
    for (const auto & t : kTasks)
        if (name == t.name) def = &t;
    if (!def) throw Error("eval", "unknown task '" + name + "' (known: " + known_tasks() + ")");
    if (!count_tokens) throw Error("eval", name + ": no token counter");
    if (opts.lengths.empty()) throw Error("eval", name + ": no context lengths");
    if (opts.n_samples < 1) throw Error("eval", name + ": n_samples must be at least 1");
    for (int64_t l : opts.lengths)
        if (l < kMinTokens)
            throw Error("eval", name + ": length " + std::to_string(l) + " is too small (at least " +
                                    std::to_string(kMinTokens) + " tokens)");
    std::vector<double> depths = {-1.0};
    if (def->has_depth) {
        if (opts.depths.empty()) throw Error("eval", name + ": no depths");
        for (double d : opts.depths)
            if (!(d >= 0.0 && d <= 1.0))
                throw Error("eval", name + ": depth " + std::to_string(d) + " is not in [0, 1]");
        depths = opts.depths;
    }

    std::vector<std::string> essay;
    std::vector<size_t> essay_sentences;
    if (def->uses_essays) {
        essay = essay_words(hay.text);
        for (size_t i = 0; i < essay.size(); ++i)
            if (i == 0 || ends_sentence(essay[i - 1])) essay_sentences.push_back(i);
    }
    const std::vector<std::string> noise = split_words(kNoise);

    std::vector<Sample> out;
    for (int64_t length : opts.lengths)
        for (double depth : depths)
            for (int i = 0; i < opts.n_samples; ++i) {
                Job job{name,  length,          depth, count_tokens,
                        essay, essay_sentences, noise, sample_rng(opts.seed, name, length, depth, i)};
                Sample s = def->gen(job);
                s.task = name;
                s.id = name + "/L" + std::to_string(length) + (depth < 0 ? "" : "/d" + depth_label(depth)) + "/s" +
                       std::to_string(opts.seed) + "/i" + std::to_string(i);
                s.meta["target_tokens"] = length;
                s.meta["depth"] = depth;
                s.meta["seed"] = opts.seed;
                s.meta["index"] = i;
                if (!s.meta.contains("needle_offset")) {  // cwe, fwe: no needle
                    s.meta["needle_offset"] = -1;
                    s.meta["needle_depth"] = -1.0;
                }
                if (def->uses_essays) s.meta["haystack"] = hay.source;
                out.push_back(std::move(s));
            }
    return out;
}

namespace {

const std::set<std::string> kMetrics = {"string_match_all", "string_match_part", "exact_match", "f1"};

std::vector<std::string> string_list(const json & j, const std::string & where) {
    if (!j.is_array()) throw Error("eval", where + ": answers must be a list of strings");
    std::vector<std::string> r;
    for (const auto & a : j) {
        if (!a.is_string()) throw Error("eval", where + ": answers must be a list of strings");
        r.push_back(a.get<std::string>());
    }
    return r;
}

std::string id_text(const json & j) {
    return j.is_string() ? j.get<std::string>() : j.dump();
}

}  // namespace

std::vector<Sample> load_qa_jsonl(const std::string & path, const std::string & metric) {
    if (!kMetrics.count(metric)) throw Error("eval", path + ": unknown metric '" + metric + "'");
    std::ifstream in(path, std::ios::binary);
    if (!in || !std::filesystem::is_regular_file(path)) throw Error("eval", "cannot read QA dataset " + path);
    const std::string stem = std::filesystem::path(path).stem().string();
    std::vector<Sample> out;
    std::set<std::string> ids;
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
        if (n == 1 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);  // UTF-8 byte order mark
        if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
        const std::string where = path + ":" + std::to_string(n);
        json j;
        try {
            j = json::parse(line);
        } catch (const json::exception & e) {
            throw Error("eval", where + ": invalid JSON: " + e.what());
        }
        if (!j.is_object()) throw Error("eval", where + ": not a JSON object");
        if (!j.contains("context")) throw Error("eval", where + ": missing \"context\"");
        if (!j["context"].is_string()) throw Error("eval", where + ": \"context\" is not a string");
        Sample s;
        s.context = j["context"].get<std::string>();
        if (j.contains("questions")) {
            if (!j["questions"].is_array() || j["questions"].empty())
                throw Error("eval", where + ": \"questions\" must be a non-empty list");
            for (const auto & q : j["questions"]) {
                if (!q.is_object() || !q.contains("question") || !q["question"].is_string())
                    throw Error("eval", where + ": missing question (each of \"questions\" needs a \"question\")");
                if (!q.contains("answers")) throw Error("eval", where + ": a question has no \"answers\"");
                s.questions.push_back({q["question"].get<std::string>(), string_list(q["answers"], where)});
            }
        } else if (j.contains("input")) {  // LongBench
            if (!j["input"].is_string()) throw Error("eval", where + ": \"input\" (the question) is not a string");
            if (!j.contains("answers")) throw Error("eval", where + ": missing \"answers\"");
            s.questions.push_back({j["input"].get<std::string>(), string_list(j["answers"], where)});
        } else {
            throw Error("eval", where + ": missing question (\"questions\" or LongBench's \"input\")");
        }
        s.task = j.contains("dataset") && j["dataset"].is_string() ? j["dataset"].get<std::string>() : "qa";
        s.metric = metric;
        if (j.contains("metric")) {
            if (!j["metric"].is_string() || !kMetrics.count(j["metric"].get<std::string>()))
                throw Error("eval", where + ": unknown metric " + j["metric"].dump());
            s.metric = j["metric"].get<std::string>();
        }
        s.id = j.contains("id")    ? id_text(j["id"])
               : j.contains("_id") ? id_text(j["_id"])
                                   : stem + "/" + std::to_string(n);
        if (!ids.insert(s.id).second) throw Error("eval", where + ": duplicate id '" + s.id + "'");
        s.meta = json::object();
        for (const auto & [k, v] : j.items())
            if (k != "context" && k != "questions" && k != "input" && k != "answers") s.meta[k] = v;
        s.meta["source"] = path;
        s.meta["line"] = n;
        out.push_back(std::move(s));
    }
    return out;
}

}  // namespace kvlab::eval
