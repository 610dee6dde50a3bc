"""torch-compile: mtbench's torch step with its forward pass and loss compiled by torch.compile, in the mode
the user picks (`torch_compiled_step`).

Graph breaks and recompilations are what make torch.compile slow or fast, so dynamo's counters go into the
result: a graph break or a recompile storm is a figure to show, not hide.

Inductor's FX graph and AOTAutograd caches (in the backend's compile cache directory) spare a later process the
compilation proper; dynamo still traces in every process. What this process's compilations used is also bundled
into one file (`torch.compiler.save_cache_artifacts`) after training and loaded before the step compiles: the
portable form of the same caches: copied into another machine's cache directory, it serves there too."""

import os

from mtbench import Extra, MtbenchError, hookimpl

CACHE_ARTIFACTS_FILE = "cache-artifacts.bin"


def cache_artifacts_path(compile_cache):
    """Where the run keeps its cache artifacts, or None when its compile cache is off."""
    if not compile_cache or compile_cache["dir"] is None:
        return None
    return os.path.join(compile_cache["dir"], CACHE_ARTIFACTS_FILE)


def artifact_counts(cache_info):
    """{kind: how many} of a torch `CacheInfo`."""
    return {kind: len(keys) for kind, keys in sorted(cache_info.artifacts.items())}


def load_cache_artifacts(path):
    """Puts the artifacts an earlier run saved at `path` into inductor's caches; their counts, or None when there
    are none to load (no file, or a torch without the API)."""
    import torch
    if path is None or not os.path.exists(path) or not hasattr(torch.compiler, "load_cache_artifacts"):
        return None
    with open(path, "rb") as f:
        info = torch.compiler.load_cache_artifacts(f.read())
    return None if info is None else artifact_counts(info)


def save_cache_artifacts(path):
    """Writes what this process's compilations added to the caches to `path` (atomically), or leaves an earlier
    file alone when they added nothing; the counts written, or None."""
    import torch
    if path is None or not hasattr(torch.compiler, "save_cache_artifacts"):
        return None
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return None
    artifacts, info = saved
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "wb") as f:
        f.write(artifacts)
    os.replace(partial, path)
    return artifact_counts(info)


class TorchCompile(Extra):
    name = "torch-compile"
    description = ("compile mtbench's torch step (forward + loss) with torch.compile (--compile-mode); "
                   "reports graphs, graph breaks and recompilations")
    backends = ("torch",)

    def make_train_step(self, run, model, step):
        from torch._dynamo.utils import counters

        from mtbench.plugins.backends.torch_compiled_step import CompiledTorchTrainStep
        from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
        if not isinstance(step, EagerTorchTrainStep) and not hasattr(step, "around"):
            # Another extra's step (a wrapper of the eager one): replaced, it would be gone without a word.
            raise MtbenchError(f"compiles mtbench's torch step, not the '{step.name}' step of "
                               f"{getattr(step, 'made_by', 'an extra')}: give --extra torch-compile before that "
                               f"extra, whose step then wraps the compiled one, or train eager (--step eager, without "
                               f"--extra torch-compile)")
        artifacts = cache_artifacts_path(run.compile_cache)
        loaded = load_cache_artifacts(artifacts)
        counters.clear()
        mode = None if run.config.compile_mode == "default" else run.config.compile_mode
        # Replaces the eager step rather than wrapping it.
        compiled = CompiledTorchTrainStep(model, mode=mode, micro_batches=run.config.grad_accum)
        run.extras_state[self.name] = {"step": compiled, "artifacts": artifacts, "artifacts_loaded": loaded}
        if isinstance(step, EagerTorchTrainStep):
            compiled.share_distribution(step)  # --extra ddp given before this extra
        elif hasattr(step, "around"):  # a wrapper that must stay around the step (fsdp's), given before this extra
            return step.around(compiled)
        return compiled

    def record(self, run):
        import torch
        from torch._dynamo.utils import counters

        from mtbench.plugins.backends.torch_compiled_step import dynamo_counters, precision_casts
        state = run.extras_state[self.name]
        step = state["step"]
        # Called once training has ended: the last point at which this process's compilations are all known.
        saved = save_cache_artifacts(state["artifacts"])
        # Read from inductor's configuration (the compiled step sets it before compiling), not assumed.
        casts = precision_casts(run.device_kind)
        return {"mode": run.config.compile_mode, "compiled": step.compiled_part, "precision_casts": casts,
                **dynamo_counters(),
                **step.compilations(), "compile_s": round(step.compile_seconds(), 3),
                "recompile_limit": torch._dynamo.config.recompile_limit,
                "shapes_trained": len(step.shapes_seen), "shapes_run_eagerly": step.shapes_run_eagerly(),
                "cuda_graphs": step.cuda_graphs(), "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"]),
                "cache_artifacts": {"file": state["artifacts"], "loaded": state["artifacts_loaded"], "saved": saved}}


@hookimpl
def mtbench_register_extras(register):
    register(TorchCompile())
