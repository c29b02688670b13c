// kvlab profile and the engine's op profile on the real default model: every kvlab node timed on
// every thread, the accounts adding up to the wall time, and the results unchanged by timing.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "app/fetch.h"
#include "environment.h"
#include "kvlab/engine.h"
#include "kvlab/op_profile.h"
#include "kvlab/registry.h"
#include "support/fixtures.h"
#include "support/tiny_gguf.h"

namespace kvlab {
namespace {

// The engine's logits are the same bits with a profile attached, and the profile counts what
// the engine ran: one graph per chunk and per decode step, each layer's attention in each graph.
TEST(OpProfile, SameLogitsAndEveryNodeCounted) {
    const std::string path = resolve_model("smollm2-135m", cli::environment().models);
    std::unique_ptr<Model> model = Model::load(path, {.n_threads = 2});
    std::vector<int32_t> toks(300);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(1000 + 37 * i % 20000);

    EngineOptions plain;
    plain.chunk_size = 128;
    Engine e0(*model, plain);
    KvStore c0 = e0.new_cache(400);
    const std::vector<float> l0 = e0.prefill(c0, toks);

    OpProfile prof;
    EngineOptions timed = plain;
    timed.n_threads = 2;  // its own backend: the thread count the profile sees is fixed
    timed.profile = &prof;
    Engine e1(*model, timed);
    KvStore c1 = e1.new_cache(400);
    prof.set_phase("prefill");
    const std::vector<float> l1 = e1.prefill(c1, toks);
    ASSERT_EQ(l0, l1);  // to the bit

    GenerateOptions go;
    go.max_tokens = 5;
    go.stop_on_eog = false;
    const GenerateResult g0 = e0.generate(c0, {toks[0]}, go);
    prof.set_phase("decode");
    const GenerateResult g1 = e1.generate(c1, {toks[0]}, go);
    prof.set_phase("");
    EXPECT_EQ(g0.tokens, g1.tokens);

    const int n_layer = model->hparams().n_layer;
    ASSERT_EQ(prof.phases().size(), 2u);
    const OpProfile::Phase & pre = prof.phases()[0];
    const OpProfile::Phase & dec = prof.phases()[1];
    EXPECT_EQ(pre.name, "prefill");
    EXPECT_EQ(pre.graphs, 3);  // 128 + 128 + 44 tokens
    EXPECT_EQ(pre.tokens, 300);
    EXPECT_EQ(dec.name, "decode");
    EXPECT_EQ(dec.graphs, 5);  // the query token and 4 steps
    EXPECT_EQ(dec.tokens, 5);
    for (const OpProfile::Phase * ph : {&pre, &dec}) {
        EXPECT_EQ(ph->n_threads, 2);
        EXPECT_GT(ph->ggml_nodes, 0);
        std::map<std::string, const OpProfile::Op *> by_name;
        std::vector<double> accounted(2, 0.0);
        for (const OpProfile::Op & op : ph->ops) {
            by_name[op.name] = &op;
            EXPECT_EQ(op.name.find("blk."), std::string::npos) << op.name;  // layers summed
            ASSERT_EQ(op.busy_s.size(), 2u);
            for (int t = 0; t < 2; ++t) {
                EXPECT_GT(op.busy_s[size_t(t)], 0.0) << op.name << " thread " << t;
                EXPECT_GE(op.wait_s[size_t(t)], 0.0) << op.name;
                // a thread's busy and wait time in a node lie within the node's wall time
                EXPECT_LE(op.busy_s[size_t(t)] + op.wait_s[size_t(t)], op.wall_s * (1 + 1e-9)) << op.name;
                accounted[size_t(t)] += op.busy_s[size_t(t)] + op.wait_s[size_t(t)];
            }
        }
        for (int t = 0; t < 2; ++t) {
            EXPECT_GT(ph->other_s[size_t(t)], 0.0);
            EXPECT_NEAR(accounted[size_t(t)] + ph->other_s[size_t(t)], ph->wall_s, 1e-9 * ph->wall_s);
        }
        ASSERT_TRUE(by_name.count("attention")) << ph->name;
        ASSERT_TRUE(by_name.count("attention merge")) << ph->name;
        EXPECT_EQ(by_name["attention"]->calls, ph->graphs * n_layer) << ph->name;
        ASSERT_TRUE(by_name.count("product q4_1 ffn_down.weight")) << ph->name;
        EXPECT_EQ(by_name["product q4_1 ffn_down.weight"]->calls, ph->graphs * n_layer) << ph->name;
    }
}

// `kvlab profile --json` on two threads: both phases, every op timed on both threads.
TEST(OpProfile, Command) {
    const auto r = test::run_command("(" + test::kvlab_binary() + " profile " + test::default_model_path() +
                                     " --context 200 --decode 3 -t 2 --chunk 64 --no-warmup --json 2>/dev/null)");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json j = nlohmann::json::parse(r.output, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.output;
    ASSERT_EQ(j["phases"].size(), 2u);
    EXPECT_EQ(j["phases"][0]["phase"], "prefill");
    EXPECT_EQ(j["phases"][0]["graphs"], 4);  // 64 * 3 + 8
    EXPECT_EQ(j["phases"][0]["tokens"], 200);
    EXPECT_EQ(j["phases"][1]["phase"], "decode");
    EXPECT_EQ(j["phases"][1]["graphs"], 3);
    for (const auto & ph : j["phases"]) {
        EXPECT_EQ(ph["threads"], 2);
        EXPECT_GT(ph["wall_s"].get<double>(), 0.0);
        ASSERT_FALSE(ph["ops"].empty());
        for (const auto & op : ph["ops"]) {
            ASSERT_EQ(op["busy_s"].size(), 2u) << op.dump();
            EXPECT_GT(op["busy_s"][0].get<double>(), 0.0) << op.dump();
            EXPECT_GT(op["busy_s"][1].get<double>(), 0.0) << op.dump();
        }
    }
    EXPECT_EQ(j["params"]["threads"], 2);
    EXPECT_FALSE(j["params"]["warmup"].get<bool>());
    EXPECT_TRUE(j["provenance"].contains("model"));
    // bad input: a clear error, not a crash
    const auto bad = test::run_command("(" + test::kvlab_binary() + " profile " + test::default_model_path() +
                                       " --context 40000 -t 1 2>&1)");
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.output.find("exceeds the model's"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace kvlab
