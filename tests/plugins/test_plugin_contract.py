"""The plugin API as a contract: the guide (docs/plugins.md) documents every method mtbench calls and every name
`mtbench` exports; the API has a version; a method in an older documented form is called with the arguments it
takes and named once in a deprecation warning; what a plugin leaves out has a default that says so in the result
(MFU, attention, the run's name) instead of borrowing the built-in Transformer's."""

import inspect
import math
import os
import re
from types import SimpleNamespace

import numpy as np
import pytest

import mtbench
from mtbench import figures
from conftest import REPOSITORY
from mtbench import (Backend, Batch, Dataset, Extra, KerasTrainStep, Launch, ModelFamily, ProcessGroup, Reporter,
                     Tokenizer, TrainStep)
from mtbench.plugins.api.versioning import next_major
from mtbench.plugins.compat import GROWN, REPLACED, older_forms
from mtbench.plugins.manager import Registry

with open(os.path.join(REPOSITORY, "docs", "plugins.md"), encoding="utf-8") as _guide:
    GUIDE = _guide.read()

DOCUMENTED_CLASSES = (Backend, Extra, Dataset, Reporter, ModelFamily, Tokenizer, TrainStep, ProcessGroup)


def public_members(cls):
    """(methods, attributes) a plugin author overrides or reads: the class's own, not inherited, not private."""
    own = {name: value for name, value in vars(cls).items() if not name.startswith("_")}
    methods = sorted(name for name, value in own.items() if inspect.isfunction(value))
    attributes = sorted(name for name, value in own.items() if not inspect.isfunction(value))
    return methods, attributes


@pytest.mark.parametrize("cls", DOCUMENTED_CLASSES, ids=lambda cls: cls.__name__)
def test_the_guide_documents_every_method_and_attribute(cls):
    methods, attributes = public_members(cls)
    named = lambda name: re.search(rf"[`.]{name}\(", GUIDE) or f"`{name}`" in GUIDE
    missing = [f"{name}(" for name in methods if not re.search(rf"[`.]{name}\(", GUIDE)]
    missing += [name for name in attributes if not named(name)]
    assert missing == [], f"docs/plugins.md does not document {cls.__name__}: {', '.join(missing)}"


def test_the_guide_documents_every_field_of_the_run_context():
    """RunContext is a dataclass: its fields with factories or without defaults are no class attributes, so the
    check above would miss them; each must be named in its own section."""
    import dataclasses

    from mtbench import RunContext
    section = GUIDE[GUIDE.index("### `RunContext`"):]
    section = section[:section.index("\n### ", 1)]
    names = [item.name for item in dataclasses.fields(RunContext)]
    names += [name for name, value in vars(RunContext).items() if isinstance(value, property)]
    assert [name for name in names if f"`{name}`" not in section] == []


def test_the_guide_lists_every_export():
    missing = [name for name in mtbench.__all__ if f"`{name}`" not in GUIDE and f"`{name}(" not in GUIDE]
    assert missing == [], f"docs/plugins.md does not list these exports of mtbench: {', '.join(missing)}"


def test_the_api_has_a_version_and_a_compatibility_section():
    assert re.fullmatch(r"\d+\.\d+", mtbench.PLUGIN_API_VERSION)
    assert "PLUGIN_API_VERSION" in mtbench.__all__
    assert next_major("1.4") == "2.0"
    assert "## Compatibility" in GUIDE and f"PLUGIN_API_VERSION` is `\"{mtbench.PLUGIN_API_VERSION}\"`" in GUIDE


class OldReporter(Reporter):
    name = "old"

    def report(self, result, console):
        return ("old", result, console)


class CurrentReporter(Reporter):
    name = "current"

    def report(self, result, console, complete):
        return ("current", result, console, complete)


class AnyReporter(Reporter):
    name = "any"

    def report(self, *arguments):
        return arguments


def registry_of(*items):
    registry = Registry()
    for item in items:
        registry.provider[("reporters", item.name)] = "someone"
    return registry


