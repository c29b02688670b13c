// Text: encode, decode and the model's own chat template, through libllama's vocabulary
// (token ids equal llama.cpp's for the same GGUF).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llama-cpp.h"

namespace kvlab {

struct ChatMessage {
    std::string role;  // "system" | "user" | "assistant"
    std::string content;
};

class Tokenizer {
public:
    // Loads only the vocabulary of the GGUF at path.
    explicit Tokenizer(const std::string & path);

    // add_special: the BOS (and EOS) the vocabulary asks for; parse_special: control
    // tokens written in the text ("<|im_start|>") become their ids.
    std::vector<int32_t> encode(const std::string & text, bool add_special = true, bool parse_special = false) const;
    std::string decode(const std::vector<int32_t> & tokens) const;
    std::string piece(int32_t token) const;

    // The model's chat template applied to messages, with the assistant turn opened unless
    // add_generation_prompt is false,
    // tokenized with exactly one BOS when the model uses one.
    std::vector<int32_t> chat(const std::vector<ChatMessage> & messages, bool add_generation_prompt = true) const;
    std::string chat_text(const std::vector<ChatMessage> & messages, bool add_generation_prompt = true) const;
    bool has_chat_template() const { return !chat_template_.empty(); }

    // A question about a long context, split so that the context's tokens are a prefix
    // every question shares (its KV cache is computed once and reused): with a chat
    // template, one user turn "CONTEXT\n\nQuestion: QUESTION" with the assistant turn
    // opened; without, "CONTEXT\n\nQuestion: QUESTION\nAnswer:".
    struct SplitPrompt {
        std::vector<int32_t> context, query;
    };
    SplitPrompt context_prompt(const std::string & context, const std::string & question) const;
    // A conversation about a long context, split at the context's end: `before` (say a
    // system message) comes first, the context joins the first of `messages` (a user
    // turn: "CONTEXT\n\nQuestion: FIRST"), the others follow, and the assistant turn is
    // opened. The context part does not depend on `messages`, so one cached context serves
    // every conversation. Without a chat template, user turns read "\n\nQuestion: Q\nAnswer:"
    // and assistant turns " A". Throws unless messages start with a user turn.
    SplitPrompt context_chat(const std::vector<ChatMessage> & before, const std::string & context,
                             const std::vector<ChatMessage> & messages) const;

    // The tokens that close a user turn and open the assistant's (with a chat template, what
    // it puts after a user message's content; without, "\n").
    std::vector<int32_t> user_turn_suffix() const;
    // The chat text whose tokens are context_chat(before, context, ...).context: the template
    // rendered up to the end of the context ("" without a chat template). A conversation whose
    // rendered text begins with it splits there as context_chat splits it.
    std::string context_text(const std::vector<ChatMessage> & before, const std::string & context) const;

    int32_t n_vocab() const;
    int32_t bos() const;
    int32_t eos() const;
    int32_t eot() const;
    bool adds_bos() const;
    bool is_eog(int32_t token) const;
    std::vector<int32_t> eog_ids() const;

private:
    llama_model_ptr model_;                // vocabulary only
    const llama_vocab * vocab_ = nullptr;  // model_'s
    std::string chat_template_;
};

}  // namespace kvlab
