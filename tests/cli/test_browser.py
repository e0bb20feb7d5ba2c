"""What users see, in a real browser (issue 24): `swerl up` and `swerl serve` as the README says, the pipeline run
from the Prefect UI's parameter form with a tiny config, its stage logs and artifacts in the Prefect UI, then its
nested runs, a metric chart and the compare view of base/SFT/GRPO in MLflow's UI. Headless Chromium (Debian
`chromium` + `chromium-driver`; `.ci/run` installs them) driven by selenium with explicit waits only.

Screenshots go to the test's tmp folder and are copied to test-artifacts/browser/ (ignored by git).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from swerl.config.base import deep_merge
from tests.cli.test_cli_up import up_command

pytestmark = pytest.mark.slow

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the dev extra")
from selenium.common.exceptions import TimeoutException, WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "browser_tiny.yaml"
ARTIFACTS = REPO / "test-artifacts" / "browser"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
RUN_TIMEOUT_S = 600  # the tiny run takes 1-3 minutes on 2 busy cores; the rest is slack for a loaded CI machine
STAGES = ["curate", "traces", "sft", "grpo", "evaluate"]
MODELS = ["base", "sft", "grpo"]

if not (CHROMIUM and CHROMEDRIVER):
    pytest.skip("needs Debian's chromium and chromium-driver (`.ci/run` installs them)", allow_module_level=True)


# ------------------------------------------------------------------------------------------------ services


def _get_json(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _source_env(path: Path, env: dict[str, str]) -> dict[str, str]:
    """The variables a shell gets from `source path`: `export K=V` lines and `. FILE` lines (followed)."""
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export ") :].split("=", 1)
            env[key.strip()] = value.strip().strip("'\"")
        elif line.startswith((". ", "source ")):
            _source_env(Path(line.split(None, 1)[1].strip().strip("'\"")), env)
    return env


@dataclass
class Stack:
    prefect: str  # UI base URL
    mlflow: str
    env: dict[str, str]  # what `source services.env` gives a shell
    data_dir: Path

    @property
    def api(self) -> str:
        return f"{self.prefect}/api"


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Ctrl-C to the process group this test started (how a user stops `swerl up`: it stops its servers and worker
    by pid), then SIGKILL to whatever is left of that group. A process that already ended is left alone (its pid
    and group id may belong to someone else by now)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`swerl up` on free loopback ports, then `swerl serve configs/local.yaml` in the environment it writes, as
    the README tells a user; everything stopped by process id (group) at the end."""
    root = tmp_path_factory.mktemp("browser-stack")
    argv, prefect_port, mlflow_port, _ = up_command(root, 300)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "SWERL_"))}
    env["HOME"] = str(root / "home")  # the worker's and the flow runs' ~/.prefect and caches: this test's own
    up_log = root / "up.log"
    with up_log.open("wb") as fh:
        up = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=root, env=env, start_new_session=True)
    serve: subprocess.Popen[bytes] | None = None
    try:
        prefect, mlflow = f"http://127.0.0.1:{prefect_port}", f"http://127.0.0.1:{mlflow_port}"
        deadline = time.monotonic() + 600
        while not (
            "Local services are up" in up_log.read_text()
            and _answers(f"{prefect}/api/health")
            and _answers(f"{mlflow}/health")
        ):
            assert up.poll() is None, up_log.read_text()[-4000:]
            assert time.monotonic() < deadline, "swerl up: services not healthy in time\n" + up_log.read_text()[-4000:]
            time.sleep(1)
        env_file = root / "services.env"
        assert env_file.is_file(), "swerl up wrote no services.env (the environment a run needs)"
        run_env = _source_env(env_file, dict(env))
        assert run_env.get("PREFECT_API_URL") == f"{prefect}/api", env_file.read_text()
        serve_log = root / "serve.log"
        with serve_log.open("wb") as fh:
            serve = subprocess.Popen(
                [sys.executable, "-m", "swerl.cli", "serve", str(REPO / "configs/local.yaml")],
                stdout=fh,
                stderr=subprocess.STDOUT,
                cwd=root,
                env=run_env,
                start_new_session=True,
            )
        # Registered: `swerl serve` exits after registering on the work pool (a foreground serve keeps running).
        deadline = time.monotonic() + 300
        while not _deployments(f"{prefect}/api"):
            assert serve.poll() in (None, 0), serve_log.read_text()[-4000:]
            assert time.monotonic() < deadline, "swerl serve registered nothing\n" + serve_log.read_text()[-4000:]
            time.sleep(1)
        yield Stack(prefect, mlflow, run_env, root)
    finally:
        if serve is not None:
            _stop(serve, 60)
        _stop(up, 180)
        for name in ("up.log", "serve.log"):
            if (root / name).exists():
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                shutil.copy(root / name, ARTIFACTS / name)


