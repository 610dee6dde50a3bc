"""Keras's AdamW update carried out by torch's fused AdamW kernel, for the torch train step.

Keras's optimizer on torch updates with out-of-place `_foreach` operations (five full-size temporaries per step)
and clips each gradient with half a dozen separate operations per variable: on the `small` preset that is about
50 ms a step on one CPU core, against 7 ms for torch's fused AdamW. The two compute the same update but for where
epsilon sits: Keras divides by `sqrt(v) + eps` and folds the bias correction of `v` into the step size, torch
divides by `sqrt(v) / sqrt(1 - beta_2**t) + eps`. Giving torch `eps / sqrt(1 - beta_2**t)` at step t makes them
the same expression. Learning rate, clipping (each gradient on its own, Keras's `clipnorm`, or all together,
`global_clipnorm`), and the decoupled weight decay (`w *= 1 - lr * weight_decay`, before the moments, on the
variables Keras decays) are Keras's. The Keras optimizer's `iterations`
advances with every step, and a resumed run's optimizer (restored at its checkpoint's iteration count) goes on
from there: the step counts, bias corrections and schedule are those the uninterrupted run would have had. torch's optimizer state is the Keras optimizer's own moment variables, which the fused
kernel updates in place: one copy of the moments (a second one would count against torch's memory alone), and
Keras always holds the current ones.
"""

import math


def fused_adamw_unsupported(optimizer):
    """Why `optimizer` cannot be carried out by `FusedAdamW` (None when it can)."""
    import keras
    if not isinstance(optimizer, keras.optimizers.AdamW):
        return f"{type(optimizer).__name__} is not AdamW"
    if optimizer.amsgrad or optimizer.use_ema or optimizer.gradient_accumulation_steps:
        return "amsgrad, EMA and gradient accumulation are left to Keras"
    if optimizer.clipvalue:
        return "clipping by value is left to Keras"
    return None


class FusedAdamW:
    def __init__(self, optimizer, variables):
        import torch
        self.keras_optimizer = optimizer
        # Counted on the host from Keras's count (read once here: a restored checkpoint's, or 0): reading Keras's
        # counter or its schedule from a GPU would wait for the device every step.
        self.iterations = int(optimizer.iterations)
        self.variables = list(variables)
        if not optimizer.built:
            optimizer.build(self.variables)  # its moment variables are the state torch updates
        self.parameters = [self.updated_tensor(v.value) for v in self.variables]
        self.clipnorm, self.global_clipnorm = optimizer.clipnorm, optimizer.global_clipnorm
        self.learning_rate = schedule_in_python(optimizer)
        # Keras's exclusions (`exclude_from_weight_decay`: biases and norms) as a group without decay.
        decays = [bool(optimizer.weight_decay) and optimizer._use_weight_decay(v) for v in self.variables]
        groups = [{"params": [p for p, d in zip(self.parameters, decays) if d == decay],
                   "weight_decay": optimizer.weight_decay if decay else 0.0} for decay in (True, False)]
        self.torch_optimizer = torch.optim.AdamW(
            [group for group in groups if group["params"]], lr=0.0, betas=(optimizer.beta_1, optimizer.beta_2),
            eps=optimizer.epsilon, weight_decay=optimizer.weight_decay or 0.0, fused=True)
        for variable, parameter in zip(self.variables, self.parameters):
            index = optimizer._get_variable_index(variable)
            # The state torch would have after `iterations` steps (the fused kernel keeps `step` on the device), with
            # Keras's moment tensors instead of new ones.
            self.torch_optimizer.state[parameter] = {
                "step": torch.full((), float(self.iterations), dtype=torch.float32, device=parameter.device),
                "exp_avg": self.updated_tensor(optimizer._momentums[index].value),
                "exp_avg_sq": self.updated_tensor(optimizer._velocities[index].value)}

    @staticmethod
    def updated_tensor(value):
        """The tensor the fused kernel updates in place for a variable's (or a moment's) `value`: the value itself;
        a subclass over values split across processes (tensor-parallel) gives their local parts."""
        return value

    def _clip_each_gradient(self, grads):
        import torch
        scales = torch._foreach_clamp_min(torch._foreach_norm(grads), self.clipnorm)
        torch._foreach_reciprocal_(scales)
        torch._foreach_mul_(scales, self.clipnorm)
        torch._foreach_mul_(grads, scales)

    def _clip_together(self, grads):
        """Keras's `clip_by_global_norm`: every gradient times clip x min(1 / norm, 1 / clip), the norm of them all,
        computed on the device (no read)."""
        import torch
        norm = torch.stack(torch._foreach_norm(grads)).square().sum().sqrt()
        scale = self.global_clipnorm * torch.clamp(1.0 / norm, max=1.0 / self.global_clipnorm)
        torch._foreach_mul_(grads, scale + (norm - norm))  # NaN where the norm is not finite, as Keras

    def step(self):
        """Updates the variables from their `.grad`."""
        optimizer = self.keras_optimizer
        if self.clipnorm:
            self._clip_each_gradient([p.grad for p in self.parameters])
        elif self.global_clipnorm:
            self._clip_together([p.grad for p in self.parameters])
        step = self.iterations + 1
        rate = self.learning_rate(self.iterations)  # the schedule at Keras's own iteration count
        epsilon = optimizer.epsilon / math.sqrt(1 - optimizer.beta_2 ** step)
        for group in self.torch_optimizer.param_groups:  # with decay, and without (biases and norms)
            group["lr"], group["eps"] = rate, epsilon
        self.torch_optimizer.step()
        # In place on the device: `assign_add(1)` would make a tensor of 1 from host data every step.
        optimizer.iterations.value.add_(1)
        self.iterations = step


def schedule_in_python(optimizer):
    """Keras's learning rate at an iteration, as a function the step calls on the host without torch: a constant
    rate is the rate's own variable (a device tensor torch's fused kernel reads, so a rate assigned later is
    seen, and nothing is read back), a `CosineDecay` (what `compile_model` sets) is computed in numpy float32 as
    Keras computes it, and any other schedule is Keras's, evaluated on the CPU."""
    import keras

    from mtbench.keras_models.schedules import cosine_decay
    rate = optimizer._learning_rate
    if not isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        return lambda iteration: rate.value
    # Keras's own, or mtbench's branch-free `WarmupCosineDecay` (the same numbers).
    if isinstance(rate, keras.optimizers.schedules.CosineDecay):
        return lambda iteration: float(cosine_decay(rate, iteration))

    def keras_schedule(iteration):
        with keras.device("cpu"):
            return float(rate(iteration))

    return keras_schedule
