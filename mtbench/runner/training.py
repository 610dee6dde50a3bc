"""One training run, top to bottom: choose the backend, read, report and tokenise the corpus, build the model
from numpy-drawn weights (or a checkpoint), train with honest timing, checkpoints and an eye on signals, loss and
target quality, evaluate, translate the test set, and write the result (a partial one when training stopped)."""

import dataclasses
from dataclasses import dataclass
import math
import os
import time

import numpy as np

from mtbench.errors import MtbenchError, RunFailure, RunInterrupted
from mtbench.plugins.api import KerasTrainStep, RunContext
from mtbench.runner import faults
from mtbench.runner import results as results_module
from mtbench.runner.batches import batches_per_epoch, encode_split, training_batches
from mtbench.runner.checkpoints import RunDirectory, TrainingState, restore, run_dir_for
from mtbench.runner.corpus_report import corpus_report, report_lines
from mtbench.runner.config import decoding_name
from mtbench.runner.data import load_corpus
from mtbench.runner.files import write_json_atomic, write_text_atomic
from mtbench.runner.flops import device_peak, training_flops
from mtbench.runner.hardware import peak_host_bytes
from mtbench.runner.progress import corpus_progress, training_progress
from mtbench.runner.signals import stop_requests
from mtbench.runner.target import QualityTarget
from mtbench.runner.timing import Stopwatch, StepTimer, TrainingClock
from mtbench.runner.weights_file import read_weights_file, write_weights_file

TRAIN_LOSS_SAMPLE = 500  # training pairs re-evaluated with the final weights, comparable to val/test loss


def resolve_backend(name, registry):
    backend = registry.lookup("backends", name)
    reason = backend.missing_framework()
    if reason:
        raise MtbenchError(reason)
    return backend


def resolve_extras(names, backend, registry):
    """The requested extras, checked for existence, backend and conflicts before anything is imported."""
    extras = []
    for name in names:
        extra = registry.lookup("extras", name)
        if backend.name not in extra.backends:
            raise MtbenchError(f"extra '{name}' serves the {', '.join(extra.backends)} backend(s), "
                               f"not '{backend.name}'")
        extras.append(extra)
    for extra in extras:
        clash = [other for other in names if other in extra.conflicts]
        if clash:
            raise MtbenchError(f"extra '{extra.name}' cannot run together with '{clash[0]}'")
    return extras


def check_output_path(path, overwrite, resuming=False, kind=".json"):
    """Refuses to replace a result or to mix with an earlier run's checkpoints, unless told to (--overwrite), or
    unless resuming the run whose partial result it is. Missing directories are created when writing."""
    if os.path.isdir(path):
        raise MtbenchError(f"{path}: is a directory; --out takes a {kind} file path")
    if os.path.exists(path) and resuming:
        status = results_module.read_status(path)
        if status not in results_module.PARTIAL_STATUSES:
            raise MtbenchError(f"{path}: the run already has a result with status {status or 'unknown'}; "
                               "there is nothing to resume")
    elif os.path.exists(path) and not overwrite:
        raise MtbenchError(f"{path}: already exists; pass --overwrite to replace it")
    if kind == ".json":
        run_dir = RunDirectory(run_dir_for(path), fresh=False)
        if not resuming and not overwrite and run_dir.checkpoints():
            raise MtbenchError(f"{run_dir.path}: holds checkpoints of an earlier run writing {path}; continue "
                               f"it with --resume {run_dir.path}, or pass --overwrite to start afresh")
    existing = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise MtbenchError(f"{path}: cannot write into {existing}: it is a file, not a directory")
    if not os.access(existing, os.W_OK):
        raise MtbenchError(f"{path}: cannot write into {existing}: permission denied or read-only")


def prepare_process(config, backend, extras):
    """Sets the environment keras and the framework read at import, then imports keras."""
    env = {"KERAS_BACKEND": backend.keras_backend, "KERAS_HOME": os.path.join(config.cache_dir, "keras")}
    env.update(backend.prepare_process(config))
    for extra in extras:
        env.update(extra.environment(config))
    os.environ.update(env)
    import keras
    if keras.backend.backend() != backend.keras_backend:
        raise RunFailure(f"keras was already imported with the {keras.backend.backend()} backend in this "
                         f"process; run each backend in its own process")
    return keras


