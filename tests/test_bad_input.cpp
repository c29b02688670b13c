// Bad input gives a clear message naming the problem and a non-zero exit, never a crash:
// through the library (exceptions) and through the kvlab command line (exit codes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ggml-cpp.h"
#include "gguf.h"
#include "kvlab/engine.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "kvlab/text.h"
#include "support/fixtures.h"
#include "support/tiny_gguf.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;

class BadInput : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = test::temp_dir("bad");
        test::TinySpec spec;
        spec.arch = "llama";
        spec.n_ctx_train = 64;
        good_ = test::write_tiny_gguf(spec, test::default_model_path(), dir_ + "/good.gguf");
    }
    void TearDown() override { fs::remove_all(dir_); }

    std::string write(const std::string & name, const std::string & bytes) {
        const std::string p = dir_ + "/" + name;
        std::ofstream(p, std::ios::binary) << bytes;
        return p;
    }
    std::string file_bytes(const std::string & p) {
        std::ifstream in(p, std::ios::binary);
        return {std::istreambuf_iterator<char>(in), {}};
    }
    // The tiny model with general.architecture rewritten to an architecture kvlab lacks.
    std::string unsupported_arch() {
        std::string b = file_bytes(good_);
        const std::string key = "general.architecture";
        const size_t at = b.find(key);
        EXPECT_NE(at, std::string::npos);
        const size_t val = b.find("llama", at + key.size());
        b.replace(val, 5, "mamba");
        return write("mamba.gguf", b);
    }
    // The tiny model with one token of its vocabulary written twice (libllama's loader
    // asserts on it: an abort before kvlab checked the table).
    // The tiny model with one token of its vocabulary written twice (libllama's loader
    // asserts on it: an abort before kvlab checked the table): token i + 1's bytes replaced
    // by token i's, two neighbours of the same length, in the file's token array.
    std::string duplicate_token(size_t * at) {
        gguf_context_ptr g(gguf_init_from_file(good_.c_str(), {/*no_alloc=*/true, nullptr}));
        const int64_t k = gguf_find_key(g.get(), "tokenizer.ggml.tokens");
        std::string b = file_bytes(good_);
        for (size_t i = 300; i + 1 < gguf_get_arr_n(g.get(), k); ++i) {
            const std::string x = gguf_get_arr_str(g.get(), k, i), y = gguf_get_arr_str(g.get(), k, i + 1);
            if (x.size() != y.size()) continue;
            std::string pair(8, '\0');
            const uint64_t n = x.size();
            std::memcpy(pair.data(), &n, 8);
            pair = pair + x + pair + y;
            const size_t pos = b.find(pair);
            if (pos == std::string::npos) continue;
            b.replace(pos + 16 + n, n, x);
            *at = i;
            return write("duplicate-token.gguf", b);
        }
        ADD_FAILURE() << "no two neighbouring tokens of the same length";
        return good_;
    }
    // The tiny model with its metadata edited by `edit` (gguf's own setters; tensors kept).
    template <typename Edit>
    std::string edited(const std::string & name, Edit edit) {
        ggml_context * data = nullptr;
        gguf_context_ptr src(gguf_init_from_file(good_.c_str(), {/*no_alloc=*/false, &data}));
        ggml_context_ptr data_ptr(data);
        gguf_context_ptr g(gguf_init_empty());
        gguf_set_kv(g.get(), src.get());
        for (int64_t i = 0; i < gguf_get_n_tensors(src.get()); ++i)
            gguf_add_tensor(g.get(), ggml_get_tensor(data, gguf_get_tensor_name(src.get(), i)));
        edit(g.get());
        const std::string p = dir_ + "/" + name;
        EXPECT_TRUE(gguf_write_to_file(g.get(), p.c_str(), false));
        return p;
    }
    // Loading must throw kvlab::Error with every fragment in its message.
    void expect_load_error(const std::string & path, const std::vector<std::string> & fragments) {
        try {
            Model::load(path, {.n_threads = 1});
            ADD_FAILURE() << "no error for " << path;
        } catch (const Error & e) {
            for (const auto & f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
        }
    }
    // The CLI must exit with 1 (not a signal) and print every fragment.
    void expect_cli_error(const std::string & args, const std::vector<std::string> & fragments) {
        const auto r = test::run_command(test::kvlab_binary() + " " + args);
        EXPECT_EQ(r.exit_code, 1) << r.output;
        for (const auto & f : fragments) EXPECT_NE(r.output.find(f), std::string::npos) << r.output;
    }
    // A malformed option: CLI11's usage error (its own exit code, never a signal) naming it.
    void expect_usage_error(const std::string & args, const std::vector<std::string> & fragments) {
        const auto r = test::run_command(test::kvlab_binary() + " " + args);
        EXPECT_GT(r.exit_code, 0) << r.output;
        EXPECT_LT(r.exit_code, 128) << r.output;
        for (const auto & f : fragments) EXPECT_NE(r.output.find(f), std::string::npos) << r.output;
    }
    std::string dir_, good_;
};

