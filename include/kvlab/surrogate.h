// KVzap's learned scorer (docs/methods.md "KVzap"; arXiv 2601.07891): per layer, a surrogate f_l
// maps the hidden state entering layer l's attention at a token to the predicted log KVzip+
// score of that token's row, one output per KV head. Linear (ridge regression) or a
// one-hidden-layer MLP (GELU). Trained by `kvlab train-scorer` for one model file and bound
// to it by its sha256; stored in a versioned, checksummed file written atomically
// (docs/kvzap.md gives the layout).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvlab {

class Surrogate {
public:
    enum class Kind { linear, mlp };
    struct Layer {
        std::vector<float> w1, b1;  // linear: [n_out][n_in], [n_out]; mlp: [n_hidden][n_in], [n_hidden]
        std::vector<float> w2, b2;  // mlp only: [n_out][n_hidden], [n_out]
    };

    Surrogate() = default;
    Surrogate(Kind kind, int n_in, int n_out, int n_hidden, std::vector<Layer> layers);

    Kind kind() const { return kind_; }
    int n_layer() const { return int(layers_.size()); }
    int n_in() const { return n_in_; }
    int n_out() const { return n_out_; }
    int n_hidden() const { return n_hidden_; }
    const Layer & layer(int il) const { return layers_.at(size_t(il)); }
    // Layer il's predictions for n hidden states x [n][n_in]: y [n][n_out] (log KVzip+ scores).
    void predict(int il, const float * x, int64_t n, float * y) const;

    // What the file says besides the weights: the model it was trained for ({"name", "sha256",
    // "arch"}), the training run's provenance (corpus, tokens, seed, ...) and the fit per layer.
    nlohmann::json model, training, fit;

    // Writes the file atomically (a temporary file in the same directory, fsync, rename): a
    // failure leaves no partial file at path. Throws kvlab::Error naming the path.
    void save(const std::string & path) const;
    // Reads and checks a file: magic, version, sizes (truncation), the sha256 of its contents
    // (flipped bits), the weights' shapes; with model_sha256 not empty, refuses a file trained
    // for another model file (naming both). Throws kvlab::Error("scorer", ...).
    static Surrogate load(const std::string & path, const std::string & model_sha256 = "");

    static const char * kind_name(Kind k);
    static Kind kind_of(const std::string & name);  // throws for another name

private:
    Kind kind_ = Kind::linear;
    int n_in_ = 0, n_out_ = 0, n_hidden_ = 0;
    std::vector<Layer> layers_;
};

// The default scorer file of a model under kvlab's cache directory (~/.cache/kvlab):
// <cache_dir>/scorers/<first 16 hex digits of the model's sha256>-<kind>.kvzap
std::string default_scorer_path(const std::string & cache_dir, const std::string & model_sha256, Surrogate::Kind kind);

class Model;
// The scorer for `model`: the file `path`, or (path empty) the model's own in kvlab's cache
// directory (default_scorer_path); checked against the model's sha256 and shape. Throws
// kvlab::Error naming `kvlab train-scorer` when there is none.
Surrogate scorer_for(const Model & model, const std::string & path, Surrogate::Kind kind);

// Ridge regression with an intercept (scikit-learn's Ridge: centred data, the intercept not
// penalised) from streamed sufficient statistics, so that no sample needs to be kept:
// add() samples (x [m][n_in], y [m][n_out]), then solve(). In double throughout.
class RidgeFit {
public:
    RidgeFit(int n_in, int n_out);
    void add(const float * x, const float * y, int64_t m);  // m samples
    int64_t n() const { return n_; }
    // W [n_out][n_in] and b [n_out] minimising sum ||y - W x - b||^2 + alpha ||W||_F^2.
    // Throws when there are fewer than two samples.
    void solve(double alpha, std::vector<float> & w, std::vector<float> & b) const;

private:
    int n_in_, n_out_;
    int64_t n_ = 0;
    std::vector<double> sxx_, sxy_, sx_, sy_;  // [n_in][n_in], [n_in][n_out], [n_in], [n_out]
};

}  // namespace kvlab
