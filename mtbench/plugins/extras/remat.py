"""remat: activation checkpointing of every Transformer block, on both backends under one name. While training,
each block keeps only its inputs for the backward pass and computes its activations again from them there
(`keras.remat`: `jax.checkpoint` on JAX, `torch.utils.checkpoint` without re-entry on torch): one more forward
pass of the blocks for activations that no longer grow with each block's intermediate tensors, as torchtitan's
"full" activation checkpointing and MaxText's `remat_policy: full`. MFU counts the model's FLOPs, not the
recomputation (nanoGPT's and PaLM's count), so a run that recomputes shows lower MFU for the same model.

Asking a framework to recompute proves nothing: XLA may compile the recomputation away or keep what it was meant
to free (XLA:CPU recomputes the blocks and holds more temporaries than without), and a layer called outside the
checkpointed function would keep its activations. So before training the run measures it: on JAX it compiles the
model's gradient on the batch twice, recomputing and keeping, and goes on only if the recomputing program runs
more matrix products and holds fewer temporary bytes (XLA's own count: `memory_analysis`), both recorded; on torch
every block's computation (its `residual_branches`) must run again inside the backward pass of one row through the
whole model, called as mtbench's torch step calls it (the torch.compile step is traced from the same checkpointed
blocks; under fsdp the checkpoint is taken around FSDP's unit; under tensor-parallel the split layers all-reduce
their activations again as they recompute, Megatron's full recomputation). A block with dropout recomputes the
masks its forward pass drew (JAX: from the seed states it takes as inputs; torch: from the generator's state
`torch.utils.checkpoint` restores), so the losses are those of the run without remat.
"""

import contextlib
import re
import time

from mtbench import Extra, hookimpl

# A matrix product in a compiled XLA program: a `dot` instruction (inside a fusion or not), or a call of a GPU
# library's GEMM.
PRODUCT = re.compile(r"\bdot\(|custom_call_target=\"__cublas\$\w*")


def compiled_products(text):
    """The matrix products in a compiled XLA program's text."""
    return len(PRODUCT.findall(text))


def recomputing_blocks(model):
    """The model's layers that recompute their activations in the backward pass."""
    return [layer for layer in model._flatten_layers(include_self=False) if getattr(layer, "remat", False) is True]


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
        if run.backend.name == "jax" and "fsdp" in run.config.extras:
            # The check compiles the model's gradient as the jit step would without fsdp's per-device gathering.
            return "beside fsdp on JAX, what XLA holds recomputing is not measured yet (torch's fsdp takes it)"
        return None

    def before_model(self, run):
        run.model_options["remat"] = True

    def verify(self, run, model, batch):
        blocks = recomputing_blocks(model)
        if not blocks:
            return "the model has no block that recomputes its activations; the run would mislabel itself"
        state = run.extras_state.setdefault(self.name, {})
        state.update(blocks=len(blocks), flops_counted="the model's, not the recomputation")
        started = time.perf_counter()
        try:
            if run.backend.name == "jax":
                return self._verify_jax(state, model, blocks, batch, run.device_kind)
            return self._verify_torch(state, model, blocks, batch)
        finally:
            # Before training, outside every figure of the run (JAX compiles the model's gradient twice for it).
            state["check_s"] = round(time.perf_counter() - started, 3)

    @staticmethod
    def _verify_jax(state, model, blocks, batch, device_kind):
        import jax
        import keras
        values = [variable.value for variable in model.trainable_variables]

        def loss(values, inputs):
            with keras.StatelessScope(state_mapping=list(zip(model.trainable_variables, values))):
                return keras.ops.sum(keras.ops.cast(model(inputs, training=True), "float32"))

        held, products = {}, {}
        try:
            for recompute in (False, True):
                for block in blocks:
                    block.remat = recompute
                compiled = jax.jit(jax.grad(loss)).lower(values, tuple(batch.inputs)).compile()
                memory = compiled.memory_analysis()
                held[recompute] = None if memory is None else int(memory.temp_size_in_bytes)
                products[recompute] = compiled_products(compiled.as_text())
        finally:
            for block in blocks:
                block.remat = True
        state.update(verified_by="the model's compiled gradient on this batch, recomputing against keeping",
                     temporary_bytes={"keeping": held[False], "recomputing": held[True]},
                     matrix_products={"keeping": products[False], "recomputing": products[True]})
        if products[True] <= products[False]:
            return (f"XLA compiled the recomputation away: the model's gradient runs {products[True]} matrix products "
                    f"recomputing and {products[False]} keeping its activations; the run would keep them all")
        if held[True] is not None and held[True] >= held[False]:
            why = " (XLA:CPU schedules the recomputation without freeing what it replaces)" * (device_kind == "cpu")
            return (f"XLA holds {held[True] / 2 ** 20:.1f} MiB of temporaries recomputing the blocks and "
                    f"{held[False] / 2 ** 20:.1f} MiB keeping their activations{why}; recomputing would cost time "
                    f"and save nothing")
        return None

    @staticmethod
    def _verify_torch(state, model, blocks, batch):
        import torch

        from mtbench.plugins.backends.torch_plain_calls import plain_calls_unsupported, plain_layer_calls
        unchecked = [block.name for block in blocks if not callable(getattr(block, "residual_branches", None))]
        if unchecked:
            return (f"cannot count what {unchecked[0]} recomputes (it has no `residual_branches`, the computation "
                    f"it recomputes); the run would be labelled unchecked")
        # Each block's computation counted where it runs: called again while the backward pass runs, it recomputed.
        backward, recomputed = [False], {block.name: 0 for block in blocks}
        for block in blocks:
            def counted(*args, _branches=block.residual_branches, _name=block.name, **kwargs):
                recomputed[_name] += backward[0]
                return _branches(*args, **kwargs)
            block.residual_branches = counted
        rows = tuple(torch.as_tensor(part[:1]) for part in batch.inputs)
        # The dropout layers draw from torch's generators: put back, the run's first step draws what it would have.
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        # Called as mtbench's torch step calls it: tensor-parallel's split layers compute outside Keras's input checks.
        calls = plain_layer_calls(training=True) if plain_calls_unsupported(model) is None else contextlib.nullcontext()
        try:
            with torch.random.fork_rng(devices=devices), calls:
                loss = model(rows, training=True).float().mean()
                backward[0] = True
                # `backward`, not `torch.autograd.grad` of the variables: under fsdp they hold shards, which the
                # graph reaches only through FSDP's hooks.
                loss.backward()
        finally:
            backward[0] = False
            for block in blocks:
                del block.residual_branches
            for variable in model.trainable_variables:
                variable.value.grad = None
        state.update(verified_by="each block's computation run again in the backward pass of one row",
                     recomputed_in_backward=sum(count > 0 for count in recomputed.values()))
        missed = [name for name, count in recomputed.items() if not count]
        if missed:
            return (f"the backward pass did not recompute {len(missed)} of the {len(blocks)} blocks ({missed[0]} "
                    f"first); the run would keep their activations")
        return None


@hookimpl
def mtbench_register_extras(register):
    register(Remat())
