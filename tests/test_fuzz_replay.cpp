// Every fuzz target's seeds (written by the target from real files) and every committed
// input of fuzz/corpus/<target>/ (each finding of the fuzzers, kept as a regression) replayed
// through the target: accepted or refused with kvlab's own error, never another exception,
// an abort or (in the sanitizer build) a sanitizer report.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "support/fixtures.h"
#include "target.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;

class FuzzReplay : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzReplay, CommittedInputsAreAcceptedOrRefusedCleanly) {
    const fuzz::Target * t = fuzz::find_target(GetParam());
    ASSERT_NE(t, nullptr);
    t->init();
    const std::string seeds = test::temp_dir("fuzz-seeds");
    t->seeds(seeds);
    size_t n_seeds = 0;
    for (const fs::path & dir : {fs::path(seeds), fs::path(test::source_dir()) / "fuzz" / "corpus" / GetParam()}) {
        if (!fs::is_directory(dir)) continue;
        for (const auto & e : fs::directory_iterator(dir)) {
            if (!e.is_regular_file() || e.path().filename().string().front() == '.') continue;
            std::ifstream in(e.path(), std::ios::binary);
            const std::string bytes{std::istreambuf_iterator<char>(in), {}};
            SCOPED_TRACE(e.path().string());
            EXPECT_NO_THROW(t->one(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size()));
            n_seeds += dir == fs::path(seeds);
        }
    }
    fs::remove_all(seeds);
    EXPECT_GT(n_seeds, 0u) << "target " << GetParam() << " wrote no seeds";
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzReplay, ::testing::ValuesIn(fuzz::target_names()),
                         [](const auto & info) { return info.param; });

}  // namespace
}  // namespace kvlab
