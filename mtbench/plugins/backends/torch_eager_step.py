"""mtbench's default train step on torch: the Keras model (a `torch.nn.Module`) called eagerly, a native torch
loss and `backward`, and Keras's AdamW carried out by torch's fused kernel (`torch_fused_adamw`), without the
per-call bookkeeping of `train_on_batch` (build checks, metric resets, compiled-loss and metric trackers). An
optimizer the fused kernel cannot carry out exactly is applied by Keras (`optimizer.apply`).

Keras's sparse cross-entropy on torch moves the class axis of the (batch, length, vocabulary) logits to
position 1 before `F.cross_entropy`, so the log-softmax and its gradient run over strided memory and the logits
are copied; on the `small` preset that is about a tenth of a CPU step. The loss `compile_model` sets (token-mean
cross-entropy from logits) is computed here over contiguous rows instead: the same numbers, faster. Any other
compiled loss is called as Keras would call it.

The forward pass, loss and accuracy are one method, `_loss_and_accuracy`, called through `self._forward`, so
that the compiled step (`torch_compiled_step`) can replace exactly that part and share the rest.
"""

import collections
import contextlib

from mtbench import TrainStep
from mtbench.plugins.backends.compiled_loss import is_token_mean_cross_entropy, refuse_accumulating_other_losses
from mtbench.plugins.backends.keras_optimizer import inner_optimizer, scales_losses
from mtbench.plugins.backends.layer_norm_rows import forms_text, layer_norms
from mtbench.plugins.backends.rounding_16_bit import EAGER_ROUNDING, NO_16_BIT, computes_in_16_bits
from mtbench.plugins.backends.torch_fused_adamw import FusedAdamW, fused_adamw_unsupported
from mtbench.plugins.backends.torch_host_syncs import keras_constants_on_device
from mtbench.plugins.backends.torch_plain_calls import plain_calls_unsupported, plain_layer_calls


def to_device(array, device):
    """A numpy batch array as a tensor on `device` without a host wait: on the CPU the array's own memory; on a
    GPU a copy into pinned (page-locked) host memory, then a non-blocking copy the device runs in order with the
    step (a copy from pageable memory would hold the host until the device had taken it)."""
    import numpy as np
    import torch
    if isinstance(array, torch.Tensor):
        return array.to(device, non_blocking=True)
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if torch.device(device).type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def separate_dropout_streams(replica):
    """Keras's dropout layers draw their masks on torch from torch's generator, which every process seeded alike
    (`keras.utils.set_random_seed`): data replica `replica` (its index along the data axis) moves it that many
    seeds on, so that each replica drops its own rows with masks of its own, as each shard of JAX's data-parallel
    step does (`jax_jit_step.shard_seeds`). The processes of a model axis keep one stream: they drop the
    activations they each hold whole alike."""
    import torch
    if replica:
        torch.manual_seed(torch.initial_seed() + replica)


def correct_tokens(labels, logits, weight):
    """Weighted count of tokens whose label has the largest logit: a max and a gather, about a quarter of
    `argmax`'s time over the (batch, length, vocabulary) logits on the CPU. It differs from argmax's count
    only on an exact tie with the label's logit."""
    label_logits = logits.gather(-1, labels[..., None].long())[..., 0]
    return ((label_logits >= logits.amax(-1)) * weight).sum()


WELFORD = "Welford's one pass, in float32"
# Keras's `LossScaleOptimizer.apply` on torch branches in Python (`ops.cond`) on whether the gradients are finite and
# then on whether the scale grows: each a read of the device, where torch's fused AdamW (float32 weights) reads none.
LOSS_SCALE_WAITS = ("the loss scale kept by Keras's `cond`, which waits on the host each step to read whether the "
                    "gradients are finite (and whether the scale grows)")


