// KVzap's surrogate: prediction, and its file (docs/kvzap.md):
//   0  magic "KVLABZAP"   8  u32 version (1)   12  u32 0   16  u64 meta bytes   24  u64 weight bytes
//   32 sha256 of everything after byte 64   64  meta (JSON)   then the weights, float32 little-endian,
//   layer after layer: w1, b1 (and w2, b2 for an MLP).
#include "kvlab/surrogate.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "kvlab/error.h"
#include "kvlab/model.h"
#include "kvlab/sys.h"
#include "press/eigen.h"

namespace kvlab {

static_assert(std::endian::native == std::endian::little, "scorer files are little-endian");

namespace {

constexpr char k_magic[8] = {'K', 'V', 'L', 'A', 'B', 'Z', 'A', 'P'};
constexpr uint32_t k_version = 1;
constexpr size_t k_head = 64;

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

Error scorer_error(const std::string & path, const std::string & what) {
    return Error("scorer", path + ": " + what);
}

size_t layer_floats(Surrogate::Kind kind, int n_in, int n_out, int n_hidden) {
    const size_t i = size_t(n_in), o = size_t(n_out), h = size_t(n_hidden);
    return kind == Surrogate::Kind::linear ? o * i + o : h * i + h + o * h + o;
}

}  // namespace

Surrogate::Surrogate(Kind kind, int n_in, int n_out, int n_hidden, std::vector<Layer> layers)
    : kind_(kind),
      n_in_(n_in),
      n_out_(n_out),
      n_hidden_(kind == Kind::linear ? 0 : n_hidden),
      layers_(std::move(layers)) {
    if (n_in < 1 || n_out < 1 || (kind == Kind::mlp && n_hidden < 1)) throw Error("scorer", "empty surrogate shape");
    const size_t rows = kind == Kind::linear ? size_t(n_out) : size_t(n_hidden);
    for (const Layer & l : layers_) {
        const bool ok =
            l.w1.size() == rows * n_in && l.b1.size() == rows &&
            (kind == Kind::linear ? l.w2.empty() && l.b2.empty()
                                  : l.w2.size() == size_t(n_out) * n_hidden && l.b2.size() == size_t(n_out));
        if (!ok) throw Error("scorer", "a layer's weights do not match the surrogate's shape");
    }
}

const char * Surrogate::kind_name(Kind k) {
    return k == Kind::linear ? "linear" : "mlp";
}

Surrogate::Kind Surrogate::kind_of(const std::string & name) {
    if (name == "linear") return Kind::linear;
    if (name == "mlp") return Kind::mlp;
    throw Error("scorer", "unknown surrogate kind '" + name + "' (linear or mlp)");
}

void Surrogate::predict(int il, const float * x, int64_t n, float * y) const {
    const Layer & l = layers_.at(size_t(il));
    const Eigen::Map<const RowMajor> X(x, n, n_in_);
    Eigen::Map<RowMajor> Y(y, n, n_out_);
    const auto bias = [](const std::vector<float> & b) {
        return Eigen::Map<const Eigen::RowVectorXf>(b.data(), Eigen::Index(b.size()));
    };
    if (kind_ == Kind::linear) {
        Y.noalias() = X * Eigen::Map<const RowMajor>(l.w1.data(), n_out_, n_in_).transpose();
        Y.rowwise() += bias(l.b1);
        return;
    }
    RowMajor H = X * Eigen::Map<const RowMajor>(l.w1.data(), n_hidden_, n_in_).transpose();
    H.rowwise() += bias(l.b1);
    // GELU, exact (erf): torch's nn.GELU default, as kvpress's KVzap MLP
    H = H.unaryExpr([](float v) { return 0.5f * v * (1.0f + std::erf(v * float(1.0 / std::numbers::sqrt2))); });
    Y.noalias() = H * Eigen::Map<const RowMajor>(l.w2.data(), n_out_, n_hidden_).transpose();
    Y.rowwise() += bias(l.b2);
}

void Surrogate::save(const std::string & path) const {
    nlohmann::json meta = {{"format", "kvlab-kvzap-scorer"},
                           {"kind", kind_name(kind_)},
                           {"n_layer", n_layer()},
                           {"n_in", n_in_},
                           {"n_out", n_out_},
                           {"n_hidden", n_hidden_},
                           {"model", model},
                           {"training", training},
                           {"fit", fit}};
    const std::string m = meta.dump();
    std::vector<uint8_t> body(m.begin(), m.end());
    const auto put_floats = [&body](const std::vector<float> & v) {
        const auto * p = reinterpret_cast<const uint8_t *>(v.data());
        body.insert(body.end(), p, p + v.size() * sizeof(float));
    };
    for (const Layer & l : layers_)
        for (const auto * v : {&l.w1, &l.b1, &l.w2, &l.b2}) put_floats(*v);
    std::vector<uint8_t> head(k_head, 0);
    std::memcpy(head.data(), k_magic, 8);
    const uint64_t meta_bytes = m.size(), weight_bytes = body.size() - m.size();
    std::memcpy(head.data() + 8, &k_version, 4);
    std::memcpy(head.data() + 16, &meta_bytes, 8);
    std::memcpy(head.data() + 24, &weight_bytes, 8);
    const std::string sha = sha256_hex(body.data(), body.size());
    for (size_t i = 0; i < 32; ++i) head[32 + i] = uint8_t(std::stoi(sha.substr(2 * i, 2), nullptr, 16));

    const std::filesystem::path target(path);
    if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw scorer_error(path, std::string("cannot create ") + tmp + ": " + std::strerror(errno));
    bool ok = true;
    for (const auto * part : {&head, &body}) {
        size_t done = 0;
        while (ok && done < part->size()) {
            const ssize_t w = ::write(fd, part->data() + done, part->size() - done);
            if (w <= 0)
                ok = false;
            else
                done += size_t(w);
        }
    }
    ok = ok && ::fsync(fd) == 0;
    ok = (::close(fd) == 0) && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string why = std::strerror(errno);
        std::remove(tmp.c_str());
        throw scorer_error(path, "could not write the scorer file: " + why);
    }
}