TEST_F(BadInput, MissingFile) {
    expect_load_error(dir_ + "/nope.gguf", {"no such file", "nope.gguf"});
    expect_cli_error("info " + dir_ + "/nope.gguf", {"nope.gguf"});
}

TEST_F(BadInput, NotAGgufFile) {
    const auto p = write("notes.gguf", "this is plain text, not a model\n");
    expect_load_error(p, {"not a GGUF file"});
    expect_cli_error("generate " + p + " --prompt hi", {"not a GGUF file"});
}

TEST_F(BadInput, TruncatedFile) {
    const std::string b = file_bytes(good_);
    const auto p = write("cut.gguf", b.substr(0, b.size() / 2));
    expect_load_error(p, {"truncated"});
    expect_cli_error("info " + p, {"truncated"});
}

TEST_F(BadInput, UnsupportedArchitecture) {
    const auto p = unsupported_arch();
    expect_load_error(p, {"unsupported architecture 'mamba'", "llama"});
    expect_cli_error("info " + p, {"unsupported architecture 'mamba'"});
}

// What ggml would assert on in a graph (shapes) or overflow on (sizes) is refused at load,
// naming the key or the tensor.
TEST_F(BadInput, HyperParametersOutOfRangeOrInconsistentWithTheTensors) {
    expect_load_error(
        edited("layers.gguf", [](gguf_context * g) { gguf_set_val_u64(g, "llama.block_count", uint64_t(1) << 40); }),
        {"llama.block_count", "1099511627776", "not a whole number in [1, 4096]"});
    expect_load_error(
        edited("eps.gguf",
               [](gguf_context * g) { gguf_set_val_f32(g, "llama.attention.layer_norm_rms_epsilon", -1.0f); }),
        {"layer_norm_rms_epsilon", "-1"});
    expect_load_error(edited("theta.gguf", [](gguf_context * g) { gguf_set_val_f32(g, "llama.rope.freq_base", NAN); }),
                      {"llama.rope.freq_base", "nan"});
    expect_load_error(
        edited("kvheads.gguf", [](gguf_context * g) { gguf_set_val_u32(g, "llama.attention.head_count_kv", 3); }),
        {"head_count 4 is not a multiple of head_count_kv 3"});
    // the tensors were written for n_ff 128 and head_dim 16
    const auto ff = edited("ff.gguf", [](gguf_context * g) { gguf_set_val_u32(g, "llama.feed_forward_length", 100); });
    expect_load_error(ff, {"tensor 'blk.0.ffn_gate.weight' has shape [64, 128]; the architecture needs [64, 100]"});
    expect_cli_error("generate " + ff + " --prompt hi", {"blk.0.ffn_gate.weight", "[64, 100]"});
    expect_load_error(edited("hd.gguf",
                             [](gguf_context * g) {
                                 for (const char * k : {"llama.attention.key_length", "llama.attention.value_length",
                                                        "llama.rope.dimension_count"})
                                     if (gguf_find_key(g, k) >= 0) gguf_set_val_u32(g, k, 8);
                             }),
                      {"tensor 'blk.0.attn_q.weight' has shape [64, 64]; the architecture needs [64, 32]"});
    expect_load_error(edited("embd.gguf", [](gguf_context * g) { gguf_set_val_u32(g, "llama.embedding_length", 32); }),
                      {"tensor 'token_embd.weight' has shape [64, ", "the architecture needs [32, *]"});
}

TEST_F(BadInput, MemoryRoomAndRequireMemory) {
    const MemoryRoom room = memory_room();
    EXPECT_GT(room.bytes, uint64_t(16) << 20) << room.limit;
    EXPECT_NO_THROW(require_memory(1 << 20, "a small buffer"));
    try {
        require_memory(room.bytes + (uint64_t(1) << 40), "a huge buffer");
        ADD_FAILURE() << "no error";
    } catch (const MemoryError & e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("[memory] a huge buffer needs " + std::to_string(room.bytes + (uint64_t(1) << 40)) + " bytes"),
                  std::string::npos)
            << m;
        EXPECT_NE(m.find("are available (" + room.limit + ")"), std::string::npos) << m;
    }
}

