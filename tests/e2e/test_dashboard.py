"""The live dashboard, end to end in Debian's headless Chromium driven by selenium and chromedriver.

The real function_app runs in the devhost on Azurite with local workers, one stack for the module. The
first test opens the page, uploads two samples, filters them by owner, project and state, cancels one
with its button, watches the other go from queued to succeeded, re-runs the cancelled one with its button,
opens a job (CPU seconds and peak RSS per shard, the CPU chart's axes, each shard's log), follows the link
to its report, and saves screenshots (the path is printed). The second (marker ``access``, issue 27) holds a
signed-in principal of one project to it: 403 on another project's job through the HTTP API and through the
dashboard's actions, and only its own jobs in /api/jobs and on the page, the principal passed in
``X-MS-CLIENT-PRINCIPAL`` as App Service passes it. Chromium and chromedriver are installed by `make test`
(mk/chromium.mk); a missing browser fails with how to install it, it never skips.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.pipeline_helpers import POOLS, REPO, module_azurite, pipeline_env, running_host, wait_for, wait_reported
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
REEF = b"""name: reef sweep
payload: logistic
owner: diver@lab.org
project: reef
params: {steps: 200, burn_in: 20}
grid: {r: [3.2]}
"""
BAD = b"name: not runnable\npayload: no-such-payload\n"
REEF_GROUP = "5f0c7e1e-8d0c-4c7b-9b43-0a6f1d1e2a10"  # an Entra group's object id
ROLES = json.dumps({"ocean.members": ["ocean"], REEF_GROUP: ["reef"]})


# The page then lists this module's jobs, not the hundreds other tests left on the session's Azurite.
azurite = module_azurite("dashboard")


def _pools(cpu_max: int) -> str:
    return json.dumps({**POOLS, "cpu": {**POOLS["cpu"], "max_nodes": cpu_max}})


def _release_cpu_pool(mp: pytest.MonkeyPatch) -> None:
    """Let the scaler start cpu workers: the host runs in this process and reads settings anew."""
    import handlers.context
    import handlers.scale

    mp.setenv("UPWELL_POOLS", _pools(2))
    handlers.context.reset()
    handlers.scale.autoscaler.cache_clear()


@dataclass
class Stack:
    host: object
    store: Storage
    mp: pytest.MonkeyPatch

    @property
    def url(self) -> str:
        return f"{self.host.http_url}/api"


@pytest.fixture(scope="module")
def stack(azurite, tmp_path_factory):
    """One devhost for the module, the cpu pool held at zero nodes until a test releases it, and the
    project roles of the principals the tests sign in with."""
    state = tmp_path_factory.mktemp("dashboard-state")
    store = Storage(azurite.connection_string)
    store.ensure()
    with pytest.MonkeyPatch.context() as mp:
        pipeline_env(mp, azurite.connection_string, state, UPWELL_POOLS=_pools(0), UPWELL_PROJECT_ROLES=ROLES)
        with running_host(azurite.connection_string, state) as host:
            assert host.http_url.startswith("http://127.0.0.1:")  # loopback only
            yield Stack(host, store, mp)


def principal(name: str, *, roles: tuple[str, ...] = (), groups: tuple[str, ...] = ()) -> str:
    """An X-MS-CLIENT-PRINCIPAL value as App Service builds it for an Entra ID user."""
    role_typ = "http://schemas.microsoft.com/ws/2008/06/identity/claims/role"
    claims = [{"typ": "name", "val": name}, {"typ": "preferred_username", "val": name},
              {"typ": "http://schemas.microsoft.com/identity/claims/objectidentifier", "val": f"oid-{name}"},
              *({"typ": role_typ, "val": r} for r in roles), *({"typ": "groups", "val": g} for g in groups)]
    doc = {"auth_typ": "aad", "claims": claims, "name_typ": "name", "role_typ": role_typ}
    return base64.b64encode(json.dumps(doc).encode()).decode()


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
    driver.set_script_timeout(30)
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


def _listed(driver) -> list[str]:
    return _js(driver, "return [...document.querySelectorAll('#jobs tbody tr[data-job]')].map(r => r.dataset.job);")


def _filter(driver, key: str, value: str) -> None:
    """Choose ``value`` in the page's ``key`` filter as a user would: once the select offers it (the page
    offers the values of the jobs it lists), then the select's change event."""
    offered = "return [...document.querySelectorAll('#f-' + arguments[0] + ' option')].map(o => o.value);"
    wait_for(lambda: value in _js(driver, offered, key), 30, f"the {key} filter to offer {value!r}",
             lambda: str(_js(driver, offered, key)))
    _js(driver, "const s = document.querySelector('#f-' + arguments[0]); s.value = arguments[1];"
        " s.dispatchEvent(new Event('change', {bubbles: true}));", key, value)


