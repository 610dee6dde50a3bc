"""The plugin manager and the plugin API as a third-party author meets them: plugins installed here as real
distributions with entry points (see conftest.THIRD_PARTY_PACKAGES), loaded, limited, listed and run."""

import json

import pytest

from conftest import ONE_BUCKET, TINY_TRAIN, env_with, install_plugin_module, python_path, run_cli

LOADED = "mtbench-thirdparty,mtbench_broken,MTBENCH.FLAKY"  # package names, spelt as pip compares them


def plugins_json(env):
    proc = run_cli("plugins", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def by_name(listing):
    return {p["name"]: p for p in listing["plugins"]}


@pytest.fixture(scope="module")
def default_listing():
    """`mtbench plugins --json` in the test environment (each listing imports both frameworks: seconds)."""
    return plugins_json({})


def test_builtin_plugins_are_listed_with_their_hooks(default_listing):
    plugins = by_name(default_listing)
    assert plugins["jax_backend"]["provides"] == {"backends": ["jax"]}
    assert plugins["torch_backend"]["hooks"] == ["mtbench_register_backends"]
    assert plugins["bible_dataset"]["provides"]["datasets"] == ["bible-en-de", "bible-en-es", "bible-en-fr"]
    assert plugins["table_reporter"]["provides"] == {"reporters": ["summary", "table"]}
    builtin = [p for p in plugins.values() if p["builtin"]]
    assert plugins["transformer"]["provides"] == {"models": ["transformer"]}
    assert plugins["marian"]["provides"] == {"models": ["marian"]}
    assert plugins["torch_ddp"]["provides"] == {"extras": ["ddp"]}
    assert plugins["fsdp"]["provides"] == {"extras": ["fsdp"]}  # one name, both backends
    assert plugins["tensor_parallel"]["provides"] == {"extras": ["tensor-parallel"]}
    assert plugins["remat"]["provides"] == {"extras": ["remat"]}
    assert plugins["pipeline_parallel"]["provides"] == {"extras": ["pipeline-parallel"]}
    assert plugins["gpt"]["provides"] == {"models": ["gpt"]}
    assert plugins["gpt2"]["provides"] == {"models": ["gpt2"]}
    assert plugins["translation"]["provides"] == {"tasks": ["translation"]}
    assert plugins["language_modelling"]["provides"] == {"tasks": ["language-modelling"]}
    assert len(builtin) == 22 and all(p["status"] == "loaded" and p["package"] == "mtbench" for p in builtin)
    # An extra that asks the model family (remat: whether its blocks recompute) is judged on the default model's.
    extras = {(row["extra"], row["backend"]): row for row in default_listing["extras"]}
    assert extras[("remat", "jax")]["available"] and extras[("remat", "torch")]["available"]


def test_an_80_column_terminal_keeps_hook_names_whole_and_folds_hints_instead_of_cutting_them(default_listing):
    proc = run_cli("plugins", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80
    assert "…" not in proc.stdout
    listing = default_listing
    hooks_column = {line.split("│")[4].strip() for line in proc.stdout.splitlines() if line.count("│") == 6}
    assert {hook for row in listing["plugins"] for hook in row["hooks"]} <= hooks_column  # one a line, unbroken
    hint = max((row["reason"] or "" for row in listing["extras"]), key=len)  # the longest why-not
    folded = "".join(line.split("│")[4].strip() for line in proc.stdout.splitlines() if line.count("│") == 5)
    assert hint.replace(" ", "") in folded.replace(" ", "")


def test_third_party_plugins_load_by_package_and_every_plugin_is_listed_with_its_status(plugin_path):
    listing = plugins_json({**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": LOADED})
    plugins = by_name(listing)
    third = plugins["thirdparty"]
    assert (third["version"], third["package"], third["status"], third["builtin"]) == \
        ("0.3.0", "mtbench_thirdparty", "loaded", False)
    assert third["provides"] == {"backends": ["fakeflow"],
                                 "extras": ["bad-record", "bfloat16-compute", "compile-late", "count-steps",
                                            "crash-before-model", "float16-compute", "no-jit", "read-loss"],
                                 "reporters": ["calls-file", "explode", "oneline"]}
    assert third["deprecated"] == []  # written in the current forms of the API
    assert third["hooks"] == ["mtbench_keras_callbacks", "mtbench_register_backends", "mtbench_register_extras",
                              "mtbench_register_reporters"]
    assert plugins["broken"]["status"] == "failed to load"
    assert "broken on purpose" in plugins["broken"]["problems"][0]
    # A plugin whose hook raised is not listed like a healthy one (flaky fails only during a run).
    assert plugins["flaky"]["status"] == "loaded"
    for name in ("trouble", "mtbench_twin_a:twin", "mtbench_twin_b:twin"):
        assert plugins[name]["status"] == "not loaded"
        assert "MTBENCH_LOAD_PLUGINS does not name" in plugins[name]["problems"][0]
    extras = {(row["extra"], row["backend"]): row for row in listing["extras"]}
    assert extras[("count-steps", "jax")]["available"] and extras[("count-steps", "torch")]["available"]
    # Every run of it stops (its compile options would not reach jax's own step): not listed as available.
    assert not extras[("no-jit", "jax")]["available"]
    assert extras[("no-jit", "jax")]["reason"].startswith("sets model.compile options and brings no train step, "
                                                          "but backend 'jax' trains with a step of its own")
    assert any("plugin 'broken' failed to load" in w and "broken on purpose" in w for w in listing["warnings"])


@pytest.fixture(scope="module")
def every_plugin_listing(plugin_path):
    """`mtbench plugins --json` with every installed plugin package loaded (MTBENCH_LOAD_PLUGINS unset)."""
    return plugins_json({**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": None})


def test_a_hook_that_raises_marks_its_plugin_broken(every_plugin_listing):
    plugins = by_name(every_plugin_listing)  # a plugin's own failure, whichever others load beside it
    assert plugins["trouble"]["status"] == "broken"
    assert "failed in mtbench_register_datasets: RuntimeError('half of the datasets registered')" in \
        plugins["trouble"]["problems"][0]
    assert plugins["trouble"]["provides"] == {"datasets": ["crashing", "needs-key"]}


@pytest.mark.slow
def test_environment_variable_limits_packages_and_says_what_it_left_out(plugin_path, every_plugin_listing):
    unset = by_name(every_plugin_listing)
    assert unset["thirdparty"]["status"] == "loaded" and unset["broken"]["status"] == "failed to load"
    none = by_name(plugins_json({**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": ""}))
    assert none["thirdparty"]["status"] == "not loaded" and none["jax_backend"]["status"] == "loaded"
    listing = plugins_json({**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench_thirdparty,mtbench-thirdpraty"})
    plugins = by_name(listing)
    assert plugins["thirdparty"]["status"] == "loaded" and plugins["broken"]["status"] == "not loaded"
    # A misspelt name loads nothing, and says so.
    assert any("MTBENCH_LOAD_PLUGINS names 'mtbench-thirdpraty', which is no installed package with mtbench "
               "plugins" in w for w in listing["warnings"])


def test_two_packages_may_share_an_entry_point_name(plugin_path):
    listing = plugins_json({**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-twin-a,mtbench-twin-b"})
    plugins = by_name(listing)
    assert plugins["mtbench_twin_a:twin"]["provides"] == {"reporters": ["twin-a"]}
    assert plugins["mtbench_twin_b:twin"]["provides"] == {"reporters": ["twin-b"]}
    assert listing["warnings"] == []


def test_unknown_names_quote_only_the_plugins_that_could_have_provided_them(plugin_path, cache_dir, tmp_path):
    env = {**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-datasets-trouble"}
    backend = run_cli("train", "--backend", "nonesuch", "--out", str(tmp_path / "a.json"), env=env)
    assert backend.returncode == 2
    assert "unknown backend 'nonesuch'" in backend.stderr and "half of the datasets" not in backend.stderr.split(
        "Error:")[1]
    assert "MTBENCH_LOAD_PLUGINS left out the plugin package(s)" in backend.stderr
    dataset = run_cli("train", "--dataset", "nonesuch", "--out", str(tmp_path / "b.json"), env=env)
    assert dataset.returncode == 2
    error = dataset.stderr.split("Error:")[1]
    assert "unknown dataset 'nonesuch'; available: bible-en-de, bible-en-es, bible-en-fr, crashing, needs-key" in error
    assert "it may come from a plugin that failed: plugin 'trouble' failed in mtbench_register_datasets" in error


def test_a_dataset_plugins_failure_is_named_with_the_plugin(plugin_path, cache_dir, tmp_path):
    env = {**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-datasets-trouble"}
    crash = run_cli("train", "--dataset", "crashing", "--cache-dir", cache_dir, "--out", str(tmp_path / "a.json"),
                    env=env)
    assert crash.returncode == 1 and "Traceback" not in crash.stderr
    assert crash.stderr.strip().endswith("Error: dataset 'crashing' of plugin 'trouble' failed: OSError: the tape "
                                         "is stuck")
    user = run_cli("train", "--dataset", "needs-key", "--cache-dir", cache_dir, "--out", str(tmp_path / "b.json"),
                   env=env)
    assert user.returncode == 2
    assert user.stderr.strip().endswith("Error: dataset 'needs-key': set NEEDS_KEY_PATH to the corpus you licensed")


@pytest.mark.slow  # a whole training run with beam search: 21 s on a 2-core machine
def test_third_party_extra_wraps_the_backends_step_and_reporters_run_isolated(plugin_path, cache_dir, tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli("train", "--backend", "jax", *TINY_TRAIN, *ONE_BUCKET, "--steps", "3", "--cache-dir", cache_dir,
                   "--out", str(out), "--report", "explode", "--report", "oneline", "--report", "table",
                   "--extra", "count-steps", "--extra", "bad-record", "--beam", "2",
                   env={**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": LOADED})
    # The exploding reporter and the extra whose record raised are named, once each, on the last line; the
    # reporters after it still run, the command fails with the reporting code, the result is written and stays.
    assert proc.returncode == 3, proc.stderr
    assert "ONELINE backend=jax steps=3 complete=True bleu=" in proc.stdout
    assert "mtbench train: jax+count-steps+bad-record" in proc.stdout
    record_failure = "extra 'bad-record' of plugin 'thirdparty' failed in record: KeyError: 'lost the count'"
    assert proc.stderr.strip().splitlines()[-1] == (
        f"Error: 2 reporting failures: (1) {record_failure}; the result is in {out}, with this failure as "
        f"extras_record['bad-record']; (2) reporter 'explode' of plugin 'thirdparty' failed: ValueError: no ink; "
        f"the result is in {out}")
    assert proc.stderr.count("no ink") == 1 and proc.stderr.count("lost the count") == 1
    assert "Warning: plugin 'broken' failed to load" in proc.stderr
    assert ("Warning: plugin 'flaky' failed in mtbench_keras_callbacks and was left out: "
            "RuntimeError('flaky callbacks on purpose')") in proc.stderr
    result = json.loads(out.read_text())
    assert result["status"] == "completed" and result["metrics"]["bleu"] is not None
    assert result["extras"] == ["count-steps", "bad-record"]
    assert result["extras_record"] == {"count-steps": {"steps_seen": 3, "wrapped": "jax-jit-stateless"},
                                       "bad-record": {"record_failed": record_failure}}
    assert result["train_step"] == "counted jax-jit-stateless"
    assert result["compile_options"]["applies_to"] == "evaluation only (training runs the 'counted " \
                                                      "jax-jit-stateless' step)"
    assert result["config"]["beam"] == 2 and result["metrics"]["decoding"] == "beam 2, length penalty 0.6"
    assert "beam 2, length penalty 0.6" in proc.stdout  # the table's decoding row


@pytest.mark.slow  # a training run a backend
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_step_that_reads_its_loss_on_the_host_is_counted_a_host_wait_a_step(plugin_path, cache_dir, tmp_path,
                                                                             backend):
    """The positive control of every `host_syncs_per_step == 0` in the suite: a third party's step that reads each
    step's loss on the host waits for the device once a step, and the result says so."""
    out = tmp_path / "r.json"
    proc = run_cli("train", "--backend", backend, *TINY_TRAIN, *ONE_BUCKET, "--steps", "8", "--measure-only",
                   "--extra", "read-loss", "--cache-dir", cache_dir, "--out", str(out),
                   env={**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": LOADED})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["train_step"].startswith("reading ")
    assert result["host_syncs_per_step"] >= 1, result["host_syncs"]


@pytest.mark.slow
def test_partial_results_reach_the_reporters(plugin_path, cache_dir, tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli("train", "--backend", "jax", *TINY_TRAIN, *ONE_BUCKET, "--steps", "6", "--cache-dir", cache_dir,
                   "--out", str(out), "--report", "oneline", "--report", "table",
                   env={**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-thirdparty",
                        "MTBENCH_TEST_NAN_AT_STEP": "4"})
    assert proc.returncode == 1
    assert "training diverged" in proc.stderr
    assert "ONELINE backend=jax steps=4 complete=False bleu=none" in proc.stdout
    assert "mtbench train: jax (diverged, partial)" in proc.stdout
    assert json.loads(out.read_text())["status"] == "diverged"


def test_compile_options_that_training_would_ignore_are_refused(plugin_path, cache_dir, tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli("train", "--backend", "jax", *TINY_TRAIN, "--steps", "2", "--cache-dir", cache_dir,
                   "--out", str(out), "--extra", "no-jit",
                   env={**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-thirdparty"})
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(
        "Error: extra 'no-jit' sets model.compile options {'jit_compile': False}, but the run trains with the "
        "'jax-jit-stateless' step, which does not run Keras's compiled train function, so they would change "
        "evaluation only; return a step built on mtbench.KerasTrainStep from make_train_step to train with them")
    assert not out.exists()


@pytest.mark.slow
def test_reporters_run_on_every_result_of_compare_and_report(plugin_path, cache_dir, tmp_path):
    env = {**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-thirdparty"}
    out, blocker = tmp_path / "c.json", tmp_path / "a-file"
    blocker.write_text("where the tracker wants a folder\n")
    # Each run's tracker fails (its folder cannot be made): the runs complete, the comparison goes on. Measured
    # only: the reporters read each run's result whatever it holds, and no evaluation is needed to make one.
    compare = run_cli("compare", "--matrix", "jax;torch", *TINY_TRAIN, *ONE_BUCKET, "--steps", "3", "--measure-only",
                      "--cache-dir", cache_dir, "--out", str(out), "--report", "oneline", "--report-to", "tensorboard",
                      "--logging-dir", str(blocker / "tb"), env=env)
    assert compare.returncode == 3, compare.stderr
    last = compare.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: 2 reporting failures: (1) run 'jax' failed: tracker 'tensorboard'")
    assert "; (2) run 'torch' failed: tracker 'tensorboard'" in last
    assert [run["label"] for run in json.loads(out.read_text())["runs"]] == ["jax", "torch"]
    assert "ONELINE backend=jax steps=3 complete=True" in compare.stdout
    assert "ONELINE backend=torch steps=3 complete=True" in compare.stdout
    assert "mtbench train:" not in compare.stdout  # the runs report nothing themselves: no table per run
    report = run_cli("report", str(out), "--format", "json", "--report", "oneline", env=env)
    assert report.returncode == 0, report.stderr
    assert set(json.loads(report.stdout)["speedups"]) == {"jax", "torch"}  # stdout stays parseable: reporters use stderr
    assert "ONELINE backend=jax steps=3 complete=True" in report.stderr
    assert "ONELINE backend=torch steps=3 complete=True" in report.stderr


def test_an_extras_crash_is_named_with_the_extra_and_its_plugin(plugin_path, cache_dir, tmp_path):
    proc = run_cli("train", "--backend", "jax", *TINY_TRAIN, "--steps", "2", "--cache-dir", cache_dir,
                   "--out", str(tmp_path / "r.json"), "--extra", "crash-before-model",
                   env={**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-thirdparty"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith(
        "Error: extra 'crash-before-model' of plugin 'thirdparty' failed: KeyError: 'mesh'")


def test_an_authors_mistakes_mark_the_plugin_broken_and_every_command_still_runs(careless_plugin_path):
    """A misspelled hook, the wrong kind registered, an extra without backends, names the command line cannot take,
    a built-in's name and a module loaded twice: each said in a line, the plugin listed as broken, and mtbench's
    own commands unharmed (their --extra help lists the extras, which once failed at import)."""
    env = {**env_with(careless_plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-careless,mtbench-careless-again"}
    version = run_cli("--version", env=env)
    assert version.returncode == 0 and "Traceback" not in version.stderr
    listing = plugins_json(env)
    careless, again = by_name(listing)["careless"], by_name(listing)["again"]
    assert careless["status"] == "broken"
    assert careless["provides"] == {"backends": ["careless-backend"], "extras": ["careless-fine", "careless-on-it"]}
    # A backend that cannot describe its devices is said in its extras' rows; the listing goes on.
    on_it = next(row for row in listing["extras"] if row["extra"] == "careless-on-it")
    assert on_it["available"] is False and on_it["reason"] == (
        "backend 'careless-backend' cannot describe its devices: NotImplementedError: backend 'careless-backend' "
        "(Deviceless) does not implement device_info, which every backend must")
    problems = "\n".join(careless["problems"])
    for said in ("implements mtbench_register_extra, which is no mtbench hook (did you mean "
                 "mtbench_register_extras?): never called",
                 "registers a Pairs, which is no Extra (mtbench.plugins.api.Extra) as extra; ignored",
                 "registers extra 'careless-nobackends' with backends None (a list of backend names)",
                 "registers extra 'careless-serves-none' with no backends (a list of the backend names it serves) as "
                 "extra; ignored",
                 "registers extra 'careless-noconflicts' with conflicts None (a list of extra names)",
                 "registers backend 'careless-nomodules' with framework_modules None (a list of module names)",
                 "registers the name 'careless:fast' (a name is letters, digits",
                 "registers extra 'torch-compile', already provided by 'torch_compile'; ignored",
                 "registers the name 'none', which the command line takes for no reporter as reporter; ignored"):
        assert said in problems, said
    assert again["status"] == "failed to load"
    assert again["problems"] == ["plugin 'again' was skipped: its module mtbench_careless is already loaded as "
                                 "plugin 'careless'"]
    environment = run_cli("env", env={**env, "COLUMNS": "400"})  # a row a line
    assert environment.returncode == 0
    rows = {line.split("│")[2].strip(): line.split("│")[3].strip() for line in environment.stdout.splitlines()
            if line.count("│") == 4 and line.split("│")[1].strip() == "plugin"}
    assert rows["again"] == ("version 1.0; failed to load: plugin 'again' was skipped: its module mtbench_careless "
                             "is already loaded as plugin 'careless'")
    assert rows["careless"].startswith("version 1.0; broken: plugin 'careless' implements mtbench_register_extra")
    train_help = run_cli("train", "--help", env=env)
    assert train_help.returncode == 0 and "careless-fine (jax)" in train_help.stdout
    # An unknown name does not blame the plugin for the built-in name it lost.
    unknown = run_cli("train", "--extra", "warp", "--preset", "tiny", env=env)
    error = [line for line in unknown.stderr.splitlines() if line.startswith("Error: ")]
    assert unknown.returncode == 2 and len(error) == 1 and "already provided by" not in error[0]
    assert len(unknown.stderr) < 3000  # pluggy's refusal of the module loaded twice ran to kilobytes, twice


@pytest.mark.slow
def test_a_plugin_that_imports_keras_as_it_loads_is_named_where_its_backend_refuses_the_run(plugin_path, tmp_path):
    """keras keeps the backend of its first import: a plugin that imports it at its module's top fixes the
    environment's (here jax) for a torch run, which then failed without naming the plugin."""
    env = {**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-eager-keras", "KERAS_BACKEND": "jax"}
    eager = by_name(plugins_json(env))["eagerkeras"]
    assert eager["status"] == "broken" and eager["problems"] == [
        "plugin 'eagerkeras' imports keras as its module loads, before mtbench chooses the backend (keras keeps the "
        "first it is given): import keras inside the plugin's methods"]
    proc = run_cli("train", "--backend", "torch", "--preset", "tiny", "--steps", "2", "--out", str(tmp_path / "r.json"),
                   env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "Error: keras was already imported with the jax backend in this process, by plugin 'eagerkeras' as it "
        "loaded: the plugin must import keras inside its methods")


UNMARKED = """
from mtbench import Extra


class Fast(Extra):
    name = "unmarked-fast"
    backends = ("jax",)


def mtbench_register_extras(register):  # no @hookimpl: pluggy skips it
    register(Fast())
"""

OTHER_ARGUMENTS = """
from mtbench import Reporter, hookimpl


class Quiet(Reporter):
    name = "other-arguments-quiet"

    def report(self, result, console, complete):
        pass


@hookimpl
def mtbench_register_extras(reg):  # the hookspec's argument is `register`
    pass


@hookimpl
def mtbench_register_reporters(register):
    register(Quiet())
"""


@pytest.fixture(scope="module")
def hook_mistakes_path(tmp_path_factory):
    """Installed plugins whose hook functions pluggy would skip without a word (no @hookimpl) or refuse with the
    whole module (an argument the hookspec does not have)."""
    site = tmp_path_factory.mktemp("hook-mistakes-site")
    for package, entry_point, source in (("mtbench_unmarked", "unmarked", UNMARKED),
                                         ("mtbench_other_arguments", "otherargs", OTHER_ARGUMENTS)):
        install_plugin_module(site, package, entry_point, source)
    return str(site)


def test_a_hook_function_pluggy_would_skip_or_refuse_is_said_in_a_line_and_marks_the_plugin_broken(
        hook_mistakes_path):
    env = {**env_with(hook_mistakes_path), "MTBENCH_LOAD_PLUGINS": "mtbench-unmarked,mtbench-other-arguments"}
    plugins = by_name(plugins_json(env))
    unmarked, other_arguments = plugins["unmarked"], plugins["otherargs"]
    assert (unmarked["status"], unmarked["hooks"], unmarked["provides"]) == ("broken", [], {})
    assert unmarked["problems"] == ["plugin 'unmarked': mtbench_register_extras is not marked @hookimpl, so pluggy "
                                    "ignores it (decorate it with mtbench.hookimpl)"]
    # pluggy refused the whole module, in a message of several lines: its other hooks still count.
    assert other_arguments["status"] == "broken"
    assert other_arguments["problems"] == [
        "plugin 'otherargs': hook mtbench_register_extras(reg) takes arguments the hook does not have (reg); its "
        "arguments are (register): never called"]
    assert other_arguments["hooks"] == ["mtbench_register_reporters"]
    assert other_arguments["provides"] == {"reporters": ["other-arguments-quiet"]}
    # An extra the unmarked hook would have registered is unknown, and the error names the plugin.
    proc = run_cli("train", "--extra", "unmarked-fast", "--preset", "tiny", env=env)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(errors) == 1
    assert errors[0].startswith("Error: unknown extra 'unmarked-fast'")
    assert "plugin 'unmarked': mtbench_register_extras is not marked @hookimpl" in errors[0]


def test_a_plugin_whose_keras_import_fails_as_it_loads_is_broken_for_that_and_nothing_else(plugin_path, tmp_path):
    """Without KERAS_BACKEND keras imports TensorFlow, missing here: that failure is the keras import's, which the
    keras warning already tells the author to move, not the plugin's failing to load for want of TensorFlow."""
    without_tensorflow = tmp_path / "without-tensorflow"
    without_tensorflow.mkdir()
    (without_tensorflow / "tensorflow.py").write_text("raise ModuleNotFoundError(\"No module named 'tensorflow'\")\n")
    env = {"PYTHONPATH": python_path(without_tensorflow, plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-eager-keras",
           "KERAS_BACKEND": None, "KERAS_HOME": str(tmp_path / "keras")}  # keras's own default: TensorFlow
    listing = plugins_json(env)
    eager = by_name(listing)["eagerkeras"]
    expected = ("plugin 'eagerkeras' imports keras as its module loads, before mtbench chooses the backend (keras "
                "keeps the first it is given): import keras inside the plugin's methods")
    assert eager["status"] == "broken" and eager["problems"] == [expected]
    assert [warning for warning in listing["warnings"] if "eagerkeras" in warning] == [expected]


def test_a_reporter_or_dataset_without_its_required_method_is_refused_at_registration():
    """They loaded as fine and failed at use with `NotImplementedError: `, naming no method."""
    from mtbench import Dataset, Reporter
    from mtbench.plugins.manager import registration_refusal

    class NoReport(Reporter):
        name = "no-report"

    class OldReport(Reporter):  # plugin API 1.0's form: still a report
        name = "old-report"

        def report(self, result, console):
            pass

    class NoRead(Dataset):
        name = "no-read"

    assert registration_refusal("reporters", NoReport()) == ("reporter 'no-report' without report (required of "
                                                             "every reporter)")
    assert registration_refusal("datasets", NoRead()) == "dataset 'no-read' without read_pairs (required of every " \
                                                         "dataset)"
    assert registration_refusal("reporters", OldReport()) is None
    with pytest.raises(NotImplementedError, match="^reporter 'no-report' \\(NoReport\\) does not implement report"):
        NoReport().report({}, None, True)
    with pytest.raises(NotImplementedError, match="^dataset 'no-read' \\(NoRead\\) does not implement read_pairs"):
        NoRead().read_pairs(None)


def test_a_backend_without_its_required_methods_is_refused_naming_its_plugin_and_the_methods(careless_plugin_path,
                                                                                               tmp_path):
    """A backend may be registered where it cannot run (named, not refused, at registration); a run on one without
    `device_info` and `synchronize` failed once keras was imported, with a bare `NotImplementedError: `."""
    env = {**env_with(careless_plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-careless"}
    out = tmp_path / "r.json"
    proc = run_cli("train", "--backend", "careless-backend", *TINY_TRAIN, "--steps", "2", "--out", str(out), env=env)
    # The plugin's other mistakes are warned about first, a line each.
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "Error: backend 'careless-backend' of plugin 'careless' does not implement device_info and synchronize, which "
        "every backend must (docs/plugins.md, \"Backend\")")
    assert not out.exists()
