// kvlab train-scorer MODEL [--corpus DIR|FILE ...] [--tokens N] [--kind linear|mlp]: trains KVzap's
// surrogate for the model on the CPU and writes the scorer file the `kvzap` method reads.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common.h"
#include "environment.h"
#include "kvlab/error.h"
#include "kvlab/provenance.h"
#include "kvlab/scorer_training.h"
#include "train_scorer.h"

namespace kvlab::cli {

namespace {

namespace fs = std::filesystem;

struct TrainArgs {
    std::string model, out, kind = "linear";
    std::vector<std::string> corpus;
    ScorerTrainingOptions opts;
    int threads = 0;
    KernelArgs kernels;
    bool json = false, force = false;
    std::vector<std::string> given;  // the options given that only one kind takes
};

// The options only one kind of surrogate takes: refused with the other, rather than ignored.
void check_kind_options(const TrainArgs & a) {
    for (const std::string & opt : a.given) {
        const bool for_mlp = opt != "--alpha";
        if (for_mlp != (a.kind == "mlp"))
            throw Error("train-scorer",
                        opt + " is an option of --kind " + (for_mlp ? "mlp" : "linear") + ", not of --kind " + a.kind);
    }
}

// The default corpus: text every Debian machine with Python 3 holds, disjoint from the
// evaluation's haystacks (essays) and synthetic tasks: Python's reference documentation
// (pydoc_data/topics.py: prose), modules of its standard library (code with docstrings) and
// the licence texts of /usr/share/common-licenses (long formal prose).
std::vector<std::string> default_corpus() {
    std::vector<std::string> out;
    std::vector<fs::path> pythons;
    for (const auto & e : fs::directory_iterator("/usr/lib"))
        if (e.path().filename().string().rfind("python3.", 0) == 0 && fs::exists(e.path() / "pydoc_data/topics.py"))
            pythons.push_back(e.path());
    std::sort(pythons.begin(), pythons.end());
    if (!pythons.empty()) {
        const fs::path py = pythons.back();
        for (const char * f :
             {"pydoc_data/topics.py", "argparse.py", "dataclasses.py", "difflib.py", "email/message.py",
              "http/client.py", "json/decoder.py", "logging/__init__.py", "pathlib.py", "statistics.py",
              "subprocess.py", "textwrap.py", "typing.py", "unittest/case.py", "zipfile.py"})
            if (fs::exists(py / f)) out.push_back((py / f).string());
    }
    for (const char * f : {"Apache-2.0", "GPL-3", "LGPL-2.1", "MPL-2.0", "GFDL-1.3", "Artistic", "CC0-1.0"}) {
        const fs::path p = fs::path("/usr/share/common-licenses") / f;
        if (fs::exists(p)) out.push_back(p.string());
    }
    if (out.empty())
        throw Error("train-scorer",
                    "no default corpus on this machine (Python 3's library, /usr/share/common-licenses): "
                    "give --corpus DIR|FILE");
    return out;
}

// Every regular file under each path (sorted), or the file itself; files with NUL bytes are skipped.
std::vector<CorpusText> read_corpus(const std::vector<std::string> & paths) {
    std::vector<std::string> files;
    for (const std::string & p : paths) {
        if (fs::is_directory(p)) {
            std::vector<std::string> here;
            for (const auto & e : fs::recursive_directory_iterator(p))
                if (e.is_regular_file()) here.push_back(e.path().string());
            std::sort(here.begin(), here.end());
            files.insert(files.end(), here.begin(), here.end());
        } else if (fs::is_regular_file(p)) {
            files.push_back(p);
        } else {
            throw Error("train-scorer", "--corpus " + p + ": no such file or directory");
        }
    }
    std::vector<CorpusText> out;
    for (const std::string & f : files) {
        std::string text = read_file(f);
        if (text.find('\0') != std::string::npos) continue;
        out.push_back({f, std::move(text)});
    }
    if (out.empty()) throw Error("train-scorer", "the corpus holds no text file");
    return out;
}

int run_train(const TrainArgs & a) {
    check_kind_options(a);
    Loaded l = load(a.model, a.kernels.options(a.threads));
    ScorerTrainingOptions o = a.opts;
    o.kind = Surrogate::kind_of(a.kind);
    const std::string out =
        a.out.empty() ? default_scorer_path(environment().cache_dir, l.model->file_sha256(), o.kind) : a.out;
    if (fs::exists(out) && !a.force) {
        std::fprintf(stderr, "[train-scorer] %s exists (--force trains again)\n", out.c_str());
        if (a.json) std::printf("%s\n", nlohmann::json{{"path", out}, {"trained", false}}.dump(2).c_str());
        return 0;
    }
    const std::vector<CorpusText> corpus = read_corpus(a.corpus.empty() ? default_corpus() : a.corpus);
    std::fprintf(stderr, "[train-scorer] %s: %zu corpus files, up to %lld tokens in texts of %lld\n", l.path.c_str(),
                 corpus.size(), static_cast<long long>(o.tokens), static_cast<long long>(o.doc_tokens));
    o.progress = [](int64_t done, int64_t total, const char * phase) {
        std::fprintf(stderr, "\r[train-scorer] %-8s text %lld/%lld", phase, static_cast<long long>(done),
                     static_cast<long long>(total));
        if (done == total) std::fputc('\n', stderr);
        std::fflush(stderr);
    };
    o.epoch_progress = [](int epoch, int epochs, double train, double valid, double seconds) {
        if (epoch == 1) std::fputc('\n', stderr);  // below the training texts' progress line
        std::fprintf(stderr, "[train-scorer] mlp epoch %d/%d: training loss %.4f, validation loss %.4f (%.0f s)\n",
                     epoch, epochs, train, valid, seconds);
    };
    Engine engine(*l.model);
    Surrogate s = train_scorer(engine, *l.tok, corpus, o);
    s.training["provenance"] = provenance(*l.model, *l.tok);
    s.save(out);
    std::fprintf(stderr, "[train-scorer] held-out fit: mean R^2 %.3f, mean Spearman %.3f over %d layers (%.0f s)\n",
                 s.fit["mean_r2"].get<double>(), s.fit["mean_spearman"].get<double>(), s.n_layer(),
                 s.training["seconds"].get<double>());
    std::fprintf(stderr, "[train-scorer] wrote %s\n", out.c_str());
    if (a.json)
        std::printf("%s\n",
                    nlohmann::json{
                        {"path", out}, {"trained", true}, {"model", s.model}, {"fit", s.fit}, {"training", s.training}}
                        .dump(2)
                        .c_str());
    return 0;
}

}  // namespace

int train_default_scorer(const std::string & model, int threads) {
    TrainArgs a;
    a.model = model;
    a.threads = threads;
    return run_train(a);
}

namespace {

const CommandRegistrar reg("train-scorer", [](CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand(
        "train-scorer",
        "Train KVzap's surrogate for a model: KVzip+ scores of a training corpus, a ridge fit (or an MLP) per layer "
        "from the hidden states entering its attention; writes the scorer file the kvzap method reads");
    auto a = std::make_shared<TrainArgs>();
    add_model_arg(cmd, a->model);
    add_list_option(cmd, "--corpus", a->corpus,
                    "training text: files, or directories read recursively (default: Python's reference "
                    "documentation and library sources, and /usr/share/common-licenses: text disjoint from every "
                    "evaluation task)");
    cmd->add_option("--tokens", a->opts.tokens, "corpus tokens used, held-out texts included")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--kind", a->kind,
                    "surrogate: linear (ridge regression) or mlp (one hidden GELU layer, trained by AdamW as "
                    "kvpress's KVzap)")
        ->capture_default_str()
        ->check(CLI::IsMember({"linear", "mlp"}));
    cmd->add_option("--doc-tokens", a->opts.doc_tokens, "tokens per training text")->capture_default_str();
    cmd->add_option("--samples", a->opts.samples_per_doc, "rows sampled per text")->capture_default_str();
    cmd->add_option("--holdout", a->opts.holdout, "share of the texts held out for the fit report")
        ->capture_default_str()
        ->check(CLI::Range(0.01, 0.5));
    std::vector<CLI::Option *> kind_options;
    kind_options.push_back(cmd->add_option("--alpha", a->opts.alpha, "linear: ridge penalty")
                               ->capture_default_str()
                               ->check(CLI::NonNegativeNumber));
    kind_options.push_back(cmd->add_option("--hidden", a->opts.n_hidden, "mlp: hidden units")
                               ->capture_default_str()
                               ->check(CLI::PositiveNumber));
    kind_options.push_back(
        cmd->add_option("--epochs", a->opts.epochs, "mlp: epochs")->capture_default_str()->check(CLI::PositiveNumber));
    kind_options.push_back(cmd->add_option("--lr", a->opts.lr,
                                           "mlp: AdamW's learning rate at the first epoch (cosine-annealed to 0 over "
                                           "the epochs)")
                               ->capture_default_str()
                               ->check(CLI::PositiveNumber));
    kind_options.push_back(cmd->add_option("--batch", a->opts.batch, "mlp: samples per AdamW step")
                               ->capture_default_str()
                               ->check(CLI::PositiveNumber));
    cmd->add_option("-s,--seed", a->opts.seed, "held-out texts and sampled rows; the MLP's initial weights and order")
        ->capture_default_str();
    cmd->add_option("-o,--output", a->out, "scorer file (default: kvlab's cache, scorers/<model sha256>-<kind>.kvzap)");
    cmd->add_flag("--force", a->force, "train again when the scorer file exists");
    add_threads_option(cmd, a->threads);
    add_kernel_options(cmd, a->kernels);
    add_json_flag(cmd, a->json, "the scorer file's path, the fit per layer and the training's provenance");
    cmd->callback([&rc, a, kind_options] {
        for (const CLI::Option * opt : kind_options)
            if (opt->count()) a->given.push_back(opt->get_name());
        rc = run_train(*a);
    });
});

}  // namespace

}  // namespace kvlab::cli
