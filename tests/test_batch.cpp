// Batched evaluation (Engine::eval_batch) on the real default model (SmolLM2-135M-Instruct Q4_1):
// sequences on caches of different lengths, one of them compressed, prefill their questions and
// decode greedily in one graph per step; every sequence's logits at every step are those it gets
// alone through Engine::generate, bit for bit, at a batch of 3 and of 16 (past the products'
// batch kernels' threshold), for F16 and for Q8_0 rows. A batch that cannot run changes no cache.
// Continuous batching (BatchDecoder): requests that join while others decode, with their own
// sampling, log-probabilities and lengths, get Engine::generate's tokens and log-probabilities;
// one cancelled mid-way stops there and the others go on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "app/fetch.h"
#include "environment.h"
#include "kvlab/batch_decoder.h"
#include "kvlab/engine.h"
#include "kvlab/error.h"
#include "kvlab/press.h"
#include "kvlab/text.h"
#include "support/fixtures.h"

namespace kvlab {
namespace {

constexpr int k_steps = 12;  // tokens generated per sequence

class Batch : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        const std::string path = resolve_model("smollm2-135m", cli::environment().models);
        model_ = Model::load(path, {.n_threads = 2}).release();
        tok_ = new Tokenizer(path);
    }
    static void TearDownTestSuite() {
        delete tok_;
        delete model_;
    }

    struct Sequence {
        KvStore cache;
        std::vector<int32_t> question;
    };

    // Sequence i: a context of its own length (every third compressed by knorm to half its rows,
    // each head keeping its own positions), then a question of its own.
    static Sequence make(Engine & engine, int i, CacheTypes types) {
        const std::string text = test::test_text("addiction.txt");
        const std::vector<int32_t> all = tok_->encode(text, true, false);
        const size_t L = size_t(60 + 37 * i) % std::min<size_t>(all.size(), 700) + 40;
        std::vector<int32_t> context(all.begin(), all.begin() + std::ptrdiff_t(L));
        Sequence s{engine.new_cache(int64_t(L), types), {}};
        engine.prefill(s.cache, context);
        if (i % 3 == 1) {
            auto press = make_press("knorm", {}, *model_);
            Budget b;
            b.ratio = 0.5;
            compress(*press, s.cache, b, 64);
        }
        s.question = tok_->encode(" Question " + std::to_string(i) + ": what is the essay about?", false, false);
        return s;
    }

    static int32_t argmax(const std::vector<float> & logits) {
        return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }

    // Each sequence alone (Engine::generate, greedy) against all of them in one batch per step.
    static void alone_and_batched(int n, CacheTypes types) {
        Engine engine(*model_);
        const int64_t n_vocab = model_->hparams().n_vocab;
        std::vector<Sequence> seqs;
        for (int i = 0; i < n; ++i) seqs.push_back(make(engine, i, types));
        std::vector<std::vector<float>> alone(static_cast<size_t>(n));  // [seq][step][n_vocab]
        for (int i = 0; i < n; ++i) {
            KvStore copy = seqs[size_t(i)].cache.copy();
            GenerateOptions go;
            go.max_tokens = k_steps;
            go.stop_on_eog = false;
            go.step_logits = &alone[size_t(i)];
            engine.generate(copy, seqs[size_t(i)].question, go);
            ASSERT_EQ(alone[size_t(i)].size(), size_t(k_steps * n_vocab));
        }
        std::vector<std::vector<float>> logits(static_cast<size_t>(n),
                                               std::vector<float>(static_cast<size_t>(n_vocab)));
        std::vector<int32_t> next(static_cast<size_t>(n));
        for (int step = 0; step < k_steps; ++step) {
            std::vector<Engine::BatchItem> items;
            for (int i = 0; i < n; ++i) {
                const std::vector<int32_t> & q = seqs[size_t(i)].question;
                items.push_back({&seqs[size_t(i)].cache, step == 0 ? q.data() : &next[size_t(i)],
                                 step == 0 ? int64_t(q.size()) : 1, logits[size_t(i)].data()});
            }
            engine.eval_batch(items);
            for (int i = 0; i < n; ++i) {
                const float * ref = alone[size_t(i)].data() + size_t(step) * size_t(n_vocab);
                ASSERT_EQ(std::memcmp(ref, logits[size_t(i)].data(), size_t(n_vocab) * sizeof(float)), 0)
                    << "sequence " << i << " of " << n << ", step " << step;
                next[size_t(i)] = argmax(logits[size_t(i)]);
            }
        }
    }

    static Model * model_;
    static Tokenizer * tok_;
};

Model * Batch::model_ = nullptr;
Tokenizer * Batch::tok_ = nullptr;

TEST_F(Batch, ThreeSequencesGetTheirOwnLogitsBitForBit) {
    alone_and_batched(3, {});
}

