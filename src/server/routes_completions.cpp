// /v1/chat/completions and /v1/completions, OpenAI's shapes (streamed as server-sent events
// or not). With kvlab's `context` field the answer comes from an independent copy of a
// stored context's cache: only the question is prefilled.
#include <atomic>
#include <ctime>

#include "kvlab/sys.h"
#include "server/openai.h"
#include "server/peer.h"
#include "server/routes.h"
#include "server/state.h"
#include "server/text_stream.h"

namespace kvlab::server {

namespace {

// A request turned into tokens, before it holds a slot.
struct Prepared {
    CompletionRequest req;
    std::shared_ptr<const ContextInfo> ctx;  // null: a fresh prompt
    std::vector<int32_t> query;              // tokens prefilled for this request
    int32_t max_tokens = 0;                  // clamped to the room the model's context leaves
    double t_request = 0.0;
};

std::string new_id(const char * prefix) {
    static std::atomic<uint64_t> n{0};
    char b[64];
    std::snprintf(b, sizeof(b), "%s-%llx%llx", prefix, static_cast<unsigned long long>(std::time(nullptr)),
                  static_cast<unsigned long long>(n++));
    return b;
}

// The request parsed, before any tokenization: its text bounded (check_prompt_bytes).
Prepared parse(ServerState & s, const nlohmann::json & body, bool chat) {
    Prepared p;
    p.t_request = now_seconds();
    p.req = parse_completion_request(body, chat);
    size_t bytes = p.req.prompt.size();
    for (const ChatMessage & m : p.req.messages) bytes += m.content.size();
    check_prompt_bytes(s, bytes, chat ? "messages" : "prompt");
    return p;
}

// Tokenizes the prompt (inside a slot) and sizes the answer.
void prepare(ServerState & s, Prepared & p, bool chat) {
    const CompletionRequest & r = p.req;
    int64_t n_context = 0;
    if (!r.context.empty()) {
        p.ctx = valid_context_id(r.context) ? s.store->info(r.context) : nullptr;
        if (!p.ctx) throw unknown_context(r.context, "context");
        n_context = int64_t(p.ctx->tokens.size());
        if (chat) {
            for (const ChatMessage & m : r.messages)
                if (m.role == "system")
                    throw ApiError(400,
                                   "a stored context fixes the start of the prompt: give system messages when "
                                   "creating it (POST /v1/contexts)",
                                   "messages");
            if (r.messages[0].role != "user")
                throw ApiError(400, "after a stored context the messages start with a user message", "messages");
            const Tokenizer::SplitPrompt sp = s.tok.context_chat(p.ctx->before, p.ctx->text, r.messages);
            if (sp.context != p.ctx->tokens)
                throw ApiError(400, "this conversation does not extend the stored context's tokens", "messages");
            p.query = sp.query;
        } else {
            p.query = s.tok.encode(r.prompt, false, true);
        }
    } else {
        p.query = chat ? s.tok.chat(r.messages) : s.tok.encode(r.prompt, true, true);
        // automatic reuse: the longest stored context that begins the prompt answers it, as if the
        // request had named it (llama-server's prompt cache, LMCache's prefix match). A chat is
        // matched by its rendered text and split there as a named context splits it (the tokens
        // of "...text\n\n\n" + "\n\nQuestion: " differ from the context's at the boundary); a
        // plain prompt by its tokens.
        const std::string text = chat && s.opts.prefix_reuse ? s.tok.chat_text(r.messages) : "";
        if (s.opts.prefix_reuse && chat && (p.ctx = s.store->longest_prefix(text))) {
            p.query = s.tok.encode(text.substr(p.ctx->prompt_text.size()), false, true);
            n_context = int64_t(p.ctx->tokens.size());
        } else if (s.opts.prefix_reuse && (p.ctx = s.store->longest_prefix(p.query))) {
            n_context = int64_t(p.ctx->tokens.size());
            p.query.erase(p.query.begin(), p.query.begin() + n_context);
        }
    }
    if (p.query.empty()) throw ApiError(400, "the prompt is empty", chat ? "messages" : "prompt");
    const int64_t n_ctx = s.model.hparams().n_ctx_train;
    const int64_t room = n_ctx - n_context - int64_t(p.query.size());
    if (room < 1)
        throw ApiError(400,
                       "the prompt needs " + std::to_string(n_context + int64_t(p.query.size())) +
                           " tokens; the model's context is " + std::to_string(n_ctx) + " tokens",
                       chat ? "messages" : "prompt", "context_length_exceeded");
    p.max_tokens = int32_t(std::min<int64_t>(r.max_tokens, room));
}

nlohmann::json token_bytes(const std::string & piece) {
    nlohmann::json b = nlohmann::json::array();
    for (unsigned char c : piece) b.push_back(int(c));
    return b;
}

// OpenAI's logprobs object of one token (chat) with its alternatives.
nlohmann::json chat_logprob(const Tokenizer & tok, const TokenLogprob & lp, int top) {
    const std::string piece = tok.piece(lp.token);
    nlohmann::json alts = nlohmann::json::array();
    for (int i = 0; i < top && i < int(lp.top.size()); ++i) {
        const std::string p = tok.piece(lp.top[size_t(i)].first);
        alts.push_back({{"token", p}, {"logprob", lp.top[size_t(i)].second}, {"bytes", token_bytes(p)}});
    }
    return {{"token", piece}, {"logprob", lp.logprob}, {"bytes", token_bytes(piece)}, {"top_logprobs", alts}};
}

// The legacy completions logprobs object over tokens [from, to).
nlohmann::json completion_logprobs(const Tokenizer & tok, const std::vector<TokenLogprob> & lps, size_t from, size_t to,
                                   int top) {
    nlohmann::json tokens = nlohmann::json::array(), values = nlohmann::json::array(), tops = nlohmann::json::array();
    for (size_t i = from; i < to && i < lps.size(); ++i) {
        tokens.push_back(tok.piece(lps[i].token));
        values.push_back(lps[i].logprob);
        nlohmann::json t = nlohmann::json::object();
        for (int k = 0; k < top && k < int(lps[i].top.size()); ++k)
            t[tok.piece(lps[i].top[size_t(k)].first)] = lps[i].top[size_t(k)].second;
        tops.push_back(t);
    }
    return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}};
}

