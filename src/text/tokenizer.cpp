#include <algorithm>
#include <unordered_map>

#include "ggml-cpp.h"
#include "gguf.h"
#include "kvlab/error.h"
#include "kvlab/text.h"
#include "llama.h"

namespace kvlab {

namespace {

// What libllama's vocabulary loader asserts on (GGML_ASSERT: an abort, not an error), checked
// first: a token table of strings, no token twice, type and score tables of its length.
void check_vocabulary(const std::string & path) {
    gguf_init_params gp = {/*no_alloc=*/true, /*ctx=*/nullptr};
    gguf_context_ptr g(gguf_init_from_file(path.c_str(), gp));
    if (!g) throw Error("text", path + ": not a readable GGUF file");
    const int64_t k = gguf_find_key(g.get(), "tokenizer.ggml.tokens");
    if (k < 0) return;  // libllama reports a missing vocabulary itself
    if (gguf_get_kv_type(g.get(), k) != GGUF_TYPE_ARRAY || gguf_get_arr_type(g.get(), k) != GGUF_TYPE_STRING)
        throw Error("text", path + ": tokenizer.ggml.tokens is not an array of strings");
    const size_t n = gguf_get_arr_n(g.get(), k);
    std::unordered_map<std::string, size_t> seen;
    seen.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        const auto [it, fresh] = seen.emplace(gguf_get_arr_str(g.get(), k, i), i);
        if (!fresh)
            throw Error("text", path + ": tokenizer.ggml.tokens has token '" + it->first + "' twice (ids " +
                                    std::to_string(it->second) + " and " + std::to_string(i) + ")");
    }
    for (const char * key : {"tokenizer.ggml.token_type", "tokenizer.ggml.scores"}) {
        const int64_t t = gguf_find_key(g.get(), key);
        if (t >= 0 && (gguf_get_kv_type(g.get(), t) != GGUF_TYPE_ARRAY || gguf_get_arr_n(g.get(), t) != n))
            throw Error("text",
                        path + ": " + key + " is not an array of " + std::to_string(n) + " entries (one per token)");
    }
}

}  // namespace

Tokenizer::Tokenizer(const std::string & path) {
    check_vocabulary(path);
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    model_.reset(llama_model_load_from_file(path.c_str(), mp));
    if (!model_) throw Error("text", "libllama could not load the vocabulary of " + path);
    vocab_ = llama_model_get_vocab(model_.get());
    if (const char * t = llama_model_chat_template(model_.get(), nullptr)) chat_template_ = t;
}

std::vector<int32_t> Tokenizer::encode(const std::string & text, bool add_special, bool parse_special) const {
    std::vector<llama_token> out(text.size() + 8);
    int32_t n = llama_tokenize(vocab_, text.data(), int32_t(text.size()), out.data(), int32_t(out.size()), add_special,
                               parse_special);
    if (n < 0) {
        out.resize(size_t(-n));
        n = llama_tokenize(vocab_, text.data(), int32_t(text.size()), out.data(), int32_t(out.size()), add_special,
                           parse_special);
    }
    if (n < 0) throw Error("text", "tokenization failed");
    out.resize(size_t(n));
    return {out.begin(), out.end()};
}

std::string Tokenizer::decode(const std::vector<int32_t> & tokens) const {
    std::string out(tokens.size() * 8 + 16, '\0');
    int32_t n =
        llama_detokenize(vocab_, tokens.data(), int32_t(tokens.size()), out.data(), int32_t(out.size()), false, false);
    if (n < 0) {
        out.resize(size_t(-n));
        n = llama_detokenize(vocab_, tokens.data(), int32_t(tokens.size()), out.data(), int32_t(out.size()), false,
                             false);
    }
    if (n < 0) throw Error("text", "detokenization failed");
    out.resize(size_t(n));
    return out;
}

std::string Tokenizer::piece(int32_t token) const {
    char buf[256];
    const int32_t n = llama_token_to_piece(vocab_, token, buf, sizeof(buf), 0, true);
    return n < 0 ? std::string() : std::string(buf, size_t(n));
}

std::string Tokenizer::chat_text(const std::vector<ChatMessage> & messages, bool add_generation_prompt) const {
    if (chat_template_.empty()) throw Error("text", "the model has no chat template; use a plain prompt instead");
    std::vector<llama_chat_message> msgs;
    size_t total = 0;
    for (const auto & m : messages) {
        msgs.push_back({m.role.c_str(), m.content.c_str()});
        total += m.content.size() + m.role.size();
    }
    std::string buf(2 * total + 256, '\0');
    int32_t n = llama_chat_apply_template(chat_template_.c_str(), msgs.data(), msgs.size(), add_generation_prompt,
                                          buf.data(), int32_t(buf.size()));
    if (n > int32_t(buf.size())) {
        buf.resize(size_t(n));
        n = llama_chat_apply_template(chat_template_.c_str(), msgs.data(), msgs.size(), add_generation_prompt,
                                      buf.data(), int32_t(buf.size()));
    }
    if (n < 0) throw Error("text", "libllama does not recognise this model's chat template");
    buf.resize(size_t(n));
    return buf;
}

