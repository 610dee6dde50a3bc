"""pipeline-parallel: a language model's blocks in consecutive stages, one stage a process, each batch sent through
them in micro-batches on the 1F1B schedule, as torchtitan runs pipeline parallelism (`torch.distributed.pipelining`).

The split (`stage_bounds`): the blocks as evenly as they go into as many stages as a pipeline has processes (the
earlier stages take one more where they do not divide); the first stage also embeds the tokens, the last computes
the final norm and the logits. The output layer's table is the token embedding's, so the first and the last stage
each hold it and, after the backward pass, all-reduce its gradient between the two of them (Megatron's shared
embedding): both then update it alike.

A step (`TorchPipelineStep`): the rows the pipeline's processes loaded are gathered (the first stage needs the
tokens, the last the labels), and the batch goes through torch's `Schedule1F1B` (or `ScheduleGPipe`,
`--pipeline-schedule`) in `--pipeline-micro-batches` parts (default 4 a stage, GPipe's rule for a bubble of a few
percent), activations sent forward and their gradients back between neighbouring stages, point to point. Each part's loss is its token sum over the whole batch's tokens, so that the
parts' gradients add up to the batch mean's. torch's fused AdamW then updates each stage's weights with Keras's
schedule (`StageAdamW`): global-norm clipping sums every stage's squared norms (the shared table once) in one
all-reduce, and float16's overflow verdict is agreed by all, so that every stage skips a step or none does. The loss
and accuracy are the last stage's, sent to the others. With `torch-compile` (either side of this extra) each
stage's forward is compiled in its mode, as torchtitan compiles its stages; the messages stay eager.

With `--pipeline-parallel-size` below the process count the processes make a `data` x `stage` mesh, as torchtitan
composes pipelines with data parallelism: each pipeline trains its share of the rows, and each stage's gradients are
averaged over the data axis in DDP's buckets, each all-reduce started from the backward pass (`GradientBuckets`).

Every process builds the whole model (the same draw on each); from its first step it holds only its stage's weights
and their Adam moments, the others' tensors freed (`StageHolding`), and `finalize` broadcasts each stage's to every
process, for evaluation and checkpoints.

JAX runs its pipeline inside one program over a `data` x `stage` mesh of one process's devices, as MaxText does
(`StagedModel`): each stage's blocks stacked and sharded over `stage`, every stage computed at once under
`jax.vmap`, and a `jax.lax.scan` over M + S - 1 ticks rolling the activations one stage on at each; JAX
differentiates it as a whole, so its schedule is GPipe's.
"""

import collections
import functools

from mtbench import Extra, MtbenchError, RunFailure, hookimpl, uneven_split_reason
from mtbench.plugins.backends.keras_optimizer import all_moments, inner_optimizer, moments_of, scales_losses
from mtbench.plugins.backends.torch_fused_adamw import FusedAdamW
from mtbench.plugins.extras.compiled_collectives import collectives_counted, hlo_collectives
from mtbench.plugins.extras.dispatched_collectives import collective_kind, profiled_collectives
from mtbench.plugins.extras.fsdp import (
    SIMULATE_HINT,
    StateRecording,
    forget_tracked_tensors,
    jax_step_state,
    process_mesh,
    processes_reason,
    state_record,
    torch_state_record,
    use_distribution,
)
from mtbench.plugins.extras.remat import compiled_products
from mtbench.plugins.extras.tensor_parallel import gathered_rows, require_fused_eager_step

# GPipe (Huang et al., 2019): with at least 4 micro-batches a stage the bubble is a small share of the step.
MICRO_BATCHES_PER_STAGE = 4
# The schedules by --pipeline-schedule: torch's class and its name in the record.
SCHEDULES = {"1f1b": ("Schedule1F1B", "1F1B"), "gpipe": ("ScheduleGPipe", "GPipe")}
PIPELINED_FAMILIES = ("gpt", "gpt2")
FIRST_STAGE = "token and position embeddings"
STAGE_AXIS, DATA_AXIS = "stage", "data"
COMPILED_STAGE = ("each pipeline stage's forward (its embeddings, blocks or output layer; backward via AOTAutograd); "
                  "the last stage's loss and the fused AdamW update eager")
LAST_STAGE = "final norm and the output layer (the token embedding's table, its gradient all-reduced with stage 0)"


def stage_bounds(blocks, stages):
    """[(first block, end)] of each of `stages` stages over `blocks` blocks: as evenly as they go, the earlier
    stages one more where they do not divide."""
    share, extra = divmod(blocks, stages)
    bounds, start = [], 0
    for stage in range(stages):
        end = start + share + (stage < extra)
        bounds.append((start, end))
        start = end
    return bounds


def stage_names(bounds):
    """'blocks 0-1 | blocks 2-3' of `stage_bounds`."""
    return " | ".join(f"blocks {start}-{end - 1}" if end - start > 1 else f"block {start}" for start, end in bounds)


def micro_batches_of(config, stages):
    return config.pipeline_micro_batches or MICRO_BATCHES_PER_STAGE * stages


def stages_of(config, processes):
    """The stage axis's size: --pipeline-parallel-size, else every process."""
    return config.pipeline_parallel_size or processes


