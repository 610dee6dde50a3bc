"""A plugin's failure keeps its name and loses nothing written: a train step that is no TrainStep, a train step
that raises, a reporter that fails on a partial result."""

import json

from conftest import ONE_BUCKET, TINY_TRAIN, env_with, run_cli

MISFITS = {"MTBENCH_LOAD_PLUGINS": "mtbench-misfits"}


def train(plugin_path, cache_dir, out, *arguments, env=None):
    return run_cli("train", *TINY_TRAIN, *ONE_BUCKET, "--steps", "6", "--cache-dir", cache_dir, "--out", str(out),
                   *arguments, env={**env_with(plugin_path), **MISFITS, **(env or {})})


def last_line(proc):
    assert "Traceback" not in proc.stderr
    return proc.stderr.strip().splitlines()[-1]


def test_a_train_step_that_is_no_train_step_is_named_with_its_extra(plugin_path, cache_dir, tmp_path):
    proc = train(plugin_path, cache_dir, tmp_path / "r.json", "--extra", "not-a-step")
    assert proc.returncode == 1
    assert last_line(proc) == ("Error: extra 'not-a-step' of plugin 'misfits' failed: TypeError: make_train_step "
                               "returned a NotAStep, not a mtbench.TrainStep (subclass it, or mtbench.WrappingStep to "
                               "wrap the step it was given)")


def test_a_step_made_around_the_model_is_named_with_its_extra(plugin_path, cache_dir, tmp_path):
    """make_train_step(run, step), `model` left out: called as plugin API 1.0's (run, model), it wrapped the model,
    and the run failed later in mtbench's own code with an AttributeError that named no plugin."""
    proc = train(plugin_path, cache_dir, tmp_path / "r.json", "--extra", "step-for-model")
    assert proc.returncode == 1
    assert last_line(proc) == ("Error: extra 'step-for-model' of plugin 'misfits' failed: TypeError: "
                               "make_train_step returned a step wrapping a Transformer, not the train step it was "
                               "given: mtbench calls make_train_step(run, model, step)")
    assert not (tmp_path / "r.json").exists()


def test_a_train_step_that_raises_names_its_extra_and_step(plugin_path, cache_dir, tmp_path):
    proc = train(plugin_path, cache_dir, tmp_path / "r.json", "--extra", "raising-step")
    assert proc.returncode == 1
    line = last_line(proc)
    assert "extra 'raising-step' of plugin 'misfits' failed at step 3: RuntimeError: the step broke" in line


def test_a_reporter_failing_on_a_partial_result_is_named_beside_the_stop(plugin_path, cache_dir, tmp_path):
    out = tmp_path / "r.json"
    proc = train(plugin_path, cache_dir, out, "--report", "partial-fails", env={"MTBENCH_TEST_NAN_AT_STEP": "3"})
    assert proc.returncode == 1
    line = last_line(proc)
    assert line.startswith("Error: training diverged") and f"partial result in {out}" in line
    assert "reporter 'partial-fails' of plugin 'misfits' failed: ValueError: cannot read a partial result" in line
    assert json.loads(out.read_text())["status"] == "diverged"