def _fetch(driver, url: str, method: str = "GET") -> list:
    """[status, body text] of a request the page itself makes (its headers, its origin)."""
    return driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0], {method: arguments[1], cache: 'no-store'})"
        ".then(async r => done([r.status, await r.text()])).catch(e => done([0, String(e)]));", url, method)


def _upload(store: Storage, path: str, body: bytes) -> str:
    etag = store.blob(names.INCOMING, path).upload_blob(body, overwrite=True)["etag"]
    return job_id_for(path, etag)


def test_page_ships_its_assets_and_no_cdn():
    html = dashboard.page().decode()
    assert "<script>" in html and "<style>" in html and "/*upwell:" not in html
    assert "https://" not in html and "http://" not in html and "src=" not in html.split("<script>")[0]


def test_dashboard_in_chromium_filters_cancels_reruns_and_shows_usage(browser, artifacts, stack):
    from selenium.webdriver.support.ui import WebDriverWait

    store, url = stack.store, f"{stack.url}/dashboard"
    browser.get(url)
    WebDriverWait(browser, 20).until(lambda d: _text(d, "#updated").startswith("updated"))
    browser.save_screenshot(str(artifacts / "0-empty.png"))
    assert "automation" in _text(browser, "#caller")  # no principal: a function-key caller

    bad_id = _upload(store, "dash/bad/job.yaml", BAD)
    job_id = _upload(store, "dash/sweep/job.yaml", SAMPLE)
    reef_id = _upload(store, "dash/reef/job.yaml", REEF)
    wait_for(lambda: _state(browser, job_id) == "queued" and _state(browser, reef_id) == "queued"
             and _state(browser, bad_id) == "rejected", 60, "the page to show both jobs queued and one rejected",
             lambda: f"states: {_state(browser, job_id)}, {_state(browser, reef_id)}, {_state(browser, bad_id)}")
    browser.save_screenshot(str(artifacts / "1-1-queued.png"))
    _filters_narrow_the_list(browser, artifacts, job_id, reef_id)
    _cancel_with_the_button(browser, store, reef_id)

    seen: list[str] = ["queued"]
    _release_cpu_pool(stack.mp)
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
    _rerun_with_the_button(browser, reef_id)

    # Pools (a chart with both axes and their units), the quarantine with its reason, the scaler's decisions.
    WebDriverWait(browser, 20).until(lambda d: "no-such-payload" in _text(d, "#quarantine"))
    cpu_chart = "#pools [data-pool=cpu] svg"
    assert _js(browser, f"return document.querySelectorAll('{cpu_chart} polyline').length") >= 1
    assert _js(browser, f"return document.querySelectorAll('{cpu_chart} .axis.y text').length") >= 3
    assert _js(browser, f"return document.querySelectorAll('{cpu_chart} .axis.x text').length") >= 2
    units = _js(browser, f"return [...document.querySelectorAll('{cpu_chart} text.unit')].map(t => t.textContent);")
    assert units in (["nodes · shards", "time (UTC, hh:mm)"], ["nodes · shards", "time (UTC, hh:mm:ss)"]), units
    assert "cpu" in _text(browser, "#decisions")
    row = _text(browser, f'#jobs tr[data-job="{job_id}"]')
    assert "3/3" in row and "lead@lab.org" in row

    _job_view_usage_and_logs(browser, artifacts, store, job_id)
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
    bad = Ledger(store).job(bad_id)
    assert bad is not None and bad.status == "rejected", bad
    shots = {p.name: p.read_bytes() for p in artifacts.glob("*.png")}
    want = {"0-empty.png", "1-1-queued.png", f"1-{len(seen)}-succeeded.png", "2-job.png", "3-report.png",
            "1-filtered.png"}
    assert want <= set(shots), sorted(shots)
    assert all(data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000 for data in shots.values())