def bubble_fraction(stages, micro_batches):
    """The share of a step a stage idles while the schedule fills and drains: (S - 1) / (M + S - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def schedule_of(config, backend):
    """--pipeline-schedule, else the backend's own: 1F1B on torch; on JAX, which differentiates the pipeline as one
    program (every forward, then every backward), GPipe."""
    return config.pipeline_schedule or ("gpipe" if backend == "jax" else "1f1b")


def pipeline_reason(config, shape, processes, units="processes", backend="torch"):
    """Why the run's `processes` (JAX: its devices, `units`) cannot make a pipeline, or None."""
    stages = stages_of(config, processes)
    if stages < 2 or processes % stages:
        return (f"--pipeline-parallel-size {stages} must be at least 2 and divide the run's {processes} {units} "
                f"(the data axis takes the rest)")
    replicas = processes // stages
    family = config.model_family[0]
    if family not in PIPELINED_FAMILIES:
        return f"splits the blocks of mtbench's language models ({' and '.join(PIPELINED_FAMILIES)}), not '{family}'"
    blocks = getattr(shape, "decoder_layers", None)
    if blocks is not None and blocks < stages:
        return (f"the model's {blocks} block{'s' * (blocks != 1)} (--layers) cannot fill {stages} stages, one a "
                f"{'device' if units.startswith('device') else 'process'}")
    if backend == "jax":
        if blocks is not None and blocks % stages:
            return (f"JAX stacks the stages' blocks into one array a weight, sharded over the stage axis: the model's "
                    f"{blocks} blocks (--layers) must divide evenly into its {stages} stages")
        if schedule_of(config, backend) != "gpipe":
            return ("JAX differentiates its pipeline as one program, every forward then every backward: GPipe's "
                    "schedule; give --pipeline-schedule gpipe")
    if config.grad_accum > 1:
        return ("the pipeline's micro-batches are its gradient accumulation; give --pipeline-micro-batches in place "
                f"of --grad-accum {config.grad_accum}")
    micro_batches = micro_batches_of(config, stages)
    if micro_batches < stages and schedule_of(config, backend) == "1f1b":
        return (f"--pipeline-micro-batches {micro_batches} must be at least the {stages} stages (the 1F1B schedule "
                f"keeps one in flight a stage; --pipeline-schedule gpipe takes fewer)")
    # torch's processes each load their rows of the batch; JAX's one process places it over the data axis.
    reason = uneven_split_reason(config, processes, "processes") if backend == "torch" else \
        uneven_split_reason(config, replicas, "devices of the data axis")
    rows = config.batch_size // replicas
    if reason is None and rows % micro_batches:
        whose = f"the batch size {rows} does" if replicas == 1 else f"a data replica's {rows} rows do"
        reason = (f"{whose} not split into {micro_batches} micro-batch{'es' * (micro_batches != 1)} "
                  f"(--pipeline-micro-batches)")
    return reason


def stage_layers(model, bounds, first, last):
    """The layers one stage computes: its blocks, the embeddings on the first, the final norm and the tied table on
    the last."""
    layers = list(model.blocks[bounds[0]:bounds[1]])
    if first:
        layers += [model.token_embedding, model.position_embedding]
    if last:
        layers.append(model.final_norm)
        if not first:
            layers.append(model.token_embedding)
    return layers


def stage_variables(model, bounds, stage):
    """The trainable variables stage `stage` of `len(bounds)` holds, in the model's order."""
    layers = stage_layers(model, bounds[stage], stage == 0, stage == len(bounds) - 1)
    held = {id(variable) for layer in layers for variable in layer.trainable_variables}
    return [variable for variable in model.trainable_variables if id(variable) in held]


def owning_stages(model, bounds):
    """[(trainable variable, the first stage that holds it: the one that sends it to the others)]."""
    held = [{id(variable) for variable in stage_variables(model, bounds, stage)} for stage in range(len(bounds))]
    return [(variable, next(stage for stage, ids in enumerate(held) if id(variable) in ids))
            for variable in model.trainable_variables]


def stage_module(model, bounds, first, last, compiled=None):
    """The `torch.nn.Module` torch's pipelining calls for one stage: the model's pieces (`embed`, its blocks,
    `logits`) the stage computes, compiled by `compiled` (the compiled step of `torch-compile`) where given. The
    Keras model is not registered with it: its weights are the variables'."""
    import torch

    blocks = model.blocks[bounds[0]:bounds[1]]

    def stage_forward(x):
        if first:
            x = model.embed(x, training=True)
        for block in blocks:
            x = block(x, training=True)
        return model.logits(x) if last else x

    if compiled is not None:
        stage_forward = compiled.compile_in_place(stage_forward, COMPILED_STAGE)

    class Stage(torch.nn.Module):
        def forward(self, x):
            return stage_forward(x)

    return Stage()


class StageHolding:
    """The weights and moments a process holds: while training (`hold_distributed`) its stage's, the other stages'
    tensors freed; for evaluation and checkpoints (`hold_full`) every one, each stage's broadcast from its process
    as one flat buffer per dtype. `owners`: [(trainable variable, the stage that sends it)]; `held`: the
    variables of this process's stage."""

    def __init__(self, model, owners, held, stage, group):
        self.model, self.stage, self.group = model, stage, group
        optimizer = model.optimizer
        self.entries = [(kept, owner) for variable, owner in owners
                        for kept in (variable, *moments_of(optimizer, variable))]
        self.held = {id(kept) for variable in held for kept in (variable, *moments_of(optimizer, variable))}
        self.distributed = False

    def hold_distributed(self):
        import torch
        for variable, _ in self.entries:
            if id(variable) not in self.held:
                value = variable._value
                empty = torch.empty(0, dtype=value.dtype, device=value.device)
                variable._value = torch.nn.Parameter(empty, requires_grad=value.requires_grad) \
                    if isinstance(value, torch.nn.Parameter) else empty
        forget_tracked_tensors(self.model)
        self.distributed = True

    def hold_full(self):
        import torch
        import torch.distributed as dist
        sent = collections.defaultdict(list)
        for variable, owner in self.entries:
            sent[owner, variable._value.dtype].append(variable)
        for (owner, dtype), variables in sent.items():
            sizes = [int(torch.Size(variable.shape).numel()) for variable in variables]
            if owner == self.stage:
                flat = torch.cat([variable._value.detach().reshape(-1) for variable in variables])
            else:
                flat = torch.empty(sum(sizes), dtype=dtype, device=variables[0]._value.device)
            dist.broadcast(flat, group_src=owner, group=self.group)
            for variable, part in zip(variables, flat.split(sizes)):
                if id(variable) not in self.held:
                    value = part.reshape(variable.shape).clone()
                    variable._value = torch.nn.Parameter(value, requires_grad=variable._value.requires_grad) \
                        if isinstance(variable._value, torch.nn.Parameter) else value
        forget_tracked_tensors(self.model)
        self.distributed = False


