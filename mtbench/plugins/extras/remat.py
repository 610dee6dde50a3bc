"""remat: activation checkpointing of every Transformer block, on both backends under one name. While training,
each block keeps only its inputs for the backward pass and computes its activations again from them there
(`keras.remat`: `jax.checkpoint` on JAX, `torch.utils.checkpoint` without re-entry on torch): one more forward
pass of the blocks for activations that no longer grow with each block's intermediate tensors, as torchtitan's
"full" activation checkpointing and MaxText's `remat_policy: full`. MFU counts the model's FLOPs, not the
recomputation (nanoGPT's and PaLM's count), so a run that recomputes shows lower MFU for the same model.

Asking a framework to recompute proves nothing: XLA may compile the recomputation away or keep what it was meant
to free (XLA:CPU recomputes the blocks and holds more temporaries than without), and a layer called outside the
checkpointed function would keep its activations. So before training the run measures it: on JAX it compiles the
model's gradient on the batch twice, recomputing and keeping (under fsdp as fsdp's step takes it, each device
gathering the units' weights), and goes on only if the recomputing program runs more matrix products and holds
fewer temporary bytes a device (XLA's own count: `memory_analysis`), both recorded; on torch
every block's computation (its `residual_branches`) must run again inside the backward pass of one row through the
whole model, called as mtbench's torch step calls it (the torch.compile step is traced from the same checkpointed
blocks; under fsdp the checkpoint is taken around FSDP's unit; under tensor-parallel the split layers all-reduce
their activations again as they recompute, Megatron's full recomputation). A block with dropout recomputes the
masks its forward pass drew (JAX: from the seed states it takes as inputs; torch: from the generator's state
`torch.utils.checkpoint` restores), so the losses are those of the run without remat.

`--remat-policy matmuls` keeps the matrix products' outputs and recomputes the rest (`selective_checkpoint`): the
layer norms, activations, softmax and dropout, not the products, so less memory saved for less time spent. torch's
check then also counts the products dispatched while a block recomputes, which must be none; JAX's wants as many
products in the compiled gradient recomputing as keeping, and fewer temporaries.
"""

import re
import time

from mtbench import Extra, hookimpl
from mtbench.plugins.extras.compiled_collectives import collective_counts, hlo_collectives

# A matrix product in a compiled XLA program: a `dot` instruction (inside a fusion or not), or a call of a GPU
# library's GEMM.
PRODUCT = re.compile(r"\bdot\(|custom_call_target=\"__cublas\$\w*")


def compiled_products(text):
    """The matrix products in a compiled XLA program's text."""
    return len(PRODUCT.findall(text))


# Matrix products as torch dispatches them (a Dense layer's matmul, an attention's batched ones).
TORCH_MATMULS = ("mm", "bmm", "addmm", "baddbmm")
TORCH_COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor")


def recomputing_blocks(model):
    """The model's layers that recompute their activations in the backward pass."""
    from mtbench.keras_models.transformer import recomputes
    return [layer for layer in model._flatten_layers(include_self=False) if recomputes(layer)]


