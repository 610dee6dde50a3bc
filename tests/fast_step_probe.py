"""Run by tests/plugins/backends/test_fast_train_steps.py in a fresh process for torch (keras fixes its backend at
import; for JAX the test calls `probe_report` in its own process, keras on JAX): trains two copies of the tiny model
on the same real batches, one with Keras's `train_on_batch`, one with the step the backend plugin makes, and prints
one JSON line of what the test compares, with the device it ran on and the arithmetic of its float32 matmuls there
(the test's tolerances depend on it). Tensors are made on the device of the variables they meet, and read back
through the host, so the probe runs on a GPU as on a CPU.

    python tests/fast_step_probe.py BACKEND CACHE_DIR
"""

import json
import os
import sys

STEPS = 5


def main(backend_name, cache_dir):
    print(json.dumps(probe_report(backend_name, cache_dir)))


def probe_report(backend_name, cache_dir):
    """What the test compares (`main` prints it), from this process: keras is imported on `backend_name` here,
    or must be on it already."""
    from mtbench.plugins import manager as plugins
    from mtbench import KerasTrainStep, RunContext
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import import_keras
    # max_len 32: every batch has one shape, so each step compiles once (48 gave two shapes and twice the compiles;
    # steps across length buckets are compared in the jax/torch parity check of `mtbench compare`).
    config = TrainConfig(backend=backend_name, preset="tiny", max_pairs=4000, valid_size=100, test_size=100,
                         max_len=32, batch_size=32, warmup_steps=1, cache_dir=cache_dir)
    backend = plugins.registry().backends[backend_name]
    keras = import_keras(config, backend)
    import numpy as np

    from benchmarks.workload import build_keras_model, prepare_workload
    workload = prepare_workload(config, STEPS + 1)
    train_batches, held_out = workload.batches[:STEPS], workload.batches[STEPS]
    run = RunContext(config=config, backend=backend, device=backend.device_info())

    def values(variables):
        return [np.array(keras.ops.convert_to_numpy(v.value)) for v in variables]

    def fused_adamw_calls(trace):
        """How many times torch's fused AdamW kernel ran in a profiler trace (None without one)."""
        return None if trace is None else sum(event.name == "aten::_fused_adamw_" for event in trace.events())

    def train(make_step, on=workload, count_fused_adamw=False):
        """`count_fused_adamw`: count the calls of torch's fused AdamW kernel under the profiler, whose recording
        and reading back of every event the other runs are spared."""
        model = build_keras_model(keras, on, total_steps=STEPS)
        initial = values(model.weights)
        step = make_step(model)
        trace = None
        if count_fused_adamw:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU]) as trace:
                losses = [float(step((b.source, b.target_input), b.target_output, b.weight)["loss"])
                          for b in train_batches]
        else:
            losses = [float(step((b.source, b.target_input), b.target_output, b.weight)["loss"])
                      for b in train_batches]
        step.finalize()
        logs = model.test_on_batch((held_out.source, held_out.target_input), held_out.target_output,
                                   sample_weight=held_out.weight, return_dict=True)
        return {"name": step.name, "losses": losses, "held_out_loss": float(logs["loss"]),
                "fused_adamw_calls": fused_adamw_calls(trace), "description": step.description(),
                "iterations": int(model.optimizer.iterations),
                "initial": initial, "weights": values(model.weights), "optimizer": values(model.optimizer.variables)}

    keras_run = train(KerasTrainStep)
    fast_run = train(lambda model: backend.make_train_step(run, model), count_fused_adamw=backend_name == "torch")

    def relative_distance(a, b):
        """|a - b| / |b| over all arrays together."""
        return float(np.sqrt(sum(np.sum((x - y) ** 2) for x, y in zip(a, b)) / sum(np.sum(y ** 2) for y in b)))

    from optimizer_exercise import float32_matmul_arithmetic
    report = {
        "device_kind": run.device["kind"],
        "matmul_arithmetic": float32_matmul_arithmetic(backend_name),
        "names": [keras_run["name"], fast_run["name"]],
        "keras_losses": keras_run["losses"], "fast_losses": fast_run["losses"],
        "held_out_losses": [keras_run["held_out_loss"], fast_run["held_out_loss"]],
        "iterations": [keras_run["iterations"], fast_run["iterations"]],
        "weights_distance": relative_distance(fast_run["weights"], keras_run["weights"]),
        "weights_moved": relative_distance(keras_run["weights"], keras_run["initial"]),
        "optimizer_distance": relative_distance(fast_run["optimizer"], keras_run["optimizer"]),
    }
    if backend_name == "torch":
        # Weights in bfloat16: the step's update is Keras's AdamW in their dtype, as JAX's step computes it.
        import dataclasses
        in_bfloat16 = dataclasses.replace(workload, config=dataclasses.replace(config, dtype="bfloat16"))
        bfloat16_run = train(lambda model: backend.make_train_step(run, model), on=in_bfloat16,
                             count_fused_adamw=True)
        report["bfloat16_update"] = bfloat16_run["description"]
        # What ran: the fused kernel each float32 step, never a bfloat16 one.
        report["fused_adamw_calls"] = {"float32": fast_run["fused_adamw_calls"],
                                       "bfloat16": bfloat16_run["fused_adamw_calls"]}
        keras.config.set_dtype_policy("float32")
        report["fused_adamw"] = fused_adamw_exercise()
        report["loss_scaled_fused_adamw"] = loss_scaled_fused_adamw_exercise()
    return report