def layer_norm_text(model, form_of=None, kernel="torch's layer_norm"):
    """How the torch steps compute the statistics of `model`'s layer norms: torch's `layer_norm` kernel (Welford's
    one pass, in float32) for every norm whose `call` reaches it (Keras's own class over contiguous axes without RMS
    scaling, through mtbench's kernel or Keras's torch backend), the others by their own `call`. `form_of(norm)`:
    the words for how a norm that reaches the kernel is computed where another than torch's kernel computes it (the
    compiled step's inductor), by `kernel`."""
    import keras
    norms = layer_norms(model)

    def reaches_kernel(norm):
        axes = sorted(norm.axis if isinstance(norm.axis, (list, tuple)) else [norm.axis])
        contiguous = all(later - earlier == 1 for earlier, later in zip(axes, axes[1:]))
        return type(norm).call is keras.layers.LayerNormalization.call and not norm.rms_scaling and contiguous

    reaching = [norm for norm in norms if reaches_kernel(norm)]
    forms = collections.Counter(map(form_of or (lambda norm: WELFORD), reaching)) or collections.Counter({WELFORD: 0})
    own_call = len(norms) - len(reaching)  # said once, beside the first form
    return "; ".join(forms_text(form, count, 0 if index else own_call, len(norms), kernel=kernel)
                     for index, (form, count) in enumerate(forms.items()))


class OwnLosses:
    """`model.losses` (what `add_loss` added in the last call, and the weights' regularization), without walking
    the model's layers every step: the layers and the regularized weights are listed once (a built model gains
    none while it trains)."""

    def __init__(self, model):
        self.model = model
        self.layers = list(model._flatten_layers(include_self=True))
        self.regularized = [v for v in model.trainable_weights if v.regularizer is not None]

    def __call__(self):
        if self.model._losses_override:
            return list(self.model._losses_override)
        losses = [loss for layer in self.layers if layer._losses for loss in layer._losses]
        return losses + [variable.regularizer(variable) for variable in self.regularized]


