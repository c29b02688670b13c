#include "press/policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/scoring.h"
#include "kvlab/error.h"

namespace kvlab::press {

void check_budget(const Scores & s, int64_t B) {
    if (B < s.n_sink + s.window)
        throw Error("press", "budget of " + std::to_string(B) + " tokens is smaller than the " +
                                 std::to_string(s.n_sink) + " sink and " + std::to_string(s.window) +
                                 " window tokens the method always keeps");
}

std::vector<int32_t> candidate_rows(const Scores & s) {
    std::vector<int32_t> c;
    for (int64_t j = 0; j < s.L; ++j)
        if (!s.is_forced(j)) c.push_back(int32_t(j));
    return c;
}

std::vector<float> candidate_scores(const Scores & s, int il, int h) {
    std::vector<float> c;
    for (int64_t j = 0; j < s.L; ++j)
        if (!s.is_forced(j)) c.push_back(s.s[il][h][j]);
    return c;
}

std::vector<int32_t> keep_rows(const Scores & s, const std::vector<float> & sc, int64_t n) {
    std::vector<int32_t> cand;
    std::vector<float> cs;
    for (int64_t j = 0; j < s.L; ++j)
        if (!s.is_forced(j)) {
            cand.push_back(int32_t(j));
            cs.push_back(sc[j]);
        }
    std::vector<int32_t> keep;
    for (int32_t i : kernels::top_rows(cs.data(), int64_t(cs.size()), n)) keep.push_back(cand[i]);
    for (int64_t j = 0; j < s.L; ++j)
        if (s.is_forced(j)) keep.push_back(int32_t(j));
    std::sort(keep.begin(), keep.end());
    return keep;
}

KeepPlan select_per_head(const Scores & s, const std::vector<std::vector<int64_t>> & n) {
    KeepPlan plan(s.s.size());
    for (size_t il = 0; il < s.s.size(); ++il)
        for (size_t h = 0; h < s.s[il].size(); ++h) plan[il].push_back(keep_rows(s, s.s[il][h], n[il][h]));
    return plan;
}

namespace {
// n[il][h] = -1 (every row) outside `layers`.
KeepPlan select_counts(const Scores & s, const std::vector<std::vector<int64_t>> & n) {
    KeepPlan plan(s.s.size());
    for (size_t il = 0; il < s.s.size(); ++il)
        for (size_t h = 0; h < s.s[il].size(); ++h) {
            if (n[il][h] >= 0) {
                plan[il].push_back(keep_rows(s, s.s[il][h], n[il][h]));
            } else {
                plan[il].emplace_back(size_t(s.L));
                std::iota(plan[il].back().begin(), plan[il].back().end(), 0);
            }
        }
    return plan;
}

std::vector<std::vector<int64_t>> every_row(const Scores & s, const std::vector<int> & layers) {
    std::vector<std::vector<int64_t>> n(s.s.size());
    for (size_t il = 0; il < s.s.size(); ++il) n[il].assign(s.s[il].size(), -1);
    for (int il : layers) std::fill(n[size_t(il)].begin(), n[size_t(il)].end(), 0);
    return n;
}
}  // namespace

KeepPlan select_global(const Scores & s, int64_t B, const std::vector<int> & layers) {
    check_budget(s, B);
    std::vector<std::vector<int64_t>> n = every_row(s, layers);
    const std::vector<int32_t> cand = candidate_rows(s);
    const int64_t nc = int64_t(cand.size());
    // flat index: (position in layers, head, candidate)
    std::vector<int64_t> idx;
    std::vector<float> score;
    for (size_t li = 0; li < layers.size(); ++li)
        for (size_t h = 0; h < s.s[size_t(layers[li])].size(); ++h)
            for (int64_t c = 0; c < nc; ++c) {
                idx.push_back(int64_t(idx.size()));
                score.push_back(s.s[size_t(layers[li])][h][size_t(cand[size_t(c)])]);
            }
    if (layers.empty() || nc == 0) return select_counts(s, n);
    const int64_t n_head = int64_t(s.s[size_t(layers[0])].size());
    const int64_t pick =
        std::min<int64_t>(std::max<int64_t>(0, B - s.forced()) * n_head * int64_t(layers.size()), int64_t(idx.size()));
    std::nth_element(idx.begin(), idx.begin() + pick, idx.end(), [&](int64_t a, int64_t b) {
        return score[size_t(a)] > score[size_t(b)] || (score[size_t(a)] == score[size_t(b)] && a < b);
    });
    for (int64_t i = 0; i < pick; ++i)
        ++n[size_t(layers[size_t(idx[size_t(i)] / nc / n_head)])][size_t((idx[size_t(i)] / nc) % n_head)];
    return select_counts(s, n);
}

KeepPlan select_threshold(const Scores & s, float t, const std::vector<int> & layers) {
    std::vector<std::vector<int64_t>> n = every_row(s, layers);
    for (int il : layers)
        for (size_t h = 0; h < s.s[size_t(il)].size(); ++h)
            for (int64_t j = 0; j < s.L; ++j)
                if (!s.is_forced(j) && s.s[size_t(il)][h][size_t(j)] >= t) ++n[size_t(il)][h];
    return select_counts(s, n);
}

KeepPlan select_per_layer_budget(const Scores & s, const std::vector<int64_t> & B) {
    const int n_layer = int(s.s.size());
    KeepPlan plan(n_layer);
    for (int il = 0; il < n_layer; ++il) {
        const int n_head = int(s.s[il].size());
        check_budget(s, B[il]);
        if (B[il] >= s.L) {
            std::vector<int32_t> all(static_cast<size_t>(s.L));
            std::iota(all.begin(), all.end(), 0);
            plan[il].assign(n_head, all);
            continue;
        }
        const int64_t n = B[il] - s.forced();
        for (int h = 0; h < n_head; ++h) {
            if (s.per_layer && h > 0) {
                plan[il].push_back(plan[il][0]);
                continue;
            }
            plan[il].push_back(keep_rows(s, s.s[il][h], n));
        }
    }
    return plan;
}

std::vector<int64_t> pyramid_budgets(int64_t L, int64_t B, int64_t w, int n_layer, int64_t beta) {
    const int64_t b = B - w;
    if (L <= B) return std::vector<int64_t>(n_layer, L);
    if (L < 2 * b || n_layer < 2) return std::vector<int64_t>(n_layer, B);
    int64_t mn = b / beta, mx = 2 * b - mn;
    if (mx >= L - w) {
        mx = L - w;
        mn = 2 * b - mx;
    }
    const int64_t step = (mx - mn) / (n_layer - 1);
    std::vector<int64_t> out(n_layer);
    for (int l = 0; l < n_layer; ++l) out[l] = mx - l * step + w;
    return out;
}

std::vector<int64_t> pyramid_budgets_kvpress(int64_t L, double keep, int64_t w, int n_layer, int64_t beta) {
    const auto round_even = [](double x) { return int64_t(std::nearbyint(x)); };  // FE_TONEAREST: half to even
    const double mcp = double(w) + double(L) * keep;
    double mn = (mcp - double(w)) / double(beta), mx = (mcp - double(w)) * 2 - mn;
    if (mx >= double(L - w)) {
        mx = double(L - w);
        mn = (mcp - double(w)) * 2 - mx;
    }
    if (!(double(L) >= mx && mx >= mn && mn >= double(w)))
        return std::vector<int64_t>(n_layer, std::max<int64_t>(1, round_even(double(L) * keep)));
    const double steps = n_layer > 1 ? (mx - mn) / double(n_layer - 1) : 0.0;
    std::vector<int64_t> out(n_layer);
    for (int l = 0; l < n_layer; ++l) out[l] = std::min<int64_t>(L, round_even(mx - double(l) * steps));
    return out;
}

std::vector<int64_t> adakv_head_budgets_kvpress(const std::vector<std::vector<float>> & scores, int64_t b,
                                                int64_t safe) {
    const int H = int(scores.size());
    std::vector<int64_t> out(H, 0);
    if (H == 0) return out;
    const int64_t rows = int64_t(scores[0].size());
    b = std::clamp<int64_t>(b, 0, rows);
    safe = std::clamp<int64_t>(safe, 0, b);
    struct Cand {
        float score;
        int h;
        int32_t j;
    };
    std::vector<Cand> rest;
    for (int h = 0; h < H; ++h) {
        std::vector<int32_t> order(static_cast<size_t>(rows));
        std::iota(order.begin(), order.end(), 0);
        const auto & sc = scores[h];
        std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return sc[x] > sc[y]; });
        out[h] = safe;
        for (int64_t r = safe; r < rows; ++r) rest.push_back({sc[order[r]], h, order[r]});
    }
    const int64_t more = int64_t(H) * (b - safe);
    std::stable_sort(rest.begin(), rest.end(), [](const Cand & x, const Cand & y) {
        return x.score > y.score || (x.score == y.score && (x.h < y.h || (x.h == y.h && x.j < y.j)));
    });
    for (int64_t i = 0; i < more && i < int64_t(rest.size()); ++i) ++out[rest[i].h];
    return out;
}