struct Outcome {
    GenerateResult r;
    std::string text;
    std::string finish;  // "stop" | "length"
    double request_ttft_s = 0.0, context_load_s = 0.0, copy_s = 0.0;
    bool client_gone = false;
    uint64_t kv_peak_bytes = 0;  // the request's copy of the cache at its largest
    nlohmann::json decode;       // the decoding policy's figures (null without one)
};

// Generates on a slot; emit(delta) releases text as it becomes final and returns false when
// the client went away.
Outcome generate(ServerState & s, const Prepared & p, Engine & engine,
                 const std::function<bool(const std::string &)> & emit) {
    Outcome o;
    // with a decoding policy the copy grows by at most its interval between compactions
    const int64_t growth = decode_growth(s.opts.decode, p.max_tokens);
    KvStore work = [&] {
        if (!p.ctx) return engine.new_cache(int64_t(p.query.size()) + growth);
        std::shared_ptr<const KvStore> rows = s.store->rows(p.ctx->id, &o.context_load_s);
        const double t0 = now_seconds();
        KvStore w = rows->copy(int64_t(p.query.size()) + growth);
        o.copy_s = now_seconds() - t0;
        return w;
    }();
    GenerateOptions go;
    go.max_tokens = p.max_tokens;
    go.eog_ids = s.tok.eog_ids();
    go.stop_on_eog = !p.req.ignore_eos;
    go.sampling = p.req.sampling;
    go.n_logprobs = p.req.logprobs ? std::max(1, p.req.top_logprobs) : 0;
    const std::unique_ptr<DecodePolicy> policy = s.decode->another();
    policy->start(work);
    if (!s.batch) go.decode = &policy->hook();
    TextStream ts(s.tok, p.req.stop);
    bool first = true;
    const auto on_token = [&](int32_t tok) {
        if (first) o.request_ttft_s = now_seconds() - p.t_request;
        first = false;
        const std::string delta = ts.push(tok);
        if (!delta.empty() && !emit(delta)) {
            o.client_gone = true;
            return false;
        }
        return !ts.stopped();
    };
    // the decoding loop takes every request of the server in one batch; a policy compacts one
    // request's cache between its own steps, on its slot
    o.r = s.batch ? s.batch->generate(work, p.query, go, on_token) : engine.generate(work, p.query, go, on_token);
    const std::string rest = ts.finish();
    if (!o.client_gone && !rest.empty()) o.client_gone = !emit(rest);
    o.text = ts.text();
    o.kv_peak_bytes = o.r.kv_peak_bytes;
    if (s.opts.decode.method != "none") o.decode = policy->stats().to_json();
    o.finish = o.r.stop_reason == "max_tokens" && !ts.stopped() ? "length" : "stop";
    s.metrics.ttft(o.request_ttft_s);
    if (o.r.n_decoded > 0) s.metrics.decode_per_token(o.r.decode_s / double(o.r.n_decoded));
    s.metrics.tokens(int64_t(p.query.size()), int64_t(o.r.tokens.size()));
    return o;
}

