"""The live dashboard, end to end in Debian's headless Chromium driven by selenium and chromedriver.

The real function_app runs in the devhost on Azurite with local workers. The test opens the page,
uploads a sample, watches its job go from queued to succeeded, opens the job, follows the link to
its report, and saves screenshots (the path is printed). Chromium and chromedriver are installed by
`make test` (mk/chromium.mk); a missing browser fails with how to install it, it never skips.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from tests.pipeline_helpers import POOLS, REPO, module_azurite, pipeline_env, running_host, wait_for
from upwell import names
from upwell.ingest.blobnames import job_id_for
from upwell.ledger import Ledger
from upwell.ops import dashboard
from upwell.storage import Storage

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000")
SAMPLE = b"""name: dashboard sweep
payload: logistic
owner: lead@lab.org
project: ocean
params: {steps: 400, burn_in: 50, sleep_s: 1.5}
grid: {r: [2.9, 3.5, 3.9]}
"""
BAD = b"name: not runnable\npayload: no-such-payload\n"


# The page then lists this test's jobs, not the hundreds other tests left on the session's Azurite.
azurite = module_azurite("dashboard")


def _pools(cpu_max: int) -> str:
    return json.dumps({**POOLS, "cpu": {**POOLS["cpu"], "max_nodes": cpu_max}})


def _release_cpu_pool(monkeypatch) -> None:
    """Let the scaler start cpu workers: the host runs in this process and reads settings anew."""
    import handlers.context
    import handlers.scale

    monkeypatch.setenv("UPWELL_POOLS", _pools(2))
    handlers.context.reset()
    handlers.scale.autoscaler.cache_clear()


@pytest.fixture
def browser(tmp_path):
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        pytest.fail("Chromium and chromedriver are needed: `make chromium` (as root: apt-get install -y chromium "
                    "chromium-driver)", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def artifacts(request) -> Path:
    out = REPO / ".upwell" / "artifacts" / "dashboard"
    shutil.rmtree(out, ignore_errors=True)  # so that every screenshot found afterwards is this run's
    out.mkdir(parents=True)
    print(f"\ndashboard screenshots: {out}")
    return out


def _js(driver, script: str, *args):
    """Read the page in one script: it redraws every poll, so element handles go stale."""
    return driver.execute_script(script, *args)


def _state(driver, job_id: str) -> str | None:
    return _js(driver, "const e = document.querySelector(`#jobs tr[data-job='${arguments[0]}'] td.state [data-state]`);"
               " return e ? e.dataset.state : null;", job_id)


def _text(driver, selector: str) -> str:
    return _js(driver, "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", selector)


def _click(driver, selector: str) -> bool:
    return _js(driver, "const e = document.querySelector(arguments[0]); if (e) e.click(); return !!e;", selector)


def test_page_ships_its_assets_and_no_cdn():
    html = dashboard.page().decode()
    assert "<script>" in html and "<style>" in html and "/*upwell:" not in html
    assert "https://" not in html and "http://" not in html and "src=" not in html.split("<script>")[0]


def test_dashboard_in_chromium_job_queued_to_done_then_report(browser, artifacts, azurite, tmp_path, monkeypatch):
    from selenium.webdriver.support.ui import WebDriverWait

    store = Storage(azurite.connection_string)
    store.ensure()
    # The cpu pool is held at zero nodes, so the job stays queued until the page has shown it so;
    # then the pool is released. Racing a 1.5 s poll against a fast pipeline is not a test.
    pipeline_env(monkeypatch, azurite.connection_string, tmp_path, UPWELL_POOLS=_pools(0))
    with running_host(azurite.connection_string, tmp_path) as host:
        url = f"{host.http_url}/api/dashboard"
        assert host.http_url.startswith("http://127.0.0.1:")  # loopback only
        browser.get(url)
        WebDriverWait(browser, 20).until(lambda d: _text(d, "#updated").startswith("updated"))
        browser.save_screenshot(str(artifacts / "0-empty.png"))

        bad_etag = store.blob(names.INCOMING, "dash/bad/job.yaml").upload_blob(BAD, overwrite=True)["etag"]
        etag = store.blob(names.INCOMING, "dash/sweep/job.yaml").upload_blob(SAMPLE, overwrite=True)["etag"]
        job_id = job_id_for("dash/sweep/job.yaml", etag)

        wait_for(lambda: _state(browser, job_id) == "queued", 60, "the page to show the job queued",
                 lambda: f"state on the page: {_state(browser, job_id)}")
        seen: list[str] = ["queued"]
        browser.save_screenshot(str(artifacts / "1-1-queued.png"))
        _release_cpu_pool(monkeypatch)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            state = _state(browser, job_id)
            if state and (not seen or seen[-1] != state):
                seen.append(state)
                browser.save_screenshot(str(artifacts / f"1-{len(seen)}-{state}.png"))
            if state == "succeeded":
                break
            time.sleep(0.2)
        assert seen and seen[0] == "queued" and seen[-1] == "succeeded", seen

        # Pools, the quarantine with its reason, and the scaler's decisions are on the page too.
        WebDriverWait(browser, 20).until(lambda d: "no-such-payload" in _text(d, "#quarantine"))
        assert _js(browser, "return document.querySelectorAll('#pools [data-pool=cpu] svg polyline').length") >= 1
        assert "cpu" in _text(browser, "#decisions")
        row = _text(browser, f'#jobs tr[data-job="{job_id}"]')
        assert "3/3" in row and "lead@lab.org" in row

        # Open the job, then follow its report link.
        assert _click(browser, f'[data-open="{job_id}"]')
        WebDriverWait(browser, 20).until(
            lambda d: _js(d, "return document.querySelectorAll('#shards tbody tr').length") == 3)
        WebDriverWait(browser, 60).until(lambda d: _text(d, "#detail-report") == "open the report")
        assert _text(browser, "#shards").count("succeeded") == 3
        browser.save_screenshot(str(artifacts / "2-job.png"))
        assert _click(browser, "#detail-report")  # a click in the page: the link's own navigation
        WebDriverWait(browser, 30).until(lambda d: job_id in d.page_source and "/reports/" in d.current_url)
        assert browser.current_url.endswith(f"/api/dashboard/reports/{job_id}/index.html")
        assert "Cost" in browser.page_source
        browser.save_screenshot(str(artifacts / "3-report.png"))

        # The JSON API the page polls.
        with urllib.request.urlopen(f"{url}/api/jobs/{job_id}") as resp:
            detail = json.loads(resp.read())
        assert detail["state"] == "succeeded" and len(detail["shards"]) == 3
        assert abs(sum(s["cost_usd"] for s in detail["shards"]) - detail["spent_usd"]) < 1e-9
        # The bad upload is a job of its own, rejected in the ledger (the page showed its quarantine).
        bad = Ledger(store).job(job_id_for("dash/bad/job.yaml", bad_etag))
        assert bad is not None and bad.status == "rejected", bad
    shots = {p.name: p.read_bytes() for p in artifacts.glob("*.png")}
    want = {"0-empty.png", "1-1-queued.png", f"1-{len(seen)}-succeeded.png", "2-job.png", "3-report.png"}
    assert want <= set(shots), sorted(shots)
    assert all(data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000 for data in shots.values())
