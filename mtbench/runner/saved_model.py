"""A trained model kept for later use: the final weights of a completed run, and where `mtbench translate` and
`mtbench evaluate` find a model (a result, a run directory, a saved model, a checkpoint).

    RUN_DIR/model/
        model.json      the family, the run's configuration, the model's shape and special token ids
        weights.npz     every variable by Keras path: the backend-neutral weights file, so the model loads on
                        any backend (and may start another run: --initial-weights)
        ...             the tokenizer's files and the family's own (a pretrained model's config.json)

Written into a temporary directory and renamed, so a half-written model is never found.
"""

import json
import os
import shutil
from dataclasses import dataclass

from mtbench.errors import MtbenchError
from mtbench.figures import last_step
from mtbench.runner.config import TrainConfig
from mtbench.runner.data.weights_file import read_weights_file, write_weights_file
from mtbench.runner.files import make_temporary_folder, read_json, write_json_atomic
from mtbench.runner.loop.checkpoints import (CHECKPOINT_NAME, RUN_FILE, TOKENIZER_DIR, open_run,
                                             run_dir_for)
from mtbench.runner.results.report import BOOKKEEPING_KEYS, COMPARE_KIND, DERIVED_KEYS, check_result

SAVED_DIR = "model"
BEST_DIR = "best"  # the model of the best validation (--eval-every), in the same format
DESCRIPTION_FILE = "model.json"
WEIGHTS_NPZ = "weights.npz"
SAVED_FORMAT = 1


def best_model_keeper(config, run_dir, data, plugins, model_shape):
    """model -> the path of RUN_DIR/best, the weights of the best validation so far, for a run that validates
    (--eval-every) and keeps its model; None for any other."""
    if config.eval_every is None or not config.save_model:
        return None
    return lambda model: save_trained_model(run_dir.path, model, data.tokenizer, plugins, model_shape, config,
                                            name=BEST_DIR)


def save_trained_model(run_dir, model, tokenizer, plugins, model_shape, config, name=SAVED_DIR):
    """Writes RUN_DIR/NAME (replacing an earlier one); returns its absolute path."""
    from mtbench.plugins.api import ModelFamily
    final = os.path.join(run_dir, name)
    os.makedirs(run_dir, exist_ok=True)
    tmp = make_temporary_folder(".tmp-model-", run_dir)
    try:
        write_weights_file(os.path.join(tmp, WEIGHTS_NPZ), {v.path: v.numpy() for v in model.weights})
        tokenizer.save(tmp)
        with plugins.model_code():
            family_record = plugins.model.save(plugins.model_path, model_shape, tmp)
        write_json_atomic(os.path.join(tmp, DESCRIPTION_FILE), {
            "mtbench_model": SAVED_FORMAT,
            "family": plugins.model.name,
            "family_record": family_record,
            # The task's tokenizer (the family brings none): reloaded by `Task.load_tokenizer`.
            "own_tokenizer": type(plugins.model).tokenizer is ModelFamily.tokenizer,
            "task": plugins.task.name,
            "tokenizer": tokenizer.describe(),
            "shape": model_shape.to_dict(),
            "special": tokenizer.special and tokenizer.special.to_dict(),
            "config": config.to_dict(),
        })
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
    except OSError as error:
        raise MtbenchError(f"{final}: cannot save the trained model: {error.strerror or error}") from None
    finally:  # a failure, or a signal (`Stopped`), leaves no half-written folder in the run's
        shutil.rmtree(tmp, ignore_errors=True)
    return os.path.abspath(final)


@dataclass
class ModelSource:
    """A trained model found on disk: the configuration that built it and where its weights are."""
    config: TrainConfig
    weights: str           # a weights.npz, or a checkpoint directory
    saved_dir: str = None  # the saved model's directory (None for a checkpoint)
    description: dict = None
    label: str = ""        # what it is, for messages

    @property
    def is_checkpoint(self):
        return self.saved_dir is None


