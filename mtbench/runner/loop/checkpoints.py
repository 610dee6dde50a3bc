"""The run directory: a run's configuration and its checkpoints, so that a run that was killed, interrupted or
stopped by a full disk continues where it stopped (`mtbench train --resume RUN_DIR`).

    RUN_DIR/run.json                the configuration (paths made absolute) and the training data's fingerprint
    RUN_DIR/checkpoint-000040/      one checkpoint, written into a temporary directory and renamed (atomic)
        model.weights.h5            Keras's save_weights: the weights and the optimizer's variables, its
                                    iteration count included (the learning-rate schedule follows it)
        random_state.npz            the model's other variables: the dropout layers' seed generator states
        generator_state.npz         where the backend's dropout draws from its framework's own generators (torch):
                                    their states, one array per process (`process_N`)
        state.json                  step, epoch, history, clocks and validation record so far

The data position is the step: each step takes one batch from a generator seeded by --seed, so a resumed run
re-creates the generator and skips that many batches without building them (see `training_batches`).
"""

import contextlib
import dataclasses
import json
import os
import re
import shutil
import warnings
import zipfile
from dataclasses import dataclass, field

import numpy as np

from mtbench.errors import MtbenchError, RunFailure
from mtbench.runner.config import TrainConfig
from mtbench.runner.files import make_temporary_folder, read_json, write_json_atomic
from mtbench.runner.results.schema import read_status, sidecar_paths

RUN_FILE = "run.json"
RUN_FORMAT = 1
WEIGHTS_FILE = "model.weights.h5"
RANDOM_STATE_FILE = "random_state.npz"
GENERATOR_STATE_FILE = "generator_state.npz"
STATE_FILE = "state.json"
# The run's tokenizer, beside its checkpoints (`Tokenizer.save`): what a checkpoint translates or generates with.
TOKENIZER_DIR = "tokenizer"
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
# Made absolute in a run file, for a resume from another folder (the files a run reads are absolute already:
# `TrainConfig`).
PATH_FIELDS = ("cache_dir", "out")


def run_dir_for(result_path):
    """Where a result's run directory lives: beside it, like its hypotheses and references."""
    stem = result_path[:-5] if result_path.endswith(".json") else result_path
    return f"{stem}.run"


def result_for(run_dir):
    """The result a run directory belongs to, the inverse of `run_dir_for`; None for a folder not named RESULT.run."""
    stem = os.path.normpath(run_dir)
    return stem[:-len(".run")] + ".json" if stem.endswith(".run") else None


@dataclass
class TrainingState:
    """What a checkpoint restores besides the variables: where training stands and every figure so far."""
    step: int = 0
    epoch: int = 0
    history: list = field(default_factory=list)
    training_s: float = 0.0
    aside_s: dict = field(default_factory=dict)      # validation and checkpoint time inside the loop
    evaluations: list = field(default_factory=list)  # validation BLEU every --eval-every steps
    resumed_at_steps: list = field(default_factory=list)

    def to_dict(self):
        return dataclasses.asdict(self)


def _absolute_paths(config_dict):
    data = dict(config_dict)
    for name in PATH_FIELDS:
        value = data.get(name)
        if value:
            data[name] = os.path.abspath(value)
    family, _, model_path = data.get("model_name", "").partition(":")
    if model_path:
        data["model_name"] = f"{family}:{os.path.abspath(model_path)}"
    return data


