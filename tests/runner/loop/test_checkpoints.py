"""Checkpoints on the functions that write and read them: a round trip, the last K kept, and a full disk that
leaves the earlier checkpoints intact."""

import errno
import json
import os
import re

import numpy as np
import pytest

from mtbench.errors import MtbenchError, RunFailure
from mtbench import Launch, ProcessGroup
from mtbench.plugins.backends.jax_backend import JaxBackend
from mtbench.plugins.backends.torch_backend import TorchBackend
from mtbench.runner.loop.checkpoints import RunDirectory, TrainingState, restore, restore_generator_state
from mtbench.runner.saved_model import find_model, model_files


def small_model(seed):
    import keras
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dropout(0.5),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.AdamW(1e-2), loss="mse")
    return model


def train(model, steps):
    rng = np.random.default_rng(0)
    for _ in range(steps):
        model.train_on_batch(rng.normal(size=(8, 4)), rng.normal(size=(8, 2)))


def save(run_dir, model, step, keep=2):
    return run_dir.save(model, TrainingState(step=step, history=[{"step": step}]), {"preset": "tiny"}, "spm.model",
                        keep)


def test_checkpoint_round_trip_restores_weights_optimizer_and_random_state(tmp_path):
    trained = small_model(seed=1)
    train(trained, 3)
    checkpoint = save(RunDirectory(str(tmp_path / "r.run"), fresh=True), trained, step=3)
    fresh = small_model(seed=2)
    state = restore(checkpoint, fresh)
    assert state == TrainingState(step=3, history=[{"step": 3}])
    assert int(fresh.optimizer.iterations.numpy()) == 3
    for restored, original in zip(fresh.variables + fresh.optimizer.variables,
                                  trained.variables + trained.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(restored.value), np.asarray(original.value))
    train(trained, 2)
    train(fresh, 2)
    np.testing.assert_array_equal(fresh.get_weights()[0], trained.get_weights()[0])


def test_the_runs_tokenizer_is_kept_beside_its_checkpoints_and_read_back_with_one(tmp_path):
    """A character tokenizer is made from the run's text, not kept in a cache: beside the checkpoints, a checkpoint
    of an interrupted language model generates with it. A fresh run's replaces an earlier run's."""
    import json
    from mtbench.plugins.manager import registry
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.data.text import CharTokenizer
    from mtbench.runner.setup import choose_plugins
    model, run_dir = small_model(seed=1), RunDirectory(str(tmp_path / "r.run"), fresh=True)
    config = {"model_name": "gpt", "preset": "tiny", "out": str(tmp_path / "r.json")}
    checkpoint = run_dir.save(model, TrainingState(step=1, history=[]), config, "chars", 2, CharTokenizer("abc d"))
    with open(os.path.join(run_dir.path, "run.json")) as f:
        assert json.load(f)["tokenizer"]["vocab_size"] == 6  # five characters and <unk>
    plugins = choose_plugins(TrainConfig(model_name="gpt", preset="tiny"), registry())
    source = find_model(checkpoint)
    assert source.is_checkpoint
    _, tokenizer = model_files(source, plugins)
    assert tokenizer.decode_text(tokenizer.encode_text("a dab")) == "a dab" and tokenizer.vocab_size == 6
    again = RunDirectory(run_dir.path, fresh=True)
    again.save(model, TrainingState(step=1, history=[]), config, "chars", 2, CharTokenizer("xyz"))
    _, tokenizer = model_files(find_model(checkpoint), plugins)
    assert tokenizer.decode_text(tokenizer.encode_text("zyx")) == "zyx" and tokenizer.vocab_size == 4


def test_only_the_last_checkpoints_are_kept_and_a_new_run_replaces_them(tmp_path):
    model = small_model(seed=1)
    run_dir = RunDirectory(str(tmp_path / "r.run"), fresh=True)
    for step in (1, 2, 3, 4):
        save(run_dir, model, step)
    assert [step for step, _ in run_dir.checkpoints()] == [3, 4]
    # on disk, not only in the listing (which passes over a checkpoint without its state file)
    on_disk = lambda: sorted(name for name in os.listdir(run_dir.path) if name.startswith("checkpoint"))
    assert [int(name.rsplit("-", 1)[1]) for name in on_disk()] == [3, 4]
    again = RunDirectory(run_dir.path, fresh=True)
    save(again, model, 1)
    assert [step for step, _ in again.checkpoints()] == [1]
    assert [int(name.rsplit("-", 1)[1]) for name in on_disk()] == [1]