def find_model(path):
    """The ModelSource of `path`: a result JSON, a run directory (its saved model, else its latest checkpoint),
    a saved model directory or a checkpoint directory. Anything else is an error that says what it is not."""
    if not os.path.exists(path):
        raise MtbenchError(f"{path}: no such file or directory")
    if os.path.isfile(path):
        return _from_result(path)
    if os.path.isfile(os.path.join(path, DESCRIPTION_FILE)):
        return _from_saved(path)
    if os.path.isfile(os.path.join(path, SAVED_DIR, DESCRIPTION_FILE)):  # a run directory: its final model
        return _from_saved(os.path.join(path, SAVED_DIR))
    if os.path.isfile(os.path.join(path, RUN_FILE)):
        return _from_run(path)
    parent, name = os.path.split(os.path.abspath(path))
    if CHECKPOINT_NAME.match(name) and os.path.isfile(os.path.join(parent, RUN_FILE)):
        resumption = open_run(parent)
        return ModelSource(resumption.config, os.path.abspath(path), label=f"checkpoint {path}")
    raise MtbenchError(f"{path}: not a result, run directory, saved model or checkpoint of mtbench")


def _from_result(path):
    """The model of the run a result describes: its saved model, or where it kept none, the checkpoint it names
    (a partial result's state when it stopped, which a resumed run's later checkpoints are not), each looked for
    beside the result first (a result moved or copied with its RESULT.run folder), then where the run wrote it. A
    model found there of another configuration, or a checkpoint of another step than the run's last, is not the
    run's (a run written to the same --out since): refused, not loaded in its place."""
    result = read_json(path, "a result JSON")
    if isinstance(result, dict) and result.get("kind") == COMPARE_KIND:
        runs = ", ".join(entry.get("result_file", "?") for entry in result.get("runs") or [])
        raise MtbenchError(f"{path}: a compare JSON of several runs; give one run's result: {runs or 'none'}")
    check_result(result, path)  # a layout of its own (model: "x") ended in AttributeError
    saved = result["model"].get("saved")
    checkpoint = result.get("checkpoint") or (result.get("metrics") or {}).get("unevaluated_checkpoint")
    for key, value in (("model.saved", saved), ("run_dir", result.get("run_dir")), ("checkpoint", checkpoint)):
        if value is not None and not isinstance(value, str):
            raise MtbenchError(f"{path}: {key}: {value!r} is not a path")
    beside = run_dir_for(path)  # where the run wrote its folder, had the result not moved with it since
    recorded, found = (saved, _from_saved_if_there) if saved else (checkpoint, _from_checkpoint_if_there)
    others = []  # (what was found, why it is another run's)
    for place in dict.fromkeys((recorded and os.path.join(beside, os.path.basename(recorded)), recorded)):
        source = place and found(place)
        if source:
            why = _another_runs(result, source)
            if not why:
                return source
            others.append((source.label, why))
    if others:
        label, why = others[0]
        raise MtbenchError(f"{path}: the {label} found for it is another run's ({why}): a run written to the same "
                           f"place since; give that model's folder to use it")
    kept = "" if saved or checkpoint else ", and it has no checkpoint"
    raise MtbenchError(f"{path}: {no_model_reason(result, saved, checkpoint, beside)}{kept}; no model to load")


def _from_saved_if_there(directory):
    return _from_saved(directory) if os.path.isfile(os.path.join(directory, DESCRIPTION_FILE)) else None


def _from_checkpoint_if_there(directory):
    run_dir = os.path.dirname(os.path.normpath(directory))
    if not (os.path.isdir(directory) and os.path.isfile(os.path.join(run_dir, RUN_FILE))):
        return None
    return ModelSource(open_run(run_dir).config, os.path.abspath(directory), label=f"checkpoint {directory}")


def _another_runs(result, source):
    """Why the model `source` found for `result` is another run's: the configuration keys that differ (where files
    went and what a run derives aside), or a checkpoint's step that is not the last the result trained; None
    where it is the run's."""
    if not isinstance(result.get("config"), dict):
        return None
    ignored = {*DERIVED_KEYS, *BOOKKEEPING_KEYS}
    own = json.loads(json.dumps(source.config.to_dict()))
    differences = [f"{key} {value!r} where the result has {result['config'][key]!r}" for key, value in own.items()
                   if key in result["config"] and key not in ignored and result["config"][key] != value]
    if differences:
        return ", ".join(differences[:3])
    trained = last_step(result)
    step = CHECKPOINT_NAME.match(os.path.basename(os.path.normpath(source.weights)))
    if source.is_checkpoint and step and trained is not None and int(step.group(1)) != trained:
        return f"it holds step {int(step.group(1))}, the result's run trained {trained}"
    return None