Surrogate Surrogate::load(const std::string & path, const std::string & model_sha256) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw scorer_error(path, "cannot open the scorer file");
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (bytes.size() < k_head || std::memcmp(bytes.data(), k_magic, 8) != 0)
        throw scorer_error(path, "not a kvlab scorer file (bad magic)");
    uint32_t version = 0;
    uint64_t meta_bytes = 0, weight_bytes = 0;
    std::memcpy(&version, bytes.data() + 8, 4);
    std::memcpy(&meta_bytes, bytes.data() + 16, 8);
    std::memcpy(&weight_bytes, bytes.data() + 24, 8);
    if (version != k_version)
        throw scorer_error(path, "scorer file version " + std::to_string(version) + "; this kvlab reads version " +
                                     std::to_string(k_version) + " (train it again with `kvlab train-scorer`)");
    const uint64_t body = bytes.size() - k_head;
    if (meta_bytes > body || weight_bytes != body - meta_bytes)
        throw scorer_error(path, "the file has " + std::to_string(bytes.size()) + " bytes; its header says " +
                                     std::to_string(k_head + meta_bytes + weight_bytes) + " (truncated?)");
    std::string want(64, '0');
    static const char * digits = "0123456789abcdef";
    for (size_t i = 0; i < 32; ++i) {
        want[2 * i] = digits[bytes[32 + i] >> 4];
        want[2 * i + 1] = digits[bytes[32 + i] & 15];
    }
    if (sha256_hex(bytes.data() + k_head, body) != want)
        throw scorer_error(path, "checksum mismatch: the file is corrupt");
    nlohmann::json meta;
    try {
        meta = nlohmann::json::parse(bytes.begin() + k_head, bytes.begin() + long(k_head + meta_bytes));
    } catch (const std::exception & e) {
        throw scorer_error(path, std::string("unreadable metadata: ") + e.what());
    }
    try {
        const Kind kind = kind_of(meta.at("kind").get<std::string>());
        const int n_layer = meta.at("n_layer").get<int>(), n_in = meta.at("n_in").get<int>(),
                  n_out = meta.at("n_out").get<int>(), n_hidden = meta.at("n_hidden").get<int>();
        if (n_layer < 1 || n_in < 1 || n_out < 1 || n_hidden < 0 || n_layer > 4096 || n_in > (1 << 20) ||
            n_out > 4096 || n_hidden > (1 << 20))
            throw scorer_error(path, "implausible shape in the metadata");
        if (weight_bytes != uint64_t(n_layer) * layer_floats(kind, n_in, n_out, n_hidden) * sizeof(float))
            throw scorer_error(path, "the weights do not match the shape in the metadata");
        const std::string sha = meta.at("model").value("sha256", "");
        if (!model_sha256.empty() && sha != model_sha256)
            throw scorer_error(path, "trained for the model '" + meta.at("model").value("name", "?") + "' (sha256 " +
                                         sha + "), not for this model file (sha256 " + model_sha256 + ")");
        const uint8_t * p = bytes.data() + k_head + meta_bytes;  // not float-aligned after the metadata
        const auto take = [&p](size_t n) {
            std::vector<float> v(n);
            std::memcpy(v.data(), p, n * sizeof(float));
            p += n * sizeof(float);
            return v;
        };
        const size_t rows = kind == Kind::linear ? size_t(n_out) : size_t(n_hidden);
        std::vector<Layer> layers(static_cast<size_t>(n_layer));
        for (Layer & l : layers) {
            l.w1 = take(rows * size_t(n_in));
            l.b1 = take(rows);
            if (kind == Kind::mlp) {
                l.w2 = take(size_t(n_out) * size_t(n_hidden));
                l.b2 = take(size_t(n_out));
            }
        }
        Surrogate s(kind, n_in, n_out, n_hidden, std::move(layers));
        s.model = meta.at("model");
        s.training = meta.value("training", nlohmann::json::object());
        s.fit = meta.value("fit", nlohmann::json::object());
        return s;
    } catch (const nlohmann::json::exception & e) {
        throw scorer_error(path, std::string("malformed metadata: ") + e.what());
    }
}