def test_each_process_draws_on_from_its_own_generator_state_kept_in_the_checkpoint(tmp_path):
    """torch's dropout draws from torch's generator, not from the model's variables: a checkpoint keeps each
    process's state, and a resumed process draws what it would have drawn next."""
    import torch
    backend, model = TorchBackend(), small_model(seed=1)
    train(model, 1)
    torch.manual_seed(4)
    first = backend.random_generator_state()
    torch.manual_seed(5)
    torch.rand(7)
    second = backend.random_generator_state()
    next_draws = torch.rand(16)
    checkpoint = RunDirectory(str(tmp_path / "r.run"), fresh=True).save(
        model, TrainingState(step=1), {"preset": "tiny"}, "spm.model", 2, generator_states=[first, second])
    torch.manual_seed(99)
    second_process = ProcessGroup(Launch(process_id=1, num_processes=2))
    assert restore_generator_state(checkpoint, backend, second_process) is None
    assert torch.equal(torch.rand(16), next_draws)
    # JAX's dropout draws from the seed states the checkpoint keeps with the weights: nothing else to restore.
    assert restore_generator_state(checkpoint, JaxBackend(), second_process) is None

    three = ProcessGroup(Launch(process_id=1, num_processes=3))
    assert restore_generator_state(checkpoint, backend, three) == ("the checkpoint holds 2 processes' states, this "
                                                                   "run has 3 processes")
    elsewhere = RunDirectory(str(tmp_path / "gpu.run"), fresh=True).save(
        model, TrainingState(step=1), {"preset": "tiny"}, "spm.model", 2, generator_states=[np.zeros(16, np.uint8)])
    assert restore_generator_state(elsewhere, backend, ProcessGroup(Launch())) == (
        f"the checkpoint's state is 16 bytes, this process's generators' {first.size} (written on another kind of "
        f"device)")
    earlier = save(RunDirectory(str(tmp_path / "earlier.run"), fresh=True), model, step=1)
    assert restore_generator_state(earlier, backend, ProcessGroup(Launch())) == ("the checkpoint holds none "
                                                                                 "(written by an earlier mtbench)")


def test_a_checkpoint_that_does_not_fit_the_model_is_refused(tmp_path):
    untrained = small_model(seed=1)  # its optimizer has no slots yet: the saved state cannot fill a built one
    checkpoint = save(RunDirectory(str(tmp_path / "r.run"), fresh=True), untrained, step=1)
    with pytest.raises(RunFailure, match=r"checkpoint-000001: does not fit this model: Skipping variable loading "
                                         r"for optimizer"):
        restore(checkpoint, small_model(seed=1))


@pytest.mark.parametrize("damaged, reason", [("model.weights.h5", "file signature not found"),
                                              ("random_state.npz", "")])
def test_a_damaged_checkpoint_is_refused_in_one_line_naming_its_file(tmp_path, damaged, reason):
    """A checkpoint file emptied (a disk that filled, a copy cut short): `--resume` says which, not h5py's error."""
    model = small_model(seed=1)
    train(model, 1)
    checkpoint = save(RunDirectory(str(tmp_path / "r.run"), fresh=True), model, step=1)
    assert damaged in os.listdir(checkpoint)
    open(os.path.join(checkpoint, damaged), "w").close()
    with pytest.raises(MtbenchError, match=rf"checkpoint-000001: its {damaged} cannot be read \(.*{reason}.*\); "
                                           r"the checkpoint is damaged$"):
        restore(checkpoint, small_model(seed=1))


@pytest.mark.parametrize("state, problem", [
    ({}, "holds no step"), ([], "holds list, not the training state's fields"),
    ({"step": 2}, "says step 2, in the checkpoint of step 1"),
    ({"step": 1, "history": {}}, "a field of the wrong kind: history"),
    ({"step": True}, "a field of the wrong kind: step"),
    ({"step": 1, "learning_rate": 1}, "has fields no checkpoint has: learning_rate"),
])
def test_a_training_state_that_is_not_its_checkpoints_is_refused(tmp_path, state, problem):
    """An emptied or edited state.json resumed the run at step 0 with step 1's weights, and wrote a completed
    result that counted the steps again."""
    model = small_model(seed=1)
    train(model, 1)
    checkpoint = save(RunDirectory(str(tmp_path / "r.run"), fresh=True), model, step=1)
    with open(os.path.join(checkpoint, "state.json"), "w") as f:
        json.dump(state, f)
    with pytest.raises(MtbenchError, match=rf"checkpoint-000001/state.json: {re.escape(problem)}; the checkpoint is "
                                           r"damaged$"):
        restore(checkpoint, small_model(seed=1))


