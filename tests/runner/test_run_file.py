"""`train --run-file`: the file is the run's whole configuration; beside it only how the run is reported and
launched, and --overwrite, the one way out of a result that already exists."""

import json

import pytest

from conftest import assert_refused_in_one_line, run_cli
from mtbench.runner.config import TrainConfig
from mtbench.runner.run_file import write_run_file


@pytest.mark.slow
def test_a_run_file_whose_result_exists_is_refused_until_overwrite_is_given(tmp_path, cache_dir):
    out = tmp_path / "run.json"
    out.write_text('{"earlier": true}')
    earlier = {"best/model.npz": "its best weights", "checkpoint-000007/state.json": "{}", "run.json": "{}",
               "tokenizer/vocab.json": "{}", "tensorboard/events": "its logs"}
    for name, text in earlier.items():
        (tmp_path / "run.run" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "run.run" / name).write_text(text)
    run_file = tmp_path / "run.train.json"
    write_run_file(str(run_file), TrainConfig(backend="jax", model_name="gpt", preset="tiny", block_size=16,
                                              batch_size=2, steps=2, dtype="float32", measure_only=True,
                                              cache_dir=cache_dir, out=str(out)))
    refused = run_cli("train", "--run-file", str(run_file))
    assert_refused_in_one_line(refused, "run.json: already exists; pass --overwrite to replace it")
    assert json.loads(out.read_text()) == {"earlier": True}
    assert all((tmp_path / "run.run" / name).read_text() == text for name, text in earlier.items())
    sidecars = [tmp_path / "run.hyp.txt", tmp_path / "run.ref.txt"]  # an earlier translation's sentences
    for sidecar in sidecars:
        sidecar.write_text("its sentences\n")
    assert_refused_in_one_line(run_cli("train", "--run-file", str(run_file)), "run.json: already exists; pass")
    assert all(sidecar.read_text() == "its sentences\n" for sidecar in sidecars)
    assert_refused_in_one_line(run_cli("train", "--run-file", str(run_file), "--steps", "3"),
                               "--run-file holds the run's whole configuration; drop --steps")
    # A run file written by a command given --overwrite (rerun's, compare's) records it: not this command's say.
    given = tmp_path / "given.train.json"
    given.write_text(json.dumps({**json.loads(run_file.read_text()),
                                 "config": {**json.loads(run_file.read_text())["config"], "overwrite": True}}))
    assert_refused_in_one_line(run_cli("train", "--run-file", str(given)), "run.json: already exists; pass")
    assert json.loads(out.read_text()) == {"earlier": True}
    diverged = run_cli("train", "--run-file", str(run_file), "--overwrite", "--report", "none",
                       env={"MTBENCH_TEST_NAN_AT_STEP": "1"})
    assert diverged.returncode == 1
    # A run that fails after it started has replaced the earlier one's result and folder, not mixed with them.
    assert json.loads(out.read_text())["status"] == "diverged"
    assert not any((tmp_path / "run.run" / name).exists() and (tmp_path / "run.run" / name).read_text() == text
                   for name, text in earlier.items())
    assert not any(sidecar.exists() for sidecar in sidecars)  # no earlier sentences pass for this run's
    replaced = run_cli("train", "--run-file", str(run_file), "--overwrite", "--report", "none")
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "completed" and len(result["history"]) == 2 and result["config"]["overwrite"]
    # Nothing the earlier run kept passes for this one's (a measure-only run keeps nothing of its own).
    assert list((tmp_path / "run.run").iterdir()) == []