def _filters_narrow_the_list(browser, artifacts: Path, job_id: str, reef_id: str) -> None:
    """Owner, project and state filters: each leaves only the matching jobs, and the URL keeps the choice."""
    assert {job_id, reef_id} <= set(_listed(browser))
    _filter(browser, "project", "reef")
    assert _listed(browser) == [reef_id] and "project=reef" in browser.current_url
    browser.save_screenshot(str(artifacts / "1-filtered.png"))
    _filter(browser, "project", "")
    _filter(browser, "owner", "lead@lab.org")
    assert _listed(browser) == [job_id]
    _filter(browser, "owner", "")
    _filter(browser, "state", "rejected")
    assert job_id not in _listed(browser) and reef_id not in _listed(browser) and _listed(browser)
    _filter(browser, "state", "")
    assert {job_id, reef_id} <= set(_listed(browser))


def _cancel_with_the_button(browser, store: Storage, reef_id: str) -> None:
    """The row's cancel button calls POST /api/jobs/{id}/cancel; the job is cancelled in the ledger."""
    _js(browser, "window.confirm = () => true;")  # the page asks before it cancels
    assert _click(browser, f'#jobs tr[data-job="{reef_id}"] button[data-action=cancel]')
    wait_for(lambda: _state(browser, reef_id) == "cancelled", 30, "the page to show the job cancelled",
             lambda: f"state {_state(browser, reef_id)}; {_text(browser, '#action-result')}")
    assert _text(browser, "#action-result").startswith(f"cancelled {reef_id}: 1 queued shard(s) cancelled")
    assert Ledger(store).job(reef_id).status == "cancelled"
    assert _js(browser, f"return document.querySelector('#jobs tr[data-job=\"{reef_id}\"] "
                        "button[data-action=cancel]').disabled")


def _rerun_with_the_button(browser, reef_id: str) -> None:
    """The row's rerun button calls POST /api/jobs/{id}/rerun: the cancelled shard runs again, to success."""
    assert _click(browser, f'#jobs tr[data-job="{reef_id}"] button[data-action=rerun]')
    wait_for(lambda: _text(browser, "#action-result") == f"re-running 1 shard(s) of {reef_id}", 30,
             "the rerun's answer", lambda: _text(browser, "#action-result"))
    wait_for(lambda: _state(browser, reef_id) == "succeeded", 120, "the re-run job to succeed",
             lambda: f"state {_state(browser, reef_id)}")


def _job_view_usage_and_logs(browser, artifacts: Path, store: Storage, job_id: str) -> None:
    """The job's shards with the CPU seconds and peak RSS their agents measured, the CPU chart with its
    axes, and each shard's log behind its link."""
    from selenium.webdriver.support.ui import WebDriverWait

    assert _click(browser, f'[data-open="{job_id}"]')
    WebDriverWait(browser, 20).until(
        lambda d: _js(d, "return document.querySelectorAll('#shards tbody tr').length") == 3)
    WebDriverWait(browser, 60).until(lambda d: _text(d, "#detail-report") == "open the report")
    assert _text(browser, "#shards").count("succeeded") == 3
    cells = _js(browser, "return [...document.querySelectorAll('#shards tbody tr')].map(r =>"
                         " [r.querySelector('td.cpu').innerText, r.querySelector('td.rss').innerText]);")
    rows = {s.shard_id: s for s in Ledger(store).shards(job_id)}
    assert all(float(cpu) > 0 and float(rss) > 1 for cpu, rss in cells), cells
    shown, recorded = sorted(float(c) for c, _ in cells), sorted(r.cpu_s for r in rows.values())
    assert all(abs(a - b) <= 0.006 for a, b in zip(shown, recorded, strict=True)), (shown, recorded)
    doc = json.loads(store.read(next(iter(rows.values())).result_blob))
    assert doc["timings"]["cpu_s"] > 0 and doc["timings"]["max_rss_mb"] > 1, doc["timings"]
    assert _js(browser, "return document.querySelectorAll('#cpu-chart rect').length") == 3
    assert _js(browser, "return [...document.querySelectorAll('#cpu-chart text.unit')].map(t => t.textContent);") \
        == ["CPU seconds", "shard"]
    # logistic prints nothing, so its attempts kept no payload.log: each row says so instead of a link to an
    # empty page, and the log's address still serves an empty log, not a 404
    assert _js(browser, "return document.querySelectorAll('#shards a.log').length") == 0
    assert _js(browser, "return [...document.querySelectorAll('#shards .silent')].map(e => e.textContent);") \
        == ["no output"] * 3
    assert all(r.log_bytes == 0 for r in rows.values()), [r.log_bytes for r in rows.values()]
    api = _js(browser, "return location.origin + location.pathname.replace(/\\/+$/, '').replace(/\\/dashboard$/, '');")
    status, text = _fetch(browser, f"{api}/jobs/{job_id}/shards/{next(iter(rows))}/log")
    assert status == 200 and text == "", (status, text[:200])
    browser.save_screenshot(str(artifacts / "2-job.png"))


