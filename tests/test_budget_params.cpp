// The press layer's small value types without a model: a Budget's one JSON form (written, read
// back, refused when malformed) and keep fraction; a method's parameters checked against their
// declared choices in one place (Params), for every method that declares some.
#include <gtest/gtest.h>

#include "kvlab/error.h"
#include "kvlab/press.h"
#include "press/method.h"

namespace kvlab {
namespace {

TEST(Budget, OneJsonFormRoundTrips) {
    Budget r = Budget::from_ratio(0.75);
    EXPECT_EQ(r.to_json(), nlohmann::json({{"ratio", 0.75}}));
    Budget t = Budget::from_tokens(128);
    t.sliding = true;
    EXPECT_EQ(t.to_json(), nlohmann::json({{"tokens", 128}, {"sliding", true}}));
    for (const Budget & b : {r, t}) {
        const Budget back = Budget::from_json(b.to_json());
        EXPECT_EQ(back.ratio, b.ratio);
        EXPECT_EQ(back.tokens, b.tokens);
        EXPECT_EQ(back.sliding, b.sliding);
    }
    EXPECT_EQ(Budget::from_json(0.5).ratio, 0.5);  // a bare number is a ratio
}

TEST(Budget, MalformedJsonIsRefused) {
    for (const char * bad : {R"({})", R"({"ratio": 0.5, "tokens": 3})", R"({"ratio": 1.0})", R"({"ratio": "half"})",
                             R"({"tokens": 0})", R"({"tokens": 2.5})", R"({"tokens": 8, "sliding": 1})",
                             R"({"tokens": 8, "window": 4})", R"("0.5")", R"([0.5])"})
        EXPECT_THROW(Budget::from_json(nlohmann::json::parse(bad)), Error) << bad;
}

TEST(Budget, KeepFractionIsKvpressOneMinusRatioOrTokensOverRows) {
    EXPECT_DOUBLE_EQ(Budget::from_ratio(0.25).keep_fraction(1000), 0.75);
    EXPECT_DOUBLE_EQ(Budget::from_tokens(250).keep_fraction(1000), 0.25);
    EXPECT_EQ(Budget::from_ratio(0.25).per_layer(1000), 750);
}

// Every parameter that declares choices takes each of them and refuses anything else, with
// one message naming the method, the parameter and the choices.
TEST(Params, ChoicesAreCheckedInOnePlace) {
    int n_with_choices = 0;
    for (const MethodInfo & m : press_methods())
        for (const ParamSpec & s : m.params) {
            if (s.choices.empty()) continue;
            ++n_with_choices;
            for (const std::string & c : s.choices)
                EXPECT_NO_THROW(press::Params(m.name, m.params, {{s.name, c}})) << m.name << " " << s.name << "=" << c;
            try {
                press::Params(m.name, m.params, {{s.name, "no-such-choice"}});
                ADD_FAILURE() << m.name << " " << s.name << " took an undeclared value";
            } catch (const Error & e) {
                const std::string w = e.what();
                EXPECT_NE(w.find(m.name), std::string::npos) << w;
                EXPECT_NE(w.find(s.name), std::string::npos) << w;
                EXPECT_NE(w.find(s.choices.front()), std::string::npos) << w;
            }
        }
    EXPECT_GE(n_with_choices, 5) << "snapkv's pooling, adakv, chunkkv, criticalkv, pyramidkv";
}

}  // namespace
}  // namespace kvlab
