// The words of RULER's keys (adjective-noun) and of common-words extraction, cleaned so
// that no word is found inside another by a substring match.
#include <iterator>
#include <set>

#include "eval/tasks/task.h"

namespace kvlab::eval::tasks {
namespace {

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

}  // namespace

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

}  // namespace kvlab::eval::tasks