def _fsync_directory(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RunDirectory:
    def __init__(self, path, fresh):
        """`fresh`: a new run, whose first checkpoint replaces whatever an earlier run left here."""
        self.path = path
        self._fresh = fresh
        self.writes = True  # of a run's several processes, process 0 alone writes (the run sets it)

    def checkpoints(self):
        """(step, path) of every complete checkpoint, oldest first."""
        if not os.path.isdir(self.path):
            return []
        found = []
        for name in os.listdir(self.path):
            match = CHECKPOINT_NAME.match(name)
            if match and os.path.isfile(os.path.join(self.path, name, STATE_FILE)):
                found.append((int(match.group(1)), os.path.join(self.path, name)))
        return sorted(found)

    def latest(self):
        checkpoints = self.checkpoints()
        return checkpoints[-1] if checkpoints else None

    def save(self, model, state, run_config, data_fingerprint, keep, tokenizer=None, generator_states=None,
             ran_on=None):
        """Writes a checkpoint of `model` at `state.step` atomically, then keeps only the last `keep`; the run's
        `tokenizer` once beside them; `generator_states`, each process's random generator state, where the backend
        has one; `ran_on`, the run's `machine_identity`, in the run file. A failed write (a full disk) leaves the
        earlier checkpoints as they were."""
        if not self.writes:
            return os.path.join(self.path, f"checkpoint-{state.step:06d}")
        tmp = None
        try:
            self.begin()
            kept = self._keep_tokenizer(tokenizer)
            write_json_atomic(os.path.join(self.path, RUN_FILE), {
                "mtbench_run": RUN_FORMAT, "config": _absolute_paths(run_config),
                "data_fingerprint": data_fingerprint, **({"tokenizer": kept} if kept else {}),
                **({"ran_on": ran_on} if ran_on else {})})
            tmp = make_temporary_folder(".tmp-checkpoint-", self.path)
            model.save_weights(os.path.join(tmp, WEIGHTS_FILE))
            np.savez(os.path.join(tmp, RANDOM_STATE_FILE), *[v.numpy() for v in _random_state(model)])
            if generator_states is not None:
                np.savez(os.path.join(tmp, GENERATOR_STATE_FILE),
                         **{f"process_{rank}": state for rank, state in enumerate(generator_states)})
            with open(os.path.join(tmp, STATE_FILE), "w") as f:
                json.dump(state.to_dict(), f)
            for name in os.listdir(tmp):
                with open(os.path.join(tmp, name), "rb") as f:
                    os.fsync(f.fileno())
            final = os.path.join(self.path, f"checkpoint-{state.step:06d}")
            if os.path.exists(final):  # the same step again after a resume: the same content
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync_directory(self.path)
        except OSError as error:
            # h5py's messages run over several lines (its file, time and errno): the first says what failed.
            reason = error.strerror or (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise RunFailure(f"{self.path}: cannot write the checkpoint of step {state.step}: "
                             f"{reason}; earlier checkpoints are intact") from None
        finally:  # a failure, or a second Ctrl-C, leaves no half-written folder (once in place, `tmp` is gone)
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        for _, old in self.checkpoints()[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def _keep_tokenizer(self, tokenizer):
        """Writes `tokenizer` into the run's folder (a fresh run's replacing an earlier one's); returns its
        `describe()`, or None where there is none or it cannot be saved (a plugin's that implements no `save`)."""
        folder = os.path.join(self.path, TOKENIZER_DIR)
        if tokenizer is None:
            return None
        description = tokenizer.describe()
        if os.path.isdir(folder):  # written by the run's first checkpoint, or by the run this one resumes
            return description
        os.makedirs(self.path, exist_ok=True)
        tmp = make_temporary_folder(".tmp-checkpoint-tokenizer-", self.path)
        try:
            try:
                tokenizer.save(tmp)
            except NotImplementedError:
                return None
            if os.path.exists(folder):
                shutil.rmtree(folder)
            os.replace(tmp, folder)
        finally:  # as the checkpoint's: nothing half-written stays
            shutil.rmtree(tmp, ignore_errors=True)
        return description

    def begin(self, result_path=None):
        """Where a fresh run starts writing, empties the folder of everything an earlier run left (only
        --overwrite lets a fresh run start on one), so that no checkpoint, kept model or log of that run passes for
        this one's; the earlier run's result (`result_path`) goes with it, so that no result names a folder that
        is gone, and so do the hypotheses and references beside it, which this run may not write (--measure-only,
        a stop before evaluating). A resumed run's folder is its own: nothing goes."""
        if self._fresh and self.writes and result_path:
            for path in (result_path, *sidecar_paths(result_path)):
                if os.path.isfile(path):
                    os.remove(path)
        if self._fresh and self.writes and os.path.isdir(self.path):
            for name in os.listdir(self.path):
                path = os.path.join(self.path, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)
        self._fresh = False


def _random_state(model):
    """Model variables that are not weights (save_weights leaves them out): seed generator states."""
    weights = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in weights]


@contextlib.contextmanager
def damaged(checkpoint, name, errors=(OSError,)):
    """A file of `checkpoint` that cannot be read (truncated, emptied, not of its format: h5py's OSError, numpy's
    errors) ends the command in one line naming it."""
    try:
        yield
    except errors as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise MtbenchError(f"{checkpoint}: its {name} cannot be read ({reason}); the checkpoint is damaged") from None


def restore(checkpoint, model):
    """Loads a checkpoint into a compiled `model` and returns its TrainingState."""
    # The optimizer must have its variables before load_weights can fill them.
    model.optimizer.build(model.trainable_variables)
    with warnings.catch_warnings(record=True) as caught, damaged(checkpoint, WEIGHTS_FILE):
        warnings.simplefilter("always")
        model.load_weights(os.path.join(checkpoint, WEIGHTS_FILE))
    # Keras only warns when it skips variables that do not fit; resuming without them would not be this run.
    skipped = [str(w.message).strip() for w in caught if "Skipping variable loading" in str(w.message)]
    if skipped:
        raise RunFailure(f"{checkpoint}: does not fit this model: {skipped[0]}")
    with damaged(checkpoint, RANDOM_STATE_FILE, (OSError, ValueError, EOFError, zipfile.BadZipFile)), \
            np.load(os.path.join(checkpoint, RANDOM_STATE_FILE)) as saved:
        values = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    variables = _random_state(model)
    if len(values) != len(variables):
        raise RunFailure(f"{checkpoint}: holds {len(values)} random-state variables, the model has {len(variables)}")
    for variable, value in zip(variables, values):
        variable.assign(value)
    return read_training_state(checkpoint)


# What each field of a checkpoint's state.json must be: a resumed run would take anything else as its own figures.
STATE_TYPES = {"step": int, "epoch": int, "history": list, "training_s": (int, float), "aside_s": dict,
               "evaluations": list, "resumed_at_steps": list}


def read_training_state(checkpoint):
    """The TrainingState a checkpoint holds, refused in one line where its state.json is not one of the step its
    directory names (an emptied or edited file restarted the run's count at step 0 with the step's weights)."""
    path = os.path.join(checkpoint, STATE_FILE)
    state = read_json(path, "a checkpoint's training state")
    match = CHECKPOINT_NAME.match(os.path.basename(os.path.normpath(checkpoint)))
    problem = None
    if not isinstance(state, dict):
        problem = f"holds {type(state).__name__}, not the training state's fields"
    elif "step" not in state:  # the others have defaults: an earlier mtbench's checkpoint may lack one
        problem = "holds no step"
    elif set(state) - set(STATE_TYPES):
        problem = "has fields no checkpoint has: " + ", ".join(sorted(set(state) - set(STATE_TYPES)))
    else:
        wrong = [key for key, value in state.items()
                 if not isinstance(value, STATE_TYPES[key]) or isinstance(value, bool)]
        if wrong:
            problem = "a field of the wrong kind: " + ", ".join(wrong)
        elif match and state["step"] != int(match.group(1)):
            problem = f"says step {state['step']}, in the checkpoint of step {int(match.group(1))}"
    if problem:
        raise MtbenchError(f"{path}: {problem}; the checkpoint is damaged")
    return TrainingState(**state)


def restore_generator_state(checkpoint, backend, processes):
    """Puts this process's random generator state back from `checkpoint`, where the backend has one; returns None,
    or why it could not, so that the run says it draws other dropout masks than an uninterrupted run would. Called
    after everything that draws before the first step (the train step's making, the extras' checks)."""
    current = backend.random_generator_state()
    if current is None:
        return None
    path = os.path.join(checkpoint, GENERATOR_STATE_FILE)
    if not os.path.isfile(path):
        return "the checkpoint holds none (written by an earlier mtbench)"
    with damaged(checkpoint, GENERATOR_STATE_FILE, (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile)), \
            np.load(path) as saved:
        states = [saved[f"process_{rank}"] for rank in range(len(saved.files))]
    if len(states) != processes.world_size:
        return f"the checkpoint holds {len(states)} processes' states, this run has {processes.world_size} processes"
    if states[processes.rank].shape != current.shape:
        return (f"the checkpoint's state is {states[processes.rank].size} bytes, this process's generators' "
                f"{current.size} (written on another kind of device)")
    backend.restore_random_generator_state(states[processes.rank])
    return None


@dataclass
class Resumption:
    """An earlier run to continue: its directory, configuration, data fingerprint and latest checkpoint."""
    directory: RunDirectory
    config: TrainConfig
    data_fingerprint: str
    step: int
    checkpoint: str
    ran_on: dict = None  # the devices and versions it ran on (`machine_identity`); None in older run files


def open_run(path):
    """The Resumption of the run in directory `path`; anything that is not a resumable mtbench run is an error
    saying what is wrong."""
    if not os.path.exists(path):
        raise MtbenchError(f"{path}: no such run directory")
    if not os.path.isdir(path):
        raise MtbenchError(f"{path}: not a directory; --resume takes the run directory (RESULT.run) of a run")
    run_file = os.path.join(path, RUN_FILE)
    if not os.path.isfile(run_file):
        result = result_for(path)
        status = result and read_status(result)
        if status:  # a run writes its run file with its first checkpoint: this one wrote none
            raise MtbenchError(f"{path}: the run finished with status {status} ({result}) and wrote no checkpoint; "
                               "there is nothing to resume")
        raise MtbenchError(f"{path}: not an mtbench run directory (it has no {RUN_FILE})")
    run = read_json(run_file, "an mtbench run file")
    if not isinstance(run, dict) or run.get("mtbench_run") != RUN_FORMAT or not isinstance(run.get("config"), dict):
        raise MtbenchError(f"{run_file}: not an mtbench run file of format {RUN_FORMAT}")
    directory = RunDirectory(path, fresh=False)
    latest = directory.latest()
    if latest is None:
        raise MtbenchError(f"{path}: holds no complete checkpoint to resume from")
    config = resumed_beside(path, TrainConfig.recorded_in(run_file, run["config"]))
    return Resumption(directory, config, run.get("data_fingerprint"), *latest, run.get("ran_on"))


def resumed_beside(path, config):
    """`config` writing its result beside the run directory `path`, where a run moved (its result and `RESULT.run`
    together) resumes: the result path the run file recorded may hold another run's result by now."""
    if not config.out or os.path.abspath(run_dir_for(config.out)) == os.path.abspath(path):
        return config
    if not os.path.abspath(path).endswith(".run"):
        raise MtbenchError(f"{path}: this run wrote its result to {config.out}, beside {run_dir_for(config.out)}; a "
                           f"run directory renamed from RESULT.run cannot be resumed: name it back")
    return dataclasses.replace(config, out=result_for(os.path.abspath(path)))
