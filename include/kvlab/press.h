// KV-cache compression (docs/methods.md, docs/design.md "Compression as plan / apply"): a method is a
// scorer (what each cached row is worth, per layer and KV head) plus a budget policy
// (how many rows each layer and head keeps) plus fixed rules (sinks, observation window).
// It returns a KeepPlan; only the KV store applies it, physically freeing the rest.
//
// Flow: make_press(name, params, model); p->observer(cache, L) goes to Engine::prefill
// when the method scores from the prefill's queries; then p->plan(cache, budget) and
// cache.compact(plan, reserve). compress() does the last two and reports times and bytes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvlab/cache.h"
#include "kvlab/model.h"
#include "kvlab/observer.h"
#include "kvlab/text.h"

namespace kvlab {

// How much to keep. ratio: fraction of the L context rows removed (kvpress convention),
// kept = int(L * (1 - ratio)) as kvpress computes it, in [0, 1). tokens: the per-layer budget B (window included).
struct Budget {
    double ratio = 0.0;
    int64_t tokens = -1;  // >= 0: use it instead of ratio
    // A byte budget instead (docs/methods.md, "Mixed precision"): the K/V bytes the rows of the
    // compressed cache hold, kv_bytes >= 0, or bytes_ratio > 0 of those of the context's full
    // cache at F16. compress() turns it into row counts: the method's ranking decides which rows
    // stay at the cache types, which are demoted and which are evicted.
    int64_t kv_bytes = -1;
    double bytes_ratio = -1.0;
    // Demotion: the rows the budget would evict are kept at this type (q8_0 or q4_0) instead
    // (GGML_TYPE_COUNT: evicted). With a byte budget, high_share is the share of the bytes held
    // at the cache types (1: eviction only; 0: every row kept demoted; < 0, the default: every
    // row kept if the bytes allow, as many of them at the cache types as fit, else every kept
    // row demoted). With a ratio or token budget the method's rows stay and all others are demoted.
    ggml_type demote = GGML_TYPE_COUNT;
    double high_share = -1.0;
    // Models with sliding-window layers (Gemma 3): false, the method compresses the global
    // layers and each sliding layer keeps its window (the rows its next query sees); true,
    // the method's choice applies to the sliding layers too, inside their window.
    bool sliding = false;
    static Budget from_ratio(double r);
    static Budget from_tokens(int64_t b);
    static Budget from_bytes(int64_t bytes);
    static Budget from_bytes_ratio(double r);  // in (0, 1]
    bool by_bytes() const { return kv_bytes >= 0 || bytes_ratio > 0.0; }
    bool demotes() const { return demote != GGML_TYPE_COUNT; }
    // Sets demote (q8_0 or q4_0) and high_share (in [0, 1], or < 0), checking them.
    void set_demotion(ggml_type type, double share);
    int64_t per_layer(int64_t L) const;  // B for a context of L rows (not for a byte budget)
    // The share of a context of L rows the budget keeps: B / L, or 1 - ratio (kvpress's 1 -
    // compression_ratio), in double.
    double keep_fraction(int64_t L) const;
    std::string describe() const;
    // Its one JSON form, written and read everywhere: {"ratio": r}, {"tokens": B}, {"kv_bytes":
    // N} or {"bytes_ratio": R}, with "sliding": true when set and "demote": "q4_0" (and
    // "high_share": F) when demoting. from_json also takes a bare number (a ratio) and checks
    // the values as the from_ functions do.
    nlohmann::json to_json() const;
    static Budget from_json(const nlohmann::json & j);
};

struct ParamSpec {
    std::string name;
    std::string def;  // default, as text
    std::string help;
    std::vector<std::string> choices = {};  // when not empty: the only values it takes (checked by Params)
};

// Parameters as given by the user (name -> text); validated against the method's specs.
using ParamMap = std::map<std::string, std::string>;

struct MethodInfo {
    std::string name;
    std::string summary;
    std::vector<ParamSpec> params;
    bool wrapper = false;   // takes a `base` scorer method
    bool observes = false;  // scores from the prefill's queries (a wrapper: as its base; listed for the default)
    // kvpress's press of the same method (docs/methods.md, "Fidelity to kvpress"): the parameters
    // under which this method follows kvpress's rules (`--preset kvpress`), and what still
    // differs from kvpress under them ("" when nothing is known to).
    ParamMap kvpress_params;
    std::string kvpress_differs;
    // What kvlab's own defaults do where kvpress does otherwise, and whose rule they are (the
    // paper's reference code); "" when the defaults are kvpress's rules.
    std::string defaults_differ;
    bool decodes = false;  // scores while decoding (a --decode-policy): set by press_methods() from the registry
    // name, summary, wrapper, scores_from_prefill, scores_while_decoding, params [{name, default, help, choices}],
    // kvpress_preset, differs_from_kvpress_under_preset, defaults_differ_from_kvpress
    nlohmann::json to_json() const;
};

// Extra tokens a method has the engine prefill on top of the prefilled context (KVzip's
// repeat prompts), one pass after another: their queries go to the observer, and their
// rows are removed again (KvStore::rollback) before anything else sees the cache.
struct ScoringPass {
    std::vector<int32_t> tokens;
    const QueryObserver * observer = nullptr;  // owned by the press; its `first` is 0
};

// The parameters of `method` under a preset: "" (kvlab's defaults: `params` as given) or
// "kvpress" (the method's kvpress_params, then `params` over them). Throws for another name.
ParamMap apply_preset(const std::string & preset, const std::string & method, const ParamMap & params);

class Press {
public:
    virtual ~Press() = default;
    const std::string & name() const { return name_; }
    // The resolved parameters (defaults filled in), for result records.
    const nlohmann::json & params() const { return params_; }

