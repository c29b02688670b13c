#include "kvlab/op_profile.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>

#include "ggml.h"
#include "kvlab/error.h"

namespace kvlab {

namespace {

// ggml's parameters of a custom node (ggml_custom_4d), as ggml.c stores them in op_params: the
// layout is ggml-impl.h's, not a public header's, so the constructor checks it on a real node.
struct CustomParams {
    ggml_custom_op_t fun;
    int n_tasks;
    void * userdata;
};
static_assert(sizeof(CustomParams) <= GGML_MAX_OP_PARAMS, "fits in a node's op_params");

using Clock = std::chrono::steady_clock;

struct Span {
    Clock::time_point begin, end;
    bool ran = false;
};

// One kvlab node of the graph being computed: its own function and data, and each thread's span.
struct Slot {
    CustomParams orig;
    std::vector<Span> spans;  // [thread]
};

void timed(ggml_tensor * dst, int ith, int nth, void * ud) {
    Slot & s = *static_cast<Slot *>(ud);
    const Clock::time_point t0 = Clock::now();
    s.orig.fun(dst, ith, nth, s.orig.userdata);
    if (size_t(ith) < s.spans.size()) s.spans[size_t(ith)] = {t0, Clock::now(), true};
}

void probe(ggml_tensor *, int, int, void *) {}

// "product q5_0 blk.12.ffn_down.weight" -> "product q5_0 ffn_down.weight": one row for all layers.
std::string op_name(const char * node_name) {
    std::string s = node_name;
    for (size_t at = s.find("blk."); at != std::string::npos; at = s.find("blk.", at)) {
        size_t e = at + 4;
        while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
        if (e > at + 4 && e < s.size() && s[e] == '.')
            s.erase(at, e + 1 - at);
        else
            at = e;
    }
    return s.empty() ? "(unnamed kvlab node)" : s;
}

double seconds(Clock::duration d) {
    return std::chrono::duration<double>(d).count();
}

}  // namespace

OpProfile::OpProfile() {
    // ggml_custom_4d on a metadata-only context, read back through CustomParams
    static char marker;
    const size_t bytes = 4 * ggml_tensor_overhead();
    std::vector<uint8_t> mem(bytes);
    ggml_context * ctx = ggml_init({bytes, mem.data(), true});
    if (!ctx) throw Error("profile", "could not create a ggml context");
    ggml_tensor * a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1);
    ggml_tensor * t = ggml_custom_4d(ctx, GGML_TYPE_F32, 1, 1, 1, 1, &a, 1, probe, 3, &marker);
    CustomParams p;
    std::memcpy(&p, t->op_params, sizeof(p));
    const bool same = t->op == GGML_OP_CUSTOM && p.fun == probe && p.n_tasks == 3 && p.userdata == &marker;
    ggml_free(ctx);
    if (!same)
        throw Error("profile", "this ggml stores custom-node parameters in another layout: nodes cannot be timed");
}

OpProfile::Phase & OpProfile::phase(int n_threads) {
    for (Phase & ph : phases_)
        if (ph.name == phase_) {
            if (ph.n_threads != n_threads)
                throw Error("profile", "phase '" + phase_ + "' was measured on " + std::to_string(ph.n_threads) +
                                           " threads, now " + std::to_string(n_threads));
            return ph;
        }
    Phase ph;
    ph.name = phase_;
    ph.n_threads = n_threads;
    ph.other_s.assign(size_t(n_threads), 0.0);
    phases_.push_back(std::move(ph));
    return phases_.back();
}

void OpProfile::measure(ggml_cgraph * gf, int n_threads, int64_t n_tokens, const std::function<void()> & compute) {
    if (phase_.empty()) return compute();
    Phase & ph = phase(n_threads);
    const int n_nodes = ggml_graph_n_nodes(gf);
    std::vector<Slot> slots;
    std::vector<ggml_tensor *> nodes;
    slots.reserve(size_t(n_nodes));  // stable addresses: the nodes hold them as userdata
    for (int i = 0; i < n_nodes; ++i) {
        ggml_tensor * t = ggml_graph_node(gf, i);
        if (t->op != GGML_OP_CUSTOM) {
            const bool view = t->op == GGML_OP_NONE || t->op == GGML_OP_RESHAPE || t->op == GGML_OP_VIEW ||
                              t->op == GGML_OP_PERMUTE || t->op == GGML_OP_TRANSPOSE;
            ph.ggml_nodes += view ? 0 : 1;
            continue;
        }
        Slot & s = slots.emplace_back();
        std::memcpy(&s.orig, t->op_params, sizeof(s.orig));
        s.spans.resize(size_t(n_threads));
        const CustomParams wrapped{timed, s.orig.n_tasks, &s};
        std::memcpy(t->op_params, &wrapped, sizeof(wrapped));
        nodes.push_back(t);
    }
    struct Restore {  // the nodes get their own functions back, whatever happens
        std::vector<ggml_tensor *> & nodes;
        std::vector<Slot> & slots;
        ~Restore() {
            for (size_t i = 0; i < nodes.size(); ++i)
                std::memcpy(nodes[i]->op_params, &slots[i].orig, sizeof(CustomParams));
        }
    } restore{nodes, slots};

    const Clock::time_point t0 = Clock::now();
    compute();
    const double wall = seconds(Clock::now() - t0);

    ph.graphs += 1;
    ph.tokens += n_tokens;
    ph.wall_s += wall;
    std::vector<double> accounted(size_t(n_threads), 0.0);
    for (size_t i = 0; i < slots.size(); ++i) {
        const std::vector<Span> & sp = slots[i].spans;
        Clock::time_point first = Clock::time_point::max(), last = Clock::time_point::min();
        for (const Span & s : sp)
            if (s.ran) first = std::min(first, s.begin), last = std::max(last, s.end);
        if (first == Clock::time_point::max()) continue;  // not computed (a node ggml skipped)
        const std::string name = op_name(ggml_get_name(nodes[i]));
        auto it = std::find_if(ph.ops.begin(), ph.ops.end(), [&](const Op & o) { return o.name == name; });
        if (it == ph.ops.end()) {
            Op op;
            op.name = name;
            op.busy_s.assign(size_t(n_threads), 0.0);
            op.wait_s.assign(size_t(n_threads), 0.0);
            it = ph.ops.insert(ph.ops.end(), std::move(op));
        }
        Op & op = *it;
        op.calls += 1;
        op.wall_s += seconds(last - first);
        for (size_t th = 0; th < sp.size(); ++th) {
            if (!sp[th].ran) continue;
            const double busy = seconds(sp[th].end - sp[th].begin), wait = seconds(last - sp[th].end);
            op.busy_s[th] += busy;
            op.wait_s[th] += wait;
            accounted[th] += busy + wait;
        }
    }
    for (size_t th = 0; th < accounted.size(); ++th) ph.other_s[th] += wall - accounted[th];
}

}  // namespace kvlab
