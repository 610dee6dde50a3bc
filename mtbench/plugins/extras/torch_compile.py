"""torch-compile: mtbench's torch step with its forward pass and loss compiled by torch.compile, in the mode
the user picks (`torch_compiled_step`).

Graph breaks and recompilations are what make torch.compile slow or fast, so dynamo's counters go into the
result: a graph break or a recompile storm is a figure to show, not hide."""

from mtbench import Extra, hookimpl


class TorchCompile(Extra):
    name = "torch-compile"
    description = ("compile mtbench's torch step (forward + loss) with torch.compile (--compile-mode); "
                   "reports graphs, graph breaks and recompilations")
    backends = ("torch",)

    def make_train_step(self, run, model, step):
        from torch._dynamo.utils import counters

        from mtbench.plugins.backends.torch_compiled_step import CompiledTorchTrainStep
        counters.clear()
        mode = None if run.config.compile_mode == "default" else run.config.compile_mode
        compiled = CompiledTorchTrainStep(model, mode=mode)  # replaces the eager step rather than wrapping it
        run.extras_state[self.name] = {"step": compiled}
        return compiled

    def record(self, run):
        from mtbench.plugins.backends.torch_compiled_step import COMPILED_PART, dynamo_counters
        step = run.extras_state[self.name]["step"]
        return {"mode": run.config.compile_mode, "compiled": COMPILED_PART, **dynamo_counters(),
                **step.compilations(), "compile_s": round(step.compile_seconds(), 3)}


@hookimpl
def mtbench_register_extras(register):
    register(TorchCompile())