def _deployments(api: str) -> dict[str, str]:
    try:
        return {d["name"]: d["id"] for d in _get_json(f"{api}/deployments/filter", {})}
    except OSError:
        return {}


# ------------------------------------------------------------------------------------------------ browser


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("browser-screenshots")
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    return folder


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--window-size=1600,1000",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-default-browser-check",
        "--proxy-server=direct://",
        "--proxy-bypass-list=*",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, saved when a test fails
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER, log_output=os.devnull)
    drv = webdriver.Chrome(options=options, service=service)
    drv.set_page_load_timeout(120)
    try:
        yield drv
    finally:
        drv.quit()  # chromedriver and its browser, by the pids selenium started


def _shot(drv: Any, shots: Path, name: str) -> Path:
    path = shots / f"{name}.png"
    drv.save_screenshot(str(path))
    shutil.copy(path, ARTIFACTS / path.name)
    return path


def _wait(drv: Any, timeout: float, what: str, cond: Callable[[Any], Any], poll: float = 0.5) -> Any:
    return WebDriverWait(drv, timeout, poll_frequency=poll, ignored_exceptions=(WebDriverException,)).until(
        cond, message=f"timed out after {timeout:.0f} s waiting for {what} ({drv.current_url[:200]})"
    )


def _body(drv: Any) -> str:
    return str(drv.find_element(By.TAG_NAME, "body").text)


def _text_visible(drv: Any, timeout: float, *texts: str) -> None:
    _wait(drv, timeout, f"{texts!r} on the page", lambda d: all(t in _body(d) for t in texts))


def _click(drv: Any, timeout: float, xpath: str) -> None:
    """Click the first displayed, enabled element at xpath; retried until it takes (a toast still sliding in, a
    menu still opening intercept a click)."""

    def click(d: Any) -> bool:
        for el in d.find_elements(By.XPATH, xpath):
            if el.is_displayed() and el.is_enabled():
                d.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
                el.click()
                return True
        return False

    _wait(drv, timeout, f"a clickable {xpath}", click)


# ------------------------------------------------------------------------------------------------ the tests

RUN: dict[str, Any] = {}  # what the Prefect test ran, for the MLflow test


def test_prefect_ui_runs_the_pipeline_from_the_form_and_shows_its_logs_and_artifacts(
    stack: Stack, driver: Any, shots: Path
) -> None:
    with _failure_shot(driver, shots, "prefect-failure"):
        _prefect_ui(stack, driver, shots)


@contextlib.contextmanager
def _failure_shot(drv: Any, shots: Path, name: str) -> Iterator[None]:
    """A screenshot of the page a failing test was on (test-artifacts/browser/NAME.png)."""
    try:
        yield
    except Exception:
        with contextlib.suppress(Exception):
            _shot(drv, shots, name)
        with contextlib.suppress(Exception):
            console = [f"{e['level']} {e['message']}" for e in drv.get_log("browser")]
            (ARTIFACTS / f"{name}-console.log").write_text("\n".join(console) + "\n")
        raise