class StageAdamW(FusedAdamW):
    """torch's fused AdamW over one stage's weights. Clipped together (`global_clipnorm`), the norm is every stage's:
    the squared norms summed here (the shared table's counted by the first stage alone) and over the stages in one
    all-reduce. A float16 overflow anywhere skips the step everywhere."""
    updates = "each process updating its stage's weights"

    def __init__(self, optimizer, variables, group, uncounted=()):
        import torch
        super().__init__(optimizer, variables, group)
        self.counted = torch.tensor([0.0 if any(v is u for u in uncounted) else 1.0 for v in self.variables],
                                    device=self.parameters[0].device)

    def _global_squared_norm(self, grads):
        import torch
        import torch.distributed as dist
        squared = (torch.stack(torch._foreach_norm(grads)).float().square() * self.counted).sum()
        dist.all_reduce(squared, group=self.group)
        return squared


def token_loss_and_correct(logits, target, tokens):
    """A micro-batch's loss (its tokens' cross-entropy summed over the whole batch's `tokens`) and its correct
    tokens. `target` holds each token's label and weight side by side (float32, exact for labels below 2^24): the
    schedule splits one tensor of targets into the micro-batches."""
    import torch.nn.functional as F

    from mtbench.plugins.backends.torch_eager_step import correct_tokens
    labels, weight = target[..., 0].long(), target[..., 1]
    token_loss = F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), reduction="none")
    return (token_loss * weight.flatten()).sum() / tokens, correct_tokens(labels, logits.detach(), weight)


