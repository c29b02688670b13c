// kvlab serve MODEL [--host H] [--port P] [--api-key K] [--parallel N] [--kv-budget BYTES]
// [--store DIR]: the HTTP server (src/server). Stops cleanly on SIGINT / SIGTERM.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "common.h"
#include "environment.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "server/server.h"

namespace kvlab::cli {

namespace {

struct ServeArgs {
    server::ServerOptions o;
    std::string model, kv_budget = "1GiB";
    int threads = 0;
    KernelArgs kernels;
    EngineArgs engine;
    DecodeArgs decode;
};

// "1073741824", "512MiB", "2GiB", "300MB": bytes.
uint64_t parse_bytes(const std::string & s) {
    size_t end = 0;
    double v = 0;
    try {
        v = std::stod(s, &end);
    } catch (const std::exception &) {
        end = 0;
    }
    const std::string unit = s.substr(end);
    const double mult = unit.empty() || unit == "B" ? 1
                        : unit == "KiB"             ? 1024.0
                        : unit == "MiB"             ? 1024.0 * 1024
                        : unit == "GiB"             ? 1024.0 * 1024 * 1024
                        : unit == "KB"              ? 1e3
                        : unit == "MB"              ? 1e6
                        : unit == "GB"              ? 1e9
                                                    : -1;
    if (end == 0 || mult < 0 || v <= 0)
        throw Error("serve", "--kv-budget takes bytes (e.g. 1073741824, 512MiB, 2GiB), got '" + s + "'");
    return uint64_t(v * mult);
}

int run_serve(ServeArgs & a) {
    // SIGINT / SIGTERM are taken by one thread that stops the server (no work in a handler)
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    signal(SIGPIPE, SIG_IGN);
    // Request bodies of up to --max-body are freed when answered: from a fixed size on they are
    // their own mappings, returned to the system at once (glibc raises this threshold to the
    // largest block freed, after which every worker thread's arena would keep its last body).
    mallopt(M_MMAP_THRESHOLD, 1 << 20);

    a.o.kv_budget = parse_bytes(a.kv_budget);
    Loaded l = load(a.model, a.kernels.options(a.threads));
    a.o.threads = l.model->n_threads();
    a.o.engine = a.engine.options();
    a.o.decode = a.decode.options();
    a.o.model_id = std::filesystem::path(l.path).stem().string();
    if (a.o.store.empty()) a.o.store = environment().cache_dir + "/contexts";
    server::Server srv(*l.model, *l.tok, a.o);
    const int port = srv.bind();
    std::thread stopper([&srv, sigs] {
        int sig = 0;
        sigwait(&sigs, &sig);
        std::fprintf(stderr, "[serve] signal %d: stopping\n", sig);
        srv.stop();
    });
    const bool batching = a.o.batching && a.o.decode.method == "none";
    const std::string compute = batching ? "batches of up to " + std::to_string(a.o.parallel) + " request(s) on " +
                                               std::to_string(std::max(1, a.o.threads)) + " thread(s)"
                                         : std::to_string(a.o.parallel) + " slot(s) x " +
                                               std::to_string(std::max(1, a.o.threads / a.o.parallel)) + " thread(s)";
    std::fprintf(stderr,
                 "[serve] model %s | %s | KV budget %s | store %s\n"
                 "[serve] listening on http://%s:%d%s\n",
                 a.o.model_id.c_str(), compute.c_str(), human_bytes(a.o.kv_budget).c_str(),
                 srv.store_description().c_str(), a.o.host.c_str(), port,
                 a.o.api_key.empty() ? "" : " (API key required)");
    std::fflush(stderr);
    srv.listen();
    pthread_kill(stopper.native_handle(), SIGTERM);  // wakes the stopper when listen ended otherwise
    stopper.join();
    return 0;
}

const CommandRegistrar reg("serve", [](CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand(
        "serve",
        "HTTP server: OpenAI-compatible completions, stored compressed contexts (/v1/contexts), /metrics, "
        "a web page at /");
    auto a = std::make_shared<ServeArgs>();
    add_model_arg(cmd, a->model);
    cmd->add_option("--host", a->o.host, "address to listen on (default localhost only)")->capture_default_str();
    cmd->add_option("--port", a->o.port, "port (0: any free one, printed)")->capture_default_str();
    cmd->add_option("--api-key", a->o.api_key, "require 'Authorization: Bearer KEY' (except on / and /health)");
    cmd->add_option("--parallel", a->o.parallel,
                    "requests computed at the same time (slots; with batching, the most in one batch)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd->add_flag("!--no-batching", a->o.batching,
                  "run each request alone on its slot (--parallel engines sharing --threads) instead of decoding the "
                  "admitted requests together in one batch per step on one engine of --threads threads (continuous "
                  "batching, the default; a --decode-policy runs each request on its slot)");
    cmd->add_option("--batch-chunk", a->o.batch_chunk,
                    "with batching: the most query tokens a request prefills in one step (the others' next token "
                    "waits for at most that)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd->add_option("--queue", a->o.queue, "requests that may wait for a slot; more get 503")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    cmd->add_option("--queue-timeout", a->o.queue_timeout_s, "seconds a request may wait for a slot")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd->add_option("--kv-budget", a->kv_budget,
                    "resident bytes of the stored contexts' KV rows; least recently used ones are dropped from "
                    "memory and reloaded from the store")
        ->capture_default_str();
    cmd->add_option("--store", a->o.store,
                    "where stored contexts live: a folder of cache files (default ~/.cache/kvlab/contexts), or "
                    "redis://[:PASSWORD@]HOST[:PORT][/DB], a Redis or Valkey server that replicas share "
                    "(docs/server.md, \"Replicas\")");
    cmd->add_option("--max-body", a->o.max_body, "largest request body in bytes; larger get 413")
        ->capture_default_str();
    cmd->add_option("--timeout", a->o.io_timeout_s, "socket write timeout in seconds (a client that stops reading)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd->add_option("--read-timeout", a->o.read_timeout_s,
                    "socket read timeout in seconds (a client that stops sending its request)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd->add_option("--max-connections", a->o.max_connections,
                    "open connections in all; past it the newest still waiting for a request (0.5 s) are closed, "
                    "and 8 reserve workers keep /health and /metrics answering")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd->add_option("--max-connections-per-client", a->o.max_per_client,
                    "open connections from one client address; past it the same rule")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    add_run_options(cmd, a->threads, a->kernels, a->engine);
    add_decode_policy_options(cmd, a->decode);
    cmd->add_flag(
        "--no-prefix-reuse", [a](int64_t) { a->o.prefix_reuse = false; },
        "answer a prompt that begins with a stored context's tokens by a fresh prefill (by default the "
        "longest such context answers it, as if the request named it; usage.prompt_tokens_details."
        "cached_tokens says how many tokens came from it)");
    cmd->callback([&rc, a] { rc = run_serve(*a); });
});

}  // namespace

}  // namespace kvlab::cli