def selective_checkpoint(backend_name):
    """A function that makes a function recompute in the backward pass all but its matrix products, whose outputs it
    keeps (the `matmuls` policy): JAX's `jax.checkpoint` with the `dots_saveable` policy; torch's non-reentrant
    checkpoint with a selective context that must save the outputs of `TORCH_MATMULS` and of the collectives
    (torchtitan's selective checkpointing by operation). A fused attention kernel is not a matrix product to
    either: both recompute it."""
    if backend_name == "jax":
        import jax
        return lambda function: jax.checkpoint(function, policy=jax.checkpoint_policies.dots_saveable)
    import functools

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
    # The collectives whose outputs DTensor's layers wait for (tensor-parallel's all-reduces of a row-split layer's
    # partial products) are kept too: what JAX keeps is the product itself, which GSPMD all-reduces once.
    collectives = [getattr(torch.ops._c10d_functional, name, None) for name in TORCH_COLLECTIVES]
    kept = {getattr(torch.ops.aten, name).default for name in TORCH_MATMULS} | {
        collective.default for collective in collectives if collective is not None}

    def policy(context, operation, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if operation in kept else CheckpointPolicy.PREFER_RECOMPUTE

    contexts = functools.partial(create_selective_checkpoint_contexts, policy)

    def recomputing(function):
        return lambda *args, **kwargs: checkpoint(function, *args, use_reentrant=False, context_fn=contexts,
                                                  **kwargs)

    return recomputing


def jax_model_gradient(model, inputs, fsdp):
    """(gradient, its arguments): the gradient of the sum of the model's outputs on `inputs` (a batch's) with
    respect to its trainable weights, a new function, so that JAX traces it again and reads each block's `remat`
    afresh; under fsdp taken as fsdp's step takes its gradient, each device gathering the units' weights
    (`per_device_gradient`), over the distribution's mesh."""
    import keras

    def loss(weights, non_trainable, inputs):
        outputs, _ = model.stateless_call(weights, non_trainable, inputs, training=True)
        return keras.ops.sum(keras.ops.cast(outputs, "float32"))

    trainable = [variable.value for variable in model.trainable_variables]
    non_trainable = [variable.value for variable in model.non_trainable_variables]
    if not fsdp:
        import jax
        return jax.grad(loss), (trainable, non_trainable, inputs)
    from mtbench.plugins.backends.jax_jit_step import laid_out_rows
    from mtbench.plugins.extras.fsdp import per_device_gradient
    distribution = keras.distribution.distribution()
    return per_device_gradient(model, distribution, loss), (trainable, non_trainable,
                                                             laid_out_rows(distribution, inputs))


class Remat(Extra):
    name = "remat"
    description = ("activation checkpointing: each Transformer block's activations recomputed in the backward pass "
                   "(keras.remat: jax.checkpoint, torch.utils.checkpoint), verified before training")
    backends = ("jax", "torch")
    # torch's checkpoint restores the generator before it recomputes; JAX's recomputation takes the seeds as inputs.
    keeps_random_draws = True

    def unavailable_reason(self, run):
        if not run.model_recomputes_blocks:
            return "the model family does not build blocks that recompute their activations"
        return None

    def before_model(self, run):
        policy = run.config.remat_policy or "full"
        run.model_options["remat"] = True if policy == "full" else selective_checkpoint(run.backend.name)
        run.extras_state.setdefault(self.name, {})["policy"] = policy

    def verify(self, run, model, batch):
        blocks = recomputing_blocks(model)
        if not blocks:
            return "the model has no block that recomputes its activations; the run would mislabel itself"
        state = run.extras_state.setdefault(self.name, {})
        state.update(blocks=len(blocks), flops_counted="the model's, not the recomputation")
        started = time.perf_counter()
        try:
            if run.backend.name == "jax":
                return self._verify_jax(state, model, blocks, batch, run.device_kind, "fsdp" in run.config.extras)
            return self._verify_torch(state, model, blocks, batch, "torch-compile" in run.config.extras)
        finally:
            # Before training, outside every figure of the run (JAX compiles the model's gradient twice for it).
            state["check_s"] = round(time.perf_counter() - started, 3)

    @staticmethod
    def _verify_jax(state, model, blocks, batch, device_kind, fsdp):
        import jax

        held, products, collectives = {}, {}, {}
        checkpoint = blocks[0].remat  # True (full) or the selective policy's function, the same for every block
        try:
            for recompute in (False, True):
                for block in blocks:
                    block.remat = checkpoint if recompute else False
                gradient, arguments = jax_model_gradient(model, tuple(batch.inputs), fsdp)
                compiled = jax.jit(gradient).lower(*arguments).compile()
                memory = compiled.memory_analysis()
                held[recompute] = None if memory is None else int(memory.temp_size_in_bytes)
                text = compiled.as_text()
                products[recompute] = compiled_products(text)
                collectives[recompute] = collective_counts(hlo_collectives(text))
        finally:
            for block in blocks:
                block.remat = checkpoint
        program = ("fsdp's per-device gradient (units gathered, gradients reduce-scattered)" if fsdp
                   else "the model's compiled gradient")
        state.update(verified_by=f"{program} on this batch, recomputing against keeping",
                     temporary_bytes={"keeping": held[False], "recomputing": held[True]},
                     matrix_products={"keeping": products[False], "recomputing": products[True]},
                     collectives={"keeping": collectives[False], "recomputing": collectives[True]})
        if checkpoint is not True and products[True] != products[False]:
            return (f"XLA's program recomputing all but the matrix products runs {products[True]} of them, "
                    f"{products[False]} keeping everything: the policy's kept products are computed again")
        if checkpoint is True and products[True] <= products[False]:
            return (f"XLA compiled the recomputation away: the model's gradient runs {products[True]} matrix products "
                    f"recomputing and {products[False]} keeping its activations; the run would keep them all")
        if held[True] is not None and held[True] >= held[False]:
            why = " (XLA:CPU schedules the recomputation without freeing what it replaces)" * (device_kind == "cpu")
            return (f"XLA holds {held[True] / 2 ** 20:.1f} MiB of temporaries recomputing the blocks and "
                    f"{held[False] / 2 ** 20:.1f} MiB keeping their activations{why}; recomputing would cost time "
                    f"and save nothing")
        return None

    @staticmethod
    def _verify_torch(state, model, blocks, batch, compiled=False):
        import torch

        from keras.src.backend.torch.core import get_device

        from mtbench.plugins.backends.torch_eager_step import to_device
        from mtbench.plugins.backends.torch_plain_calls import called_as_the_step_calls
        unchecked = [block.name for block in blocks if not callable(getattr(block, "residual_branches", None))]
        if unchecked:
            return (f"cannot count what {unchecked[0]} recomputes (it has no `residual_branches`, the computation "
                    f"it recomputes); the run would be labelled unchecked")
        # Each block's computation counted where it runs: called again while the backward pass runs, it recomputed;
        # the matrix products dispatched while it runs again are those recomputed (a selective policy's kept ones are
        # served from its cache, above this counter).
        backward, recomputed, recomputing = [False], {block.name: 0 for block in blocks}, [False]
        for block in blocks:
            def counted(*args, _branches=block.residual_branches, _name=block.name, **kwargs):
                recomputed[_name] += backward[0]
                recomputing[0] = backward[0]
                try:
                    return _branches(*args, **kwargs)
                finally:
                    recomputing[0] = False
            block.residual_branches = counted
        # On the run's device, as mtbench's step copies its batch: a split layer's DTensor takes its input as it is.
        rows = tuple(to_device(part[:1], get_device()) for part in batch.inputs)
        # The dropout layers draw from torch's generators: put back, the run's first step draws what it would have.
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        calls = called_as_the_step_calls(model, training=True)
        matmuls = matmuls_counted_while(recomputing)
        try:
            with torch.random.fork_rng(devices=devices), calls, matmuls:
                loss = model(rows, training=True).float().mean()
                backward[0] = True
                # `backward`, not `torch.autograd.grad` of the variables: under fsdp they hold shards, which the
                # graph reaches only through FSDP's hooks.
                loss.backward()
                if devices:  # the check's time (`check_s`) with the GPU's, which `backward` only queued
                    torch.cuda.synchronize()
        finally:
            backward[0] = False
            for block in blocks:
                del block.residual_branches
            for variable in model.trainable_variables:
                variable.value.grad = None
        # Counted eagerly: a compiled step recomputes as AOTAutograd's partition of its graph does, not looked into.
        state.update(verified_by="each block's computation run again in the backward pass of one row" + (
                         ", eagerly (the compiled step's own recomputation, AOTAutograd's, is not counted)"
                         if compiled else ""),
                     recomputed_in_backward=sum(count > 0 for count in recomputed.values()),
                     matmuls_recomputed=matmuls.count)
        missed = [name for name, count in recomputed.items() if not count]
        if missed:
            return (f"the backward pass did not recompute {len(missed)} of the {len(blocks)} blocks ({missed[0]} "
                    f"first); the run would keep their activations")
        if state.get("policy") == "matmuls" and matmuls.count:
            return (f"the backward pass recomputed {matmuls.count} matrix products the policy keeps; the run would "
                    f"be labelled with a policy it does not follow")
        return None


def matmuls_counted_while(flag):
    """A torch dispatch mode that counts the matrix products (`TORCH_MATMULS`) dispatched while `flag[0]` is true,
    in its `count`."""
    from torch.utils._python_dispatch import TorchDispatchMode

    names = {f"aten.{name}.default" for name in TORCH_MATMULS}

    class MatmulCounter(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if flag[0] and str(func) in names:
                self.count += 1
            return func(*args, **(kwargs or {}))

    return MatmulCounter()


@hookimpl
def mtbench_register_extras(register):
    register(Remat())
