"""One training run, top to bottom: choose the backend, read and tokenise the corpus, build the model from
numpy-drawn weights, train with honest timing, evaluate, translate the test set, and write the result."""

import dataclasses
import math
import os
import time

import numpy as np

from mtbench.errors import MtbenchError, RunFailure
from mtbench.plugins.api import KerasTrainStep, RunContext
from mtbench.runner import results as results_module
from mtbench.runner.batches import batches_per_epoch, encode_split, training_batches
from mtbench.runner.data import load_corpus
from mtbench.runner.files import write_json_atomic, write_text_atomic
from mtbench.runner.hardware import peak_host_bytes
from mtbench.runner.progress import corpus_progress, training_progress
from mtbench.runner.timing import Stopwatch, StepTimer

TRAIN_LOSS_SAMPLE = 500  # training pairs re-evaluated with the final weights, comparable to val/test loss


def resolve_backend(name, registry):
    if name not in registry.backends:
        raise MtbenchError(f"unknown backend '{name}'; available: {', '.join(sorted(registry.backends))}")
    backend = registry.backends[name]
    reason = backend.missing_framework()
    if reason:
        raise MtbenchError(reason)
    return backend


def resolve_extras(names, backend, registry):
    """The requested extras, checked for existence, backend and conflicts before anything is imported."""
    extras = []
    for name in names:
        if name not in registry.extras:
            available = ", ".join(sorted(registry.extras)) or "none installed"
            raise MtbenchError(f"unknown extra '{name}'; available: {available}")
        extra = registry.extras[name]
        if backend.name not in extra.backends:
            raise MtbenchError(f"extra '{name}' serves the {', '.join(extra.backends)} backend(s), "
                               f"not '{backend.name}'")
        extras.append(extra)
    for extra in extras:
        clash = [other for other in names if other in extra.conflicts]
        if clash:
            raise MtbenchError(f"extra '{extra.name}' cannot run together with '{clash[0]}'")
    return extras


def check_output_path(config):
    if os.path.isdir(config.out):
        raise MtbenchError(f"{config.out}: is a directory; --out takes a .json file path")
    if os.path.exists(config.out) and not config.overwrite:
        raise MtbenchError(f"{config.out}: already exists; pass --overwrite to replace it")
    parent = os.path.dirname(os.path.abspath(config.out))
    existing = parent
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK):
        raise MtbenchError(f"{config.out}: cannot write into {existing}")


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