class TorchPipelineStep(StateRecording):
    """mtbench's eager torch step, its model's stages one a process (see the module). The first call is a warm-up
    of its own (torch's schedule sets its stages up: each stage votes, and their buffers are made); the second, the
    last warm-up call, is profiled for what a step sends and the collectives it runs."""

    def __init__(self, inner, model, plan, holding, record):
        from mtbench.plugins.backends.torch_compiled_step import CompiledTorchTrainStep
        super().__init__(inner, record, None)
        self.model, self.plan, self.layout = model, plan, holding
        # The compiled step of `torch-compile` whose mode the stages compile in, or None (eager stages).
        self.compiled = inner if isinstance(inner, CompiledTorchTrainStep) else None
        self.schedules = {}  # batch shape -> torch's schedule for it (a stage's messages have one shape)
        self.calls = 0

    @property
    def warmup_calls(self):
        return self.inner.warmup_calls + 1

    def around(self, step):
        """This pipeline over `step`, the compiled step `torch-compile` makes when it is given after this extra:
        its stages compiled, each stage's weights updated as before."""
        step.fused_optimizer = self.inner.fused_optimizer
        return TorchPipelineStep(step, self.model, self.plan, self.layout, self.record)

    def measure(self):
        if not self.layout.distributed:
            return None
        import torch
        import torch.distributed as dist
        plan = self.plan
        parameters = [variable.value for variable in plan.variables]
        # The other stages' moments hold nothing while the stages are held apart.
        held = torch_state_record(parameters, self.model.optimizer)
        # On the processes' device: NCCL gathers only what is on the GPU.
        mine = torch.tensor([held["parameter_bytes"], held["gradient_bytes"], held["optimizer_state_bytes"]],
                            dtype=torch.float64, device=parameters[0].device)
        every = [torch.zeros_like(mine) for _ in range(plan.stages)]
        dist.all_gather(every, mine, group=plan.group)
        largest = max(every, key=lambda held: float(held.sum()))
        unsharded = sum(int(torch.Size(v.shape).numel()) * parameters[0].element_size()
                        for v in self.model.trainable_variables)
        return {**state_record(*(float(b) for b in largest), unsharded),
                "parameter_bytes_by_stage": [int(held[0]) for held in every]}

    def _schedule(self, shape):
        if shape not in self.schedules:
            import torch
            import torch.distributed.pipelining as pipelining
            from keras.src.backend.torch.core import get_device
            plan, model = self.plan, self.model
            rows, length = shape[0] // plan.micro_batches, shape[1]
            vocabulary, width = model.token_embedding.embeddings.shape
            activations = torch.empty((rows, length, width), dtype=getattr(torch, model.dtype_policy.compute_dtype),
                                      device="meta", requires_grad=True)  # whose gradients are sent back
            # The messages' shapes given, the stage computes nothing to infer them (which would run the loss on
            # an empty micro-batch).
            stage = pipelining.PipelineStage(
                stage_module(model, plan.bounds[plan.stage], plan.first, plan.last, self.compiled), plan.stage,
                plan.stages, get_device(), group=plan.group,
                input_args=torch.empty((rows, length), dtype=torch.int32, device="meta") if plan.first else activations,
                output_args=torch.empty((rows, length, vocabulary), device="meta", requires_grad=True) if plan.last
                else activations)
            schedule = getattr(pipelining, SCHEDULES[plan.schedule][0])
            self.schedules[shape] = schedule(stage, plan.micro_batches, loss_fn=self._micro_batch_loss,
                                             scale_grads=False)
        return self.schedules[shape]

    def _micro_batch_loss(self, logits, target):
        loss, correct = token_loss_and_correct(logits, target, self._tokens)
        self._loss, self._correct = self._loss + loss.detach(), self._correct + correct
        # The data axis's buckets average the replicas' gradients, each the gradient of its part of the sum.
        return self.model.optimizer.scale_loss(loss * self.plan.replicas)  # scaled only by a loss-scaling optimizer

    def __call__(self, x, y, sample_weight):
        if not self.layout.distributed:
            self.layout.hold_distributed()
            kept = [variable.path for variable, _ in self.layout.entries
                    if id(variable) not in self.layout.held and variable.value.numel()]
            if kept:
                raise RunFailure(f"stage {self.plan.stage} still holds weights of other stages: {', '.join(kept[:3])}")
        self.calls += 1
        if self.compiled is not None:
            self.compiled.shapes_seen.add(tuple(y.shape))
        if self.calls != self.warmup_calls:
            return self._step(x, y, sample_weight)
        logs, ran = profiled_collectives(lambda: self._step(x, y, sample_weight))
        kinds = collections.Counter()
        for op, count in ran.items():
            kinds[collective_kind(op)] += count
        self.record["messages_per_step"] = dict(sorted(kinds.items()))
        if self.plan.data_axis is not None:
            self.record["data_axis_gradients"] = self.plan.data_axis.record()
        return logs

    def _step(self, x, y, sample_weight):
        import torch
        import torch.distributed as dist
        plan, inner = self.plan, self.inner
        ids, y, sample_weight = gathered_rows([x[0], y, sample_weight], plan.group, plan.stages)
        for parameter in inner.fused_optimizer.parameters:
            parameter.grad = None
        self._tokens = sample_weight.sum()
        if plan.data_group is not None and plan.last:  # the tokens of every replica's rows
            self._tokens = self._tokens.float()
            dist.all_reduce(self._tokens, group=plan.data_group)
        self._loss = self._correct = torch.zeros((), device=ids.device)
        schedule = self._schedule(tuple(ids.shape))
        with inner._forward_context():
            if plan.first:
                schedule.step(ids, return_outputs=False)
            elif plan.last:
                schedule.step(target=torch.stack([y.float(), sample_weight.float()], -1), return_outputs=False)
            else:
                schedule.step(return_outputs=False)
        if plan.data_axis is not None:
            plan.data_axis.finish()  # each gradient the mean of the replicas' (the table's: each copy's own part)
        if plan.shared is not None:  # the first and last stages' copies of the token embedding's table
            table = plan.shared.value
            if table.grad is None:
                table.grad = torch.zeros_like(table)
            dist.all_reduce(table.grad, group=plan.shared_group)
        with torch.no_grad():
            inner.fused_optimizer.step()
        figures = torch.stack([self._loss, self._correct]).float()
        if plan.data_group is not None and plan.last:
            dist.all_reduce(figures, group=plan.data_group)
        figures = torch.stack([figures[0], figures[1] / self._tokens])
        dist.broadcast(figures, group_src=plan.stages - 1, group=plan.group)
        return {"loss": figures[0], "accuracy": figures[1]}

    def description(self):
        plan = self.plan
        stages = stage_names(plan.bounds)
        over = f"{plan.stages} processes" if plan.data_axis is None else \
            f"a mesh of {plan.replicas} data x {plan.stages} stage processes"
        averaged = "" if plan.data_axis is None else ", the gradients averaged over the data axis in DDP's buckets"
        own = (f"pipeline-parallel over {over} ({stages}), {plan.micro_batches} "
               f"micro-batch{'es' * (plan.micro_batches != 1)}, "
               f"{SCHEDULES[plan.schedule][1]}{averaged}")
        return ", ".join(part for part in (self.inner.description(), own) if part)

    def finalize(self):
        super().finalize()
        if self.layout.distributed:
            self.layout.hold_full()


class StagePlan(collections.namedtuple(
        "StagePlan", "stages stage bounds first last micro_batches schedule variables shared group shared_group "
                     "replicas data_group data_axis")):
    """This process's part of the pipeline: `variables` its stage's trainable variables, `shared` the token
    embedding's variable where this stage shares it (the first or the last of several), else None; `group` its
    pipeline's processes, `shared_group` its pipeline's first and last; over a data axis of `replicas` pipelines,
    `data_group` the processes of this stage in every pipeline, `data_axis` the gradient buckets averaged over
    them (else None)."""