def test_an_older_form_gets_the_arguments_it_takes_and_one_warning():
    registry = registry_of(OldReporter())
    old = OldReporter()
    assert registry.call("reporters", old, "report", "R", "C", True) == ("old", "R", "C")
    assert registry.call("reporters", old, "report", "R2", "C2", False) == ("old", "R2", "C2")
    [warning] = registry.warnings
    # Named with the version that deprecated it, which later versions do not move.
    assert warning.startswith("plugin 'someone': reporter 'old' implements report(result, console), deprecated in "
                              "plugin API 1.0: mtbench calls report(result, console, complete)")
    assert "until plugin API 2.0" in warning
    assert registry.problems == []  # a deprecation is no failure: the plugin stays "loaded"


def test_current_forms_and_star_args_get_every_argument_without_a_warning():
    registry = registry_of(CurrentReporter(), AnyReporter())
    assert registry.call("reporters", CurrentReporter(), "report", 1, 2, True) == ("current", 1, 2, True)
    assert registry.call("reporters", AnyReporter(), "report", 1, 2, True) == (1, 2, True)
    assert registry.warnings == []


def test_the_methods_that_grew_are_listed_as_older_forms():
    class OldExtra(Extra):
        name = "old-extra"

        def make_train_step(self, run, model):
            return None

    assert older_forms(OldReporter(), "reporters") == [
        ("report", "report(result, console)", "report(result, console, complete)")]
    assert older_forms(OldExtra(), "extras") == [
        ("make_train_step", "make_train_step(run, model)", "make_train_step(run, model, step)")]
    assert older_forms(CurrentReporter(), "reporters") == older_forms(Extra(), "extras") == []
    for kind, methods in GROWN.items():
        for method in methods:
            assert f"`{method}(" in GUIDE


def test_an_extra_that_still_changes_the_configuration_in_place_is_called_and_named_deprecated_once():
    """`Extra.adjust_config(run)` (deprecated in 1.2 for `config_changes`) still changes the run's configuration, on
    a copy, and is named once in a deprecation warning and among `mtbench plugins`' older forms."""
    from mtbench.plugins.api import RunContext
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import RunPlugins, configuration_changes

    class InPlace(Extra):
        name = "in-place"

        def adjust_config(self, run):
            run.config.batch_size = 8

    registry = Registry()
    registry.provider[("extras", "in-place")] = "someone"
    given = TrainConfig(steps=5)
    run = RunContext(config=given, backend=None, device={"count": 1})
    plugins = RunPlugins(None, [InPlace()], [], registry)
    assert [configuration_changes(run, plugins)[0].batch_size for _ in range(2)] == [8, 8] and given.batch_size != 8
    [warning] = registry.warnings
    assert warning.startswith("plugin 'someone': extra 'in-place' implements adjust_config(run), deprecated in "
                              "plugin API 1.2: mtbench calls config_changes(run)")
    assert older_forms(InPlace(), "extras") == [("adjust_config", "adjust_config(run)", "config_changes(run)")]
    for kind, methods in REPLACED.items():
        for method in methods:
            assert f"`Extra.{method}(" in GUIDE


def test_a_model_family_without_the_later_methods_has_defaults_that_say_so():
    class Minimal(ModelFamily):
        name = "minimal"

    family = Minimal()
    assert family.shape(None, None) is None
    assert family.training_flops(None, 8, 16, 16) is None
    assert family.attention_kinds == ()
    with pytest.raises(NotImplementedError, match=r"model family 'minimal' \(Minimal\) does not implement build"):
        family.build(None, None, None, 32)
    with pytest.raises(NotImplementedError, match="does not implement load_saved"):
        family.load_saved("dir", {})


def test_the_built_in_families_count_the_transformers_flops_and_name_their_attention():
    from mtbench.keras_models.presets import PRESETS
    from mtbench.plugins.models.marian import MarianFamily
    from mtbench.plugins.models.transformer import TransformerFamily
    for family in (TransformerFamily(), MarianFamily()):
        # 3 x the forward pass counted by hand in tests/runner/measurement/test_flops_and_compilation.py
        assert family.training_flops(PRESETS["tiny"], 2, 16, 16) == 3 * 9_732_096
        assert family.attention_kinds == ("causal", "masked", "decoding")


