"""A plugin written against the plugin guide before the API had a version (tests/plugins/frozen/mtbench-frozen-v0,
frozen: never edited to make a test pass) still runs: its older forms are called with the arguments they take,
each named once in a deprecation warning, and what it left out has a working default."""

import importlib.metadata
import json
import os

import pytest

import mtbench
from mtbench import figures
from conftest import ONE_BUCKET, REPOSITORY, TINY_TRAIN, run_cli

PACKAGE = "mtbench-frozen-v0"
FROZEN_DIR = os.path.join(REPOSITORY, "tests", "plugins", "frozen", PACKAGE)
INSTALL = f"pip install --no-deps -e tests/plugins/frozen/{PACKAGE}"
LOADED = {"MTBENCH_LOAD_PLUGINS": PACKAGE}
STEPS = 4
OLD_FORMS = {  # what the frozen plugin implements -> what mtbench calls now
    "extra 'frozen-count' implements make_train_step(run, model)": "make_train_step(run, model, step)",
    "reporter 'frozen-oneline' implements report(result, console)": "report(result, console, complete)",
}


@pytest.fixture(scope="module", autouse=True)
def installed():
    """Installed from this checkout (the CI script installs it); never skipped."""
    try:
        importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"the frozen plugin package {PACKAGE} is not installed; run: {INSTALL}", pytrace=False)
    import mtbench_frozen_v0
    where = os.path.realpath(mtbench_frozen_v0.__file__)
    if not where.startswith(os.path.realpath(FROZEN_DIR) + os.sep):
        pytest.fail(f"{PACKAGE} is imported from {where}, not from this checkout; run: {INSTALL}", pytrace=False)


def deprecation_lines(stderr):
    return [line for line in stderr.splitlines() if "deprecated in plugin API" in line]


def test_plugins_lists_it_loaded_with_its_deprecated_forms_and_the_api_version():
    proc = run_cli("plugins", "--json", env=LOADED)
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    assert listing["plugin_api_version"] == mtbench.PLUGIN_API_VERSION
    frozen = {p["name"]: p for p in listing["plugins"]}["frozen"]
    assert (frozen["status"], frozen["problems"]) == ("loaded", [])
    assert frozen["provides"] == {"extras": ["frozen-count"], "reporters": ["frozen-csv", "frozen-oneline"],
                                  "models": ["frozen-transformer"]}
    assert len(frozen["deprecated"]) == len(OLD_FORMS)
    for old, new in OLD_FORMS.items():
        assert any(old in line and f"mtbench calls {new}" in line for line in frozen["deprecated"])
    assert listing["warnings"] == []  # listing a plugin calls none of its methods: no warning yet
    table = run_cli("plugins", env=LOADED)
    assert table.returncode == 0 and f"plugin API {mtbench.PLUGIN_API_VERSION}" in table.stdout


@pytest.fixture(scope="module")
def frozen_run(cache_dir, tmp_path_factory):
    """One tiny jax run with every part of the frozen plugin: its model family, extra, reporter, tracker and
    callback."""
    folder = tmp_path_factory.mktemp("frozen")
    out, log = str(folder / "r.json"), str(folder / "log.jsonl")
    proc = run_cli("train", "--backend", "jax", *TINY_TRAIN, *ONE_BUCKET, "--steps", str(STEPS),
                   "--cache-dir", cache_dir, "--out", out, "--model", "frozen-transformer", "--extra", "frozen-count",
                   "--report", "frozen-oneline", "--report", "table", "--report-to", "frozen-csv",
                   env={**LOADED, "MTBENCH_FROZEN_LOG": log})
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out, encoding="utf-8") as f:
        result = json.load(f)
    with open(log, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    return {"proc": proc, "result": result, "log": lines, "out": out}


@pytest.mark.slow
def test_each_older_form_runs_and_is_named_once_in_a_deprecation_warning(frozen_run):
    proc, result = frozen_run["proc"], frozen_run["result"]
    warnings = deprecation_lines(proc.stderr)
    assert len(warnings) == len(OLD_FORMS), proc.stderr
    for old, new in OLD_FORMS.items():
        [line] = [line for line in warnings if old in line]
        assert line.startswith("Warning: plugin 'frozen': ") and f"mtbench calls {new}" in line
    # report(result, console): called, once, with the two arguments it takes
    assert proc.stdout.count(f"FROZEN-ONELINE jax: {STEPS} steps, BLEU ") == 1
    # make_train_step(run, model): its step replaced the backend's and trained every step
    assert result["status"] == "completed"
    assert result["train_step"] == "frozen-counted-keras"
    assert result["extras_record"] == {"frozen-count": {"calls": STEPS}}


@pytest.mark.slow
def test_its_tracker_and_callback_follow_the_run(frozen_run):
    result = frozen_run["result"]
    assert frozen_run["log"] == [{"kind": "callback", "backend": "jax", "batches": STEPS}]
    with open(os.path.join(frozen_run["out"][:-5] + ".run", "figures.csv"), encoding="utf-8") as f:
        rows = [line.rstrip("\n").split(",") for line in f]
    assert [(int(step), float(value)) for step, name, value in rows if name == "train_loss"] == \
        [(h["step"], pytest.approx(h["loss"])) for h in result["history"]]


@pytest.mark.slow
def test_its_model_family_trains_without_what_came_later(frozen_run):
    """No `shape`, `training_flops` or `attention_kinds`: the run trains, its label names the family, MFU is n/a
    with the reason, and no attention kernel is claimed for it."""
    result, proc = frozen_run["result"], frozen_run["proc"]
    assert result["model"]["family"] == "frozen-transformer"
    assert figures.run_label(result) == "jax+frozen-count:model=frozen-transformer"
    assert f"mtbench train: {figures.run_label(result)}" in proc.stdout
    utilization = result["utilization"]
    assert utilization["mfu"] is None and utilization["model_flops_per_s"] is None
    assert utilization["mfu_reason"] == ("model family 'frozen-transformer' counts no training FLOPs "
                                         "(ModelFamily.training_flops)")
    assert result["model"]["attention"] == {}
    assert figures.attention_text(result).startswith("none named")
    assert result["metrics"]["bleu"] is not None  # evaluated and translated like any model