// A context whose KV cache would not fit is refused before any allocation or prefill, with the
// bytes it needs; a single token repeated 100k times is such a context (and, on the default
// model, one longer than its 8,192-token window).
TEST_F(BadInput, ContextTooBigForMemoryIsRefusedUpFrontWithItsSize) {
    test::TinySpec spec;
    spec.arch = "llama";
    spec.n_layer = 4;
    spec.n_head = 4;
    spec.n_head_kv = 4;
    spec.head_dim = 64;  // 4 KiB of F16 K and V per token: 100k tokens need ~400 MiB
    spec.n_ctx_train = 131072;
    const std::string wide = test::write_tiny_gguf(spec, test::default_model_path(), dir_ + "/wide.gguf");
    const std::string small = write("small.txt", "The code is 7431.");
    std::string words;
    for (int i = 0; i < 100000; ++i) words += "the ";
    const std::string big = write("big.txt", words);
    const std::string ask =
        test::kvlab_binary() + " ask " + wide + " -t 1 -q 'What is the code?' --max-tokens 4 --context-file ";
    // the least address space (ulimit -v, in steps of 32 MiB) in which the small context answers
    int64_t limit_kb = 0;
    for (int64_t kb = 128 << 10; kb <= int64_t(8) << 20; kb += 32 << 10) {
        if (test::run_command("bash -c " + shell_quote("ulimit -v " + std::to_string(kb) + "; exec " + ask + small))
                .exit_code == 0) {
            limit_kb = kb;
            break;
        }
    }
    ASSERT_GT(limit_kb, 0) << "the small context never answered under ulimit -v";
    const auto r = test::run_command(
        "bash -c " + shell_quote("ulimit -v " + std::to_string(limit_kb + (96 << 10)) + "; exec " + ask + big));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    for (const char * f : {"[memory] a KV cache of ", " bytes (", "are available (ulimit -v)"})
        EXPECT_NE(r.output.find(f), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("tok/s"), std::string::npos) << "refused only after the prefill:\n" << r.output;
    expect_cli_error("ask " + test::default_model_path() + " -q hi --context-file " + big,
                     {"context has 100", "exceeds the model's context of 8192 tokens"});
}

TEST_F(BadInput, DuplicateTokenInTheVocabulary) {
    size_t i = 0;
    const auto p = duplicate_token(&i);
    const std::string ids = "twice (ids " + std::to_string(i) + " and " + std::to_string(i + 1) + ")";
    EXPECT_THROW(Tokenizer{p}, Error);
    expect_cli_error("info " + p, {"tokenizer.ggml.tokens has token", ids});
    expect_cli_error("generate " + p + " --prompt hi", {ids});
}

TEST_F(BadInput, PromptLongerThanTheContext) {
    auto model = Model::load(good_, {.n_threads = 1});
    Engine e(*model);
    KvStore c = e.new_cache(80);
    std::vector<int32_t> toks(65, 100);
    try {
        e.prefill(c, toks);
        ADD_FAILURE() << "no error";
    } catch (const Error & err) {
        EXPECT_NE(std::string(err.what()).find("exceeds the model's maximum of 64"), std::string::npos) << err.what();
    }
    std::string prompt;
    for (int i = 0; i < 80; ++i) prompt += " word";
    expect_cli_error("generate " + good_ + " --max-tokens 4 --prompt '" + prompt + "'", {"context of 64"});
}

TEST_F(BadInput, UnknownModelNameAndBadOptions) {
    expect_cli_error("generate no-such-model --prompt hi", {"no-such-model", "smollm2-135m"});
    const auto r = test::run_command(test::kvlab_binary() + " generate " + good_ + " --prompt hi --top-p 3");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_LT(r.exit_code, 128) << r.output;
}