std::string default_scorer_path(const std::string & cache_dir, const std::string & model_sha256, Surrogate::Kind kind) {
    return (std::filesystem::path(cache_dir) / "scorers" /
            (model_sha256.substr(0, 16) + "-" + Surrogate::kind_name(kind) + ".kvzap"))
        .string();
}

Surrogate scorer_for(const Model & model, const std::string & path, Surrogate::Kind kind) {
    std::string file = path;
    if (file.empty()) {
        if (model.cache_dir().empty())
            throw Error("scorer", "no scorer file given (--param scorer=FILE) and no kvlab cache directory to look in");
        file = default_scorer_path(model.cache_dir(), model.file_sha256(), kind);
    }
    if (!std::filesystem::exists(file))
        throw Error("scorer", "no KVzap scorer at " + file + " for this model; train one with `kvlab train-scorer " +
                                  model.path() + " --kind " + Surrogate::kind_name(kind) +
                                  "` (scripts/setup.sh does it for the default model) or pass --param scorer=FILE");
    Surrogate s = Surrogate::load(file, model.file_sha256());
    const HParams & hp = model.hparams();
    if (s.n_layer() != hp.n_layer || s.n_in() != hp.n_embd || s.n_out() != hp.n_head_kv)
        throw scorer_error(file, "its shape (" + std::to_string(s.n_layer()) + " layers, " + std::to_string(s.n_in()) +
                                     " inputs, " + std::to_string(s.n_out()) + " outputs) does not fit this model");
    return s;
}

}  // namespace kvlab