class EagerTorchTrainStep(TrainStep):
    name = "torch-eager"
    # Whether later work may overwrite the memory of a step's loss and accuracy (a compiled step's: see
    # torch_compiled_step), so that the step returns copies: two kernels a step that the eager step saves.
    outputs_overwritten = False

    def __init__(self, model, micro_batches=1):
        """`micro_batches`: the equal parts of each batch whose gradients a step sums before it updates."""
        self.model = model
        self.micro_batches = micro_batches
        self.variables = list(model.trainable_variables)
        self.own_losses = OwnLosses(model)
        self.native_loss = is_token_mean_cross_entropy(model.loss)
        refuse_accumulating_other_losses(micro_batches, self.native_loss, model.loss)
        if not model.optimizer.built:  # a restored checkpoint built it: building again would reset a loss scale
            model.optimizer.build(self.variables)
        # Why Keras's `optimizer.apply` updates the variables instead of torch's fused AdamW (None: it does not).
        self.fused_optimizer_refused = fused_adamw_unsupported(model.optimizer, self.variables)
        self.fused_optimizer = None if self.fused_optimizer_refused else FusedAdamW(model.optimizer, self.variables)
        self._forward = self._loss_and_accuracy
        # Why the layers must be called through `Layer.__call__` (None: they are called plainly).
        self.plain_calls_refused = plain_calls_unsupported(model)
        self.module = model     # what the forward pass calls: the model, or DistributedDataParallel around it
        self.processes = None   # the ProcessGroup of a step distributed over several processes
        # The torch group of the processes that hold different rows of the batch (None: every process), and
        # their count: the gradients are averaged over them.
        self.data_group, self.replicas = None, 1
        # What each micro-batch's forward and backward run under, given whether it is the step's last (None: DDP's
        # `no_sync` before the last, where the module has it); an extra's own (fsdp keeps its units gathered).
        self.micro_batch_context = None

    def distribute(self, processes, module, data_group=None):
        """Trains over several processes (`processes`, a ProcessGroup) through `module`: the model wrapped in
        DistributedDataParallel, whose backward averages the gradients over the processes; or, with `data_group`
        (a torch process group: the data axis of a mesh whose other axis splits the model), the model itself,
        whose gradients something else averages over that group."""
        import torch.distributed as dist
        self.processes, self.module, self.data_group = processes, module, data_group
        self.replicas = processes.world_size if data_group is None else dist.get_world_size(data_group)
        separate_dropout_streams(processes.rank if data_group is None else dist.get_rank(data_group))

    def share_distribution(self, step):
        """Trains over the processes `step` was distributed over (one DDP wrapper per model: a second would
        reduce every gradient twice)."""
        self.processes, self.module = step.processes, step.module
        self.data_group, self.replicas = step.data_group, step.replicas
        self.micro_batch_context = step.micro_batch_context

    def description(self):
        """What differs from the default step: the update, when Keras's `optimizer.apply` carries it out, and the host
        waits its loss scaling adds."""
        parts = [f"gradients of {self.micro_batches} micro-batches summed"] if self.micro_batches > 1 else []
        if self.fused_optimizer_refused is not None:
            parts.append(f"update by Keras's optimizer.apply ({self.fused_optimizer_refused})")
            if scales_losses(self.model.optimizer):
                parts.append(LOSS_SCALE_WAITS)
        return "; ".join(parts)

    def numerics(self):
        if self.fused_optimizer is not None:
            update = self.fused_optimizer.description()
        else:
            name = type(inner_optimizer(self.model.optimizer)).__name__
            update = f"Keras's {name} (`optimizer.apply`), eager: {self.fused_optimizer_refused}"
            if scales_losses(self.model.optimizer):
                update += f"; {LOSS_SCALE_WAITS}"
        return {"layer_norm": layer_norm_text(self.model), "optimizer_update": update,
                "rounding_16_bit": self.rounding_16_bit()}

    def rounding_16_bit(self):
        """Where the step rounds its 16-bit intermediates (`TrainStep.numerics`): eagerly, each operation's result."""
        return EAGER_ROUNDING if computes_in_16_bits(self.model) else NO_16_BIT

    def _loss(self, y, logits, sample_weight):
        import torch.nn.functional as F
        if not self.native_loss:
            return self.model.loss(y, logits, sample_weight=sample_weight)
        token_loss = F.cross_entropy(logits.flatten(0, -2).float(), y.flatten().long(), reduction="none")
        return (token_loss * sample_weight.flatten()).sum() / sample_weight.sum()

    def _loss_and_accuracy(self, x, y, sample_weight):
        logits = self.module(x, training=True)
        # The comparison has no gradient, so the accuracy adds nothing to the backward pass.
        correct = correct_tokens(y, logits.detach(), sample_weight)
        return self._loss(y, logits, sample_weight), correct / sample_weight.sum()

    @contextlib.contextmanager
    def _forward_context(self):
        """The context `self._forward` runs in: Keras layers called without `Layer.__call__`'s per-call Python
        (`torch_plain_calls`), where the model allows it, and Keras's per-call constants filled on the device
        (`torch_host_syncs.keras_constants_on_device`)."""
        plain = contextlib.nullcontext() if self.plain_calls_refused is not None else plain_layer_calls(training=True)
        with plain, keras_constants_on_device():
            yield

    def __call__(self, x, y, sample_weight):
        import torch
        from keras.src.backend.torch.core import get_device
        optimizer = self.model.optimizer
        # On Keras's device, and as tensors before any compiled code sees them.
        device = get_device()
        x = tuple(to_device(part, device) for part in x)
        # The labels as the indices torch's loss takes (int64), converted on the device before the step's graph:
        # converted inside it, torch 2.11's inductor, emulating the eager step's rounding, wrote the logits'
        # gradient beside the logits the forward saved instead of over them (1,572 MiB more on GPT-2 small).
        y, sample_weight = to_device(y, device).long(), to_device(sample_weight, device)
        # The tensors each variable holds now (an extra may swap them: fsdp's shards), read as the attribute:
        # Keras's `value` property costs microseconds a read, a tenth of a millisecond a step.
        for variable in self.variables:
            variable._value.grad = None
        if self.micro_batches > 1:
            loss, accuracy = self._accumulate(x, y, sample_weight)
        else:
            # The backward pass in the forward's context too: a block that recomputes its activations there
            # (`--extra remat`) calls its layers as the forward pass did, through the same kernels.
            with self._forward_context():
                loss, accuracy = self._forward(x, y, sample_weight)
                losses = self.own_losses()
                own = sum(losses) if losses else None
                if self.processes is not None:
                    objective, loss, accuracy = self._global_token_means(loss, accuracy, sample_weight, own)
                else:
                    objective = loss = loss if own is None else loss + own
                optimizer.scale_loss(objective).backward()  # the identity unless the optimizer scales losses
        with torch.no_grad():
            if self.fused_optimizer:
                self.fused_optimizer.step()
            else:
                optimizer.apply([variable._value.grad for variable in self.variables], self.variables)
        # Tensors, not numbers: reading them would wait for the device; the loop reads them at its window's edge.
        loss, accuracy = loss.detach(), accuracy.detach()
        if self.outputs_overwritten:
            loss, accuracy = loss.clone(), accuracy.clone()
        return {"loss": loss, "accuracy": accuracy}

    def _accumulate(self, x, y, sample_weight):
        """Forward and backward of each of the batch's `micro_batches` equal parts in turn, the gradients summed in
        `.grad`: each part's token mean weighted by its share of the batch's tokens, so that the sum is the whole
        batch's token mean, and its gradient what one batch of all the rows would give. Over several processes
        (ddp) the batch is the global one: its token count is all-reduced first, the gradients are averaged only
        with the last part (DDP's `no_sync` before it), and the figures are all-reduced at the end. Returns the
        batch's loss and accuracy (device tensors)."""
        import torch
        import torch.distributed as dist
        parts = self.micro_batches
        tokens, scale = sample_weight.sum(), 1
        if self.processes is not None:
            tokens = tokens.float()
            dist.all_reduce(tokens, group=self.data_group)
            scale = self.replicas  # DDP averages over the processes: the sum is what each adds
        loss = accuracy = 0.0
        for part in range(parts):
            rows = slice(part * y.shape[0] // parts, (part + 1) * y.shape[0] // parts)
            part_weight = sample_weight[rows]
            with self._micro_batch(last=part == parts - 1), self._forward_context():
                part_loss, part_accuracy = self._forward(tuple(p[rows] for p in x), y[rows], part_weight)
                share = part_weight.sum() / tokens
                objective = part_loss * share
                losses = self.own_losses()
                if losses:
                    # Each process's own losses weigh 1 / replicas of a part's, as each device's do in JAX's
                    # step: DDP's average of the gradients and the figures' sum then count them once.
                    objective = objective + sum(losses) / (parts * scale)
                self.model.optimizer.scale_loss(objective * scale).backward()
            loss = loss + objective.detach()
            accuracy = accuracy + part_accuracy.detach() * share
        if self.processes is not None:
            figures = torch.stack([loss, accuracy]).float()
            dist.all_reduce(figures, group=self.data_group)
            loss, accuracy = figures[0], figures[1]
        return loss, accuracy

    def _micro_batch(self, last):
        """The context of one micro-batch's forward and backward: DDP's `no_sync` before the last (the gradients
        averaged once a step), or what an extra set (`micro_batch_context`)."""
        if self.micro_batch_context is not None:
            return self.micro_batch_context(last)
        return self.module.no_sync() if hasattr(self.module, "no_sync") and not last else contextlib.nullcontext()

    def _global_token_means(self, loss, accuracy, sample_weight, own=None):
        """(what to differentiate, the loss, the accuracy) over the global batch of several processes. Each
        process's loss is a mean over its own target tokens; DDP averages the gradients over the processes, so
        each process differentiates its token sum times the process count over the global token count, and
        the average is the gradient of the global token mean (a plain mean of the processes' means would weigh
        a process with fewer real tokens as much as one with more). The model's own losses (`own`, or None)
        are averaged over the processes, as JAX's step averages them over its devices. One all-reduce of four
        numbers gives the token count and the figures the step reports."""
        import torch
        import torch.distributed as dist
        tokens = sample_weight.sum()
        own_figure = torch.zeros_like(tokens) if own is None else own.detach()
        sums = torch.stack([figure.float() for figure in (loss.detach() * tokens, accuracy.detach() * tokens, tokens,
                                                          own_figure)])
        dist.all_reduce(sums, group=self.data_group)
        global_tokens = sums[2]
        objective = loss * tokens * self.replicas / global_tokens
        if own is not None:
            objective = objective + own
        return objective, sums[0] / global_tokens + sums[3] / self.replicas, sums[1] / global_tokens
