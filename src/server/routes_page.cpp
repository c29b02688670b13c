// GET /: the web page (data/web/index.html, embedded by CMake).
#include "server/routes.h"
#include "server/state.h"

namespace kvlab::server {

namespace {

#include "web_page.inc"  // k_web_page

const RouteRegistrar reg({{"GET", "/"}}, [](ServerState & s) {
    s.http.Get("/", [](const httplib::Request &, httplib::Response & res) {
        res.set_content(k_web_page, "text/html; charset=utf-8");
    });
});

}  // namespace

}  // namespace kvlab::server
