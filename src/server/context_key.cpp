#include "server/context_key.h"

#include "kvlab/cache_file.h"
#include "kvlab/sys.h"

namespace kvlab::server {

std::string context_key(const std::string & model_sha256, const ContextJob & job, const CacheTypes & types) {
    nlohmann::json params = nlohmann::json::object();  // a std::map: the keys in one order
    for (const auto & [k, v] : job.params) params[k] = v;
    // the texts by their bytes' digests: two texts that differ only in bytes that are not UTF-8 differ
    nlohmann::json before = nlohmann::json::array();
    for (const ChatMessage & m : job.before)
        before.push_back({{"role", m.role}, {"content_sha256", sha256_hex(m.content.data(), m.content.size())}});
    const nlohmann::json content = {
        {"kvlab_context", 1},
        {"cache_file_version", k_cache_file_version},
        {"model_sha256", model_sha256},
        {"before", before},
        {"text_sha256", sha256_hex(job.text.data(), job.text.size())},
        {"method", job.method},
        {"preset", job.preset},
        {"params", params},
        {"budget", job.budget ? job.budget->to_json() : nlohmann::json()},
        {"cache_types",
         {{"k", cache_type_name(types.k)}, {"v", cache_type_name(types.v)}, {"rotate", types.rotate}}},
    };
    const std::string text = content.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return "ctx-" + sha256_hex(text.data(), text.size()).substr(0, 24);
}

}  // namespace kvlab::server