def compile_model(keras, model, config, total_steps, compile_options):
    warmup = min(config.warmup_steps, max(total_steps - 1, 0))
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0, warmup_target=config.learning_rate, warmup_steps=warmup,
        decay_steps=max(total_steps - warmup, 1), alpha=0.1)
    optimizer = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=config.weight_decay,
                                       beta_1=0.9, beta_2=0.98, epsilon=1e-9, clipnorm=1.0)
    if config.dtype in ("float16", "mixed_float16"):
        # float16 gradients underflow without loss scaling; Keras's optimizer wrapper scales dynamically.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    # The loss and accuracy are means over real target tokens: the batch's weights are 0 on padding.
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
    options = {"jit_compile": "auto"}
    options.update(compile_options)
    model.compile(optimizer=optimizer, loss=loss,
                  weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")], **options)
    return {"jit_compile": model.jit_compile, "optimizer": type(model.optimizer).__name__,
            "dtype_policy": model.dtype_policy.name}


@dataclass
class PreparedData:
    """The corpus and its splits, encoded with the run's tokenizer."""
    corpus: object
    tokenizer: object
    train: object
    valid: object
    test: object
    train_eval: object  # the first TRAIN_LOSS_SAMPLE training pairs, re-evaluated with the final weights

    def encoded(self):
        return {"train": self.train, "valid": self.valid, "test": self.test}


def read_corpus(config, registry, console, stopwatch):
    with stopwatch.phase("data"), corpus_progress(console) as progress:
        return load_corpus(config, registry, progress)


def prepare_data(config, corpus, stopwatch):
    """Trains (or loads) the tokenizer and encodes every split."""
    from mtbench.runner.tokenizer import load_or_train_tokenizer
    with stopwatch.phase("tokenizer"):
        tokenizer = load_or_train_tokenizer(corpus.train, config.vocab_size, config.cache_dir)
        splits = [encode_split(pairs, tokenizer, config.max_len)
                  for pairs in (corpus.train, corpus.valid, corpus.test, corpus.train[:TRAIN_LOSS_SAMPLE])]
    data = PreparedData(corpus, tokenizer, *splits)
    if len(data.valid) == 0 or len(data.test) == 0:
        raise MtbenchError(f"every validation or test pair is longer than --max-len {config.max_len} tokens")
    return data


def build_model(config, tokenizer, model_options=None):
    """The Transformer of `config`, its vocabulary sized by the tokenizer (a small corpus may support fewer
    pieces than asked for); `model_options` are those extras set (flash attention)."""
    from mtbench.keras_models.transformer import build_transformer
    model_shape = dataclasses.replace(config.model, vocab_size=tokenizer.vocab_size)
    return build_transformer(model_shape, **(model_options or {})), model_shape


def write_initial_weights(config, registry, console, path, overwrite=False):
    """Draws the initial weights of `config`'s model from its seed and writes them to a weights file; returns
    the file's sha256.

    The numpy draw needs every variable's Keras path and shape, and the embedding's shape depends on the
    tokenizer's vocabulary, known only once the corpus is read. Rather than restate the model's structure
    without keras (a second description that could drift from the real one), this prepares the data and builds
    the model exactly as a run does, on `config.backend`, and writes only numpy arrays: the file is
    backend-neutral although keras named its variables. Like a run, it needs a process of its own
    (`mtbench init-weights`), because keras fixes its backend at import."""
    backend = resolve_backend(config.backend, registry)
    check_output_path(path, overwrite, kind=".npz")
    stopwatch = Stopwatch()
    corpus = read_corpus(config, registry, console, stopwatch)
    prepare_process(config, backend, extras=())
    from mtbench.keras_models.initialization import initial_weights
    data = prepare_data(config, corpus, stopwatch)
    model, _ = build_model(config, data.tokenizer)
    return write_weights_file(path, initial_weights(model, config.seed))


def starting_weights(config, model, weights_file):
    """Sets the model's initial weights: those of the weights file when one was given, else the numpy draw."""
    from mtbench.keras_models.initialization import assign_weights, initial_weights
    if weights_file is None:
        assign_weights(model, initial_weights(model, config.seed))
        return
    try:
        assign_weights(model, weights_file)
    except ValueError as error:
        raise MtbenchError(f"{config.initial_weights}: {error}") from None


def run_training(config, registry, console, resume=None):
    """Runs `config`; `resume` (a checkpoints.Resumption, whose config `config` is) continues an earlier run
    from its latest checkpoint."""
    stopwatch = Stopwatch()
    run_config = config.to_dict()  # what --resume rebuilds the run from; extras may adjust `config` below
    backend = resolve_backend(config.backend, registry)
    extras = resolve_extras(config.extras, backend, registry)
    check_output_path(config.out, config.overwrite, resuming=resume is not None)
    # Read before any framework is imported, so a bad file fails at once; the hash is of the bytes loaded.
    weights_file, weights_sha256 = (read_weights_file(config.initial_weights) if config.initial_weights
                                    else (None, None))
    run_dir = resume.directory if resume else RunDirectory(run_dir_for(config.out), fresh=True)

    # Read before the framework is imported: a bad corpus file fails in a second, not after the import.
    corpus = read_corpus(config, registry, console, stopwatch)

    keras = prepare_process(config, backend, extras)
    from mtbench.runner.decoding import make_decoder
    from mtbench.runner.evaluation import loss_and_accuracy, translate_and_score

    run = RunContext(config=config, backend=backend, device=backend.device_info())
    reason = backend.unsupported_dtype_reason(config.dtype, run.device)
    if reason:
        raise MtbenchError(f"--dtype {config.dtype}: {reason}")
    for extra in extras:
        reason = extra.unavailable_reason(run)
        if reason:
            raise MtbenchError(f"{extra.name}: {reason}")

    for extra in extras:
        extra.adjust_config(run)

    data = prepare_data(config, corpus, stopwatch)
    tokenizer = data.tokenizer
    train_split, valid_split, test_split, train_eval_split = data.train, data.valid, data.test, data.train_eval
    report = corpus_report(corpus, data.encoded(), config.max_len)
    for line in report_lines(corpus.name, report):
        console.print(line, highlight=False, soft_wrap=True)
    # The tokenizer file is named by a hash of the training pairs: a resumed run must train on the same ones.
    data_fingerprint = os.path.basename(tokenizer.path)
    if resume and resume.data_fingerprint != data_fingerprint:
        raise MtbenchError(f"{resume.directory.path}: the training data differs from the run's (tokenizer "
                           f"{data_fingerprint}, the run had {resume.data_fingerprint}); it cannot be resumed")
    if config.epochs is not None:
        total_steps = max(1, math.ceil(config.epochs * batches_per_epoch(train_split, config.batch_size,
                                                                         config.max_len)))
    else:
        total_steps = config.steps

    with stopwatch.phase("build"):
        keras.utils.set_random_seed(config.seed)
        keras.config.set_dtype_policy(config.dtype)
        for extra in extras:
            extra.before_model(run)
        model, model_shape = build_model(config, tokenizer, run.model_options)
        starting_weights(config, model, weights_file)
        compile_options = {}
        for extra in extras:
            compile_options.update(extra.compile_options(run))
        compile_options = compile_model(keras, model, config, total_steps, compile_options)
        state = TrainingState()
        if resume:
            state = restore(resume.checkpoint, model)
            state.resumed_at_steps.append(state.step + 1)
            console.print(f"resuming {resume.directory.path} after step {state.step}", highlight=False,
                          soft_wrap=True)
        # Created after a restore: a step that keeps its own copy of the state reads the restored variables.
        train_step = backend.make_train_step(run, model) or KerasTrainStep(model)
        for extra in extras:
            train_step = extra.make_train_step(run, model) or train_step
        try:
            batches = training_batches(train_split, config.batch_size, config.max_len, config.seed, skip=state.step)
            _, first_batch = next(training_batches(train_split, config.batch_size, config.max_len, config.seed))
        except ValueError as error:
            raise MtbenchError(str(error)) from None
        for extra in extras:
            reason = extra.verify(run, model, first_batch)
            if reason:
                raise RunFailure(f"{extra.name}: {reason}")
        decode = backend.compile_inference(make_decoder(model, config.beam, config.length_penalty), model)

    callbacks = keras.callbacks.CallbackList(registry.keras_callbacks(config), model=model)
    timer = StepTimer()
    step_flops = lambda shape: training_flops(model_shape, shape[0], shape[1], shape[1])
    for h in state.history:
        timer.add(h["step"], tuple(h["shape"]), h["seconds"], h["tokens"], first_of_shape=h["first_of_shape"],
                  flops=step_flops(h["shape"]), input_seconds=h["input_seconds"], compilations=h["compilations"])
    timer.restart()
    target = QualityTarget(config.target_bleu, config.eval_every, state.evaluations)
    poison_at = faults.nan_step()
    stop = None  # (status, reason) when training ends before its last step
    checkpoint = resume.checkpoint if resume else None  # the latest of this run (not of an overwritten one)
    callbacks.on_train_begin()
    clock = TrainingClock(state.training_s, state.aside_s)
    with stopwatch.phase("train"), training_progress(console, total_steps, state.step) as progress, \
            stop_requests() as signals:
        for step in range(state.step + 1, total_steps + 1):
            t_input = time.perf_counter()
            epoch, batch = next(batches)
            input_seconds = time.perf_counter() - t_input
            if step == poison_at:
                train_step.finalize()  # a step holding its own copy of the weights re-reads them next call
                faults.poison_weights(model)
            callbacks.on_train_batch_begin(step)
            compiled_before = backend.compilations()
            backend.synchronize(model)
            t0 = time.perf_counter()
            logs = train_step((batch.source, batch.target_input), batch.target_output, batch.weight)
            backend.synchronize(model)
            seconds = time.perf_counter() - t0
            compiled = None if compiled_before is None else backend.compilations() - compiled_before
            loss, accuracy = float(logs["loss"]), float(logs["accuracy"])
            first = timer.add(step, batch.shape, seconds, batch.target_tokens, flops=step_flops(batch.shape),
                              input_seconds=input_seconds, compilations=compiled)
            state.history.append({"step": step, "epoch": epoch, "loss": _finite_or_none(loss),
                                  "accuracy": _finite_or_none(accuracy), "seconds": seconds,
                                  "shape": list(batch.shape), "tokens": batch.target_tokens, "first_of_shape": first,
                                  "input_seconds": input_seconds, "compilations": compiled})
            callbacks.on_train_batch_end(step, {"loss": loss, "accuracy": accuracy})
            if not math.isfinite(loss):
                stop = ("diverged", f"the loss is {loss} at step {step}")
                break
            state.step, state.epoch = step, epoch
            progress.advance(loss, batch.target_tokens / seconds)
            reached = False
            if target.due(step):
                training_s = clock.training_s()
                with clock.aside("validation"):
                    eval_t0 = time.perf_counter()
                    train_step.finalize()
                    scores = translate_and_score(decode, tokenizer, valid_split, corpus.valid,
                                                 config.decode_batch_size, config.max_len)
                    eval_seconds = time.perf_counter() - eval_t0
                reached = target.record(step, scores.bleu, scores.chrf, training_s, eval_seconds)
            if signals.requested or (config.checkpoint_every and step % config.checkpoint_every == 0):
                checkpoint = _save_checkpoint(run_dir, model, train_step, state, clock, target, run_config,
                                              data_fingerprint, config.keep_checkpoints)
            if signals.requested:
                stop = ("interrupted", f"{signals.name} received; stopped after step {step}")
                break
            if reached:
                stop = ("completed", f"validation BLEU {scores.bleu:.2f} reached the target {config.target_bleu} "
                                     f"at step {step}")
                break
    callbacks.on_train_end()
    train_step.finalize()
    status, status_reason = stop or ("completed", None)

    extras_record = {extra.name: extra.record(run) for extra in extras}
    steady = timer.summary()
    peak, peak_source = device_peak(backend, run.device, config.dtype, config.cache_dir,
                                    registry.backends.values())
    devices_used = max([record.get("devices", 1) for record in extras_record.values()] + [1])
    # Simulated devices share one CPU, whose measured peak already spans all its cores.
    peak_devices = 1 if run.device_kind == "cpu" else devices_used
    mfu = None if peak is None or steady["flops_per_s"] is None else steady["flops_per_s"] / (peak * peak_devices)
    result = {
        "schema_version": results_module.SCHEMA_VERSION,
        "status": status,
        "status_reason": status_reason,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "backend": backend.name,
        "extras": [extra.name for extra in extras],
        "extras_record": extras_record,
        "devices_used": devices_used,
        "config": {**config.to_dict(), "initial_weights_sha256": weights_sha256},
        "compile_options": compile_options,
        "train_step": train_step.name,
        "env": results_module.environment(backend),
        "data": {
            "corpus": corpus.name, "origin": corpus.origin, "pairs": corpus.sizes(),
            "dropped_too_long": report["dropped"]["too_long"],
            **report,
            "tokenizer": {"type": "sentencepiece-unigram", "vocab_size": tokenizer.vocab_size,
                          "file": tokenizer.path},
        },
        "model": {"parameters": int(model.count_params()), **model_shape.to_dict(),
                  "dtype_policy": model.dtype_policy.name},
        "timing": {
            **steady,
            "steps": len(state.history),
            "epochs_seen": state.epoch + 1,
            "train_s": clock.training_s(),
            "validation_s": clock.aside_s.get("validation", 0.0),
            "checkpoint_s": clock.aside_s.get("checkpoint", 0.0),
            "resumed_at_steps": state.resumed_at_steps,
            "clock": "time.perf_counter around each step, device synchronised before and after; train_s is the "
                     "training wall time of every process of the run, validation and checkpoints apart",
            # Every XLA compilation during the steps (None where the backend compiles nothing ahead of time);
            # the first step of a run also compiles a few one-time helper programs.
            "compilations_by_shape": timer.compilations_by_shape(),
        },
        "utilization": {
            "flops_per_step_note": "analytic: matmuls and attention of the padded batch, training = 3x forward",
            "model_flops_per_s": steady["flops_per_s"],
            "peak_flops_per_s": peak, "peak_source": peak_source, "mfu": mfu,
        },
        "target": target.to_dict(),
        "metrics": _metrics_so_far(state.history),
        "history": state.history,
        "run_dir": os.path.abspath(run_dir.path) if checkpoint else None,
        "checkpoint": checkpoint,
        "hypotheses_file": None,
        "references_file": None,
    }
    if status != "completed":
        _write_result(config.out, result, stopwatch, backend)
        _raise_for_stop(status, status_reason, config.out, result["checkpoint"], run_dir, signals)

    with stopwatch.phase("evaluate"):
        batch_rows = config.batch_size
        train_loss, train_accuracy = loss_and_accuracy(model, train_eval_split, batch_rows, config.max_len)
        val_loss, val_accuracy = loss_and_accuracy(model, valid_split, batch_rows, config.max_len)
        test_loss, test_accuracy = loss_and_accuracy(model, test_split, batch_rows, config.max_len)
    with stopwatch.phase("translate"):
        scores = translate_and_score(decode, tokenizer, test_split, corpus.test, config.decode_batch_size,
                                     config.max_len)

    hypotheses_file, references_file = results_module.sidecar_paths(config.out)
    write_text_atomic(hypotheses_file, "".join(h + "\n" for h in scores.hypotheses))
    write_text_atomic(references_file, "".join(r + "\n" for r in scores.references))
    result["metrics"].update({
        "train_loss": train_loss, "train_accuracy": train_accuracy,
        "val_loss": val_loss, "val_accuracy": val_accuracy,
        "test_loss": test_loss, "test_accuracy": test_accuracy,
        "bleu": scores.bleu, "chrf": scores.chrf,
        "bleu_signature": scores.bleu_signature, "chrf_signature": scores.chrf_signature,
        "test_sentences_scored": len(scores.hypotheses),
        "decoding": decoding_name(config.beam, config.length_penalty),
    })
    result["hypotheses_file"] = os.path.abspath(hypotheses_file)
    result["references_file"] = os.path.abspath(references_file)
    _write_result(config.out, result, stopwatch, backend)
    return result


def _finite_or_none(value):
    """JSON has no NaN: a diverged step's loss is written as null (the result's status_reason says what it was)."""
    return value if math.isfinite(value) else None


def _metrics_so_far(history):
    """The metrics of a run whose evaluation has not run yet: only the training loss of the last steps."""
    recent = [h["loss"] for h in history[-50:] if h["loss"] is not None]
    metrics = dict.fromkeys(("train_loss", "train_accuracy", "val_loss", "val_accuracy", "test_loss",
                             "test_accuracy", "bleu", "chrf", "bleu_signature", "chrf_signature",
                             "test_sentences_scored", "decoding"))
    metrics["train_loss_last_steps"] = float(np.mean(recent)) if recent else None
    return metrics


def _save_checkpoint(run_dir, model, train_step, state, clock, target, run_config, data_fingerprint, keep):
    # The figures so far are read before the checkpoint's own time starts counting apart.
    state.training_s, state.aside_s, state.evaluations = clock.training_s(), dict(clock.aside_s), target.evaluations
    with clock.aside("checkpoint"):
        train_step.finalize()  # a train step that keeps state outside the Keras variables writes it back
        return run_dir.save(model, state, run_config, data_fingerprint, keep)


def _write_result(path, result, stopwatch, backend):
    result["timing"]["phases_s"] = dict(stopwatch.phases)
    result["timing"]["total_s"] = stopwatch.total()
    result["memory"] = {"peak_host_bytes": peak_host_bytes(), "peak_device_bytes": backend.peak_device_bytes()}
    write_json_atomic(path, result)


def _raise_for_stop(status, reason, out, checkpoint, run_dir, signals):
    saved = f"partial result in {out}"
    if checkpoint:
        saved += f", checkpoint {checkpoint}; continue with: mtbench train --resume {run_dir.path}"
    if status == "diverged":
        raise RunFailure(f"training diverged: {reason}; {saved}")
    raise RunInterrupted(f"interrupted: {reason}; {saved}", signals.exit_code)