def _prefect_ui(stack: Stack, drv: Any, shots: Path) -> None:
    drv.get(f"{stack.prefect}/deployments")
    _click(drv, 120, "//a[normalize-space(.)='local-pipeline']")
    _text_visible(drv, 60, "swerl-pipeline")
    _click(drv, 60, "//button[normalize-space(.)='Run']")
    _click(drv, 30, "//*[normalize-space(.)='Custom run'][self::a or self::button or @role='menuitem']")
    _wait(drv, 60, "the custom-run page", lambda d: urlparse(d.current_url).path.rstrip("/").endswith("/run"))
    # The typed form, rendered from the pydantic config with its descriptions.
    _text_visible(drv, 120, "Parameters", "Max Steps", "Optimizer steps")
    _shot(drv, shots, "prefect-form")

    # Fill it with the tiny config: the form's JSON view of the deployment's parameters, the tiny keys put in.
    _click(drv, 30, "//h3[normalize-space(.)='Parameters']/following::button[1]")
    _click(drv, 30, "//button[contains(@class,'p-overflow-menu-item')][normalize-space(.)='Use JSON input']")
    editor = _wait(
        drv,
        30,
        "the JSON editor",
        lambda d: d.find_element(By.CSS_SELECTOR, "textarea.p-code-input__textarea"),
    )
    shown = json.loads(editor.get_attribute("value"))
    assert shown["config"]["tracking"]["uri"] == stack.mlflow, "the deployment does not log to swerl up's MLflow"
    assert shown["config"]["storage"]["root"].startswith("s3://"), "the deployment does not store in swerl up's S3"
    tiny = yaml.safe_load(TINY.read_text())
    filled = {**shown, "config": deep_merge(shown["config"], tiny)}
    drv.execute_script(
        "const el = arguments[0]; el.value = arguments[1]; el.dispatchEvent(new Event('input', {bubbles: true}));",
        editor,
        json.dumps(filled, indent=2),
    )
    _wait(
        drv,
        30,
        "the form to take the tiny config",
        lambda d: (
            json.loads(d.find_element(By.CSS_SELECTOR, "textarea.p-code-input__textarea").get_attribute("value"))[
                "config"
            ]["sft"]["max_steps"]
            == tiny["sft"]["max_steps"]
        ),
    )
    _shot(drv, shots, "prefect-form-json")
    run_name = tiny["run"]["name"]
    name_input = _wait(
        drv,
        30,
        "the Run Name field",
        lambda d: d.find_element(By.XPATH, "//*[normalize-space(text())='Run Name']/following::input[1]"),
    )
    name_input.send_keys(Keys.CONTROL, "a")
    name_input.send_keys(run_name)
    _wait(drv, 30, "the typed run name", lambda d: name_input.get_attribute("value") == run_name)
    _submit(drv, stack, run_name)

    # The deployment's page lists the new run under the name typed in the form (and run.name, which names it once
    # it starts): its page, until the run ends.
    _click(drv, 120, f"//a[normalize-space(.)='{run_name}']")
    _wait(drv, 60, "the flow run's page", lambda d: "/flow-run/" in d.current_url)
    flow_run_id = drv.current_url.rstrip("/").rsplit("/", 1)[-1].split("?")[0]
    RUN["flow_run_id"] = flow_run_id
    state = _wait_for_end(drv, flow_run_id)
    _shot(drv, shots, "prefect-run")
    assert state == "Completed", f"the run from the UI ended {state}; its logs: {_tail_logs(stack, flow_run_id)}"

    # Logs: every stage's start and end, the SFT steps and pass@1 per model, in the run's Logs tab.
    _open_tab(drv, "Logs")
    expected = [f"stage {s}: done" for s in STAGES] + ["sft step", "pass@1"]
    seen: set[str] = set()
    try:
        _wait(drv, 180, "the stage logs", lambda d: _logs_show(d, expected, seen))
    except TimeoutException:
        raise AssertionError(f"the run's Logs tab never showed {sorted(set(expected) - seen)}") from None
    # The screenshot shows the end of the run: the innermost element holding the evaluation's last line, centred.
    _scroll_to_text(drv, "stage evaluate: done", "center")
    _shot(drv, shots, "prefect-logs")

    # Artifacts: each stage's report by its key (the flow graph above is a canvas: these are the tab's cards).
    keys = ["curate", "traces", "sft", "grpo", "grpo-plots", "evaluate-evaluation"]
    _open_tab(drv, "Artifacts")
    _wait(
        drv,
        120,
        f"the artifacts {keys}",
        lambda d: all(_shown(d, f"//*[normalize-space(text())='{k}']") for k in keys),
    )
    _scroll_to_text(drv, "Task runs", "start")  # the cards in the screenshot
    _shot(drv, shots, "prefect-artifacts")

    # A stage's plots, drawn: GRPO's curves as an image in its markdown artifact.
    _click(drv, 60, "//*[normalize-space(text())='grpo-plots']")
    _wait(drv, 120, "a drawn plot in the grpo-plots artifact", _image_drawn)
    _shot(drv, shots, "prefect-artifact-plot")
    RUN["done"] = True