Policy adakv_policy(double alpha, bool kvpress) {
    return [alpha, kvpress](const Scores & s, const Budget & b, const KvStore &) {
        const int64_t B = b.per_layer(s.L);
        check_budget(s, B);
        std::vector<std::vector<int64_t>> n(s.s.size());
        for (size_t il = 0; il < s.s.size(); ++il) {
            const int64_t cand = s.L - s.forced();
            const int64_t bc = std::min(cand, B - s.forced());
            std::vector<std::vector<float>> cs;
            for (size_t h = 0; h < s.s[il].size(); ++h) cs.push_back(candidate_scores(s, int(il), int(h)));
            if (kvpress) {
                const int64_t n_safe = alpha > 0.0 ? std::max<int64_t>(1, int64_t(double(B) * alpha)) : 0;
                n[il] = adakv_head_budgets_kvpress(cs, bc, std::max<int64_t>(0, n_safe - s.forced()));
            } else {
                n[il] = adakv_head_budgets(cs, bc, alpha);
            }
        }
        return select_per_head(s, n);
    };
}

std::vector<int64_t> adakv_head_budgets(const std::vector<std::vector<float>> & scores, int64_t b, double alpha) {
    const int H = int(scores.size());
    std::vector<int64_t> out(H);
    if (H == 0) return out;
    const int64_t rows = int64_t(scores[0].size());
    if (b >= rows) return std::vector<int64_t>(H, rows);
    // each head's candidates by descending score (ties: lower row first)
    std::vector<std::vector<int32_t>> order(H);
    for (int h = 0; h < H; ++h) {
        order[h].resize(static_cast<size_t>(rows));
        std::iota(order[h].begin(), order[h].end(), 0);
        const auto & sc = scores[h];
        std::stable_sort(order[h].begin(), order[h].end(), [&](int32_t a, int32_t c) { return sc[a] > sc[c]; });
    }
    // global top H*b: merge the heads' orders (ties: lower head, then lower row)
    const int64_t total = int64_t(H) * b;
    std::vector<int64_t> n(H, 0);
    for (int64_t t = 0; t < total; ++t) {
        int best = -1;
        for (int h = 0; h < H; ++h) {
            if (n[h] >= rows) continue;
            if (best < 0 || scores[h][order[h][n[h]]] > scores[best][order[best][n[best]]]) best = h;
        }
        ++n[best];
    }
    const int64_t safe = int64_t(std::floor(alpha * double(b)));
    int64_t sum = 0;
    for (int h = 0; h < H; ++h) {
        out[h] = std::clamp<int64_t>(std::llround(double(n[h]) * (1.0 - alpha) + double(safe)), 0, rows);
        sum += out[h];
    }
    // exact total by the same global ranking
    while (sum < total) {
        int best = -1;
        for (int h = 0; h < H; ++h) {
            if (out[h] >= rows) continue;
            if (best < 0 || scores[h][order[h][out[h]]] > scores[best][order[best][out[best]]]) best = h;
        }
        ++out[best];
        ++sum;
    }
    while (sum > total) {
        int worst = -1;
        for (int h = 0; h < H; ++h) {
            if (out[h] <= safe || out[h] == 0) continue;
            if (worst < 0 || scores[h][order[h][out[h] - 1]] < scores[worst][order[worst][out[worst] - 1]]) worst = h;
        }
        KVLAB_ASSERT(worst >= 0, "Ada-KV: the safeguard leaves room for the total");
        --out[worst];
        --sum;
    }
    return out;
}

}  // namespace kvlab::press