def fused_adamw_exercise():
    """The torch step's fused AdamW against Keras's own `apply` on the optimizer exercise: the largest update
    difference relative to the update, per tensor."""
    import numpy as np
    import torch

    from mtbench.plugins.backends.torch_fused_adamw import FusedAdamW, fused_adamw_unsupported
    from optimizer_exercise import keras_optimizer_result, keras_variables, mtbench_optimizer, optimizer_exercise
    initial, grads = optimizer_exercise()
    expected, _ = keras_optimizer_result(initial, grads)
    optimizer = mtbench_optimizer()
    assert fused_adamw_unsupported(optimizer) is None
    variables = keras_variables(initial)
    fused = FusedAdamW(optimizer, variables.values())
    for step_grads in grads:
        for name, variable in variables.items():
            variable.value.grad = torch.from_numpy(step_grads[name].copy()).to(variable.value.device)
        with torch.no_grad():
            fused.step()
    differences = {}
    for name, variable in variables.items():
        moved = expected[name] - initial[name]
        got = variable.value.detach().cpu().numpy() - initial[name]
        differences[name] = float(np.abs(got - moved).max() / np.abs(moved).max())
    return {"relative_difference": differences, "iterations": int(optimizer.iterations)}


def loss_scaled_fused_adamw_exercise():
    """float16's loss scaling (Keras's `LossScaleOptimizer` around mtbench's AdamW) carried out by the torch step's
    fused AdamW against Keras's own `apply`, both handed the exercise's gradients times Keras's scale of the step,
    with the scale doubling after 2 finite steps: three finite steps (the scale grows after the second), a fourth
    whose gradients overflow, and a fifth. After the fourth and the fifth: each tensor's largest update difference
    relative to its update, the scale, growth count and iterations of both."""
    import numpy as np
    import torch
    from keras import ops

    from mtbench.plugins.backends.torch_fused_adamw import FusedAdamW, fused_adamw_unsupported
    from optimizer_exercise import keras_variables, mtbench_optimizer, optimizer_exercise
    initial, grads = optimizer_exercise()
    overflowing = {name: grad.copy() for name, grad in grads[0].items()}
    overflowing["ordinary"][0, 1] = np.inf
    steps = [*grads, overflowing, grads[1]]
    keras_optimizer, fused_optimizer = mtbench_optimizer("mixed_float16"), mtbench_optimizer("mixed_float16")
    assert fused_adamw_unsupported(fused_optimizer) is None
    for optimizer in (keras_optimizer, fused_optimizer):
        optimizer.dynamic_growth_steps = 2
    keras_variables_, fused_variables = keras_variables(initial), keras_variables(initial)
    fused = FusedAdamW(fused_optimizer, fused_variables.values())
    keras_optimizer.build(list(keras_variables_.values()))

    def state(optimizer):
        return {"scale": float(ops.convert_to_numpy(optimizer.dynamic_scale.value)),
                "growth_count": int(ops.convert_to_numpy(optimizer.step_counter.value)),
                "iterations": int(ops.convert_to_numpy(optimizer.iterations.value))}

    def differences(names):
        found = {}
        for name in names:
            expected = ops.convert_to_numpy(keras_variables_[name].value) - initial[name]
            got = ops.convert_to_numpy(fused_variables[name].value) - initial[name]
            found[name] = float(np.abs(got - expected).max() / np.abs(expected).max())
        return found

    report = {"scales_given": []}
    for index, step_grads in enumerate(steps):
        scale = state(keras_optimizer)["scale"]
        report["scales_given"].append(scale)
        keras_optimizer.apply([ops.convert_to_tensor(step_grads[name] * scale) for name in keras_variables_],
                              list(keras_variables_.values()))
        for name, variable in fused_variables.items():
            variable.value.grad = torch.from_numpy(step_grads[name] * np.float32(scale)).to(variable.value.device)
        with torch.no_grad():
            fused.step()
        if index == 3:
            report["after_overflow"] = {"relative_difference": differences(initial),
                                        "keras": state(keras_optimizer), "fused": state(fused_optimizer)}
    report["after_overflow_and_a_step"] = {"relative_difference": differences(initial),
                                           "keras": state(keras_optimizer), "fused": state(fused_optimizer)}
    return report


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(*sys.argv[1:])