def torch_pipeline_step(run, model, step):
    import torch.distributed as dist

    from mtbench.plugins.backends.torch_eager_step import separate_dropout_streams
    from mtbench.plugins.extras.gradient_buckets import GradientBuckets
    require_fused_eager_step(step, "each stage's weights")
    if not step.native_loss:
        raise MtbenchError("computes the token-mean cross-entropy on the last stage; the model compiles another loss")
    world = run.processes.world_size
    stages = stages_of(run.config, world)
    replicas = world // stages
    blocks = getattr(model, "blocks", None)
    if blocks is None or not hasattr(model, "embed") or len(blocks) < stages:
        raise MtbenchError(f"needs a model of {stages} blocks or more with `embed`, `blocks` and `logits` "
                           f"(mtbench's GPT); '{model.name}' is not one")
    # Processes next to each other (on a GPU machine the GPUs joined by the fastest links) make a pipeline.
    if replicas == 1:
        mesh = process_mesh(world, axis_names=(STAGE_AXIS,))
        data_group = None
    else:
        grid = process_mesh((replicas, stages), axis_names=(DATA_AXIS, STAGE_AXIS))
        mesh, data_group = grid[STAGE_AXIS], grid.get_group(DATA_AXIS)
    stage, replica = mesh.get_local_rank(), run.processes.rank // stages
    separate_dropout_streams(replica)  # each data replica drops its own rows with masks of its own
    # Every process joins the making of every replica's group of its first and last stage, which share the table.
    shared_groups = [dist.new_group([index * stages, index * stages + stages - 1]) for index in range(replicas)]
    bounds = stage_bounds(len(blocks), stages)
    first, last = stage == 0, stage == stages - 1
    variables = stage_variables(model, bounds, stage)
    table = model.token_embedding.embeddings
    micro_batches = micro_batches_of(run.config, stages)
    data_axis = None if data_group is None else GradientBuckets([v.value for v in variables], data_group, replicas,
                                                                arrivals=micro_batches)
    plan = StagePlan(stages, stage, bounds, first, last, micro_batches, schedule_of(run.config, "torch"),
                     variables, table if first or last else None, mesh.get_group(), shared_groups[replica],
                     replicas, data_group, data_axis)
    step.fused_optimizer = StageAdamW(model.optimizer, variables, plan.group, uncounted=() if first else (table,))
    # The whole model until the first step (an extra's `verify` runs it), the stage's weights from then on.
    holding = StageHolding(model, owning_stages(model, bounds), variables, stage, plan.group)
    record = {"devices": world, "processes": world, "collectives": run.processes.collectives, "stages": stages,
              **({"mesh_axes": [STAGE_AXIS], "mesh_shape": [stages]} if replicas == 1 else
                 {"mesh_axes": [DATA_AXIS, STAGE_AXIS], "mesh_shape": [replicas, stages]}),
              "stage_blocks": [[start, end] for start, end in bounds], "first_stage": FIRST_STAGE,
              "last_stage": LAST_STAGE, "schedule": SCHEDULES[plan.schedule][1], "micro_batches": micro_batches,
              "micro_batch_rows": run.config.batch_size // replicas // micro_batches,
              "bubble_fraction": round(bubble_fraction(stages, micro_batches), 4)}
    return TorchPipelineStep(step, model, plan, holding, record)


# ----- JAX -----

STACKED = "pipeline_stacked"  # the name every stacked variable starts with, and its optimizer moments contain
JAX_FIRST_AND_LAST = ("embeddings, final norm and the tied output layer replicated over the stages, each device "
                      "computing them for its share of the batch's rows")


