// GET /v1/models: the one model the server runs, in OpenAI's list shape.
#include <ctime>

#include "server/routes.h"
#include "server/state.h"

namespace kvlab::server {

namespace {

const RouteRegistrar reg({{"GET", "/v1/models"}}, [](ServerState & s) {
    s.http.Get("/v1/models", [&s](const httplib::Request &, httplib::Response & res) {
        const nlohmann::json m = {{"id", s.opts.model_id},
                                  {"object", "model"},
                                  {"created", int64_t(std::time(nullptr))},
                                  {"owned_by", "kvlab"},
                                  {"meta",
                                   {{"n_ctx_train", s.model.hparams().n_ctx_train},
                                    {"n_vocab", s.model.hparams().n_vocab},
                                    {"arch", s.model.hparams().arch}}}};
        send_json(res, 200, {{"object", "list"}, {"data", {m}}});
    });
});

}  // namespace

}  // namespace kvlab::server