nlohmann::json usage(const Prepared & p, const Outcome & o) {
    const int64_t cached = p.ctx ? int64_t(p.ctx->tokens.size()) : 0;
    const int64_t prompt = cached + int64_t(p.query.size()), completion = int64_t(o.r.tokens.size());
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

nlohmann::json timings(const Prepared & p, const Outcome & o) {
    return {{"context", p.ctx ? nlohmann::json(p.ctx->id) : nlohmann::json()},
            {"context_tokens", p.ctx ? p.ctx->tokens.size() : 0},
            {"context_load_s", o.context_load_s},
            {"cache_copy_s", o.copy_s},
            {"query_tokens", p.query.size()},
            {"query_prefill_s", o.r.query_prefill_s},
            {"ttft_s", o.request_ttft_s},
            {"engine_ttft_s", o.r.ttft_s},
            {"decode_s", o.r.decode_s},
            {"decode_tokens", o.r.n_decoded},
            {"decode_tokens_per_s", o.r.decode_tokens_per_second()},
            {"kv_peak_bytes", o.kv_peak_bytes},
            {"decode_policy", o.decode}};
}

void complete(ServerState & s, const httplib::Request & http_req, const nlohmann::json & body, httplib::Response & res,
              bool chat) {
    auto p = std::make_shared<Prepared>(parse(s, body, chat));
    auto lease = std::shared_ptr<Slots::Lease>(s.slots->acquire());
    prepare(s, *p, chat);
    const std::string id = new_id(chat ? "chatcmpl" : "cmpl");
    const int64_t created = int64_t(std::time(nullptr));
    const nlohmann::json head = {
        {"id", id},
        {"object", chat ? (p->req.stream ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
        {"created", created},
        {"model", s.opts.model_id},
        {"system_fingerprint", s.fingerprint}};
    // the one model this server runs answers whatever the client named (as llama-server); said so
    const std::string & asked = p->req.model;
    const std::string warning =
        asked.empty() || asked == s.opts.model_id
            ? ""
            : "model '" + asked.substr(0, 100) + "' is not served here; '" + s.opts.model_id + "' answered";
    if (!warning.empty()) res.set_header("X-Kvlab-Warning", warning);
    if (!p->req.stream) {
        // nothing is written before the end: the client's socket is watched instead (a client that
        // hung up frees its slot within a fraction of a second)
        PeerWatch peer(http_req);
        Outcome o = generate(s, *p, lease->engine(), [&](const std::string &) { return !peer.gone(); });
        if (o.client_gone) {  // no one to answer; counted as nginx counts it
            res.status = 499;
            return;
        }
        nlohmann::json choice = {{"index", 0}, {"finish_reason", o.finish}};
        const size_t n_tok = o.r.logprobs.size();
        if (chat) {
            choice["message"] = {{"role", "assistant"}, {"content", o.text}};
            nlohmann::json lp = nullptr;
            if (p->req.logprobs) {
                lp = {{"content", nlohmann::json::array()}};
                for (const auto & x : o.r.logprobs)
                    lp["content"].push_back(chat_logprob(s.tok, x, p->req.top_logprobs));
            }
            choice["logprobs"] = lp;
        } else {
            choice["text"] = o.text;
            choice["logprobs"] = p->req.logprobs
                                     ? completion_logprobs(s.tok, o.r.logprobs, 0, n_tok, p->req.top_logprobs)
                                     : nlohmann::json();
        }
        nlohmann::json body = head;
        body["choices"] = {choice};
        body["usage"] = usage(*p, o);
        if (!warning.empty()) body["warnings"] = {warning};
        body["timings"] = timings(*p, o);
        return send_json(res, 200, body);
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [&s, p, lease, head, chat](size_t, httplib::DataSink & sink) {
        const auto send = [&sink](const nlohmann::json & j) {
            const std::string line =
                "data: " + j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
            return sink.write(line.data(), line.size());
        };
        const auto chunk = [&](const nlohmann::json & choice) {
            nlohmann::json c = head;
            c["choices"] = {choice};
            return c;
        };
        if (chat && !send(chunk({{"index", 0},
                                 {"delta", {{"role", "assistant"}, {"content", ""}}},
                                 {"logprobs", nullptr},
                                 {"finish_reason", nullptr}})))
            return false;
        Outcome o;
        try {
            o = generate(s, *p, lease->engine(), [&](const std::string & delta) {
                nlohmann::json choice = {{"index", 0}, {"finish_reason", nullptr}};
                if (chat) {
                    choice["delta"] = {{"content", delta}};
                    choice["logprobs"] = nullptr;
                } else {
                    choice["text"] = delta;
                    choice["logprobs"] = nullptr;
                }
                return send(chunk(choice));
            });
        } catch (const ApiError & e) {
            send(e.body());
            sink.done();
            return true;
        } catch (const std::exception & e) {
            send(ApiError(500, std::string("internal error: ") + e.what()).body());
            sink.done();
            return true;
        }
        if (o.client_gone) return false;
        nlohmann::json last = chunk(
            chat ? nlohmann::json{{"index", 0},
                                  {"delta", nlohmann::json::object()},
                                  {"logprobs", nullptr},
                                  {"finish_reason", o.finish}}
                 : nlohmann::json{{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", o.finish}});
        last["timings"] = timings(*p, o);
        if (p->req.logprobs) {  // the logprobs of the whole answer ride on the last chunk
            if (chat) {
                nlohmann::json lp = {{"content", nlohmann::json::array()}};
                for (const auto & x : o.r.logprobs)
                    lp["content"].push_back(chat_logprob(s.tok, x, p->req.top_logprobs));
                last["choices"][0]["logprobs"] = lp;
            } else {
                last["choices"][0]["logprobs"] =
                    completion_logprobs(s.tok, o.r.logprobs, 0, o.r.logprobs.size(), p->req.top_logprobs);
            }
        }
        if (!send(last)) return false;
        if (p->req.include_usage) {
            nlohmann::json u = head;
            u["choices"] = nlohmann::json::array();
            u["usage"] = usage(*p, o);
            if (!send(u)) return false;
        }
        const std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
    });
}

const RouteRegistrar reg({{"POST", "/v1/chat/completions"}, {"POST", "/v1/completions"}}, [](ServerState & s) {
    post_json(s, "/v1/chat/completions",
              [&s](const httplib::Request & req, const nlohmann::json & body, httplib::Response & res) {
                  complete(s, req, body, res, true);
              });
    post_json(s, "/v1/completions",
              [&s](const httplib::Request & req, const nlohmann::json & body, httplib::Response & res) {
                  complete(s, req, body, res, false);
              });
});

}  // namespace

}  // namespace kvlab::server