def test_an_earlier_mtbenchs_training_state_without_the_later_fields_is_resumed(tmp_path):
    model = small_model(seed=1)
    train(model, 1)
    checkpoint = save(RunDirectory(str(tmp_path / "r.run"), fresh=True), model, step=1)
    with open(os.path.join(checkpoint, "state.json"), "w") as f:
        json.dump({"step": 1, "epoch": 0, "history": [{"step": 1, "loss": 5.0}], "training_s": 0.5}, f)
    state = restore(checkpoint, small_model(seed=1))
    assert (state.step, state.history, state.resumed_at_steps) == (1, [{"step": 1, "loss": 5.0}], [])


def test_a_second_ctrl_c_inside_a_checkpoint_leaves_no_half_written_folder(tmp_path, monkeypatch):
    """The first Ctrl-C's checkpoint cut short by a second: the run's folder held a .tmp-checkpoint-* folder with a
    half-written weights file, beside the checkpoints written before, which stay."""
    import signal
    from mtbench.runner.loop.signals import StoppedAtOnce, stop_requests
    from mtbench.runner.training import stopped_at_once
    model = small_model(seed=1)
    train(model, 1)
    run_dir = RunDirectory(str(tmp_path / "r.run"), fresh=True)
    save(run_dir, model, 1)
    before = sorted(os.listdir(run_dir.path))

    def second_ctrl_c(path):
        with open(path, "wb") as f:
            f.write(b"half a file")
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(model, "save_weights", second_ctrl_c)
    with pytest.raises(StoppedAtOnce) as stopped, stop_requests():
        signal.raise_signal(signal.SIGINT)  # the first: recorded, the run goes on to its checkpoint
        save(run_dir, model, 2)
    assert sorted(os.listdir(run_dir.path)) == before
    assert restore(run_dir.latest()[1], small_model(seed=1)).step == 1
    assert str(stopped.value) == "SIGINT received, then SIGINT: stopped at once"
    # What the run says as it ends: what its files keep, and how to go on from them.
    out = str(tmp_path / "r.json")
    assert str(stopped_at_once(stopped.value, out)) == (
        f"SIGINT received, then SIGINT: stopped at once; checkpoint {run_dir.path}/checkpoint-000001; continue with: "
        f"mtbench train --resume {run_dir.path}")
    with open(out, "w") as f:
        json.dump({"status": "interrupted"}, f)
    assert str(stopped_at_once(stopped.value, out, processes=2)) == (
        f"SIGINT received, then SIGINT: stopped at once; partial result in {out}; checkpoint {run_dir.path}/"
        f"checkpoint-000001; continue with: the launcher of its 2 processes, mtbench train --resume {run_dir.path}")
    with open(out, "w") as f:  # a Ctrl-C as the reporters of a finished run ran: nothing to continue
        json.dump({"status": "completed"}, f)
    assert str(stopped_at_once(KeyboardInterrupt(), out)) == (
        f"interrupted; result in {out}; checkpoint {run_dir.path}/checkpoint-000001")
    assert str(stopped_at_once(KeyboardInterrupt(), str(tmp_path / "other.json"))) == (
        "interrupted; no checkpoint or result was written")


def test_full_disk_during_a_checkpoint_leaves_the_earlier_ones_intact(tmp_path, monkeypatch):
    model = small_model(seed=1)
    train(model, 1)
    run_dir = RunDirectory(str(tmp_path / "r.run"), fresh=True)
    save(run_dir, model, 1)
    save(run_dir, model, 2)
    before = sorted(os.listdir(run_dir.path))

    def disk_full(path):
        with open(path, "wb") as f:
            f.write(b"half a file")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(model, "save_weights", disk_full)
    with pytest.raises(RunFailure, match=r"r.run: cannot write the checkpoint of step 3: No space left on device; "
                                         r"earlier checkpoints are intact"):
        save(run_dir, model, 3)
    assert sorted(os.listdir(run_dir.path)) == before
    assert restore(run_dir.latest()[1], small_model(seed=1)).step == 2

    def h5py_full(path):  # h5py's OSError has no strerror, and a message of several lines
        raise OSError("Unable to synchronously create file (file write failed: time = Fri Dec  4 13:31:44 2026\n"
                      ", filename = 'x', file descriptor = 9, errno = 28, error message = 'No space left on device')")

    monkeypatch.setattr(model, "save_weights", h5py_full)
    with pytest.raises(RunFailure) as refused:
        save(run_dir, model, 3)
    assert str(refused.value).endswith("cannot write the checkpoint of step 3: Unable to synchronously create file "
                                       "(file write failed: time = Fri Dec  4 13:31:44 2026; earlier checkpoints "
                                       "are intact")
