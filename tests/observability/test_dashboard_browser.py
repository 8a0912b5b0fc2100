"""The latency dashboard in real Chromium: charts drawn from seeded figures and from
live requests sent to a real server while the page is open. Screenshots go to
test-artifacts/screenshots/dashboard-*.png."""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS, require_browser_and_bundle
from tools.live_server import LiveServer

pytestmark = pytest.mark.slow

PASSWORD = "operator-password-42"
CHART_IDS = ("ttft", "itl", "e2e", "queue", "tps", "load", "batch", "kv", "prefix", "errors")


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    require_browser_and_bundle("dashboard.js", "dashboard.css")
    srv = LiveServer(
        tmp_path_factory.mktemp("dashboard-server"),
        tiny_model_dir,
        OBS_SAMPLE_INTERVAL_S="1",
        ENGINE_KV_CACHE_MEMORY_MB="64",
        ENGINE_MAX_NUM_SEQS="8",
    )
    srv.start()
    try:
        srv.make_user("operator", PASSWORD, staff=True)
        # An hour of history: seeded request figures and engine samples, rolled up.
        srv.python(
            "from datetime import timedelta; from django.utils import timezone; "
            "from chatapp.observability import rollups; "
            "from tests.records import seed; "
            "now = timezone.now(); "
            "[seed(now - timedelta(minutes=m), minutes=2, per_minute=12, seed=m) "
            "for m in range(4, 60, 5)]; "
            # Older than 5 minutes, so the live 5-minute window holds only the live load.
            "seed(now - timedelta(minutes=7), minutes=2, per_minute=30); "
            "rollups.rollup_since(now=now)"
        )
        yield srv
    finally:
        srv.stop()


