"""The result of one training run, assembled from what each stage gave: the section of training figures (written
as a partial result when training stopped early), then the evaluation's figures, then the file."""

import json
import os
import time

import numpy as np

from mtbench.errors import RunFailure, RunInterrupted
from mtbench.plugins.api import Backend
from mtbench.runner.files import write_json_atomic
from mtbench.runner.launch import devices_spanned, measuring_cpus
from mtbench.runner.measurement.environment import run_environment
from mtbench.runner.measurement.peaks import device_peak_record
from mtbench.runner.results.schema import SCHEMA_VERSION


def run_peak(config, run, backend, all_backends):
    """The peak MFU divides by (`device_peak_record`). A CPU's is measured once per CPU model, each backend's in a
    process of its own on this process's CPUs, so that no other framework is imported here: called before
    training, its time is a phase of its own and the run's energy and memory hold none of its matmuls."""
    return device_peak_record(backend, run.device, config.dtype, config.cache_dir, all_backends,
                              matmul_precision=config.matmul_precision, cpus=measuring_cpus())


def utilization(steady, backend, run, devices_used, config, all_backends, family, peak_record=None):
    """Model FLOP/s (as the model family `family` counts them) against the peak of the devices used (MFU);
    `peak_record`: `run_peak`'s (None: found now)."""
    peak_record = peak_record or run_peak(config, run, backend, all_backends)
    peak, peak_source = peak_record["flops_per_s"], peak_record["source"]
    # A CPU's measured peak spans all its cores, which a machine's processes and simulated devices share: one peak
    # a machine the run's processes span.
    peak_devices = machines_of(run.processes) if run.device_kind == "cpu" else devices_used
    def share_of_peak(flops_per_s):
        return None if peak is None or flops_per_s is None else flops_per_s / (peak * peak_devices)

    mfu = share_of_peak(steady["flops_per_s"])
    uncounted = f"model family '{family.name}' counts no training FLOPs (ModelFamily.training_flops)"
    counted = steady["flops_per_s"] is not None or not steady["steady_steps"]
    if mfu is not None:
        reason = None
    elif not steady["steady_steps"]:
        reason = "no steady steps"
    else:
        reason = peak_source if counted else uncounted
    return {
        "flops_per_step_note": f"ModelFamily.training_flops of model family '{family.name}' over each steady "
                               f"step's padded batch" if counted else f"not counted: {uncounted}",
        "model_flops_per_s": steady["flops_per_s"],
        # The useful work: the FLOPs of the steady steps' real tokens alone, as tokens/s counts them.
        "real_token_flops_per_s": steady["real_token_flops_per_s"],
        "peak_flops_per_s": peak, "peak_source": peak_source, "peak_devices": peak_devices, "mfu": mfu,
        "mfu_real_tokens": share_of_peak(steady["real_token_flops_per_s"]),
        "mfu_reason": reason,  # why MFU is null, else null
        # A measured (CPU) peak: when, and under what load; null for a datasheet's.
        "peak_measured_at": peak_record["measured_at"], "peak_load_average": peak_record["load_average"],
        "peak_cpus": peak_record.get("cpus"), "peak_threads": peak_record.get("threads"),
        "peak_other_processes_percent": peak_record.get("other_processes_percent"),
    }


def plugin_packages(config, plugins, registry):
    """{plugin: 'PACKAGE VERSION'} of the installed plugins whose backend, extras, dataset, model family, task or
    reporters the run used (mtbench's built-in ones are its own version)."""
    used = [("backends", plugins.backend.name), *(("extras", extra.name) for extra in plugins.extras),
            *(("reporters", reporter.name) for reporter in plugins.reporters),
            *([("models", plugins.model.name)] if plugins.model else []),
            *([("tasks", plugins.task.name)] if plugins.task else []),
            *([("datasets", config.dataset)] if config.dataset and not config.data_file else [])]
    return registry.packages_providing(used)


