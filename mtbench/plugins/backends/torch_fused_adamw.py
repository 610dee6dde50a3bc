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

float16 trains through Keras's `LossScaleOptimizer` around the AdamW, carried out here as JAX's compiled step
carries it out, without a host wait (Keras's own `apply` on torch branches in Python on whether the gradients are
finite, a read of the device every step). The scale and its growth counter are Keras's variables, updated in place
by the kernels torch's `GradScaler` uses (`DynamicLossScale`); the fused kernel skips the update where a gradient
is not finite (`found_inf`) and takes its step count back; Keras's `iterations` advances by the steps applied, and
the learning rate is Keras's schedule read at that count on the device (`schedule_on_device`). One thing the host
cannot know without waiting: the epsilon handed to torch (above) is corrected for the steps attempted, so after a
skipped step it is a little smaller than Keras's, which changes the update of a weight only where its gradients are
of epsilon's order (1e-8); the run records how many steps were skipped.
"""

import collections
import math

from mtbench.plugins.backends.keras_optimizer import inner_optimizer, moments_of, scales_losses


def fused_adamw_unsupported(optimizer, variables=()):
    """Why `optimizer` cannot be carried out by `FusedAdamW` over `variables` (None when it can). 16-bit weights
    (`--dtype bfloat16` or `float16`) are left to Keras: its AdamW updates them in their own dtype, as JAX's step
    does (Keras's optimizer there), where torch's fused kernel would compute in float32, other arithmetic. Keras's
    torch form of the update (`torch_adam`'s foreach operations) orders the moments' arithmetic otherwise than
    its form on JAX, which in 16 bits rounds otherwise: the reason says so."""
    import keras
    sixteen_bit = sorted({str(variable.dtype) for variable in variables} & {"bfloat16", "float16"})
    if sixteen_bit:
        return (f"{sixteen_bit[0]} weights, which Keras's AdamW updates in {sixteen_bit[0]} as on JAX, in its torch "
                f"form: m*beta_1 + g*(1-beta_1) where JAX's is m + (g-m)*(1-beta_1), rounded otherwise")
    optimizer = inner_optimizer(optimizer)
    if not isinstance(optimizer, keras.optimizers.AdamW):
        return f"{type(optimizer).__name__} is not AdamW"
    if optimizer.amsgrad or optimizer.use_ema or optimizer.gradient_accumulation_steps:
        return "amsgrad, EMA and gradient accumulation are left to Keras"
    if optimizer.clipvalue:
        return "clipping by value is left to Keras"
    return None


class DynamicLossScale:
    """Keras's `LossScaleOptimizer` scale, in its own variables, updated on the device by the kernels torch's
    `GradScaler` uses: a step whose gradients are all finite counts towards growth (the scale doubles after
    `dynamic_growth_steps` of them in a row), one that is not halves the scale and starts the count again, Keras's
    rule to the step. Gradients are unscaled by multiplying by the scale's reciprocal, which for a power of two is
    Keras's division exactly."""

    def __init__(self, optimizer):
        import torch
        self.scale = optimizer.dynamic_scale.value
        self.counter = optimizer.step_counter.value
        self.growth_steps = optimizer.dynamic_growth_steps
        self.found_inf = torch.zeros((), dtype=torch.float32, device=self.scale.device)
        # torch's kernel counts in int32; Keras's counter (int64) is given every new count.
        self.growth_tracker = self.counter.to(torch.int32)

    def unscale(self, grads):
        """Divides `grads` by the scale in place; `found_inf` becomes 1 if any of them is not finite, else 0."""
        import torch
        self.found_inf.zero_()
        inverse = self.scale.double().reciprocal().float()
        by_dtype = collections.defaultdict(list)
        for grad in grads:
            by_dtype[grad.dtype].append(grad)
        for same_dtype in by_dtype.values():
            torch._amp_foreach_non_finite_check_and_unscale_(same_dtype, self.found_inf, inverse)

    def update(self):
        import torch
        torch._amp_update_scale_(self.scale, self.growth_tracker, self.found_inf, 2.0, 0.5, self.growth_steps)
        self.counter.copy_(self.growth_tracker)


class FusedAdamW:
    # What each process's kernel updates, where processes hold different parts of the model (a subclass's own).
    updates = ""

    def __init__(self, optimizer, variables, group=None):
        """`group`: the processes that each hold different gradients of one model (parts of split weights, shards,
        stages), whose norms and overflow verdicts a subclass combines; None where every process holds them all."""
        import torch
        self.variables = list(variables)
        self.group = group
        self.loss_scale = None
        if scales_losses(optimizer):
            if not optimizer.built:
                optimizer.build(self.variables)
            self.loss_scale = DynamicLossScale(optimizer)
            optimizer = inner_optimizer(optimizer)
        self.keras_optimizer = optimizer
        # Counted on the host from Keras's count (read once here: a restored checkpoint's, or 0): reading Keras's
        # counter or its schedule from a GPU would wait for the device every step.
        self.iterations = int(optimizer.iterations)
        if not optimizer.built:
            optimizer.build(self.variables)  # its moment variables are the state torch updates
        self.parameters = [self.updated_tensor(v.value) for v in self.variables]
        self.clipnorm, self.global_clipnorm = optimizer.clipnorm, optimizer.global_clipnorm
        # With loss scaling a step may be skipped, which the host learns only by waiting: the rate is read on the
        # device at Keras's count of the steps applied.
        self.learning_rate = (schedule_in_python(optimizer) if self.loss_scale is None else
                              schedule_on_device(optimizer, self.parameters[0].device))
        # Keras's exclusions (`exclude_from_weight_decay`: biases and norms) as a group without decay.
        decays = [bool(optimizer.weight_decay) and optimizer._use_weight_decay(v) for v in self.variables]
        groups = [{"params": [p for p, d in zip(self.parameters, decays) if d == decay],
                   "weight_decay": optimizer.weight_decay if decay else 0.0} for decay in (True, False)]
        self.torch_optimizer = torch.optim.AdamW(
            [group for group in groups if group["params"]], lr=0.0, betas=(optimizer.beta_1, optimizer.beta_2),
            eps=optimizer.epsilon, weight_decay=optimizer.weight_decay or 0.0, fused=True)
        for variable, parameter in zip(self.variables, self.parameters):
            momentum, velocity = moments_of(optimizer, variable)
            # The state torch would have after `iterations` steps (the fused kernel keeps `step` on the device), with
            # Keras's moment tensors instead of new ones.
            self.torch_optimizer.state[parameter] = {
                "step": torch.full((), float(self.iterations), dtype=torch.float32, device=parameter.device),
                "exp_avg": self.updated_tensor(momentum.value), "exp_avg_sq": self.updated_tensor(velocity.value)}

    def description(self):
        """What carries out the update, for `TrainStep.numerics`."""
        calls = len(self.torch_optimizer.param_groups)
        text = (f"Keras's AdamW by torch's fused AdamW kernel, {calls} call{'s' * (calls != 1)} a step (one a "
                f"parameter group)")
        if self.updates:
            text += f", {self.updates}"
        # The kernel's epsilon is a number set on the host each step, bias-corrected by the host's count: the steps
        # attempted, where Keras's count (and the kernel's own bias corrections) take the skipped ones back.
        return text + (", the loss scale updated on the device; epsilon's bias correction counts the steps attempted "
                       "(Keras's the steps applied: they part after a skipped step)"
                       if self.loss_scale is not None else "")

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

    def _global_squared_norm(self, grads):
        """The squared norm of `grads` all together (a subclass over gradients held by several processes sums theirs)."""
        import torch
        return torch.stack(torch._foreach_norm(grads)).square().sum()

    def _clip_together(self, grads):
        """Keras's `clip_by_global_norm`: every gradient times clip x min(1 / norm, 1 / clip), the norm of them all,
        computed on the device (no read)."""
        import torch
        norm = self._global_squared_norm(grads).sqrt()
        scale = self.global_clipnorm * torch.clamp(1.0 / norm, max=1.0 / self.global_clipnorm)
        torch._foreach_mul_(grads, scale + (norm - norm))  # NaN where the norm is not finite, as Keras

    def local_parts(self, grads):
        """The tensors of `grads` this process holds (a subclass over DTensors gives their local shards)."""
        return grads

    def agree_on_overflow(self, found_inf):
        """Makes every process's `found_inf` (1: a gradient it holds is not finite) the same, where the processes
        hold different gradients (`group`): the largest, in one all-reduce."""
        if self.group is not None:
            import torch.distributed as dist
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=self.group)

    def step(self):
        """Updates the variables from their `.grad`."""
        optimizer = self.keras_optimizer
        grads = [p.grad for p in self.parameters]
        if self.loss_scale is not None:
            self.loss_scale.unscale(self.local_parts(grads))
            self.agree_on_overflow(self.loss_scale.found_inf)
            # Read by torch's AdamW as `GradScaler.step` hands it over: the fused kernel leaves every weight and
            # moment as it was where it is 1, and takes back the step count it added.
            self.torch_optimizer.found_inf = self.loss_scale.found_inf
        if self.clipnorm:
            self._clip_each_gradient(grads)
        elif self.global_clipnorm:
            self._clip_together(grads)
        step = self.iterations + 1
        # The schedule at Keras's own iteration count (a device tensor with loss scaling).
        rate = self.learning_rate(self.iterations if self.loss_scale is None else optimizer.iterations.value)
        epsilon = optimizer.epsilon / math.sqrt(1 - optimizer.beta_2 ** step)
        for group in self.torch_optimizer.param_groups:  # with decay, and without (biases and norms)
            group["lr"], group["eps"] = rate, epsilon
        self.torch_optimizer.step()
        # In place on the device: `assign_add(1)` would make a tensor of 1 from host data every step.
        optimizer.iterations.value.add_(1)
        if self.loss_scale is not None:
            optimizer.iterations.value.sub_(self.loss_scale.found_inf.to(optimizer.iterations.value.dtype))
            self.loss_scale.update()
        self.iterations = step


def schedule_on_device(optimizer, device):
    """Keras's learning rate at an iteration count held on the device, as a function of that count (a 0-d integer
    tensor) computed without a host wait: a constant rate is its variable; mtbench's `WarmupCosineDecay` (or Keras's
    `CosineDecay` without warm-up), whose every operation is elementwise, is evaluated by Keras on the CPU at every
    iteration up to the one where it stops changing, once, into a table on the device that the count indexes. Any
    other schedule is Keras's, called on the count (a schedule that branches in Python waits for the device: the
    host-sync probe counts it)."""
    import keras
    import torch

    from mtbench.keras_models.schedules import WarmupCosineDecay
    rate = optimizer._learning_rate
    if not isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        return lambda iterations: rate.value
    elementwise = isinstance(rate, WarmupCosineDecay) or (
        type(rate) is keras.optimizers.schedules.CosineDecay and rate.warmup_target is None)
    if not elementwise:
        return lambda iterations: rate(iterations)
    last = rate.decay_steps + (rate.warmup_steps if rate.warmup_target is not None else 0)
    with keras.device("cpu"):
        table = rate(torch.arange(last + 1, dtype=torch.float32))
    table = torch.as_tensor(table, dtype=torch.float32).to(device)

    def rate_at(iterations):
        return table.index_select(0, iterations.clamp(max=last).reshape(1)).reshape(())

    return rate_at


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
