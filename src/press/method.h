// The method seam: one file per method registers a Registration (its MethodInfo and a
// factory). Score-based methods are a Scorer plus a Policy; wrappers (adakv, criticalkv,
// chunkkv) take any registered scorer as their `base`.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvlab/error.h"
#include "kvlab/press.h"

namespace kvlab::press {

// Scores of the L context rows of every (layer, KV head), higher = keep. Rows
// [0, n_sink) and [L - window, L) are always kept; their scores are ignored.
struct Scores {
    int64_t L = 0;
    int64_t n_sink = 0;
    int64_t window = 0;
    bool per_layer = false;                          // one row set per layer: heads' scores are equal
    std::vector<std::vector<std::vector<float>>> s;  // [layer][head][L]
    int64_t forced() const { return std::min(L, n_sink + window); }
    bool is_forced(int64_t j) const { return j < n_sink || j >= L - window; }
};

// Validated, typed parameters of one method (defaults from its MethodInfo).
class Params {
public:
    // Throws for a name not among `specs` (the method's and, for a wrapper, its base's).
    Params(const std::string & method, const std::vector<ParamSpec> & specs, const ParamMap & given);
    int64_t get_int(const std::string & name) const;
    double get_float(const std::string & name) const;
    bool get_bool(const std::string & name) const;
    std::string get_string(const std::string & name) const;
    nlohmann::json json() const;

private:
    const std::string & raw(const std::string & name) const;
    std::string method_;
    std::map<std::string, std::string> values_;
};

class Scorer {
public:
    virtual ~Scorer() = default;
    // Like Press::observer; the scorer adds the seconds it spends observing to *observe_s.
    virtual const QueryObserver * observer(KvStore & cache, int64_t L, double * observe_s) { return nullptr; }
    virtual Scores score(const KvStore & cache) = 0;
};

using ScorerFactory = std::function<std::unique_ptr<Scorer>(const Params &, const Model &)>;

// Scoring while decoding (docs/methods.md, "Compression during decoding"): the scores of the rows a
// segment (layer, KV head) holds now, whatever earlier compressions left in it (the segments of one
// cache differ), generated step after step. The decoding policy (DecodePolicy) decides when and
// selects the rows; a method that can score this way registers a SegmentScorerFactory.
class SegmentScorer {
public:
    virtual ~SegmentScorer() = default;
    // What it reads from each decoding step (the step's queries, its hidden states), or nullptr.
    virtual const QueryObserver * observer() { return nullptr; }
    // A generation starts on `cache`; after_token follows each generated token (its row is in the
    // cache), compressed each compression step (whether or not it dropped rows).
    virtual void start(const KvStore & cache) {}
    virtual void after_token(const KvStore & cache) {}
    virtual void compressed(const KvStore & cache) {}
    // The scores of segment (il, h)'s rows [n_rows(il, h)], higher kept first; +inf: never dropped.
    virtual std::vector<float> score(const KvStore & cache, int il, int h) = 0;
    // The method's own selection rule when it has one: a threshold (DMSPress) instead of a row
    // target, the rows scored below `value` dropped unless among the `window` most recent positions.
    struct Threshold {
        float value = 0.0f;
        int64_t window = 0;
    };
    virtual std::optional<Threshold> threshold() const { return std::nullopt; }
    // A scorer for another generation with the same parameters, sharing what this one loaded
    // (read-only: a server's requests each take one).
    virtual std::unique_ptr<SegmentScorer> another() const = 0;
};
// Throws kvlab::Error for parameters the method does not take while decoding.
using SegmentScorerFactory = std::function<std::unique_ptr<SegmentScorer>(const ParamMap &, const Model &)>;

// The scores of one segment's rows from those rows alone (key norms, key diversity, recency): one
// function gives a method both its prefill scorer and its decoding scorer.
using SegmentScore = std::function<std::vector<float>(const KvStore & cache, int il, int h)>;
// Every segment of a freshly prefilled cache scored by f, over n_threads threads.
Scores score_segments(const KvStore & cache, int n_threads, const SegmentScore & f);
// The decoding scorer of such a method.
std::unique_ptr<SegmentScorer> stateless_segment_scorer(SegmentScore f);
// For a decoding scorer that takes no parameters: throws naming the method when `params` has any.
void refuse_decode_params(const std::string & method, const ParamMap & params);
// Budget policy: the plan for the scores and the per-layer budget B.
using Policy = std::function<KeepPlan(const Scores &, const Budget &, const KvStore &)>;
using PressFactory = std::function<std::unique_ptr<Press>(const Params &, const Model &)>;

struct Registration {
    MethodInfo info;
    PressFactory make;
    ScorerFactory scorer;          // set for methods usable as a wrapper's base
    SegmentScorerFactory segment;  // set for methods that score while decoding (DecodePolicy)
};

void register_method(Registration r);
const Registration * find_method(const std::string & name);
std::vector<const Registration *> all_methods();

template <typename F>
struct MethodRegistrar {
    explicit MethodRegistrar(F f) { register_method(f()); }
};

// A scorer with a policy: the common shape of a method.
std::unique_ptr<Press> scored_press(std::unique_ptr<Scorer> scorer, Policy policy);
// The uniform policy: every layer keeps the budget B (each head its own rows).
Policy uniform_policy();
// The registration of a scorer with the uniform policy, usable as a wrapper's base.
Registration uniform_method(MethodInfo info, ScorerFactory scorer);

// Shared parameter specs.
std::vector<ParamSpec> window_params();  // window, kernel, pooling (SnapKV family)
// The SnapKV family's window under kvpress's rules (window 64, kernel 5, avg pooling: its
// SnapKVPress defaults), with `more` (a method's own kvpress parameters) added.
ParamMap kvpress_window_params(const ParamMap & more = {});
const std::vector<ParamSpec> & wrapper_base_param();

// Window-attention scorer (SnapKV family): observation window w, pooling.
std::unique_ptr<Scorer> make_window_scorer(const Params & p, const Model & m);

// The scorer named by a wrapper's `base` parameter, built from the same parameters.
std::unique_ptr<Scorer> make_base_scorer(const Params & p, const Model & m);
// Specs of a wrapper: its own, plus `base`, plus the base's (given the chosen base).
std::vector<ParamSpec> wrapper_specs(const std::vector<ParamSpec> & own, const ParamMap & given);

// Post-RoPE keys of segment (il, h) as float32 [rows][head_dim] (all rows of a freshly
// prefilled context), and its values.
std::vector<float> keys(const KvStore & cache, int il, int h);
std::vector<float> values(const KvStore & cache, int il, int h);

// W_o of layer il (Model::attn_output) dequantized to float32, [n_embd][n_head * head_dim].
std::vector<float> output_matrix(const Model & m, int il);
// The Gram matrix of each query head's block of W_o: G_h = W_h^T W_h, [n_head][head_dim][head_dim]
// (W_h = the head_dim columns of head h), so that ||W_h v||^2 = v^T G_h v: the norm of value v's
// contribution to the layer's output through head h (KVzip+).
std::vector<float> output_grams(const Model & m, int il);

// Runs f(i) for i in [0, n) on up to n_threads threads (the caller's among them), each taking
// the next i in turn; f(i) must depend on nothing another index writes. An exception from f
// is rethrown once every thread has stopped.
void parallel_for(int64_t n, int n_threads, const std::function<void(int64_t)> & f);

}  // namespace kvlab::press