def _submit(drv: Any, stack: Stack, run_name: str, tries: int = 3) -> None:
    """Submit the form and wait for the deployment's page. On a loaded machine the UI once answered "Something went
    wrong" with no run created: then, as a user would, submit again (never when a run exists: no double run)."""
    on_form = lambda d: urlparse(d.current_url).path.rstrip("/").endswith("/run")  # noqa: E731
    failed = "//*[contains(normalize-space(.), 'Something went wrong')]"
    for _ in range(tries):
        _click(drv, 30, "//button[@type='submit'][normalize-space(.)='Submit']")
        outcome = _wait(
            drv,
            90,
            "the deployment's page (or an error)",
            lambda d: "left" if not on_form(d) else ("error" if d.find_elements(By.XPATH, failed) else False),
        )
        if outcome == "left":
            return
        made = [r for r in _get_json(f"{stack.api}/flow_runs/filter", {}) if r["name"] == run_name]
        assert not made, "the UI said 'Something went wrong', yet made the run"
        drv.execute_script("document.querySelectorAll('.p-toast').forEach(t => t.remove());")
    raise AssertionError(f"the form's Submit failed {tries} times ('Something went wrong')")


def _scroll_to_text(drv: Any, text: str, block: str) -> None:
    """Scroll the innermost element holding text (its last one) into view."""
    drv.execute_script(
        "const s = arguments[0];"
        "const hits = Array.from(document.querySelectorAll('body *')).filter("
        "  e => e.textContent.includes(s) && !Array.from(e.children).some(c => c.textContent.includes(s)));"
        "if (hits.length) hits[hits.length - 1].scrollIntoView({block: arguments[1]});",
        text,
        block,
    )


def _shown(drv: Any, xpath: str) -> bool:
    return any(el.is_displayed() for el in drv.find_elements(By.XPATH, xpath))


def _image_drawn(drv: Any) -> bool:
    """An image on the page that the browser decoded (a broken or empty data: URI has no natural width)."""
    return bool(
        drv.execute_script(
            "return Array.from(document.images)"
            ".some(i => i.complete && i.naturalWidth > 100 && i.src.startsWith('data:image'));"
        )
    )


def _open_tab(drv: Any, name: str) -> None:
    _click(drv, 60, f"//*[@role='tablist']/*[normalize-space(.)='{name}']")


def _run_state(drv: Any) -> str | None:
    """The state the flow run page's badge shows, when it is a final one."""
    for badge in drv.find_elements(By.CSS_SELECTOR, ".state-badge"):
        text = badge.text.strip()
        if text in ("Completed", "Failed", "Crashed", "Cancelled"):
            return str(text)
    return None


def _wait_for_end(drv: Any, flow_run_id: str) -> str:
    """Wait for the run page to show a final state; reload it now and then (the page polls, a reload is cheap)."""
    last = [time.monotonic()]

    def ended(d: Any) -> str | bool:
        state = _run_state(d)
        if state:
            return state
        if time.monotonic() - last[0] > 30:
            d.refresh()
            last[0] = time.monotonic()
        return False

    return str(_wait(drv, RUN_TIMEOUT_S, f"flow run {flow_run_id} to end", ended, poll=2))


def _logs_show(drv: Any, expected: list[str], seen: set[str]) -> bool:
    """Every expected line rendered at some point while the (virtualised) log list is scrolled down, page by page."""
    text = _body(drv)
    seen.update(e for e in expected if e in text)
    if seen == set(expected):
        return True
    drv.execute_script("window.scrollBy(0, 600);")
    return False


