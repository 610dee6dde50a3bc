"""remat (activation checkpointing), by what it changes: the bytes a forward pass keeps for the backward pass and
the layers the backward pass runs again (torch), the recomputation in JAX's programs before and after XLA, the
losses and gradients (none changed, with dropout too), and the runs it refuses."""

import collections
import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import CPU_ONLY, assert_refused_in_one_line, json_answer, keras_on_jax, run_cli, simulated_devices
from mtbench.plugins.api import RunContext
from mtbench.plugins.extras.remat import Remat
from mtbench.runner.config import TrainConfig

TINY_GPT = ["--model", "gpt", "--preset", "tiny", "--block-size", "32", "--batch-size", "8", "--valid-size", "10",
            "--test-size", "10", "--steps", "6", "--dtype", "float32"]

TORCH_PROBE = textwrap.dedent("""
    import dataclasses, gc, json, os, weakref
    os.environ["KERAS_BACKEND"] = "torch"
    import keras, torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.plugins.extras.remat import selective_checkpoint

    class Ran(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    class Made(TorchDispatchMode):
        # Every tensor the forward pass makes, by its storage, weakly: those alive after it are what it holds.
        def __init__(self):
            super().__init__()
            self.storages = {}
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in (out if isinstance(out, (tuple, list)) else [out]):
                if isinstance(tensor, torch.Tensor):
                    storage = tensor.untyped_storage()
                    self.storages.setdefault(storage.data_ptr(), (weakref.ref(storage), storage.nbytes()))
            return out
        def held(self):
            gc.collect()
            return sum(size for ref, size in self.storages.values() if ref() is not None)

    ids = torch.randint(0, 256, (8, 128), generator=torch.Generator().manual_seed(0))
    figures = {}
    for dropout, remat in ((0.0, False), (0.0, True), (0.2, False), (0.2, True), (0.0, "matmuls")):
        shape = dataclasses.replace(GPT_PRESETS["tiny"], vocab_size=256, max_len=128, decoder_layers=4,
                                    dropout=dropout)
        keras.utils.set_random_seed(0)
        model = build_gpt(shape, remat=selective_checkpoint("torch") if remat == "matmuls" else remat)
        torch.manual_seed(1)
        kept = []
        def keep(tensor):
            kept.append(tensor.numel() * tensor.element_size())
            return tensor
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor), Made() as made:
            loss = model(ids, training=True).float().logsumexp(-1).mean()
        held = made.held()
        parameters = [variable.value for variable in model.trainable_variables]
        with Ran() as backward:
            grads = torch.autograd.grad(loss, parameters)
        figures[f"{dropout} {remat}"] = {"kept_bytes": sum(kept), "held_bytes": held, "loss": loss.item(),
                          "backward_norms": backward.ops.count("aten.native_layer_norm.default"),
                          "backward_matmuls": sum(backward.ops.count(f"aten.{name}.default")
                                                  for name in ("mm", "bmm", "addmm", "baddbmm")),
                          "grads": [grad.flatten()[:64].tolist() for grad in grads]}
    print(json.dumps(figures))
""")