TEST_F(BadInput, AskRefusesBadMethodsBudgetsAndContexts) {
    std::string words;
    for (int i = 0; i < 20; ++i) words += " word";
    const auto ctx = write("ctx.txt", words);
    const std::string ask = "ask " + good_ + " --context-file " + ctx + " -q what --max-tokens 4 ";
    expect_cli_error(ask + "--method snapkvv --ratio 0.5", {"unknown method 'snapkvv'", "snapkv"});
    expect_cli_error(ask + "--method snapkv --ratio 0.5 --param windw=4", {"unknown parameter 'windw'", "window"});
    expect_cli_error(ask + "--method snapkv --ratio 1.5", {"ratio must lie in [0, 1)"});
    expect_cli_error(ask + "--method snapkv",
                     {"needs a budget: --ratio R, --budget B, --kv-bytes N or --bytes-ratio R"});
    expect_cli_error(ask + "--method snapkv --bytes-ratio 0", {"bytes ratio", "must lie in (0, 1]"});
    expect_cli_error(ask + "--method snapkv --kv-bytes 100", {"holds no row per segment"});
    expect_cli_error(ask + "--method snapkv --ratio 0.5 --high-share 0.5", {"--high-share needs --demote TYPE"});
    expect_cli_error(ask + "--demote q4_0", {"need --method"});
    // a NUL byte: a clear error; bytes that are not UTF-8: answered (the JSON output replaces them)
    const auto nul = write("nul.txt", std::string("some text \0 more text", 21));
    expect_cli_error("ask " + good_ + " --context-file " + nul + " -q what -n 2", {"NUL byte at offset 10"});
    const auto bad_utf8 = write("bad-utf8.txt", "some text \xff\xfe more text");
    const auto r = test::run_command(test::kvlab_binary() + " ask " + good_ + " --context-file " + bad_utf8 +
                                     " -q what -n 4 --json");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    // stdout's JSON after any line stderr printed (the threads notice on a busy machine)
    const size_t json_at = r.output.rfind("[threads]", 0) == 0 ? r.output.find("\n{") + 1 : 0;
    EXPECT_NO_THROW(nlohmann::json::parse(r.output.substr(json_at))) << r.output;
    expect_cli_error(ask + "--method snapkv --budget 10", {"budget of 10 tokens is smaller than the 0 sink and"});
    expect_cli_error(ask + "--method snapkv --ratio 0.5 --param bad", {"KEY=VALUE"});
    std::string long_words;
    for (int i = 0; i < 80; ++i) long_words += " word";
    const auto long_ctx = write("long.txt", long_words);
    expect_cli_error("ask " + good_ + " --context-file " + long_ctx + " -q what --method snapkv --ratio 0.5",
                     {"exceeds the model's context of 64 tokens"});
}

TEST_F(BadInput, EvalRefusesBadExperiments) {
    const std::string eval = "eval " + good_ + " --out " + dir_ + "/ev ";
    expect_cli_error(eval + "--tasks nosuchtask", {"nosuchtask", "niah"});
    expect_cli_error(eval + "--methods snapkv", {"methods need at least one budget"});
    expect_cli_error(eval + "--methods snapkvv --ratios 0.5", {"unknown method 'snapkvv'"});
    expect_cli_error(eval + "--methods snapkv --ratios 1.2", {"ratio must lie in [0, 1)"});
    expect_cli_error(eval + "--shard 3/2", {"--shard takes i/N", "3/2"});
    expect_cli_error(eval + "--shard a/b", {"--shard takes i/N", "a/b"});
    expect_cli_error(eval + "--methods snapkv,h2o --ratios 0.5 --param window=4", {"say which with METHOD:KEY=VALUE"});
    expect_cli_error(eval + "--methods snapkv --ratios 0.5 --param h2o:normalize=1", {"no method h2o in the run"});
    expect_usage_error(eval + "--lengths 1k", {"--lengths", "1k"});
    expect_usage_error(eval + "--methods snapkv --ratios 0.5 --preset kvpres", {"--preset", "kvpres"});
    const auto bad_preset = write("preset.json", R"({"preset": "kvpres", "methods": ["snapkv"], "budgets": [0.5]})");
    expect_cli_error("eval " + good_ + " " + bad_preset + " --out " + dir_ + "/ev2", {"unknown preset 'kvpres'"});
    const auto bad_key = write("exp.json", R"({"model": "x", "lenghts": [512]})");
    expect_cli_error("eval " + bad_key, {"exp.json", "unknown experiment key 'lenghts'"});
    const auto not_json = write("exp2.json", "{model: x");
    expect_cli_error("eval " + not_json, {"exp2.json", "not valid JSON"});
    expect_cli_error("eval " + good_ + " " + good_, {"two models"});
    expect_cli_error("report " + dir_ + "/nothing-here", {"no such file or directory"});
}

TEST_F(BadInput, BenchMethodsRefusesBadMethodsAndParams) {
    const std::string bench = "bench-methods " + good_ + " --reps 1 --decode 2 ";
    expect_cli_error(bench + "--context 16 --methods snapkvv", {"unknown method 'snapkvv'"});
    expect_cli_error(bench + "--context 16 --methods snapkv --param snapkv:windw=4", {"unknown parameter 'windw'"});
    expect_cli_error(bench + "--context 100", {"exceeds the model's context of 64 tokens"});
    const auto not_ids = write("ids.json", R"({"ids": [1, 2]})");
    expect_cli_error(bench + "--context 16 --tokens " + not_ids, {"ids.json", "not a JSON array of token ids"});
    const auto few = write("few.json", "[1, 2, 3]");
    expect_cli_error(bench + "--context 16 --tokens " + few, {"few.json has only 3 token ids"});
}

}  // namespace
}  // namespace kvlab