def test_utilization_without_the_familys_flops_is_na_with_the_reason(monkeypatch):
    from mtbench.runner.results import run_result
    monkeypatch.setattr(run_result, "device_peak_record", lambda *args, **kwargs: {
        "flops_per_s": 1e12, "source": "datasheet", "measured_at": None, "load_average": None})
    run = SimpleNamespace(device_kind="gpu", device={"kind": "gpu", "name": "some gpu"},
                          processes=ProcessGroup(Launch()))
    config = SimpleNamespace(dtype="float32", cache_dir=None, matmul_precision="highest")
    family = SimpleNamespace(name="bow")
    counted = run_result.utilization({"flops_per_s": 5e11, "real_token_flops_per_s": 4e11, "steady_steps": 3}, None,
                                     run, 1, config, (), family)
    assert counted["mfu"] == 0.5 and counted["mfu_real_tokens"] == 0.4 and counted["mfu_reason"] is None
    uncounted = run_result.utilization({"flops_per_s": None, "real_token_flops_per_s": None, "steady_steps": 3},
                                       None, run, 1, config, (), family)
    assert uncounted["mfu"] is None and uncounted["model_flops_per_s"] is None
    assert uncounted["mfu_reason"] == "model family 'bow' counts no training FLOPs (ModelFamily.training_flops)"


def test_a_step_without_flops_leaves_the_steady_flops_uncounted():
    from mtbench.runner.loop.timing import StepTimer
    timer = StepTimer()
    for step in range(1, 4):
        timer.add(step, (8, 16), 0.1, 100, flops=None)
    assert timer.summary()["flops_per_s"] is None and timer.summary()["tokens_per_s"] == pytest.approx(1000)


def test_only_the_attention_a_family_names_is_recorded():
    from mtbench.runner.results.run_result import attention_implementations
    run = SimpleNamespace(attention={"causal": "xla", "masked": "xla", "decoding": "xla"})
    model = SimpleNamespace(_flatten_layers=lambda: [])  # no mtbench attention layer: no arithmetic recorded
    assert attention_implementations(run, SimpleNamespace(attention_kinds=()), model) == {}
    assert attention_implementations(run, SimpleNamespace(attention_kinds=("causal", "masked", "decoding")),
                                     model) == run.attention
    assert figures.attention_text({"model": {"attention": {}}}).startswith("none named")
    assert figures.attention_text({"model": {}}) == "not recorded"  # a result from before it was recorded


def test_a_run_of_another_model_family_is_named_with_it():
    from mtbench.runner.orchestration.runs import plan_runs
    transformer = {"model_name": "transformer", "d_model": 128}
    assert figures.run_name("jax", [], transformer) == "jax:d-model=128"
    assert figures.run_name("jax", ["pmap"], {}) == "jax+pmap"  # results from before --model
    assert figures.run_name("jax", [], {"model_name": "marian:/models/opus-en-fr"}, 2) == "jax@2:model=marian"
    assert figures.run_name("torch", [], {"model_name": "bow", "layers": 2}) == "torch:model=bow,layers=2"
    specs = plan_runs("jax,torch", model="marian:/models/opus-en-fr")
    assert [spec.label for spec in specs] == ["jax:model=marian", "torch:model=marian"]
    assert [spec.label for spec in plan_runs(matrix="jax:d-model=128")] == ["jax:d-model=128"]
    result = {"backend": "jax", "extras": [], "config": {"model_name": "marian:/models/opus-en-fr"}}
    assert figures.run_label(result) == specs[0].label  # --baseline and --matrix name the run as its result does


def plugins_with(*extras):
    registry = Registry()
    for extra in extras:
        registry.provider[("extras", extra.name)] = "someone"
    return SimpleNamespace(extras=list(extras), registry=registry)