@pytest.mark.slow
def test_torch_blocks_keep_only_their_inputs_and_run_again_in_the_backward_pass():
    env = {key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"}
    proc = subprocess.run([sys.executable, "-c", TORCH_PROBE], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    keeping, recomputing, dropping, dropping_recomputing, selective = json.loads(
        proc.stdout.strip().splitlines()[-1]).values()
    # Each of the 4 blocks keeps its input alone, (8, 128, 64) float32: 256 KiB, 1 MiB for the blocks, beside what
    # the embeddings, the final norm and the output layer keep (the same in both).
    block_input = 8 * 128 * 64 * 4
    assert keeping["kept_bytes"] - recomputing["kept_bytes"] > 10 * 4 * block_input
    assert recomputing["kept_bytes"] < keeping["kept_bytes"] / 5
    # The backward pass runs each block's two layer norms forward again, and only with remat.
    assert keeping["backward_norms"] == 0 and recomputing["backward_norms"] == 4 * 2
    assert recomputing["loss"] == keeping["loss"]
    np.testing.assert_allclose(np.array(recomputing["grads"]), np.array(keeping["grads"]), rtol=1e-6, atol=1e-9)
    # The `matmuls` policy: the matrix products' outputs kept (more bytes than recomputing all, fewer than keeping
    # all), no product computed again in the backward pass, each block's layer norms computed again; the same
    # gradients.
    assert recomputing["held_bytes"] < selective["held_bytes"] < keeping["held_bytes"]
    assert selective["backward_matmuls"] == keeping["backward_matmuls"] < recomputing["backward_matmuls"]
    assert selective["backward_norms"] == 4 * 2 and selective["loss"] == keeping["loss"]
    np.testing.assert_allclose(np.array(selective["grads"]), np.array(keeping["grads"]), rtol=1e-6, atol=1e-9)
    # With dropout the recomputed blocks drop what the forward pass dropped (torch's generator state restored).
    assert dropping_recomputing["loss"] == dropping["loss"] != keeping["loss"]
    # Of a block's 6 products the recomputation runs 5 without dropout: torch's non-reentrant checkpoint stops once
    # it has recomputed the last tensor the backward saved, the feed-forward's second product's input; with dropout
    # the mask of the dropout after that product is one more, and all 6 run again.
    assert recomputing["backward_matmuls"] - keeping["backward_matmuls"] == 4 * 5
    assert dropping_recomputing["backward_matmuls"] - dropping["backward_matmuls"] == 4 * 6
    np.testing.assert_allclose(np.array(dropping_recomputing["grads"]), np.array(dropping["grads"]), rtol=1e-6,
                               atol=1e-9)


def primitives(jaxpr, counts):
    for equation in jaxpr.eqns:
        counts[equation.primitive.name] += 1
        for value in equation.params.values():
            inner = getattr(value, "jaxpr", None)
            if inner is not None:
                primitives(getattr(inner, "jaxpr", inner), counts)
    return counts


def compiled_matmuls(text):
    """The matrix products of a compiled XLA program's text: its dots, and on a GPU the cuBLAS calls XLA turned
    dots into (`__cublas$gemm`, `__cublas$lt$matmul`)."""
    return text.count(" dot(") + len(re.findall(r'custom_call_target="__cublas\$', text))


def jax_gradients_of_a_tiny_gpt(remat):
    """(the model, the ids, the traced gradient's checkpoints, the lowered program's matmuls, the compiled one's, the
    gradient, the lowered program's layer norms) of a 2-block GPT with dropout 0.2, keras on JAX."""
    keras = keras_on_jax()
    import jax
    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import GPT_PRESETS
    shape = dataclasses.replace(GPT_PRESETS["tiny"], vocab_size=256, max_len=32, decoder_layers=2, dropout=0.2)
    ids = np.random.default_rng(0).integers(0, 256, (2, 32)).astype("int32")
    keras.utils.set_random_seed(0)
    model = build_gpt(shape, remat=remat)

    def loss(values, ids):
        with keras.StatelessScope(state_mapping=list(zip(model.trainable_variables, values))):
            return keras.ops.sum(model(ids, training=True))

    values = [variable.value for variable in model.trainable_variables]
    # One trace of the model for both the jaxpr read here and the program lowered from it (jax.make_jaxpr is this
    # trace's jaxpr; a second trace of the model cost a second apiece).
    trace = jax.jit(jax.grad(loss)).trace(values, ids)
    traced = primitives(trace.jaxpr.jaxpr, collections.Counter())
    program = trace.lower()
    executable = program.compile()
    text = program.as_text()
    return (model, ids, traced["remat2"] + traced["checkpoint"], text.count("stablehlo.dot_general"),
            compiled_matmuls(executable.as_text()), [np.asarray(value) for value in executable(values, ids)],
            text.count("stablehlo.rsqrt"))


@pytest.fixture(scope="module")
def tiny_jax_gradients():
    """jax_gradients_of_a_tiny_gpt's figures by policy (None: keeping, "full", "matmuls"), each made once for the
    tests below that read them (a build, a trace and a compilation apiece), with the `remat` its blocks hold:
    (remat, figures). The figures are deterministic (seeded model, ids and dropout), so every test reads what a
    fresh call would give it."""
    keras_on_jax()
    from mtbench.plugins.extras.remat import selective_checkpoint

    @functools.cache
    def gradients(policy):
        remat = {None: False, "full": True, "matmuls": selective_checkpoint("jax")}[policy]
        return remat, jax_gradients_of_a_tiny_gpt(remat=remat)
    return gradients


@pytest.mark.slow
def test_jax_traces_a_checkpoint_per_block_which_recomputes_the_masks_the_forward_pass_drew(tiny_jax_gradients):
    """jax.checkpoint is in the traced gradient once per block, and its recomputation in the program handed to XLA
    (each block's forward matmuls twice); with dropout the gradient is the one without remat."""
    _, _, no_checkpoints, keeping, _, kept, _ = tiny_jax_gradients(None)[1]
    _, _, checkpoints, recomputing, _, recomputed, _ = tiny_jax_gradients("full")[1]
    assert checkpoints == 2 and no_checkpoints == 0
    # Each block's forward matmuls whose products its backward pass reads, once more: as many in each block.
    assert recomputing - keeping >= 2 * 4 and (recomputing - keeping) % 2 == 0, (recomputing, keeping)
    # The recomputed blocks drop with the masks the forward pass drew (the seed states are the function's inputs);
    # XLA sums the two programs' float32 gradients in other orders (other masks would differ by their size).
    for got, want in zip(recomputed, kept):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-4)


@pytest.mark.slow
def test_jax_recomputing_all_but_the_matmuls_runs_no_matmul_twice(tiny_jax_gradients):
    """The `matmuls` policy (`dots_saveable`) in the program handed to XLA: a checkpoint per block, each block's
    matmuls once, as keeping everything; the elementwise rest recomputed (more operations than keeping); the same
    gradient with dropout."""
    _, _, _, keeping, _, kept, norms_keeping = tiny_jax_gradients(None)[1]
    _, _, checkpoints, selective, _, recomputed, norms = tiny_jax_gradients("matmuls")[1]
    assert checkpoints == 2 and selective == keeping
    assert norms - norms_keeping == 2 * 2  # each block's two layer norms computed again
    for got, want in zip(recomputed, kept):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["full", "matmuls"])
