"""The web page `kvlab serve` serves at `/` (data/web/index.html), driven in headless Chromium
against a real server: compress a document, chat against it with streamed tokens, and show
the API's errors.

Needs Selenium 4 (Debian python3-selenium), /usr/bin/chromium and /usr/bin/chromedriver
(scripts/deps.sh --tests installs them; missing, the test fails). CTest runs it with the venv
of scripts/test-venv.sh.
"""
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvlab_server import KvlabServer, haystack  # noqa: E402

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def new_driver():
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for a in ("--no-sandbox", "--headless=new", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=o)


def severe(entries, allow_network=False):
    """The SEVERE browser-log entries that are errors of the page (not a favicon 404; with
    allow_network, not the failed responses an error test asks for)."""
    out = []
    for e in entries:
        if e.get("level") != "SEVERE" or "favicon" in e.get("message", ""):
            continue
        if allow_network and e.get("source") == "network":
            continue
        out.append(e)
    return out


class BrowserCase(unittest.TestCase):
    """A real server (started with `server_extra`) and one headless Chromium for the class."""
    server_extra = ()

    @classmethod
    def setUpClass(cls):
        cls.server = KvlabServer(extra=cls.server_extra)
        cls.server.start()
        try:
            cls.driver = new_driver()
        except Exception:
            cls.server.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.driver.quit()
        cls.server.stop()
        if cls.server._own_store:  # the harness made a temporary store for this class: remove it
            shutil.rmtree(cls.server.store, ignore_errors=True)

    # helpers
    def el(self, id_):
        return self.driver.find_element(By.ID, id_)

    def text(self, id_):
        return self.el(id_).text

    def wait_for(self, cond, timeout, what):
        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.2).until(lambda d: cond())
        except TimeoutException:
            self.fail("timed out after %ds waiting for %s\n#error: %r\n#context-info: %r\n#answer: %r\n"
                      "#timings: %r\nserver log (tail):\n%s"
                      % (timeout, what, self.text("error"), self.text("context-info"), self.text("answer"),
                         self.text("timings"), self.server.log()[-3000:]))

    def open_page(self):
        self.driver.get_log("browser")  # drop what earlier tests left
        self.driver.get(self.server.url + "/")
        # the first GET /v1/contexts has answered: the select has options, or an error shows
        self.wait_for(lambda: self.driver.find_elements(By.CSS_SELECTOR, "#contexts option") or
                      self.el("error").is_displayed(), 30, "the context list to load")

    def paste(self, id_, text):
        self.driver.execute_script(
            "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'));", self.el(id_), text)

    def set_value(self, id_, value):
        e = self.el(id_)
        e.clear()
        e.send_keys(value)


class PageTest(BrowserCase):
    def test_compress_and_chat(self):
        self.open_page()
        self.assertFalse(self.el("error").is_displayed(), self.text("error"))
        # every method the server registers is offered (GET /v1/methods), after the full cache
        _, methods, _ = self.server.get("/v1/methods")
        offered = [o.get_attribute("value") for o in Select(self.el("method")).options]
        self.assertEqual(offered, ["none"] + [m["id"] for m in methods["data"]])
        self.assertIn("kvzip", offered)
        self.paste("doc-text", haystack(3000))
        Select(self.el("method")).select_by_value("snapkv")
        self.set_value("ratio", "0.5")
        self.el("compress").click()
        self.wait_for(lambda: "Tokens" in self.text("context-info") and "MiB" in self.text("context-info"),
                      180, "#context-info to show the compressed context's figures")
        self.assertFalse(self.el("error").is_displayed(), self.text("error"))

        status, body, _ = self.server.get("/v1/contexts")
        self.assertEqual(status, 200)
        self.assertEqual(len(body["data"]), 1)
        ctx = body["data"][0]
        self.assertEqual(ctx["method"], "snapkv")
        info = self.text("context-info")
        self.assertIn(ctx["id"], info)
        self.assertIn(str(ctx["tokens"]), info)
        self.assertIn("%d / %d" % (ctx["rows_kept"], ctx["rows_full"]), info)
        self.assertIn("%.2f MiB of %.2f MiB" % (ctx["kv_bytes"] / 1048576, ctx["kv_bytes_full"] / 1048576), info)
        self.assertIn("% saved", info)
        self.assertLess(ctx["kv_bytes"], ctx["kv_bytes_full"])
        # the list was refreshed after the create and the new context is selected
        self.assertEqual(Select(self.el("contexts")).first_selected_option.get_attribute("value"), ctx["id"])
        # a new visit shows the pre-selected context's figures at once, without a change of selection
        self.open_page()
        self.wait_for(lambda: ctx["id"] in self.text("context-info"), 30, "the selected context's figures")

        self.set_value("question", "What is the secret code?")
        self.el("send").click()
        self.wait_for(lambda: "7431" in self.text("answer") and "TTFT" in self.text("timings"),
                      120, "the streamed answer with 7431 and its timings")
        self.assertFalse(self.el("error").is_displayed(), self.text("error"))
        self.assertRegex(self.text("timings"), r"TTFT \d+\.\d+ s")
        self.assertRegex(self.text("timings"), r"decode \d+\.\d tokens/s")
        self.assertEqual(severe(self.driver.get_log("browser")), [])

    def test_error_shown_for_empty_document(self):
        self.open_page()
        self.paste("doc-text", "")
        self.el("compress").click()
        self.wait_for(lambda: self.el("error").is_displayed(), 30, "#error to show")
        self.assertIn("the context is empty", self.text("error"))
        self.assertIn("HTTP 400", self.text("error"))
        self.assertTrue(self.el("compress").is_enabled())
        self.assertEqual(severe(self.driver.get_log("browser"), allow_network=True), [])

    def test_file_input_fills_the_document(self):
        self.open_page()
        self.paste("doc-text", "")
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
            f.write("A short document.\nThe secret code is 7431.\n")
        try:
            self.el("doc-file").send_keys(f.name)
            self.wait_for(lambda: self.el("doc-text").get_property("value") ==
                          "A short document.\nThe secret code is 7431.\n", 30, "#doc-text to hold the file's text")
        finally:
            os.unlink(f.name)
        self.assertEqual(severe(self.driver.get_log("browser")), [])


class ApiKeyTest(BrowserCase):
    """The key typed into #api-key goes out as `Authorization: Bearer KEY`."""
    server_extra = ("--api-key", "k")

    def test_api_key(self):
        self.open_page()
        # the page asks for the key the server wants, with the key field focused
        self.wait_for(lambda: "wants an API key" in self.text("error"), 30, "the page to ask for the key")
        self.assertEqual(self.driver.switch_to.active_element.get_attribute("id"), "api-key")
        self.set_value("api-key", "wrong")
        self.el("refresh").click()
        self.wait_for(lambda: "invalid API key" in self.text("error"), 30, "the invalid-key error")
        self.assertIn("HTTP 401", self.text("error"))
        self.set_value("api-key", "k")
        self.el("refresh").click()
        self.wait_for(lambda: not self.el("error").is_displayed(), 30, "the error to clear with the right key")
        self.wait_for(lambda: "no contexts yet" in self.text("contexts"), 30, "the context list with the right key")
        self.assertFalse(self.el("error").is_displayed(), self.text("error"))
        self.assertEqual(severe(self.driver.get_log("browser"), allow_network=True), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
