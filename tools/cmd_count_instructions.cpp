// kvlab count-instructions MODEL (internal): one prefill and one decode step between callgrind
// client requests, on 1 thread; `kvlab bench --instructions` runs it under valgrind.
#include <valgrind/callgrind.h>

#include <random>

#include "common.h"
#include "kvlab/engine.h"
#include "kvlab/error.h"

namespace kvlab::cli {

namespace {

struct CountArgs {
    std::string model;
    int tokens = 512;
    EngineArgs engine;
};

int run_count(const CountArgs & a) {
    if (!RUNNING_ON_VALGRIND)
        throw Error("count-instructions",
                    "run it under valgrind --tool=callgrind --instr-atstart=no "
                    "(kvlab bench --instructions does)");
    Loaded l = load(a.model, {.n_threads = 1});
    Engine engine(*l.model, a.engine.options());
    // real token ids drawn from the vocabulary with a fixed seed, as kvlab bench does
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> dist(0, l.model->hparams().n_vocab - 1);
    std::vector<int32_t> toks(size_t(a.tokens));
    for (auto & t : toks) t = dist(rng);
    KvStore cache = engine.new_cache(a.tokens + 1);
    CALLGRIND_START_INSTRUMENTATION;
    CALLGRIND_ZERO_STATS;
    engine.prefill(cache, toks);
    CALLGRIND_DUMP_STATS_AT("kvlab-prefill");
    engine.prefill(cache, {toks[0]});  // one single-token evaluation: a decode step
    CALLGRIND_DUMP_STATS_AT("kvlab-decode-step");
    CALLGRIND_STOP_INSTRUMENTATION;
    return 0;
}

const CommandRegistrar reg("count-instructions", [](CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand("count-instructions", "one prefill and one decode step for callgrind (internal)");
    cmd->group("");  // hidden: kvlab bench --instructions runs it
    auto a = std::make_shared<CountArgs>();
    add_model_arg(cmd, a->model);
    cmd->add_option("--tokens", a->tokens, "prefill tokens")->check(CLI::PositiveNumber);
    add_engine_options(cmd, a->engine);
    cmd->callback([&rc, a] { rc = run_count(*a); });
});

}  // namespace

}  // namespace kvlab::cli