def machines_of(processes):
    """How many machines the run's processes span (a plugin's process group that kept no `launch`: one)."""
    launch = getattr(processes, "launch", None)
    return max(launch.num_processes // launch.local_processes, 1) if launch else 1


def way_of_training(extras):
    """What a run on another backend shares with this one when it trains the same way (`report`'s counterparts):
    how the extras lay the training over devices (`Extra.parallelism`), and the extras that several backends serve
    (fused attention, remat), which change the work. An extra of one backend alone (torch-compile) is that
    backend's own way of running its step, which a comparison of the frameworks leaves to each."""
    return {"parallelism": sorted({extra.parallelism for extra in extras if extra.parallelism}),
            "extras": sorted(extra.name for extra in extras if not extra.parallelism and len(extra.backends) > 1)}


def training_result(config, run, plugins, registry, data, built, outcome, weights_sha256, run_dir,
                    training_memory=None, peak_record=None):
    """Every section of the result that training decides; the task's metrics are null until `add_evaluation`
    fills them (`data`: the task's `TaskData`). `training_memory`: `device_memory.training_memory`, read as training
    ended; `peak_record`: `run_peak`'s, found before training (None: found now)."""
    extras_record = extras_records(run, plugins)
    devices_used = devices_spanned(extras_record.values())
    steady = outcome.timer.summary()
    state, clock = outcome.state, outcome.clock
    return {
        "schema_version": SCHEMA_VERSION,
        "status": outcome.status,
        "status_reason": outcome.reason,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "backend": plugins.backend.name,
        "extras": [extra.name for extra in plugins.extras],
        # The extras that change no random draw: a run with dropout draws the masks of the run without them.
        "extras_keeping_draws": [extra.name for extra in plugins.extras if extra.keeps_random_draws],
        "way_of_training": way_of_training(plugins.extras),
        "extras_record": extras_record,
        "devices_used": devices_used,
        # The run's processes: each trained on its shard of every global batch; tokens/s counts the global batch.
        "processes": {**run.processes.record(max(devices_used // run.processes.world_size, 1)),
                      "spanned_by": [extra.name for extra in plugins.extras if extra.spans_processes],
                      "cpu_share": run.cpu_share, "machines": machines_of(run.processes)},
        # The values used (the preset with the size flags over it, under "model") and what they add up to.
        # `model` is the shape built: a pretrained family's own, the vocabulary the tokenizer supports.
        "config": {**config.to_dict(), "model": built.model_shape.to_dict(), "initial_weights_sha256": weights_sha256,
                   "parameters": int(built.model.count_params()), "task": plugins.task.name},
        "compile_options": built.compile_record,
        "loss_scaling": loss_scaling_record(built.model.optimizer, len(state.history)),
        "train_step": built.train_step.name,
        "train_step_detail": step_description(built.train_step),
        # What the step computes its own way where the backends' steps may differ (layer norms, the update).
        "train_step_numerics": step_numerics(built.train_step),
        "train_step_chosen": run.step_choice,  # --step, and why auto chose as it did
        "dtype_chosen": run.dtype_choice,      # --dtype, and why auto chose as it did
        # Host waits inside one steady step (`Backend.host_sync_counter`), counted apart from the timed steps.
        "host_syncs_per_step": (outcome.host_syncs or {}).get("per_step"),
        "host_syncs": outcome.host_syncs,
        # --profile: the steps traced by the backend's profiler, apart from the timed steps, and the trace's files.
        "profile": outcome.profile,
        "env": {**run_environment(plugins.backend), "matmul_precision": run.matmul_precision,
                "plugins": plugin_packages(config, plugins, registry)},
        "data": data.record,
        # The data's fingerprint as its checkpoints keep it (the task's record beside it is the task's own): `--resume`
        # refuses other data by it, `rerun` names it.
        "data_fingerprint": data.fingerprint,
        "model": {"family": plugins.model.name,
                  "path": plugins.model_path and os.path.abspath(plugins.model_path),
                  "parameters": int(built.model.count_params()), **built.model_shape.to_dict(),
                  "dtype_policy": built.model.dtype_policy.name,
                  # how the starting weights were drawn (--init's scheme), 'pretrained', None: a file that says not
                  "init": built.init,
                  "init_description": built.init_description,
                  "attention": attention_implementations(run, plugins.model, built.model),
                  "inference": inference_of(plugins.backend),
                  # the task's test figures of the starting weights (pretrained models only)
                  "before_training": built.before_training,
                  "saved": None},
        "timing": {
            **steady,
            "steps": len(state.history),
            "epochs_seen": state.epoch + 1,
            "train_s": clock.training_s(),
            "validation_s": clock.aside_s.get("validation", 0.0),
            "checkpoint_s": clock.aside_s.get("checkpoint", 0.0),
            "host_sync_probe_s": clock.aside_s.get("host_sync_probe", 0.0),
            "profiled_s": clock.aside_s.get("profiled", 0.0),
            "resumed_at_steps": state.resumed_at_steps,
            "timing_window": config.timing_window,
            "clock": f"time.perf_counter around windows of up to {config.timing_window} steady steps, the device "
                     "synchronised (and the losses read) at each window's edges, the first step of each shape "
                     "alone; a step's seconds are its window's mean; train_s is the training wall time of every "
                     "process of the run, validation, checkpoints, the host-sync probe's step and --profile's steps "
                     "apart",
            # Every XLA compilation during the steps (None where the backend compiles nothing ahead of time);
            # the first step of a run also compiles a few one-time helper programs.
            "compilations_by_shape": outcome.timer.compilations_by_shape(),
            "compile_cache": compile_cache_section(run),
        },
        "utilization": utilization(steady, plugins.backend, run, devices_used, config,
                                   registry.backends.values(), plugins.model, peak_record),
        "memory": {"training": training_memory},
        "target": outcome.target.to_dict(),
        "metrics": _metrics_so_far(plugins.task.metrics, state.history),
        "history": state.history,
        "run_dir": os.path.abspath(run_dir.path) if outcome.checkpoint else None,
        "checkpoint": outcome.checkpoint and os.path.abspath(outcome.checkpoint),
        **dict.fromkeys(plugins.task.result_files),
    }


def loss_scaling_record(optimizer, steps):
    """What float16's dynamic loss scaling (Keras's `LossScaleOptimizer`, carried out by either backend's step) did
    over the run's `steps`, read once after training; None for a run without it."""
    if not hasattr(optimizer, "dynamic_scale"):
        return None
    return {"initial_scale": float(optimizer.initial_scale), "growth_steps": int(optimizer.dynamic_growth_steps),
            "final_scale": float(optimizer.dynamic_scale.numpy()),
            # The optimizer counts the updates applied; a step whose gradients overflowed applied none.
            "steps_skipped": steps - int(optimizer.iterations.numpy())}


def step_description(step):
    """How the train step ran, in its own words (`TrainStep.description`). One that raises, a plugin's, takes no
    trained run down: the detail says which code failed, and every report of the run shows it."""
    return _step_said(step, "description", "",
                      lambda text: None if isinstance(text, str) else f"it returned {type(text).__name__}, not a str")


NUMERICS_KEYS = ("layer_norm", "optimizer_update", "rounding_16_bit")


def step_numerics(step):
    """{key: text} of what the step computes its own way (`TrainStep.numerics`; a step from before it: {}). One
    that fails, or says something else, has each key say so: the run's figures are kept."""
    said = _step_said(step, "numerics", {}, _numerics_error)
    return dict.fromkeys(NUMERICS_KEYS, said) if isinstance(said, str) else said


def _numerics_error(said):
    if not isinstance(said, dict):
        return f"it returned {type(said).__name__}, not a dict"
    for key, text in said.items():
        if key not in NUMERICS_KEYS:
            return f"it returned the key {key!r}, not one of {', '.join(NUMERICS_KEYS)}"
        if not isinstance(text, str):
            return f"its {key!r} is {type(text).__name__}, not a str"
    return None


def _step_said(step, method, default, error_of):
    """What the step's `method` returned, called after training; where it raised, or returned what `error_of`
    finds wrong, 'not described: ...' with the code that failed (a plugin's own, after training: the figures are
    safe)."""
    try:
        said = getattr(step, method, lambda: default)()
        error = error_of(said)
        if error:
            raise TypeError(error)
        return said
    except Exception as error:
        where = f"{type(step).__module__}.{type(step).__qualname__}.{method}()"
        return f"not described: {where} failed: {type(error).__name__}: {error}"


# The key of an extra's `extras_record` entry when its `record` failed: the failure, in place of a record.
RECORD_FAILED = "record_failed"


def extras_records(run, plugins):
    """{extra: its `record(run)`}. A record that raises, or that is no JSON object, takes nothing else down: the
    extra's entry is {RECORD_FAILED: the failure, naming the extra and its plugin} and the result is still written
    (see `record_failures`)."""
    records = {}
    for extra in plugins.extras:
        try:
            record = extra.record(run)
            if not isinstance(record, dict):
                raise TypeError(f"it returned {type(record).__name__}, not a dict")
            try:  # NaN or an infinity is no JSON: written bare, it would make the result file unreadable
                json.dumps(record, allow_nan=False)
            except ValueError as error:
                raise ValueError(f"{error} (a record says a non-finite number as null)") from None
        except Exception as error:  # an extra's own code, after training: the run's figures are safe
            plugin = plugins.registry.provider.get(("extras", extra.name), "?")
            record = {RECORD_FAILED: f"extra '{extra.name}' of plugin '{plugin}' failed in record: "
                                     f"{type(error).__name__}: {error}"}
        records[extra.name] = record
    return records


def record_failures(result, result_path):
    """A line for each extra whose record failed: the command ends with them (exit code 3, as for reporters)."""
    return [f"{record[RECORD_FAILED]}; the result is in {result_path}, with this failure as extras_record['{name}']"
            for name, record in result["extras_record"].items() if RECORD_FAILED in record]


def attention_implementations(run, family, model):
    """What each kind of attention ran: the causal self-attention of the decoder, the attentions with a padding
    mask, and incremental decoding (`setup.choose_attention_kernels`, from what the extras asked for; a fused
    kernel is asked for only by an extra that verifies it ran). Only the kinds the model family's model runs
    (`ModelFamily.attention_kinds`): none for a model without attention, or one whose attention mtbench does not
    hold to a kernel. With them, the arithmetic of the training attention where the model's attention is
    mtbench's own layer (`keras_models.transformer.attention_arithmetic`)."""
    from mtbench.keras_models.transformer import attention_arithmetic
    kinds = {kind: name for kind, name in run.attention.items() if kind in family.attention_kinds}
    if kinds:  # and what the backend held the process to (torch's SDPA switches), beside the kinds
        kinds.update({key: value for key, value in run.attention.items() if key not in ("causal", "masked", "decoding")})
        arithmetic = attention_arithmetic(model)
        if arithmetic:
            kinds["arithmetic"] = arithmetic
        chosen = getattr(run, "attention_choice", None)  # --attention, and why auto chose as it did
        if chosen:
            kinds["chosen"] = chosen
    return kinds


def inference_of(backend):
    """How the backend runs the model for inference (test translations, samples): its own words
    (`Backend.inference`); 'eager' where it keeps the API's default `compile_inference`; None where it compiles
    its own way and says nothing."""
    if backend.inference:
        return backend.inference
    return "eager" if type(backend).compile_inference is Backend.compile_inference else None


def compile_cache_section(run):
    """The persistent compilation cache: its state as the run started (`state`: whether it held any program),
    what it holds now, and this process's own hits and misses. A run of several processes adds every process's
    (`every_process`): JAX writes its cache from process 0 alone and keys a CPU program by the devices of the
    process that compiles it, so the others may compile every program while process 0 loads each. `programs`
    says whether the run's programs came from the cache, by every process's lookups: 'warm' (every lookup hit),
    'cold' (none did), 'partly warm', or None where the backend does not count lookups. None where the backend
    has no such cache. Every process of the run calls it at the same point."""
    opened = run.compile_cache
    if opened is None:
        return None
    lookups = {"hits": None, "misses": None}
    entries_after = None
    if opened["dir"] is not None:
        lookups.update(run.backend.compile_cache_hits() or {})
        entries_after = run.backend.compile_cache_entries(opened["dir"])
    section = {**opened, "entries_after": entries_after, **lookups}
    if run.processes.world_size > 1:
        section["every_process"] = lookups = every_process_lookups(run.processes, **lookups)
    section["programs"] = programs_state(lookups["hits"], lookups["misses"]) if lookups else None
    return section


def every_process_lookups(processes, hits, misses):
    """The cache lookups of every process of the run summed, or None where any process counts none."""
    counted = hits is not None and misses is not None
    every = processes.sum([counted, hits if counted else 0, misses if counted else 0])
    if every[0] < processes.world_size:
        return None
    return {"processes": processes.world_size, "hits": int(every[1]), "misses": int(every[2])}


def programs_state(hits, misses):
    """Whether a run's compiled programs came from the persistent cache, by its lookups."""
    if hits is None or misses is None or hits + misses == 0:
        return None
    return "warm" if not misses else "cold" if not hits else "partly warm"


def _metrics_so_far(task_metrics, history):
    """The metrics of a run whose evaluation has not run yet: the task's, null, and the training loss of the last
    steps."""
    recent = [h["loss"] for h in history[-50:] if h["loss"] is not None]
    metrics = dict.fromkeys(task_metrics)
    metrics["train_loss_last_steps"] = float(np.mean(recent)) if recent else None
    return metrics


def add_evaluation(result, metrics, sidecar):
    """Fills the metrics with the task's evaluation (`Evaluator.evaluate`), and adds what it wrote beside the
    result (translation: the hypotheses and references files)."""
    result["metrics"].update(metrics)
    result.update(sidecar)


def write_result(path, result, stopwatch, price_per_hour):
    """Adds the figures of the whole run (time, cost) and writes the result file. The total leaves out the `peak`
    phase: measuring a CPU's matmul peak is the machine's, once, and would make the first run of a comparison on a
    new machine look slower than the others (`phases_s` keeps it)."""
    result["timing"]["phases_s"] = dict(stopwatch.phases)
    result["timing"]["total_s"] = stopwatch.total() - stopwatch.phases.get("peak", 0.0)
    result["cost"] = cost(price_per_hour, result["timing"]["total_s"], result["target"],
                          result["processes"].get("machines", 1))
    write_json_atomic(path, result)


def cost(price_per_hour, total_s, target, machines=1):
    """What the run cost at `price_per_hour` (USD, per machine) on its `machines`: this process's run, and the
    training time to the target quality when one was reached."""
    if price_per_hour is None:
        return {"price_per_hour": None, "reason": "no --price-per-hour (or MTBENCH_PRICE_PER_HOUR) was given"}
    reached = target["time_to_target_s"] if target else None
    return {"price_per_hour": price_per_hour, "currency": "USD", "reason": None, "machines": machines,
            "usd": price_per_hour * machines * total_s / 3600,
            "usd_to_target": None if reached is None else price_per_hour * machines * reached / 3600}


def continue_with(run_dir, processes=1):
    """'continue with: mtbench train --resume DIR': how a stopped run goes on (a run of several processes: with the
    launcher that started them)."""
    relaunch = "" if processes == 1 else f"the launcher of its {processes} processes, "
    return f"continue with: {relaunch}mtbench train --resume {run_dir}"


def stop_error(outcome, out, run_dir, processes=1, failures=()):
    """The error a run that stopped early ends with, naming its partial result, how to continue it (a run of
    several processes: with the launcher that started them) and the reporters that failed on the partial result."""
    saved = f"partial result in {out}"
    if outcome.checkpoint:
        saved += f", checkpoint {outcome.checkpoint}; {continue_with(run_dir.path, processes)}"
    if failures:
        saved += "; and " + "; ".join(failures)
    if outcome.status == "diverged":
        return RunFailure(f"training diverged: {outcome.reason}; {saved}")
    if outcome.status == "failed":
        return RunFailure(f"training failed {outcome.reason}; {saved}")
    return RunInterrupted(f"interrupted: {outcome.reason}; {saved}", outcome.exit_code)


def eager_torch_note(result):
    """For `mtbench train`: one line where torch trained eager on a CUDA GPU without being asked to (`--step auto`
    whose extras refused the compiled step), where its best users compile it; None for any other run."""
    device = (result.get("env") or {}).get("device") or {}
    chosen = result.get("train_step_chosen") or {}
    if result.get("backend") != "torch" or device.get("kind") != "gpu" or chosen.get("asked") != "auto" \
            or chosen.get("by_extra"):
        return None
    return (f"note: torch trained its step eager on a CUDA GPU, where its best users compile it (JAX's step is "
            f"compiled): {chosen.get('why_not')}")