def test_an_extras_failing_record_is_kept_in_place_of_its_record():
    from mtbench.runner.results.run_result import RECORD_FAILED, extras_records, record_failures

    class Raises(Extra):
        name = "raises"

        def record(self, run):
            raise KeyError("k")

    class NotADict(Extra):
        name = "list"

        def record(self, run):
            return [1]

    class NotJson(Extra):
        name = "object"

        def record(self, run):
            return {"step": object()}

    class NotFinite(Extra):
        name = "nan"

        def record(self, run):
            return {"loss": float("nan")}

    run = SimpleNamespace(extras_state={"fine": {"devices": 2}})
    fine = Extra()
    fine.name = "fine"
    records = extras_records(run, plugins_with(fine, Raises(), NotADict(), NotJson(), NotFinite()))
    assert records["fine"] == {"devices": 2}
    assert records["raises"] == {RECORD_FAILED: "extra 'raises' of plugin 'someone' failed in record: KeyError: 'k'"}
    assert records["list"][RECORD_FAILED].endswith("TypeError: it returned list, not a dict")
    assert "is not JSON serializable" in records["object"][RECORD_FAILED]
    # Written as it was, the result file held a bare NaN, which no JSON reader takes.
    assert records["nan"][RECORD_FAILED].startswith("extra 'nan' of plugin 'someone' failed in record: ValueError: ")
    assert "(a record says a non-finite number as null)" in records["nan"][RECORD_FAILED]
    lines = record_failures({"extras_record": records}, "r.json")
    assert len(lines) == 4 and lines[0].endswith("; the result is in r.json, with this failure as "
                                                 "extras_record['raises']")


def test_an_extra_whose_compile_options_every_run_would_refuse_is_not_available():
    from mtbench.runner.measurement.availability import ignored_compile_options_reason

    class AsksOptions(Extra):
        name = "asks"

        def compile_options(self, run):
            return {"jit_compile": False}

    class BringsItsStep(AsksOptions):
        def make_train_step(self, run, model, step):
            return KerasTrainStep(model)

    class OwnStep(Backend):
        name = "fast"

        def make_train_step(self, run, model):
            return None

    plain = Backend()
    plain.name = "plain"
    assert ignored_compile_options_reason(AsksOptions(), OwnStep()).startswith(
        "sets model.compile options and brings no train step, but backend 'fast' trains with a step of its own")
    assert ignored_compile_options_reason(AsksOptions(), plain) is None  # Keras's own step runs them
    assert ignored_compile_options_reason(BringsItsStep(), OwnStep()) is None
    assert ignored_compile_options_reason(Extra(), OwnStep()) is None


def test_the_divergence_test_hook_touches_only_the_batch():
    from mtbench.runner.loop.faults import poisoned
    ids = np.ones((2, 4), np.int32)
    batch = Batch(ids, ids, ids, np.ones((2, 4), np.float32), np.arange(2))
    bad = poisoned(batch)
    assert np.isnan(bad.weight).all() and bad.weight.dtype == np.float32
    assert bad.source is batch.source and not np.isnan(batch.weight).any()
    assert math.isnan(float((bad.weight * 1.0).sum()))


def test_a_method_taking_fewer_arguments_than_any_form_of_the_api_is_the_plugins_failure_not_an_older_form():
    """`verify(self, run)` was called with `run` alone and warned of as 'deprecated in plugin API 1.30' (the current
    version), a form that never was: only the methods that grew an argument (`compat.GROWN`) have older forms."""
    from mtbench.errors import RunFailure

    class Checking(Extra):
        name = "checking"

        def verify(self, run):
            return None

    registry = Registry()
    registry.provider[("extras", "checking")] = "someone"
    with pytest.raises(RunFailure) as refused:
        registry.call("extras", Checking(), "verify", "run", "model", "batch")
    assert str(refused.value) == ("extra 'checking' of plugin 'someone' failed: TypeError: it implements verify(run), "
                                  "and mtbench calls verify with 3 arguments (docs/plugins.md)")
    assert registry.warnings == []
