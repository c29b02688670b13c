// kvlab bench-methods on the real default model: what its JSON says of each method's prefill.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/fixtures.h"
#include "support/tiny_gguf.h"

namespace kvlab {
namespace {

nlohmann::json bench_methods(const std::string & flags) {
    const auto r = test::run_command("(" + test::kvlab_binary() + " bench-methods " + test::default_model_path() +
                                     " --context 96 --ratio 0.5 --reps 2 --decode 2 -t 1 --methods snapkv,h2o --json " +
                                     flags + " 2>/dev/null)");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output, nullptr, false);
}

// With --prefill-per-method every method reports the prefill it ran itself (observed by it
// alone), every repetition of it; without, one shared prefill serves them all.
TEST(BenchMethods, PrefillPerMethodTimesEachMethodsOwnPrefill) {
    const nlohmann::json own = bench_methods("--prefill-per-method");
    ASSERT_FALSE(own.is_discarded());
    EXPECT_TRUE(own["params"]["prefill_per_method"].get<bool>());
    EXPECT_GT(own["prefill_s"].get<double>(), 0.0);
    ASSERT_EQ(own["results"].size(), 2u);
    for (const auto & r : own["results"]) {
        ASSERT_TRUE(r.contains("prefill_s")) << r.dump();
        EXPECT_GT(r["prefill_s"].get<double>(), 0.0);
        EXPECT_EQ(r["prefill_s_reps"].size(), 2u);
        EXPECT_GT(r["compression_s"].get<double>(), 0.0);
        EXPECT_LT(r["last"]["rows_after"].get<int64_t>(), r["last"]["rows_before"].get<int64_t>());
    }
    const nlohmann::json shared = bench_methods("");
    ASSERT_FALSE(shared.is_discarded());
    EXPECT_FALSE(shared["params"]["prefill_per_method"].get<bool>());
    for (const auto & r : shared["results"]) EXPECT_FALSE(r.contains("prefill_s")) << r.dump();
}

}  // namespace
}  // namespace kvlab