TEST_F(Batch, SixteenSequencesGetTheirOwnLogitsBitForBit) {
    alone_and_batched(16, {});
}

TEST_F(Batch, QuantizedRowsGetTheirOwnLogitsBitForBit) {
    alone_and_batched(4, {.k = GGML_TYPE_Q8_0, .v = GGML_TYPE_Q8_0});
}

TEST_F(Batch, RequestsJoiningAndLeavingGetWhatTheyGetAlone) {
    Engine engine(*model_);
    constexpr int n = 6;
    std::vector<Sequence> seqs;
    std::vector<GenerateOptions> opts(n);
    for (int i = 0; i < n; ++i) {
        seqs.push_back(make(engine, i, {}));
        opts[size_t(i)].max_tokens = 6 + 3 * i;
        opts[size_t(i)].eog_ids = tok_->eog_ids();
        opts[size_t(i)].n_logprobs = i % 2 ? 3 : 0;
        if (i % 3 == 2) opts[size_t(i)].sampling = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = uint64_t(7 + i)};
    }
    std::vector<GenerateResult> alone;
    for (int i = 0; i < n; ++i) {
        KvStore copy = seqs[size_t(i)].cache.copy();
        alone.push_back(engine.generate(copy, seqs[size_t(i)].question, opts[size_t(i)]));
    }
    BatchDecoder dec(engine, /*chunk=*/8);
    std::vector<int64_t> ids;
    int cancelled_after = 0;
    for (int i = 0; i < n; ++i) {
        // request 4 stops itself after 3 tokens (as a client that went away)
        std::function<bool(int32_t)> on_token;
        if (i == 4) on_token = [&cancelled_after](int32_t) { return ++cancelled_after < 3; };
        ids.push_back(dec.add(seqs[size_t(i)].cache, seqs[size_t(i)].question, opts[size_t(i)], on_token));
        dec.step();  // the next request joins a step later, while the earlier ones prefill or decode
        dec.step();
    }
    int most = 0;
    while (dec.step()) most = std::max(most, dec.last_batch());
    EXPECT_GT(most, 1) << "the requests never shared a step";
    for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(dec.done(ids[size_t(i)]));
        const GenerateResult r = dec.take(ids[size_t(i)]);
        const GenerateResult & a = alone[size_t(i)];
        if (i == 4) {
            EXPECT_EQ(r.stop_reason, "caller");
            ASSERT_EQ(r.tokens.size(), 3u);
            EXPECT_TRUE(std::equal(r.tokens.begin(), r.tokens.end(), a.tokens.begin())) << "request 4";
            continue;
        }
        EXPECT_EQ(r.tokens, a.tokens) << "request " << i;
        EXPECT_EQ(r.stop_reason, a.stop_reason) << "request " << i;
        ASSERT_EQ(r.logprobs.size(), a.logprobs.size()) << "request " << i;
        for (size_t t = 0; t < r.logprobs.size(); ++t) {
            EXPECT_EQ(r.logprobs[t].logprob, a.logprobs[t].logprob) << "request " << i << " token " << t;
            EXPECT_EQ(r.logprobs[t].top, a.logprobs[t].top) << "request " << i << " token " << t;
        }
    }
}

TEST_F(Batch, ABatchThatCannotRunChangesNoCache) {
    Engine engine(*model_);
    Sequence a = make(engine, 0, {}), b = make(engine, 2, {});
    Sequence q = make(engine, 3, {.k = GGML_TYPE_Q8_0, .v = GGML_TYPE_Q8_0});
    const int32_t pa = a.cache.next_pos(), pb = b.cache.next_pos();
    const int32_t bad = model_->hparams().n_vocab;
    const auto refused = [&](const std::vector<Engine::BatchItem> & items, const std::string & why) {
        try {
            engine.eval_batch(items);
            ADD_FAILURE() << "accepted: " << why;
        } catch (const Error & e) {
            EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
        }
        EXPECT_EQ(a.cache.next_pos(), pa);
        EXPECT_EQ(b.cache.next_pos(), pb);
        EXPECT_EQ(a.cache.total_rows(), int64_t(a.cache.n_layer()) * a.cache.n_head_kv() * pa);
    };
    refused({{&a.cache, a.question.data(), 1, nullptr}, {&b.cache, &bad, 1, nullptr}}, "outside the vocabulary");
    refused({{&a.cache, a.question.data(), 1, nullptr}, {&a.cache, a.question.data(), 1, nullptr}}, "twice");
    refused({{&a.cache, a.question.data(), 1, nullptr}, {&q.cache, q.question.data(), 1, nullptr}}, "row types");
    refused({{&a.cache, a.question.data(), 0, nullptr}}, "at least one token");
}

}  // namespace
}  // namespace kvlab
