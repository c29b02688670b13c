#include "app/load.h"

#include <cstdio>

#include "app/fetch.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab::app {

namespace {
// Says so on stderr when other work keeps some of the CPUs busy.
void say_idle(int idle) {
    const int n = n_cpus();
    if (idle < n)
        std::fprintf(stderr, "[threads] %d of %d CPUs: the others are busy with other work (-t N to choose)\n", idle,
                     n);
}
}  // namespace

Loaded load(const std::string & name_or_path, const ModelOptions & opts, const ModelStore & store) {
    Loaded l;
    l.path = resolve_model(name_or_path, store);
    l.model = Model::load(l.path, opts);  // n_threads 0: the model samples the idle CPUs itself
    if (opts.n_threads == 0) say_idle(l.model->n_threads());
    l.tok = std::make_unique<Tokenizer>(l.path);
    if (l.tok->n_vocab() != l.model->hparams().n_vocab)
        throw Error("model", l.path + ": the vocabulary (" + std::to_string(l.tok->n_vocab()) +
                                 " tokens) does not match the output layer (" +
                                 std::to_string(l.model->hparams().n_vocab) + ")");
    return l;
}

int resolve_threads(int requested) {
    if (requested > 0) return requested;
    const int idle = idle_cpus();
    say_idle(idle);
    return idle;
}

}  // namespace kvlab::app