std::vector<int32_t> Tokenizer::chat(const std::vector<ChatMessage> & messages, bool add_generation_prompt) const {
    // The template text may itself start with the BOS text; tokenizing with add_special
    // would then give two BOS tokens. Keep exactly one.
    std::vector<int32_t> toks =
        encode(chat_text(messages, add_generation_prompt), /*add_special=*/true, /*parse_special=*/true);
    const int32_t b = bos();
    if (toks.size() >= 2 && b >= 0 && toks[0] == b && toks[1] == b) toks.erase(toks.begin());
    return toks;
}

Tokenizer::SplitPrompt Tokenizer::context_prompt(const std::string & context, const std::string & question) const {
    return context_chat({}, context, {{"user", question}});
}

Tokenizer::SplitPrompt Tokenizer::context_chat(const std::vector<ChatMessage> & before, const std::string & context,
                                               const std::vector<ChatMessage> & messages) const {
    if (messages.empty() || messages[0].role != "user")
        throw Error("text", "a conversation about a context starts with a user message");
    if (const size_t nul = context.find('\0'); nul != std::string::npos)
        throw Error("text", "the context has a NUL byte at offset " + std::to_string(nul) +
                                ": a chat template cannot carry it (remove it from the text)");
    for (const ChatMessage & m : messages)
        if (m.role != "user" && m.role != "assistant")
            throw Error("text", "after the context only user and assistant messages may follow, not '" + m.role + "'");
    SplitPrompt sp;
    if (!has_chat_template()) {
        std::string head;
        for (const ChatMessage & m : before) head += m.content + "\n\n";
        sp.context = encode(head + context, true, false);
        std::string tail;
        for (const ChatMessage & m : messages)
            tail += m.role == "user" ? "\n\nQuestion: " + m.content + "\nAnswer:" : " " + m.content;
        sp.query = encode(tail, false, false);
        return sp;
    }
    std::vector<ChatMessage> all = before;
    all.push_back({"user", context + "\n\nQuestion: " + messages[0].content});
    all.insert(all.end(), messages.begin() + 1, messages.end());
    const std::string text = chat_text(all);
    const size_t at = text.find(context + "\n\nQuestion: ");
    if (at == std::string::npos) throw Error("text", "the chat template did not keep the context verbatim");
    const size_t end = at + context.size();
    sp.context = encode(text.substr(0, end), true, true);
    const int32_t b = bos();
    if (sp.context.size() >= 2 && b >= 0 && sp.context[0] == b && sp.context[1] == b)
        sp.context.erase(sp.context.begin());
    sp.query = encode(text.substr(end), false, true);
    return sp;
}

std::string Tokenizer::context_text(const std::vector<ChatMessage> & before, const std::string & context) const {
    if (!has_chat_template()) return "";
    std::vector<ChatMessage> all = before;
    all.push_back({"user", context + "\n\nQuestion: "});
    const std::string text = chat_text(all);
    const size_t at = text.find(context + "\n\nQuestion: ");
    if (at == std::string::npos) throw Error("text", "the chat template did not keep the context verbatim");
    return text.substr(0, at + context.size());
}

std::vector<int32_t> Tokenizer::user_turn_suffix() const {
    if (!has_chat_template()) return encode("\n", false, false);
    const std::string marker = "kvlab-user-turn-marker";
    const std::string text = chat_text({{"user", marker}});
    const size_t at = text.rfind(marker);
    if (at == std::string::npos) throw Error("text", "the chat template did not keep a user message verbatim");
    return encode(text.substr(at + marker.size()), false, true);
}

int32_t Tokenizer::n_vocab() const {
    return llama_vocab_n_tokens(vocab_);
}
int32_t Tokenizer::bos() const {
    return llama_vocab_bos(vocab_);
}
int32_t Tokenizer::eos() const {
    return llama_vocab_eos(vocab_);
}
int32_t Tokenizer::eot() const {
    return llama_vocab_eot(vocab_);
}
bool Tokenizer::adds_bos() const {
    return llama_vocab_get_add_bos(vocab_);
}
bool Tokenizer::is_eog(int32_t token) const {
    return llama_vocab_is_eog(vocab_, token);
}

std::vector<int32_t> Tokenizer::eog_ids() const {
    std::vector<int32_t> ids;
    for (int32_t t = 0; t < n_vocab(); ++t)
        if (is_eog(t)) ids.push_back(t);
    return ids;
}

}  // namespace kvlab