def run_training(config, registry, console):
    stopwatch = Stopwatch()
    backend = resolve_backend(config.backend, registry)
    extras = resolve_extras(config.extras, backend, registry)
    check_output_path(config)

    keras = prepare_process(config, backend, extras)
    from mtbench.keras_models.initialization import assign_weights, initial_weights
    from mtbench.keras_models.transformer import build_transformer
    from mtbench.runner.decoding import greedy_decoder
    from mtbench.runner.evaluation import loss_and_accuracy, translate_and_score
    from mtbench.runner.tokenizer import load_or_train_tokenizer

    run = RunContext(config=config, backend=backend, device=backend.device_info())
    for extra in extras:
        reason = extra.unavailable_reason(run)
        if reason:
            raise MtbenchError(f"{extra.name}: {reason}")

    for extra in extras:
        extra.adjust_config(run)

    with stopwatch.phase("data"), corpus_progress(console) as progress:
        corpus = load_corpus(config, registry.datasets, progress)
    with stopwatch.phase("tokenizer"):
        tokenizer = load_or_train_tokenizer(corpus.train, config.vocab_size, config.cache_dir)
        train_split = encode_split(corpus.train, tokenizer, config.max_len)
        valid_split = encode_split(corpus.valid, tokenizer, config.max_len)
        test_split = encode_split(corpus.test, tokenizer, config.max_len)
        train_eval_pairs = corpus.train[:TRAIN_LOSS_SAMPLE]
        train_eval_split = encode_split(train_eval_pairs, tokenizer, config.max_len)
    if len(valid_split) == 0 or len(test_split) == 0:
        raise MtbenchError(f"every validation or test pair is longer than --max-len {config.max_len} tokens")
    if config.epochs is not None:
        total_steps = max(1, math.ceil(config.epochs * batches_per_epoch(train_split, config.batch_size,
                                                                         config.max_len)))
    else:
        total_steps = config.steps
    try:
        batches = training_batches(train_split, config.batch_size, config.max_len, config.seed)
    except ValueError as error:
        raise MtbenchError(str(error)) from None

    with stopwatch.phase("build"):
        keras.utils.set_random_seed(config.seed)
        keras.config.set_dtype_policy(config.dtype)
        for extra in extras:
            extra.before_model(run)
        model_shape = dataclasses.replace(config.model, vocab_size=tokenizer.vocab_size)
        model = build_transformer(model_shape, **run.model_options)
        assign_weights(model, initial_weights(model, config.seed))
        compile_options = {}
        for extra in extras:
            compile_options.update(extra.compile_options(run))
        compile_options = compile_model(keras, model, config, total_steps, compile_options)
        train_step = backend.make_train_step(run, model) or KerasTrainStep(model)
        for extra in extras:
            train_step = extra.make_train_step(run, model) or train_step
        _, first_batch = next(training_batches(train_split, config.batch_size, config.max_len, config.seed))
        for extra in extras:
            reason = extra.verify(run, model, first_batch)
            if reason:
                raise RunFailure(f"{extra.name}: {reason}")

    callbacks = keras.callbacks.CallbackList(registry.keras_callbacks(config), model=model)
    timer = StepTimer()
    history = []
    epoch = 0
    callbacks.on_train_begin()
    with stopwatch.phase("train"), training_progress(console, total_steps) as progress:
        for step in range(1, total_steps + 1):
            epoch, batch = next(batches)
            callbacks.on_train_batch_begin(step)
            backend.synchronize(model)
            t0 = time.perf_counter()
            logs = train_step((batch.source, batch.target_input), batch.target_output, batch.weight)
            backend.synchronize(model)
            seconds = time.perf_counter() - t0
            loss, accuracy = float(logs["loss"]), float(logs["accuracy"])
            timer.add(step, batch.shape, seconds, batch.target_tokens)
            history.append({"step": step, "epoch": epoch, "loss": loss, "accuracy": accuracy,
                            "seconds": seconds, "shape": list(batch.shape)})
            callbacks.on_train_batch_end(step, {"loss": loss, "accuracy": accuracy})
            if not math.isfinite(loss):
                raise RunFailure(f"training diverged at step {step}: loss is {loss}")
            progress.advance(loss, batch.target_tokens / seconds)
    callbacks.on_train_end()
    train_step.finalize()

    with stopwatch.phase("evaluate"):
        batch_rows = config.batch_size
        train_loss, train_accuracy = loss_and_accuracy(model, train_eval_split, batch_rows, config.max_len)
        val_loss, val_accuracy = loss_and_accuracy(model, valid_split, batch_rows, config.max_len)
        test_loss, test_accuracy = loss_and_accuracy(model, test_split, batch_rows, config.max_len)
    with stopwatch.phase("translate"):
        decode = backend.compile_inference(greedy_decoder(model), model)
        scores = translate_and_score(decode, tokenizer, test_split, corpus.test, config.decode_batch_size,
                                     config.max_len)

    hypotheses_file, references_file = results_module.sidecar_paths(config.out)
    write_text_atomic(hypotheses_file, "".join(h + "\n" for h in scores.hypotheses))
    write_text_atomic(references_file, "".join(r + "\n" for r in scores.references))
    steady = timer.summary()
    extras_record = {extra.name: extra.record(run) for extra in extras}
    result = {
        "schema_version": results_module.SCHEMA_VERSION,
        "status": "completed",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "backend": backend.name,
        "extras": [extra.name for extra in extras],
        "extras_record": extras_record,
        "devices_used": max([record.get("devices", 1) for record in extras_record.values()] + [1]),
        "config": config.to_dict(),
        "compile_options": compile_options,
        "train_step": train_step.name,
        "env": results_module.environment(backend),
        "data": {
            "corpus": corpus.name, "origin": corpus.origin, "pairs": corpus.sizes(),
            "dropped_too_long": {"train": train_split.dropped_too_long, "valid": valid_split.dropped_too_long,
                                 "test": test_split.dropped_too_long},
            "tokenizer": {"type": "sentencepiece-unigram", "vocab_size": tokenizer.vocab_size,
                          "file": tokenizer.path},
        },
        "model": {"parameters": int(model.count_params()), **model_shape.to_dict()},
        "timing": {
            **steady,
            "steps": total_steps,
            "epochs_seen": epoch + 1,
            "train_s": stopwatch.phases["train"],
            "phases_s": dict(stopwatch.phases),
            "total_s": stopwatch.total(),
            "clock": "time.perf_counter around each step, device synchronised before and after",
        },
        "memory": {"peak_host_bytes": peak_host_bytes(), "peak_device_bytes": backend.peak_device_bytes()},
        "metrics": {
            "train_loss": train_loss, "train_accuracy": train_accuracy,
            "train_loss_last_steps": float(np.mean([h["loss"] for h in history[-50:]])),
            "val_loss": val_loss, "val_accuracy": val_accuracy,
            "test_loss": test_loss, "test_accuracy": test_accuracy,
            "bleu": scores.bleu, "chrf": scores.chrf,
            "bleu_signature": scores.bleu_signature, "chrf_signature": scores.chrf_signature,
            "test_sentences_scored": len(scores.hypotheses),
        },
        "history": history,
        "hypotheses_file": os.path.abspath(hypotheses_file),
        "references_file": os.path.abspath(references_file),
    }
    write_json_atomic(config.out, result)
    return result
