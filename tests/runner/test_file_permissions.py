"""Everything mtbench writes is readable as the umask says, like any other file of the user's: results,
hypotheses and references, weights files, logs, checkpoints and the saved model, not tempfile's private 0600 and
0700 (colleagues and CI jobs running as another user must read them)."""

import os
import stat
import subprocess
import sys

import pytest

from conftest import ONE_BUCKET, TINY_TRAIN, cli_environment
from mtbench.runner.files import current_umask, make_temporary_folder, write_json_atomic


@pytest.fixture
def umask():
    """Sets the process's umask for a test and puts the old one back."""
    previous = os.umask(0o022)
    os.umask(previous)

    def set_to(mask):
        os.umask(mask)
    yield set_to
    os.umask(previous)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def every_path(top):
    yield top
    for folder, folders, files in os.walk(top):
        for name in folders + files:
            yield os.path.join(folder, name)


def assert_as_the_umask_says(paths, mask):
    expected = {True: 0o777 & ~mask, False: 0o666 & ~mask}
    wrong = {path: oct(mode(path)) for path in paths if mode(path) != expected[os.path.isdir(path)]}
    assert wrong == {}, f"not {oct(expected[False])} (files) and {oct(expected[True])} (folders) under umask {mask:03o}"


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_atomic_writes_and_temporary_folders_follow_the_umask(tmp_path, umask, mask):
    umask(mask)
    assert current_umask() == mask
    path = tmp_path / "result.json"
    write_json_atomic(str(path), {"a": 1})
    folder = make_temporary_folder(".tmp-checkpoint-", str(tmp_path))
    assert_as_the_umask_says([str(path), folder], mask)
    write_json_atomic(str(path), {"a": 2})  # a replaced file too
    assert mode(path) == 0o666 & ~mask


def test_a_comparisons_files_follow_the_umask(compared):
    mask = current_umask()
    combined = compared["combined"]
    paths = [compared["path"], combined["initial_weights"]["file"]]
    for run in combined["runs"]:
        paths += [run["result_file"], run["log_file"], run["result"]["hypotheses_file"],
                  run["result"]["references_file"], *every_path(run["result"]["model"]["saved"])]
    assert_as_the_umask_says(paths, mask)


@pytest.mark.slow
def test_a_runs_result_checkpoints_and_model_follow_the_umask(tmp_path, cache_dir):
    out = tmp_path / "jax.json"
    proc = subprocess.run([sys.executable, "-m", "mtbench", "train", "--backend", "jax", *TINY_TRAIN, *ONE_BUCKET,
                           "--checkpoint-every", "30", "--report", "none", "--cache-dir", cache_dir, "--out", str(out)],
                          capture_output=True, text=True, env=cli_environment(), umask=0o002, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "jax.run"
    assert sorted(name for name in os.listdir(run_dir) if name.startswith("checkpoint-")) == \
        ["checkpoint-000030", "checkpoint-000060"]
    assert_as_the_umask_says([str(out), str(tmp_path / "jax.hyp.txt"), str(tmp_path / "jax.ref.txt"),
                              *every_path(str(run_dir))], 0o002)