def _call(url: str, header: str | None = None, method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None,
                                     headers={"X-MS-CLIENT-PRINCIPAL": header} if header else {})
    try:
        with urllib.request.urlopen(request) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _actions(base: str, job_id: str) -> dict[str, tuple[str, str]]:
    """Each action on one job, as the dashboard's page calls it: (method, URL)."""
    return {"status": ("GET", f"{base}/dashboard/api/jobs/{job_id}"),
            "cancel": ("POST", f"{base}/jobs/{job_id}/cancel"),
            "rerun": ("POST", f"{base}/jobs/{job_id}/rerun"),
            "report": ("GET", f"{base}/dashboard/reports/{job_id}/index.html")}


@pytest.mark.access
def test_a_principal_sees_and_acts_only_within_its_projects(browser, stack):
    store, base = stack.store, stack.url
    ocean_id = _upload(store, "access/ocean/job.yaml", REEF.replace(b"reef", b"ocean"))
    reef_id = _upload(store, "access/reef/job.yaml", REEF.replace(b"reef sweep", b"reef access"))
    _release_cpu_pool(stack.mp)
    for job in (ocean_id, reef_id):
        wait_reported(store, job, timeout=120)
    ocean = principal("ana@lab.org", roles=("ocean.members",))
    reef = principal("rui@partner.edu", groups=(REEF_GROUP,))

    # The HTTP API: the list holds only the caller's projects; another project's job is 403 for every action.
    for header, mine, theirs in ((ocean, ocean_id, reef_id), (reef, reef_id, ocean_id)):
        code, body = _call(f"{base}/jobs", header)
        listed = json.loads(body)
        assert code == 200 and mine in {j["job_id"] for j in listed} and theirs not in {j["job_id"] for j in listed}
        assert len({j["project"] for j in listed}) == 1
        assert _call(f"{base}/jobs/{theirs}", header)[0] == 403
        assert _call(f"{base}/jobs/{theirs}/shards/s00000/log", header)[0] == 403
        for action, (method, url) in _actions(base, theirs).items():
            code, body = _call(url, header, method)
            assert code == 403, (action, code, body[:300])
        assert _call(f"{base}/jobs/{mine}", header)[0] == 200
        assert _call(_actions(base, mine)["report"][1], header)[0] == 200
    ledger = Ledger(store)
    for job in (ocean_id, reef_id):  # the refused cancels and reruns changed nothing
        row = ledger.job(job)
        assert row.status == "succeeded" and row.reruns == 0 and not row.cancelled_at, row
    # A key (automation) sees both; a malformed principal is refused at the door.
    assert {ocean_id, reef_id} <= {j["job_id"] for j in json.loads(_call(f"{base}/jobs")[1])}
    filtered = json.loads(_call(f"{base}/jobs?project=reef&owner=diver%40lab.org&state=succeeded")[1])
    assert reef_id in {j["job_id"] for j in filtered} and ocean_id not in {j["job_id"] for j in filtered}
    assert {(j["project"], j["owner"], j["status"]) for j in filtered} == {("reef", "diver@lab.org", "succeeded")}
    assert _call(f"{base}/jobs", "not base64 json!")[0] == 401

    # The page, signed in as the ocean member: only ocean's jobs, and every action on reef's job is 403.
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"X-MS-CLIENT-PRINCIPAL": ocean}})
    browser.get(f"{base}/dashboard#job={reef_id}")
    wait_for(lambda: ocean_id in _listed(browser), 30, "the page to list the ocean job", lambda: _listed(browser))
    assert reef_id not in _listed(browser)
    projects = _js(browser, "return [...document.querySelectorAll('#jobs tbody tr[data-job]')]"
                            ".map(r => r.dataset.project);")
    assert set(projects) == {"ocean"}, projects
    assert "ana@lab.org" in _text(browser, "#caller") and "ocean" in _text(browser, "#caller")
    wait_for(lambda: _js(browser, "const e = document.querySelector('#detail-summary [data-http]');"
                                  " return e && e.dataset.http;") == "403", 30, "the opened reef job to be refused")
    for action, (method, url) in _actions(base, reef_id).items():
        status, body = _fetch(browser, url, method)
        assert status == 403, (action, status, body[:300])
    assert _fetch(browser, _actions(base, ocean_id)["status"][1])[0] == 200