def test_the_jax_run_goes_on_exactly_when_the_compiled_gradient_recomputes_and_holds_less(policy,
                                                                                          tiny_jax_gradients):
    """What XLA compiles decides whether the run recomputes: the extra accepts exactly when the model's compiled
    gradient runs more matrix products recomputing than keeping (the `matmuls` policy: as many) and holds fewer
    temporary bytes."""
    from types import SimpleNamespace

    _, _, _, _, keeping, _, _ = tiny_jax_gradients(None)[1]
    checkpoint, (model, ids, _, _, recomputing, _, _) = tiny_jax_gradients(policy)
    import jax
    device_kind = jax.default_backend()  # 'cpu', or 'gpu' where the slow tier runs on one
    run = SimpleNamespace(backend=SimpleNamespace(name="jax"), device_kind=device_kind,
                          extras_state={"remat": {"policy": policy}}, config=SimpleNamespace(extras=("remat",)))
    refusal = Remat().verify(run, model, SimpleNamespace(inputs=(ids,)))
    measured = run.extras_state["remat"]
    assert measured["matrix_products"] == {"keeping": keeping, "recomputing": recomputing}
    held = measured["temporary_bytes"]
    products_as_asked = recomputing > keeping if policy == "full" else recomputing == keeping
    if device_kind == "cpu":  # XLA:CPU today, as the refusal says: the recomputation compiled in, holding more
        assert products_as_asked and held["recomputing"] >= held["keeping"] > 0, (recomputing, keeping, held)
    if products_as_asked and held["recomputing"] < held["keeping"]:
        assert refusal is None
    elif products_as_asked:  # XLA:CPU today: the recomputation compiled in, and more temporaries than keeping
        why = " (XLA:CPU schedules the recomputation without freeing what it replaces)" * (device_kind == "cpu")
        assert refusal == (f"XLA holds {held['recomputing'] / 2 ** 20:.1f} MiB of temporaries recomputing the blocks "
                           f"and {held['keeping'] / 2 ** 20:.1f} MiB keeping their activations{why}; recomputing "
                           f"would cost time and save nothing")
    else:
        assert refusal is not None and "matrix products" in refusal
    assert all(block.remat is checkpoint for block in model.blocks)  # the verification put them back