    // Called before the context is prefilled into `cache` (L tokens from its current
    // end). Returns the observer to pass to Engine::prefill, or nullptr when the method
    // scores from the cache alone. The cache must outlive the prefill.
    virtual const QueryObserver * observer(KvStore & cache, int64_t L) { return nullptr; }
    // Whether the method runs passes of its own on top of the context (needs a tokenizer).
    virtual bool has_scoring_passes() const { return false; }
    // Whether it scores from the prefill (its queries or hidden states, or passes of its own): the
    // cache it compresses must come from a prefill of the context it observed.
    bool observes() const { return observes_ || has_scoring_passes(); }
    // The passes to run after the context's prefill, built
    // from its tokens and the tokenizer's prompts; the store holds exactly the context.
    virtual std::vector<ScoringPass> scoring_passes(const KvStore & cache, const std::vector<int32_t> & context,
                                                    const Tokenizer & tok) {
        return {};
    }
    // Seconds spent inside the observer during prefill (scoring work done on the fly), and
    // in the scoring passes (add_scoring_seconds): the method's share of the compression time.
    double observe_seconds() const { return observe_s_; }
    void add_scoring_seconds(double s) { observe_s_ += s; }
    // The rows to keep, per layer and head, for the budget. Throws for an impossible
    // budget (smaller than the rows the method always keeps).
    virtual KeepPlan plan(const KvStore & cache, const Budget & budget) = 0;
    // The scores the last plan ranked, [layer][head][L] (higher is kept first), and the rows it
    // kept whatever their score (sinks and window, flagged 1 in `forced`); empty for methods
    // that rank nothing row by row. For cross-checks (bench-methods --dump-plans).
    struct RowScores {
        std::vector<std::vector<std::vector<float>>> s;
        std::vector<char> forced;  // [L]
    };
    virtual RowScores last_scores() const { return {}; }

protected:
    std::string name_;
    nlohmann::json params_;
    double observe_s_ = 0.0;
    bool observes_ = false;  // set by make_press from MethodInfo::observes (a wrapper: its base's)
    friend std::unique_ptr<Press> make_press(const std::string &, const ParamMap &, const Model &);
};

// Several methods' observers on one prefill (each scores from the same queries; each
// method's observing time stays its own): each observer sees the rows it asked for.
class ObserverSet {
public:
    explicit ObserverSet(const Model & model);
    void add(const QueryObserver * o);  // null is ignored
    const QueryObserver * get() const;  // null when no observer was added
    ObserverSet(const ObserverSet &) = delete;
    ObserverSet & operator=(const ObserverSet &) = delete;

private:
    std::vector<const QueryObserver *> obs_;
    QueryObserver all_;
    int64_t per_row_ = 0, n_embd_ = 0;
};

// Throws kvlab::Error for an unknown method or parameter, or a malformed value.
std::unique_ptr<Press> make_press(const std::string & name, const ParamMap & params, const Model & model);
std::vector<MethodInfo> press_methods();

struct CompressStats {
    double plan_s = 0.0;                      // scoring from the cache and planning
    double observe_s = 0.0;                   // scoring done during prefill (inside the observer)
    double apply_s = 0.0;                     // compaction of the store
    int64_t rows_before = 0, rows_after = 0;  // over all (layer, head) segments
    uint64_t bytes_before = 0, bytes_after = 0, used_before = 0, used_after = 0;
    std::vector<std::vector<int64_t>> kept;  // [layer][head] rows kept (demoted ones included)
    int64_t rows_demoted = 0;                // of rows_after, those held at the demoted type
    // A byte budget: the bytes it allowed, the rows per compressed segment it gave at the cache
    // types and in all (the rest demoted) before the method placed them
    int64_t budget_bytes = -1, rows_high = -1, rows_total = -1;
    double seconds() const { return plan_s + observe_s + apply_s; }
    nlohmann::json to_json() const;
};

// The layers a budget compresses: every layer, or on a model with sliding-window layers the
// global ones unless budget.sliding (policies that share a budget across layers use these).
std::vector<int> compressed_layers(const KvStore & cache, const Budget & budget);

// Plans with `press` for `budget` and compacts the cache, leaving `reserve` free rows per
// segment for the query and answer tokens. On sliding-window layers the plan is replaced
// by the layer's window (budget.sliding false) or cut to it (true).
CompressStats compress(Press & press, KvStore & cache, const Budget & budget, int64_t reserve);

}  // namespace kvlab