def send_load(server: LiveServer, key: str, n: int = 12) -> list[int]:
    """n chat completions at once through the OpenAI API."""
    statuses: list[int] = []

    def one(i: int) -> None:  # a failure leaves its status out
        body = {
            "model": Path(server.env["CHATAPP_MODEL"]).name,
            "messages": [{"role": "user", "content": f"Tell me a story number {i}."}],
            "max_tokens": 24,
            "stream": i % 2 == 0,
        }
        req = urllib.request.Request(
            server.url + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
            statuses.append(r.status)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def colored_pixels(page, chart: str) -> int:  # type: ignore[no-untyped-def]
    """Pixels of the chart's canvas that a series line painted (saturated colour)."""
    return page.evaluate(
        """(id) => {
          const c = document.querySelector(`#chart-${id} canvas`);
          const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          let n = 0;
          for (let i = 0; i < d.length; i += 4) {
            const [r, g, b, a] = [d[i], d[i + 1], d[i + 2], d[i + 3]];
            if (a > 200 && Math.max(r, g, b) - Math.min(r, g, b) > 90) n++;
          }
          return n;
        }""",
        chart,
    )


# Every text a canvas draws, with its ink box in canvas pixels, kept on the canvas as
# `__texts` (emptied when the whole canvas is cleared, as uPlot does before each redraw):
# what the axis labels look like on screen, measured in the font they were drawn in.
RECORD_CANVAS_TEXT = """(() => {
  const P = CanvasRenderingContext2D.prototype;
  const fillText = P.fillText, clearRect = P.clearRect;
  P.clearRect = function (x, y, w, h) {
    const c = this.canvas;
    if (x <= 0 && y <= 0 && w >= c.width && h >= c.height) c.__texts = [];
    return clearRect.apply(this, arguments);
  };
  P.fillText = function (text, x, y, ...rest) {
    const s = String(text);
    if (s) {
      const m = this.measureText(s);
      const t = this.getTransform();
      const X = t.a * x + t.c * y + t.e, Y = t.b * x + t.d * y + t.f;
      (this.canvas.__texts ||= []).push({
        text: s,
        rotated: t.b !== 0 || t.c !== 0,
        left: X - m.actualBoundingBoxLeft * t.a,
        right: X + m.actualBoundingBoxRight * t.a,
        top: Y - m.actualBoundingBoxAscent * t.d,
        bottom: Y + m.actualBoundingBoxDescent * t.d,
      });
    }
    return fillText.call(this, text, x, y, ...rest);
  };
})();"""

# A chart's x-axis labels as drawn (the texts under the plot area, which uPlot's .u-over
# covers), with the plot's left and right edges, all in canvas pixels.
X_AXIS_LABELS = """(id) => {
  const c = document.querySelector(`#chart-${id} canvas`);
  const over = document.querySelector(`#chart-${id} .u-over`);
  if (!c || !over) return null;
  const k = c.width / c.getBoundingClientRect().width;
  const [left, top] = [parseFloat(over.style.left), parseFloat(over.style.top)];
  const [width, height] = [parseFloat(over.style.width), parseFloat(over.style.height)];
  return {
    plot_left: left * k,
    plot_right: (left + width) * k,
    labels: (c.__texts || []).filter((t) => t.top >= (top + height) * k - 0.5),
  };
}"""


def assert_x_labels_apart(page: Any, where: str, at_least: int) -> None:
    """On every chart, the time axis's labels as rendered: none overlaps another and none
    crosses the plot's left edge into the y axis's numbers (issue 17, item 11: the first
    label did), nor its right edge. Each chart must show `at_least` labels (uPlot puts
    ticks X_TICK_SPACE apart, on the steps of X_INCRS: a 5-minute window gets 2-minute ones)."""
    deadline = time.monotonic() + 20
    while True:
        axes = {chart: page.evaluate(X_AXIS_LABELS, chart) for chart in CHART_IDS}
        if all(a and len(a["labels"]) >= at_least for a in axes.values()):
            break
        if time.monotonic() > deadline:
            break
        page.wait_for_timeout(250)
    for chart, axis in axes.items():
        assert axis is not None, f"{where}: no chart {chart}"
        labels = sorted(axis["labels"], key=lambda t: t["left"])
        seen = [(t["text"], round(t["left"], 1), round(t["right"], 1)) for t in labels]
        plot = f"{axis['plot_left']}-{axis['plot_right']}"
        why = f"{where}, chart {chart}: labels {seen}, plot {plot}"
        assert len(labels) >= at_least, why
        for t in labels:
            assert not t["rotated"], why
            assert t["left"] >= axis["plot_left"], "crosses the plot's left edge: " + why
            assert t["right"] <= axis["plot_right"], "crosses the plot's right edge: " + why
        for a, b in itertools.pairwise(labels):
            assert a["right"] <= b["left"], f"{a['text']!r} overlaps {b['text']!r}: " + why


def signed_in_page(browser: Any, server: LiveServer, next_path: str) -> tuple[Any, list[str]]:
    """A page signed in as the operator through the admin log-in, landed on `next_path`
    (URL-quoted), and the list its page errors are collected into. What its canvases
    draw as text is recorded (RECORD_CANVAS_TEXT)."""
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.add_init_script(RECORD_CANVAS_TEXT)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/admin/login/?next=" + next_path)
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    return page, errors


def test_dashboard_draws_charts_from_stored_figures_and_live_load(server: LiveServer) -> None:
    from playwright.sync_api import expect, sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    key = server.make_key("operator", max_concurrent=32, rate_limit_per_minute=1000)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page, errors = signed_in_page(browser, server, "/admin/latency/%3Fwindow%3D1h")
            expect(page.locator("#latency-dashboard[data-ready='1']")).to_be_attached(timeout=20000)
            assert page.locator(".ld-plot canvas").count() >= len(CHART_IDS)
            for chart in ("ttft", "itl", "e2e", "queue", "tps", "load", "kv", "prefix"):
                assert colored_pixels(page, chart) > 30, chart
            # Two 30-minute ticks on these charts' width; one is blanked near an edge.
            assert_x_labels_apart(page, "1-hour window", at_least=1)
            page.screenshot(path=str(SCREENSHOTS / "dashboard-1h.png"), full_page=True)
            # Longer windows: more labels, the 7-day ones the widest ("12/1 09:05").
            for window in ("24h", "7d"):
                page.click(f"button[data-window='{window}']")
                assert_x_labels_apart(page, f"{window} window", at_least=2)
            page.screenshot(path=str(SCREENSHOTS / "dashboard-7d.png"), full_page=True)

            # Live: the 5-minute window while requests run against the real engine.
            page.click("button[data-window='5m']")
            assert send_load(server, key) == [200] * 12
            # A second wave in the next 10-second bucket, so the live charts have a line
            # to draw and not a single point. The buckets are whole multiples of 10 s since
            # the epoch, by each request's end (chatapp/observability/dashboard.py): the
            # next one starts at most 10 s from now, on average 5.
            time.sleep(10 - time.time() % 10 + 0.5)
            assert send_load(server, key) == [200] * 12
            expect(page.locator("#ld-slowest tr[data-request^='api-']").first).to_be_attached(
                timeout=20000
            )
            # Request charts fill from the live requests as the page refreshes (the
            # engine-sample charts are checked on the 1-hour window above).
            for chart in ("ttft", "tps"):
                deadline = time.monotonic() + 20
                while colored_pixels(page, chart) <= 30 and time.monotonic() < deadline:
                    page.wait_for_timeout(500)
                assert colored_pixels(page, chart) > 30, chart
            # Labels with seconds ("09:05:07"), the widest this window draws.
            assert_x_labels_apart(page, "5-minute window", at_least=1)
            rows = page.locator("#ld-slowest tr[data-request]")
            assert rows.count() >= 10
            assert page.locator("#ld-slowest .ld-breakdown .seg-decode").count() >= 10
            page.screenshot(path=str(SCREENSHOTS / "dashboard-5m-under-load.png"), full_page=True)
            assert not errors, errors
        finally:
            browser.close()


SEED_TUNING = """
from chatapp.observability import tuning
from chatapp.jobs.models import Job
current = tuning.current_settings()
other = {**current, "MAX_NUM_SEQS": 4}
def runs(*goodputs):
    return [{"requests": 6, "refused": 0, "met_targets": 6, "goodput_rps": g,
             "throughput_tok_s": 90.0, "ttft_p50": 0.02, "ttft_p99": 0.05, "tpot_p50": 0.004,
             "tpot_p99": 0.01, "cached_tokens": 0, "wall_s": 0.6} for g in goodputs]
report = tuning.verdict_of(current, [current, other], [runs(%s), runs(%s)])
report.update(workload="synthetic", requests=6, targets={"ttft_s": 1.0, "tpot_s": 0.1})
print(Job.objects.create(kind="tuning", status="done", result=report).pk)
"""


def test_dashboard_shows_the_tuning_verdict_and_offers_only_a_winner(server: LiveServer) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page, errors = signed_in_page(browser, server, "/admin/latency/")
            server.python(SEED_TUNING % ("2.0, 2.2, 2.1", "3.0, 2.9, 3.1"))
            page.reload()
            verdict = page.locator("#ld-tune-verdict")
            expect(verdict).to_have_text(
                "MAX_NUM_SEQS=4 beats the current settings: goodput 2.90-3.10 req/s "
                "against 2.00-2.20",
                timeout=20000,
            )
            rows = page.locator("#ld-tune-runs tr")
            expect(rows).to_have_count(3)
            expect(rows.nth(1)).to_contain_text("current")
            expect(rows.nth(2)).to_have_class("ld-best")
            expect(rows.nth(2)).to_contain_text("3.00 (2.90\u20133.10)")
            expect(page.locator("#ld-tune-apply")).to_contain_text("ENGINE_MAX_NUM_SEQS=4")
            # Applying posts through the shared API module (CSRF from the cookie).
            with page.expect_response(lambda r: r.url.endswith("/apply")) as applied:
                page.click("#ld-tune-apply")
            assert applied.value.status == 200, applied.value.text()
            expect(page.locator("#ld-status")).to_contain_text("updated")

            # A newer run inside the noise: the verdict says so and nothing is offered.
            server.python(SEED_TUNING % ("2.0, 2.2, 2.1", "2.1, 2.3, 2.2"))
            page.reload()
            expect(verdict).to_have_text("no clear winner: keep the current settings")
            expect(page.locator("#ld-tune-runs .ld-best")).to_have_count(0)
            expect(page.locator("#ld-tune-apply")).to_have_count(0)
            page.screenshot(path=str(SCREENSHOTS / "dashboard-tuning.png"), full_page=True)
            assert not errors, errors
        finally:
            browser.close()