def _tail_logs(stack: Stack, flow_run_id: str) -> list[str]:
    try:
        logs = _get_json(
            f"{stack.api}/logs/filter",
            {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "sort": "TIMESTAMP_DESC", "limit": 15},
        )
        return [str(x["message"])[:300] for x in reversed(logs)]
    except OSError as exc:
        return [f"(logs unavailable: {exc})"]


# ------------------------------------------------------------------------------------------------ MLflow


def _mlflow_runs(stack: Stack, experiment_id: str) -> list[dict[str, Any]]:
    out = _get_json(
        f"{stack.mlflow}/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment_id], "max_results": 500}
    )
    return list(out.get("runs", []))


def _tags(run: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def test_mlflow_ui_shows_nested_runs_a_metric_chart_and_the_compare_view(
    stack: Stack, driver: Any, shots: Path
) -> None:
    if not RUN.get("done"):
        pytest.skip("the Prefect UI test did not finish a run")
    with _failure_shot(driver, shots, "mlflow-failure"):
        _mlflow_ui(stack, driver, shots)


def _mlflow_ui(stack: Stack, drv: Any, shots: Path) -> None:
    experiment = _get_json(f"{stack.mlflow}/api/2.0/mlflow/experiments/get-by-name?experiment_name=swerl-local")
    exp_id = experiment["experiment"]["experiment_id"]
    runs = _mlflow_runs(stack, exp_id)
    by_id = {r["info"]["run_id"]: r for r in runs}
    parents = [r for r in runs if "mlflow.parentRunId" not in _tags(r)]
    assert len(parents) == 1, [r["info"]["run_name"] for r in parents]
    parent = parents[0]
    children = {
        r["info"]["run_name"]: r for r in runs if _tags(r).get("mlflow.parentRunId") == parent["info"]["run_id"]
    }
    assert set(STAGES) <= set(children), sorted(children)
    evals = {r["info"]["run_name"]: r for r in runs if r["info"]["run_name"] in {f"eval-{m}" for m in MODELS}}
    assert set(evals) == {f"eval-{m}" for m in MODELS}, sorted(by_id[i]["info"]["run_name"] for i in by_id)

    # The experiment's runs, the pipeline's parent run expanded to its stage runs.
    drv.get(f"{stack.mlflow}/#/experiments/{exp_id}/runs")
    _text_visible(drv, 120, parent["info"]["run_name"])
    _close_assistant(drv)
    parent_id = parent["info"]["run_id"]
    _click(drv, 60, f"//a[contains(@href, '/runs/{parent_id}')]/ancestor::*[@role='gridcell'][1]//button")
    _text_visible(drv, 60, *STAGES)
    _shot(drv, shots, "mlflow-nested-runs")

    # A metric chart: the SFT loss curve on the SFT run's metrics page.
    sft = children["sft"]["info"]["run_id"]
    drv.get(f"{stack.mlflow}/#/experiments/{exp_id}/runs/{sft}/model-metrics")
    _text_visible(drv, 120, "train/loss")
    _wait(
        drv,
        60,
        "a drawn chart",
        lambda d: d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot svg, canvas, svg.main-svg"),
    )
    _close_assistant(drv)
    _shot(drv, shots, "mlflow-metric-chart")

    # The compare view of the base, SFT and GRPO evaluation runs.
    ids = [evals[f"eval-{m}"]["info"]["run_id"] for m in MODELS]
    drv.get(f"{stack.mlflow}/#/compare-runs?runs={json.dumps(ids)}&experiments={json.dumps([exp_id])}")
    _text_visible(drv, 120, *[f"eval-{m}" for m in MODELS])
    _text_visible(drv, 60, "pass_at_1")
    _close_assistant(drv)
    _shot(drv, shots, "mlflow-compare")


def _close_assistant(drv: Any) -> None:
    """MLflow opens its assistant panel beside the page; closed for readable screenshots (absent: nothing to do)."""
    for button in drv.find_elements(By.XPATH, "//button[@aria-label='Close']"):
        if button.is_displayed():
            button.click()
            return