def no_model_reason(result, saved, checkpoint, beside):
    """Why a result leads to no model, by what its run was told (its configuration) and how it ended."""
    config = result.get("config") if isinstance(result.get("config"), dict) else {}
    status = result.get("status", "completed")
    if saved:
        return f"its saved model is gone (not in {saved}, nor in {beside})"
    if checkpoint:
        return (f"its checkpoint is gone (not {checkpoint}, nor in {beside}; a run resumed since keeps only its "
                f"last --keep-checkpoints)")
    if config.get("measure_only"):
        return "the run kept no model (--measure-only: it trained and timed only)"
    if config.get("save_model") is False:
        return "the run kept no model (--no-save-model)"
    if status != "completed":
        return f"the run kept no model (it did not complete: {status})"
    return "the run kept no model (--no-save-model, or it did not complete)"


def _from_run(run_dir):
    resumption = open_run(run_dir)
    return ModelSource(resumption.config, resumption.checkpoint, label=f"checkpoint {resumption.checkpoint}")


def _from_saved(directory):
    description_file = os.path.join(directory, DESCRIPTION_FILE)
    description = read_json(description_file, "a saved model's description")
    if not isinstance(description, dict) or description.get("mtbench_model") != SAVED_FORMAT:
        raise MtbenchError(f"{description_file}: not a saved mtbench model of format {SAVED_FORMAT}")
    config = TrainConfig.recorded_in(description_file, description["config"])
    return ModelSource(config, os.path.join(directory, WEIGHTS_NPZ), saved_dir=directory,
                       description=description, label=f"model {directory}")


def model_files(source, plugins):
    """(the PATH the family builds from, the tokenizer the model was trained with): a saved model's own copies
    (a pretrained family's files, mtbench's tokenizer), or for a checkpoint the run's."""
    if source.saved_dir is not None:
        with plugins.model_code():
            path, tokenizer = plugins.model.load_saved(source.saved_dir, source.description["family_record"])
        if source.description["own_tokenizer"]:
            with plugins.task_code():
                tokenizer = plugins.task.load_tokenizer(source.saved_dir, source.description.get("tokenizer") or {})
        return path, tokenizer
    with plugins.model_code():
        tokenizer = plugins.model.tokenizer(plugins.model_path, source.config)
    return plugins.model_path, tokenizer or _checkpoints_tokenizer(source, plugins)


def _checkpoints_tokenizer(source, plugins):
    """The tokenizer a checkpoint's run kept beside its checkpoints (`RunDirectory.save`); for a run of an older
    mtbench, which kept none, the joint tokenizer translation trained into its cache (run.json names the file)."""
    from mtbench.runner.data.tokenizer import JointTokenizer
    run_dir = os.path.dirname(source.weights)
    run = read_json(os.path.join(run_dir, RUN_FILE), "an mtbench run file")
    if os.path.isdir(os.path.join(run_dir, TOKENIZER_DIR)) and run.get("tokenizer"):
        with plugins.task_code():
            return plugins.task.load_tokenizer(os.path.join(run_dir, TOKENIZER_DIR), run["tokenizer"])
    fingerprint = run.get("data_fingerprint") or ""
    path = os.path.join(source.config.cache_dir, "tokenizers", fingerprint)
    if not fingerprint or not os.path.isfile(path):
        raise MtbenchError(f"{source.label}: its run kept no tokenizer beside its checkpoints (an older mtbench), "
                           f"and {path} is no longer in the cache; use a completed run's saved model instead")
    return JointTokenizer.from_file(path)


def load_weights(source, keras, model, config):
    """Sets the model's variables from the saved weights or the checkpoint."""
    from mtbench.keras_models.initialization import assign_weights
    from mtbench.runner.loop.checkpoints import restore
    from mtbench.runner.setup import compile_model
    if source.is_checkpoint:
        compile_model(keras, model, config, config.steps or 1, {})  # a checkpoint holds the optimizer's state too
        restore(source.weights, model)
        return
    weights, _ = read_weights_file(source.weights)
    try:
        assign_weights(model, weights)
    except ValueError as error:
        raise MtbenchError(f"{source.weights}: {error}") from None