def test_a_remat_policy_without_the_extra_is_refused(tmp_path, cache_dir):
    proc = run_cli("train", "--backend", "torch", *TINY_GPT, "--remat-policy", "matmuls", "--cache-dir", cache_dir,
                   "--out", str(tmp_path / "r.json"))
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1
    assert proc.stderr == "Error: --remat-policy is an option of --extra remat; give the extra too\n"
    assert not (tmp_path / "r.json").exists()


def test_a_model_of_a_family_whose_blocks_cannot_recompute_is_refused():
    from mtbench.plugins.backends.jax_backend import JaxBackend
    from mtbench.plugins.backends.torch_backend import TorchBackend
    for backend in (JaxBackend(), TorchBackend()):
        context = RunContext(config=TrainConfig(model_name="gpt", preset="char"), backend=backend)
        assert Remat().unavailable_reason(dataclasses.replace(context, model_recomputes_blocks=True)) is None
        assert Remat().unavailable_reason(context) == (
            "the model family does not build blocks that recompute their activations")


@pytest.mark.slow
def test_torch_trains_the_same_losses_recomputing_and_records_what_it_counted(tmp_path, cache_dir):
    """With dropout: the recomputed blocks drop what the forward pass dropped, and the check before training draws
    nothing the run's steps would have drawn; compare's parity check holds the runs to one curve (remat keeps every
    draw, whatever it keeps), where runs with dropout are otherwise held to nothing."""
    out = tmp_path / "compare.json"
    # --measure-only: the checks read the losses, the parity check and the extra's record, not the evaluation.
    proc = run_cli("compare", "--matrix", "torch;torch+remat;torch+remat:remat-policy=matmuls", *TINY_GPT,
                   "--dropout", "0.1", "--measure-only", "--cache-dir", cache_dir, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    comparison = json.loads(out.read_text())
    keeping, recomputing, selective = (run["result"] for run in comparison["runs"])
    for run in (recomputing, selective):
        assert [h["loss"] for h in run["history"]] == [h["loss"] for h in keeping["history"]]
    pairs = comparison["parity"]["pairs"]
    assert len(pairs) == 2 and len({pair["reference"] for pair in pairs}) == 1
    assert "remat" not in pairs[0]["reference"] and "remat-policy=matmuls" in pairs[1]["run"]
    assert all(pair["max_relative_difference"] == 0.0 for pair in pairs)
    record = recomputing["extras_record"]["remat"]
    assert record.pop("check_s") > 0
    # 6 matrix products a block: query, key and value in one, the attention's two, its output, the feed-forward's two.
    assert record == {"policy": "full", "blocks": 2, "flops_counted": "the model's, not the recomputation",
                      "verified_by": "each block's computation run again in the backward pass of one row",
                      "recomputed_in_backward": 2, "matmuls_recomputed": 2 * 6}
    assert (recomputing["extras"], recomputing["extras_keeping_draws"]) == (["remat"], ["remat"])
    # Both backends serve remat: a run on the other backend is its counterpart only recomputing too.
    assert recomputing["way_of_training"] == {"parallelism": [], "extras": ["remat"]}
    # Recomputing all but the matrix products: no product computed twice.
    record = selective["extras_record"]["remat"]
    assert (record["policy"], record["recomputed_in_backward"], record["matmuls_recomputed"]) == ("matmuls", 2, 0)
    assert selective["config"]["remat_policy"] == "matmuls"


@pytest.mark.slow
def test_jax_on_a_cpu_stops_before_training_saying_what_xla_holds(tmp_path, cache_dir):
    """A refusal as any other (exit code 2, one line): nothing trained, and the user's fix is to drop the extra. It
    comes once XLA has compiled the model's gradient both ways, since what XLA:CPU holds differs by model and dtype
    (the tiny GPT in float32 holds more recomputing; the `small` Transformer, a default run, 2 % less). Beside fsdp
    the check refuses in the same words, by what fsdp's per-device program holds: the fsdp probe below holds the
    check's answer there to the whole refusal (a run of its own here cost 19 CPU s)."""
    proc = run_cli("train", "--backend", "jax", *TINY_GPT, "--extra", "remat", "--cache-dir", cache_dir,
                   "--out", str(tmp_path / "r.json"), env=CPU_ONLY)
    assert_refused_in_one_line(proc, "extra 'remat' did not take effect: ")
    assert re.fullmatch(r"Error: extra 'remat' did not take effect: XLA holds [0-9.]+ MiB of temporaries recomputing "
                        r"the blocks and [0-9.]+ MiB keeping their activations \(XLA:CPU schedules the recomputation "
                        r"without freeing what it replaces\); recomputing would cost time and save nothing",
                        proc.stderr.strip()), proc.stderr[-3000:]
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("extra", ["fsdp", "ddp", "tensor-parallel"])
def test_over_two_processes_the_blocks_recompute_with_what_each_process_holds(tmp_path, cache_dir, extra):
    """fsdp: each block recomputes with the parameters FSDP holds gathered until its backward (the checkpoint taken
    around the unit's call); ddp with --grad-accum 2: every micro-batch's blocks; tensor-parallel: each block's
    split layers, all-reducing their activations again as Megatron's full recomputation does (2 all-reduces more
    a GPT block: after its attention and after its MLP), and none again recomputing all but the products (their
    all-reduced outputs kept). The losses, with dropout, are those of the run without remat. What the recomputation
    does over processes is checked here, not how they were launched: without torchrun's agent."""
    from tests.plugins.extras.test_multi_process import launched_by_flags
    accumulate = ["--grad-accum", "2"] * (extra == "ddp")
    results = {}
    runs = [("keeping", []), ("recomputing", ["--extra", "remat"])]
    if extra == "tensor-parallel":  # all but the products: their all-reduced outputs kept too, none run again
        runs.append(("selective", ["--extra", "remat", "--remat-policy", "matmuls"]))
    for name, more in runs:
        out = tmp_path / f"{name}.json"
        # --measure-only: the checks read the losses and the extras' records, not the evaluation after training.
        launched_by_flags("train", "--backend", "torch", "--extra", extra, *TINY_GPT, "--dropout", "0.1",
                          *accumulate, *more, "--measure-only", "--cache-dir", cache_dir, "--out", str(out))
        results[name] = json.loads(out.read_text())
    assert [h["loss"] for h in results["recomputing"]["history"]] == [h["loss"] for h in results["keeping"]["history"]]
    assert results["recomputing"]["extras_record"]["remat"]["recomputed_in_backward"] == 2
    if extra == "tensor-parallel":
        counted = [results[name]["extras_record"][extra]["activation_all_reduces_per_step"]
                   for name in ("keeping", "recomputing", "selective")]
        assert counted == [4 * 2, 6 * 2, 4 * 2]
        assert [h["loss"] for h in results["selective"]["history"]] == [h["loss"] for h in results["keeping"]["history"]]
        assert results["selective"]["extras_record"]["remat"]["matmuls_recomputed"] == 0


FSDP_PROBE = textwrap.dedent(r"""
    import dataclasses, json, re, sys
    from types import SimpleNamespace
    import numpy as np, jax, keras
    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep
    from mtbench.plugins.extras.fsdp import gathered_per_device, sharded_model_parallel
    from mtbench.plugins.extras.remat import Remat
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import compile_model

    def moved(hlo, kind):
        # The arrays each collective of `kind` moves (XLA combines independent ones into a tuple).
        return sum(len(re.findall(r"[a-z0-9]+\[[0-9,]*\]", shapes))
                   for shapes in re.findall(rf"= (\(.*?\)|\S+) {kind}(?:-start)?\(", hlo))

    compiled = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kwargs: compiled.append(event) if event.endswith("backend_compile_duration") else None)
    keras.distribution.set_distribution(sharded_model_parallel(jax.devices()))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 256, (8, 33)).astype("int32")
    batch = ((ids[:, :-1],), ids[:, 1:], np.ones((8, 32), "float32"))
    figures = {}
    for remat in (False, True):
        keras.utils.set_random_seed(0)
        shape = dataclasses.replace(GPT_PRESETS["tiny"], vocab_size=256, max_len=32, decoder_layers=2, dropout=0.1)
        model = build_gpt(shape, remat=remat)
        model(batch[0])
        compile_model(keras, model, TrainConfig(model_name="gpt", preset="tiny", learning_rate=3e-3,
                                                warmup_steps=2), 6, {})
        model.optimizer.build(model.trainable_variables)
        run = SimpleNamespace(backend=SimpleNamespace(name="jax"), device_kind=jax.default_backend(),
                              extras_state={"remat": {"policy": "full"}},
                              config=SimpleNamespace(extras=("fsdp", "remat")))
        refusal = Remat().verify(run, model, SimpleNamespace(inputs=batch[0])) if remat else None
        distribution = keras.distribution.distribution()
        step = JitTrainStep(model, distribution, gathered_per_device(model, distribution))
        losses = [float(step(*batch)["loss"])]
        before = len(compiled)
        losses += [float(step(*batch)["loss"]) for _ in range(2)]
        compiled_later = len(compiled) - before
        hlo = step._step.lower(step.state, *(step._distribute(a) for a in batch),
                               step.schedule_arguments()).compile().as_text()
        step.finalize()
        figures[str(remat)] = {"losses": losses, "refusal": refusal, "record": run.extras_state["remat"],
                               "compiled_after_the_first_step": compiled_later,
                               "step": {kind: moved(hlo, kind) for kind in ("all-gather", "reduce-scatter")}}
    print(json.dumps(figures))
""")


@pytest.mark.slow
def test_beside_jax_fsdp_the_check_compiles_the_per_device_gradient_the_step_runs():
    """Under fsdp the check measures fsdp's program, not the one-device gradient: its gradient gathers the units'
    weights and reduce-scatters their gradients exactly as often as the fsdp step's compiled program does, keeping
    or recomputing (remat gathers no unit twice), and runs more matrix products recomputing; it stops the run by
    what that program holds per device (XLA:CPU: more recomputing). The fsdp step with recomputing blocks, dropout
    and all, trains the losses of the one keeping them, and either step compiles its program once: dropout's seed
    states rest whole, as the step returns them."""
    env = {**os.environ, "KERAS_BACKEND": "jax", **simulated_devices(2)}
    proc = subprocess.run([sys.executable, "-c", FSDP_PROBE], capture_output=True, text=True, env=env, timeout=600)
    figures = json_answer(proc)
    keeping, recomputing = figures["False"], figures["True"]
    record = recomputing["record"]
    assert record["verified_by"] == ("fsdp's per-device gradient (units gathered, gradients reduce-scattered) on "
                                     "this batch, recomputing against keeping")
    assert keeping["step"]["all-gather"] > 0 and keeping["step"]["reduce-scatter"] > 0
    for name, run in (("keeping", keeping), ("recomputing", recomputing)):
        counted = record["collectives"][name]
        assert (counted.get("all-gather"), counted.get("reduce-scatter")) == (
            run["step"]["all-gather"], run["step"]["reduce-scatter"]), (name, counted, run["step"])
    assert record["collectives"]["keeping"] == record["collectives"]["recomputing"]
    products, held = record["matrix_products"], record["temporary_bytes"]
    assert products["recomputing"] > products["keeping"]
    # The probe's devices are the CPU's (simulated): XLA:CPU holds more recomputing, and the check stops the run in
    # the words a one-device run's refusal has (the test above holds the command's refusal to them).
    assert held["recomputing"] >= held["keeping"] > 0, held
    assert recomputing["refusal"] == (
        f"XLA holds {held['recomputing'] / 2 ** 20:.1f} MiB of temporaries recomputing the blocks and "
        f"{held['keeping'] / 2 ** 20:.1f} MiB keeping their activations (XLA:CPU schedules the recomputation without "
        f"freeing what it replaces); recomputing would cost time and save nothing")
    np.testing.assert_allclose(recomputing["losses"], keeping["losses"], rtol=1e-5)
    assert len(set(keeping["losses"])) == 3
    # The first step's program serves the next steps: the seed states rest as the step returns them (whole), not
    # split over the 2 devices, which made the second step compile the program again.
    assert keeping["compiled_after_the_first_step"] == recomputing["compiled_after_the_first_step"] == 0
