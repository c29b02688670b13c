// kvlab profile MODEL: where a prefill's and a decode step's time goes, node kind by node kind
// and thread by thread: each thread's time computing in kvlab's nodes, its wait at the barrier
// after each for the slowest thread, and what remains (ggml's own nodes, their barriers, the
// dispatch). kvlab/op_profile.h says how it is measured.
#include <algorithm>
#include <cstdio>
#include <random>

#include "common.h"
#include "kvlab/error.h"
#include "kvlab/op_profile.h"
#include "kvlab/provenance.h"

namespace kvlab::cli {

namespace {
struct ProfileArgs {
    std::string model;
    int context = 4096, n_decode = 32, threads = 0;
    KernelArgs kernels;
    EngineArgs engine;
    bool json = false, no_warmup = false;
};

nlohmann::json to_json(const OpProfile::Phase & ph) {
    nlohmann::json ops = nlohmann::json::array();
    for (const OpProfile::Op & op : ph.ops)
        ops.push_back({{"op", op.name},
                       {"calls", op.calls},
                       {"wall_s", op.wall_s},
                       {"busy_s", op.busy_s},
                       {"wait_s", op.wait_s}});
    return {{"phase", ph.name},    {"threads", ph.n_threads},     {"graphs", ph.graphs},   {"tokens", ph.tokens},
            {"wall_s", ph.wall_s}, {"ggml_nodes", ph.ggml_nodes}, {"other_s", ph.other_s}, {"ops", ops}};
}

// One table per phase, in milliseconds per graph (a decode step; a prefill's total for the
// prefill), rows by wall time.
void print(const OpProfile::Phase & ph, bool per_graph) {
    const double f = 1e3 / (per_graph ? double(std::max<int64_t>(1, ph.graphs)) : 1.0);
    const int nt = ph.n_threads;
    std::printf("\n%s: %lld tokens in %lld graphs, %d thread%s, wall %.2f ms%s (%.1f tok/s)\n", ph.name.c_str(),
                static_cast<long long>(ph.tokens), static_cast<long long>(ph.graphs), nt, nt == 1 ? "" : "s",
                ph.wall_s * f, per_graph ? " per graph" : "", ph.wall_s > 0 ? double(ph.tokens) / ph.wall_s : 0.0);
    std::printf("  %-40s %7s %9s", "node (ms)", "calls", "wall");
    for (int t = 0; t < nt; ++t) std::printf("  busy t%-2d wait t%-2d", t, t);
    std::printf("\n");
    std::vector<const OpProfile::Op *> ops;
    for (const OpProfile::Op & op : ph.ops) ops.push_back(&op);
    std::stable_sort(ops.begin(), ops.end(), [](auto * a, auto * b) { return a->wall_s > b->wall_s; });
    std::vector<double> busy(size_t(nt), 0.0), wait(size_t(nt), 0.0);
    for (const OpProfile::Op * op : ops) {
        std::printf("  %-40s %7lld %9.3f", op->name.c_str(), static_cast<long long>(op->calls), op->wall_s * f);
        for (int t = 0; t < nt; ++t) {
            std::printf("  %8.3f %8.3f", op->busy_s[size_t(t)] * f, op->wait_s[size_t(t)] * f);
            busy[size_t(t)] += op->busy_s[size_t(t)];
            wait[size_t(t)] += op->wait_s[size_t(t)];
        }
        std::printf("\n");
    }
    std::printf("  %-40s %7lld %9s", "ggml's nodes, barriers, dispatch", static_cast<long long>(ph.ggml_nodes), "");
    for (int t = 0; t < nt; ++t) std::printf("  %8.3f %8s", ph.other_s[size_t(t)] * f, "");
    std::printf("\n  share of the wall time:");
    for (int t = 0; t < nt; ++t)
        std::printf("  t%d kvlab nodes %.1f%%, waiting after them %.1f%%, the rest %.1f%%;", t,
                    100.0 * busy[size_t(t)] / ph.wall_s, 100.0 * wait[size_t(t)] / ph.wall_s,
                    100.0 * ph.other_s[size_t(t)] / ph.wall_s);
    std::printf("\n");
}

int run_profile(const ProfileArgs & a) {
    const int threads = resolve_threads(a.threads);  // fixed: a phase is measured on one thread count
    Loaded l = load(a.model, a.kernels.options(threads));
    if (a.context + a.n_decode > l.model->hparams().n_ctx_train)
        throw Error("profile", "context " + std::to_string(a.context) + " + decode exceeds the model's " +
                                   std::to_string(l.model->hparams().n_ctx_train) + " tokens");
    OpProfile prof;
    EngineOptions eo = a.engine.options();
    eo.profile = &prof;
    Engine engine(*l.model, eo);
    // real token ids drawn from the vocabulary, as `kvlab bench` does (speed does not depend on the text)
    std::mt19937 rng(1234);
    std::vector<int32_t> toks(size_t(a.context));
    std::uniform_int_distribution<int32_t> dist(0, l.model->hparams().n_vocab - 1);
    for (auto & t : toks) t = dist(rng);
    if (!a.no_warmup) {  // not counted: the compute buffer grows to the context's size and its pages are touched
        std::fprintf(stderr, "[profile] warm-up prefill of %d tokens\n", a.context);
        KvStore c = engine.new_cache(a.context);
        engine.prefill(c, toks);
    }
    KvStore cache = engine.new_cache(int64_t(a.context) + a.n_decode);
    std::fprintf(stderr, "[profile] prefill of %d tokens on %d thread%s\n", a.context, threads,
                 threads == 1 ? "" : "s");
    prof.set_phase("prefill");
    engine.prefill(cache, toks);
    std::fprintf(stderr, "[profile] %d decode steps\n", a.n_decode);
    prof.set_phase("decode");
    GenerateOptions go;
    go.max_tokens = a.n_decode;  // the query token's graph, then n_decode - 1 steps: one token each
    go.stop_on_eog = false;
    engine.generate(cache, {toks[0]}, go);
    prof.set_phase("");

    if (a.json) {
        nlohmann::json phases = nlohmann::json::array();
        for (const OpProfile::Phase & ph : prof.phases()) phases.push_back(to_json(ph));
        nlohmann::json j = {{"phases", phases},
                            {"params",
                             {{"context", a.context},
                              {"n_decode", a.n_decode},
                              {"threads", threads},
                              {"engine", a.engine.to_json()},
                              {"products", a.kernels.products},
                              {"warmup", !a.no_warmup},
                              {"note",
                               "busy: a thread computing in a kvlab node; wait: the same thread at the barrier after "
                               "it until the slowest thread left the node; other: the graphs' wall time minus both "
                               "(ggml's own nodes, their barriers, the dispatch)"}}},
                            {"provenance", provenance(*l.model, *l.tok)}};
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("kvlab profile %s: context %d, %d decode steps on top\n", a.model.c_str(), a.context, a.n_decode);
    for (const OpProfile::Phase & ph : prof.phases()) print(ph, ph.name == "decode");
    return 0;
}

const CommandRegistrar reg("profile", [](CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand(
        "profile",
        "Where prefill's and decode's time goes: each kvlab node kind, thread by thread, with barrier waits");
    auto a = std::make_shared<ProfileArgs>();
    add_model_arg(cmd, a->model);
    cmd->add_option("--context", a->context, "tokens prefilled (random ids from the vocabulary, as `kvlab bench`)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--decode", a->n_decode, "single-token steps on top of the context")->check(CLI::PositiveNumber);
    add_run_options(cmd, a->threads, a->kernels, a->engine);
    add_json_flag(cmd, a->json, "every phase's per-node, per-thread seconds and the provenance");
    cmd->add_flag("--no-warmup", a->no_warmup,
                  "profile the engine's first prefill (by default a prefill of the same context runs first, not "
                  "counted, as in `kvlab bench`'s later repetitions: the compute buffer grown, its pages touched)");
    cmd->footer(
        "Each thread's time in each of kvlab's graph nodes (weight products, packing, attention, cache writes; "
        "layers summed), its wait at the barrier after the node until the slowest thread leaves it, and the rest of "
        "the wall time: ggml's own nodes (norms, rope, additions), their barriers and the dispatch. Prefill in "
        "milliseconds for the whole context, decode per step.");
    cmd->callback([&rc, a] { rc = run_profile(*a); });
});

}  // namespace

}  // namespace kvlab::cli