def staged_distribution(devices, stages):
    """A `keras.distribution.ModelParallel` over a `data` x `stage` mesh of `devices`, the batch split over `data`:
    it lays a stacked variable (`StagedModel`) and its Adam moments out over `stage` by their leading axis, and
    every other variable out whole."""
    from keras.distribution import DeviceMesh, LayoutMap, ModelParallel, TensorLayout

    class StagedLayouts(ModelParallel):
        def get_variable_layout(self, variable):
            if STACKED in variable.path:
                return TensorLayout([STAGE_AXIS] + [None] * (len(variable.shape) - 1), self.device_mesh)
            return super().get_variable_layout(variable)

    # Devices next to each other (on a GPU machine the ones joined by the fastest links) make a pipeline.
    mesh = DeviceMesh((len(devices) // stages, stages), [DATA_AXIS, STAGE_AXIS], devices)
    return StagedLayouts(layout_map=LayoutMap(mesh), batch_dim_name=DATA_AXIS)


def stacked_variable(group):
    """A variable holding each stage's copy of one weight (`group`: the stages' own, in order) along a leading
    stage axis, laid out over it: each device holds its stage's."""
    import keras
    first = group[0]
    return keras.Variable(initializer="zeros", shape=(len(group), *first.shape), dtype=first.dtype,
                          trainable=first.trainable, name=f"{STACKED}_{first.path.replace('/', '_')}")


def mirrored_optimizer(optimizer, variables, deciding):
    """An optimizer made as `compile_model` made `optimizer` (Keras's AdamW with its schedule, clipping and weight
    decay, inside its loss scaling if any), for `variables`; `deciding[i]` is the model's variable whose weight
    decay `variables[i]` takes."""
    import keras
    inner = inner_optimizer(optimizer)
    if type(inner) is not keras.optimizers.AdamW:
        raise MtbenchError(f"stacks the moments of Keras's AdamW, not of {type(inner).__name__}")
    if inner.clipnorm:
        # Keras would clip a stacked weight by the norm of every stage's copy together: not torch's stages' clipping.
        raise MtbenchError("cannot clip each weight on its own on JAX (Keras's clipnorm "
                           "would take every stage's copy of a weight as one); give --clip global or --clip none")
    learning_rate = inner._learning_rate
    if not isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        learning_rate = float(inner.learning_rate)
    mirrored = keras.optimizers.AdamW(learning_rate=learning_rate, weight_decay=inner.weight_decay,
                                      beta_1=inner.beta_1, beta_2=inner.beta_2, epsilon=inner.epsilon,
                                      amsgrad=inner.amsgrad, clipnorm=inner.clipnorm,
                                      global_clipnorm=inner.global_clipnorm)
    mirrored.exclude_from_weight_decay(var_list=[variable for variable, model_variable in zip(variables, deciding)
                                                 if not inner._use_weight_decay(model_variable)])
    if scales_losses(optimizer):
        mirrored = keras.optimizers.LossScaleOptimizer(mirrored, initial_scale=optimizer.initial_scale,
                                                       dynamic_growth_steps=optimizer.dynamic_growth_steps)
    return mirrored  # built by the jit step, over the variables the step trains


@functools.lru_cache(maxsize=64)
def _stacking_program(sharding):
    import jax
    import jax.numpy as jnp
    return jax.jit(jnp.stack, out_shardings=sharding)


@functools.lru_cache(maxsize=64)
def _unstacking_program(shardings):
    import jax
    return jax.jit(list, out_shardings=list(shardings))


@functools.lru_cache(maxsize=1)
def _next_stage():
    """h -> h moved one stage on along its first axis (the last stage's to the first), differentiated as the move
    back: JAX's own transpose of `jnp.roll` (a split, then pads) costs two collective permutes over a sharded axis,
    where one moves it."""
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def next_stage(h):
        return jnp.roll(h, 1, axis=0)

    def forward(h):
        return next_stage(h), None

    def backward(_, gradient):
        return (jnp.roll(gradient, -1, axis=0),)

    next_stage.defvjp(forward, backward)
    return next_stage


class StagedModel:
    """What mtbench's jit step trains in place of a GPT, as MaxText pipelines: the j-th block of every stage held
    as one stacked variable a weight, sharded over the mesh's `stage` axis, so that each device holds its stage's
    blocks and their Adam moments; one `jax.vmap` runs every stage's blocks at once, each device its own, and a
    `jax.lax.scan` over M + S - 1 ticks moves each micro-batch's activations one stage on a tick (a collective
    permute), the first stage taking the next micro-batch in. JAX differentiates the whole as one program: every
    forward, then every backward (GPipe's schedule). The embeddings and the output layer stay whole on every device,
    which computes them for its share of the rows.

    It serves the jit step as a Keras model does (`trainable_variables`, `non_trainable_variables`, `optimizer`,
    `loss`, `stateless_call`); `hold_stages` moves the model's block weights and their moments into the stacked
    variables (the model's freed), `hold_whole` back, for evaluation and checkpoints."""

    def __init__(self, model, stages, micro_batches, distribution):
        blocks = model.blocks
        per_stage = len(blocks) // stages
        self.model, self.stages, self.per_stage, self.micro_batches = model, stages, per_stage, micro_batches
        self.distribution, self.mesh = distribution, distribution.device_mesh.backend_mesh
        self.dtype_policy = model.dtype_policy  # what the stages compute in, for the step's `numerics`
        in_blocks = {id(variable) for block in blocks for variable in block.variables}

        def groups(variables_of):  # [position in a stage][weight] -> that weight of every stage's block there
            return [[[variables_of(blocks[stage * per_stage + position])[index] for stage in range(stages)]
                     for index in range(len(variables_of(blocks[position])))] for position in range(per_stage)]

        self.trainable_groups = groups(lambda block: block.trainable_variables)
        self.non_trainable_groups = groups(lambda block: block.non_trainable_variables)
        self.rest = [v for v in model.trainable_variables if id(v) not in in_blocks]
        self.rest_non_trainable = [v for v in model.non_trainable_variables if id(v) not in in_blocks]
        self.stacked = [[stacked_variable(group) for group in position] for position in self.trainable_groups]
        self.stacked_non_trainable = [[stacked_variable(group) for group in position]
                                      for position in self.non_trainable_groups]
        self.trainable_variables = [*self.rest, *(v for position in self.stacked for v in position)]
        self.non_trainable_variables = [*self.rest_non_trainable,
                                        *(v for position in self.stacked_non_trainable for v in position)]
        deciding = [*self.rest, *(group[0] for position in self.trainable_groups for group in position)]
        self.optimizer = mirrored_optimizer(model.optimizer, self.trainable_variables, deciding)
        self.loss = model.loss
        self.name = model.name
        self.holding_stages = False

    def _flatten_layers(self, *args, **kwargs):
        return self.model._flatten_layers(*args, **kwargs)

    # ----- the state -----

    def _pairs(self):
        """(stacked variables, [the model's variables stacked in each, by stage]) and (variables of the step's
        optimizer, the model optimizer's variable it stands for)."""
        stacked, single = [], []
        for mine, theirs in zip(self.stacked + self.stacked_non_trainable,
                                self.trainable_groups + self.non_trainable_groups):
            stacked += zip(mine, theirs)
        for variable, group in zip(self.trainable_variables[len(self.rest):],
                                   (group for position in self.trainable_groups for group in position)):
            for kind in range(2):  # the first and the second moment
                stacked.append((moments_of(self.optimizer, variable)[kind],
                                [moments_of(self.model.optimizer, model_variable)[kind] for model_variable in group]))
        for variable in self.rest:
            single += zip(moments_of(self.optimizer, variable), moments_of(self.model.optimizer, variable))
        moments = {id(v) for v in [*all_moments(self.optimizer), *all_moments(self.model.optimizer)]}
        counters = [v for v in self.optimizer.variables if id(v) not in moments]
        model_counters = [v for v in self.model.optimizer.variables if id(v) not in moments]
        if [v.name for v in counters] != [v.name for v in model_counters]:
            raise RunFailure(f"the pipeline's optimizer keeps {[v.name for v in counters]}, the model's "
                             f"{[v.name for v in model_counters]}")
        return stacked, single + list(zip(counters, model_counters))

    def hold_stages(self):
        """The model's blocks and their moments stacked into this model's variables (the model's buffers freed);
        the embeddings' moments and the optimizer's counters taken over as they are."""
        import jax
        stacked, single = self._pairs()
        self.whole_layouts = [[variable.value.sharding for variable in theirs] for _, theirs in stacked]
        for mine, theirs in stacked:
            mine._value = _stacking_program(mine.value.sharding)([variable.value for variable in theirs])
            jax.block_until_ready(mine._value)  # a buffer deleted while a program reads it stalls its collectives
            for variable in theirs:
                variable.value.delete()
        for mine, theirs in single:
            mine._value = theirs.value
        self.holding_stages = True

    def hold_whole(self):
        """Each stage's weights and moments written back to the model's variables, replicated, as they were."""
        import jax
        stacked, single = self._pairs()
        for (mine, theirs), layouts in zip(stacked, self.whole_layouts):
            for variable, value in zip(theirs, _unstacking_program(tuple(layouts))(mine.value)):
                variable._value = value
            jax.block_until_ready([variable.value for variable in theirs])
            mine.value.delete()
        for mine, theirs in single:
            theirs._value = mine.value
        self.holding_stages = False

    # ----- the computation -----

    def stateless_call(self, trainable, non_trainable, x, training=False, return_losses=False):
        import jax
        import jax.numpy as jnp
        import keras
        from jax.sharding import NamedSharding, PartitionSpec

        from mtbench.plugins.backends.jax_jit_step import shard_seeds

        def spread(values, layout):  # [[value] a weight] a position, as `layout` ([[variable]]) holds them
            flat = iter(values)
            return [[next(flat) for _ in position] for position in layout]

        rest_count, rest_non_trainable_count = len(self.rest), len(self.rest_non_trainable)
        stacked = spread(trainable[rest_count:], self.stacked)
        stacked_non_trainable = spread(non_trainable[rest_non_trainable_count:], self.stacked_non_trainable)
        stages, micro_batches, model = self.stages, self.micro_batches, self.model
        replicas = self.mesh.shape[DATA_AXIS]
        constrain = jax.lax.with_sharding_constraint

        def laid(*spec):
            return NamedSharding(self.mesh, PartitionSpec(*spec))

        def run_stage(weights, states, h):  # one stage's blocks, on the device of its stage
            updated = []
            for position in range(self.per_stage):
                h, state = model.blocks[position].stateless_call(weights[position], states[position], h,
                                                                 training=training)
                updated.append(state)
            return h, updated

        def pipeline(weights, states, rows):
            """One data replica's rows through the stages: (their outputs, the stages' dropout seeds after)."""
            count, length, width = rows.shape
            # Micro-batch m is rows m, m + M, ...
            parts = rows.reshape(count // micro_batches, micro_batches, length, width).swapaxes(0, 1)
            # Each tick's micro-batch in the first stage's slot alone, the stages' slots on their devices: taken
            # whole by the first stage, it sends the others nothing, and its gradient is summed over no stage.
            ticks = micro_batches + stages - 1
            entering = jnp.zeros((ticks, stages, *parts.shape[1:]), parts.dtype).at[:micro_batches, 0].set(parts)
            entering = constrain(entering, laid(None, STAGE_AXIS))
            first = (jnp.arange(stages) == 0).reshape(stages, 1, 1, 1)

            def tick(carry, entering):
                h, states = carry
                # Each stage's output moves on to the next (a collective permute); the first takes a micro-batch.
                h = constrain(jnp.where(first, entering, _next_stage()(h)), laid(STAGE_AXIS))
                h, states = jax.vmap(run_stage)(weights, states, h)
                return (h, states), h

            start = constrain(jnp.zeros((stages, *parts.shape[1:]), parts.dtype), laid(STAGE_AXIS))
            (_, states), leaving = jax.lax.scan(tick, (start, states), entering)
            # Each stage's outputs stay on its device through the ticks; the last stage's leave once, after them
            # (gathered at every tick, they cost an all-gather a tick forward and an all-reduce back).
            leaving = constrain(leaving, laid(None, STAGE_AXIS))[stages - 1:, stages - 1]
            return leaving.swapaxes(0, 1).reshape(count, length, width), states

        # Every data replica its own copy of the stages' weights (sharded over the data axis too): each sums its
        # gradients over the ticks where it is, and the copies' gradients are summed once, after the loop. On
        # weights shared by the replicas GSPMD would all-reduce them over the data axis at every tick.
        copies = jax.tree.map(lambda weight: constrain(jnp.broadcast_to(weight, (replicas, *weight.shape)),
                                                       laid(DATA_AXIS, STAGE_AXIS)), stacked)
        # Each replica draws its dropout masks from its own stream, as DDP's processes do; replica 0's the seeds'.
        seeds = [shard_seeds(position, replicas, self.distribution) for position in stacked_non_trainable]
        mapping = [*zip(self.rest, trainable[:rest_count]),
                   *zip(self.rest_non_trainable, non_trainable[:rest_non_trainable_count])]
        with keras.StatelessScope(state_mapping=mapping) as scope:
            # The embeddings and the output layer: each device computes them for its share of the rows.
            h = constrain(model.embed(x, training=training), laid((DATA_AXIS, STAGE_AXIS)))
            rows, length, width = h.shape
            by_replica = constrain(h.reshape(replicas, rows // replicas, length, width), laid(DATA_AXIS))
            h, seeds = jax.vmap(pipeline, spmd_axis_name=DATA_AXIS)(copies, seeds, by_replica)
            h = constrain(h.reshape(rows, length, width), laid((DATA_AXIS, STAGE_AXIS)))
            logits = model.logits(h)
            rest_non_trainable = [scope.get_current_value(v) for v in self.rest_non_trainable]
        rest_non_trainable = [new if new is not None else old for new, old in
                              zip(rest_non_trainable, non_trainable[:rest_non_trainable_count])]
        stacked_non_trainable = jax.tree.map(lambda state: state[0], seeds)
        updated = [*rest_non_trainable, *(value for position in stacked_non_trainable for value in position)]
        return (logits, updated, []) if return_losses else (logits, updated)


class JaxPipelineStep(StateRecording):
    """mtbench's jit step training a `StagedModel`: the stages held stacked while it trains, the model whole at
    every `finalize`; the collectives of its compiled program counted for the first batch's shapes at the first
    `finalize` (outside the timed steps)."""

    def __init__(self, inner, staged, record):
        super().__init__(inner, record, jax_step_state)
        self.staged, self.first_batch = staged, None

    def __call__(self, x, y, sample_weight):
        if not self.staged.holding_stages:
            self.staged.hold_stages()
            if "collectives_per_step" not in self.record:
                self.first_batch = (x, y, sample_weight)
        return self.inner(x, y, sample_weight)

    def finalize(self):
        if self.first_batch is not None and self.inner.state is not None:
            program = self.inner.lowered_program(*self.first_batch, optimised=True)
            collectives = hlo_collectives(program)
            self.record.update(collectives_counted(collectives))
            # Where remat recomputes the stages' blocks, their forward products appear again in the backward.
            self.record["matrix_products_compiled"] = compiled_products(program)
            # {kind: {shape: times a step}}: the activations' shapes, moved at every tick, are told by their width.
            self.record["collectives_moved"] = {kind: dict(collections.Counter(shapes)) for kind, shapes in
                                                sorted(collectives.items())}
            self.first_batch = None
        super().finalize()
        if self.staged.holding_stages:
            self.staged.hold_whole()

    def description(self):
        return (f"{self.inner.description()}, pipeline-parallel ({stage_names(self.record['stage_blocks'])}), "
                f"{self.staged.micro_batches} micro-batch{'es' * (self.staged.micro_batches != 1)}, GPipe, each "
                f"stage's blocks stacked over the stage axis")


def jax_pipeline_step(run, model, step):
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep
    from mtbench.plugins.backends.layer_norm_rows import layer_norms
    if not isinstance(step, JitTrainStep) or step.distribution is None or step.micro_batches > 1:
        raise MtbenchError(f"pipelines mtbench's jit step, not the '{step.name}' step")
    if not hasattr(model, "blocks") or not hasattr(model, "embed"):
        raise MtbenchError(f"needs a model with `embed`, `blocks` and `logits` (mtbench's GPT); '{model.name}' "
                           f"is not one")
    step.finalize()  # the Keras variables hold the state again
    record = run.extras_state[PipelineParallel.name]
    stages = record["mesh_shape"][1]
    micro_batches = micro_batches_of(run.config, stages)
    staged = StagedModel(model, stages, micro_batches, step.distribution)
    bounds = stage_bounds(len(model.blocks), stages)
    record.update({"stages": stages, "stage_blocks": [[start, end] for start, end in bounds],
                   "first_stage": JAX_FIRST_AND_LAST, "last_stage": JAX_FIRST_AND_LAST, "schedule": "GPipe",
                   "micro_batches": micro_batches,
                   "micro_batch_rows": run.config.batch_size // record["mesh_shape"][0] // micro_batches,
                   "bubble_fraction": round(bubble_fraction(stages, micro_batches), 4)})
    pipelined = JitTrainStep(staged, step.distribution)
    # A later stage's block is computed by the first stage's block at its position, with its own weights stacked.
    for index, block in enumerate(model.blocks[staged.per_stage:], staged.per_stage):
        for norm, by in zip(layer_norms(block), layer_norms(model.blocks[index % staged.per_stage])):
            pipelined.traced_norms.stand_in(norm, by)
    return JaxPipelineStep(pipelined, staged, record)


def cuda_graphs_reason(config):
    """Why torch's stages cannot compile in --compile-mode, or None: CUDA graphs reuse a graph's output memory at its
    next replay, and a stage hands on (and keeps for its backward) each micro-batch's output while it computes
    the next."""
    from mtbench.plugins.backends.torch_compiled_step import CUDA_GRAPH_MODES
    if config.compile_mode in CUDA_GRAPH_MODES:
        return (f"--compile-mode {config.compile_mode} replays CUDA graphs, which reuse a stage's output memory for "
                f"the next micro-batch while the schedule still holds the last one's; give --compile-mode default "
                f"or max-autotune-no-cudagraphs")
    return None


class PipelineParallel(Extra):
    name = "pipeline-parallel"
    description = ("a language model's blocks in stages, each batch through them in micro-batches: torch "
                   "torch.distributed.pipelining under torchrun (1F1B, one stage a process), JAX one program over a "
                   "stage mesh axis (GPipe, the stages' blocks stacked)")
    backends = ("jax", "torch")
    conflicts = ("fsdp", "ddp", "tensor-parallel", "data-parallel", "pmap", "tpu")
    spans_processes = True
    parallelism = "pipeline"

    def unavailable_reason(self, run):
        if run.backend.name == "jax":
            # The processes first: simulating devices in each of several processes would only lead to this.
            if run.processes.world_size > 1:
                return "JAX's pipeline runs over one process's devices; start one process"
            count = run.device.get("count", 1)
            if count < 2:
                return f"needs at least 2 devices; this run has {count} ({SIMULATE_HINT})"
            return pipeline_reason(run.config, run.model_shape, count, "devices", "jax")
        reason = processes_reason(run) or cuda_graphs_reason(run.config)
        if reason:
            return reason
        try:
            import torch.distributed.pipelining  # noqa: F401 (torch 2.4 and later)
        except ImportError:
            import torch
            return f"needs torch.distributed.pipelining, which torch {torch.__version__} lacks"
        return pipeline_reason(run.config, run.model_shape, run.processes.world_size)

    def before_model(self, run):
        if run.backend.name != "jax":
            return
        import jax
        devices = jax.devices()
        stages = stages_of(run.config, len(devices))
        distribution = staged_distribution(devices, stages)
        run.extras_state[self.name] = {**use_distribution(run, distribution), "mesh_axes": [DATA_AXIS, STAGE_AXIS],
                                       "per_device_batch": run.config.batch_size // (len(devices) // stages)}

    def make_train_step(self, run, model, step):
        if run.backend.name == "jax":
            return jax_pipeline_step(run, model, step)
        pipelined = torch_pipeline_step(run, model, step)
        run.extras_state[self.name] = pipelined.record
        return pipelined


@hookimpl
def mtbench_register_extras(register):
    register(PipelineParallel())
