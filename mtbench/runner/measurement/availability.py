"""Which extras can run on this machine, and why not: what `mtbench plugins` shows."""

from mtbench.plugins.api import Backend, Extra, RunContext
from mtbench.runner.choices import auto_dtype
from mtbench.runner.config import TrainConfig
from mtbench.runner.setup import read_model_family


def ignored_compile_options_reason(extra, backend):
    """Why every default run of `extra` on `backend` stops before training (`setup.check_compile_options_apply`):
    the extra asks for model.compile options (overrides `compile_options`) and gives no train step of its own,
    while the backend trains with its own step (overrides `make_train_step`), which does not run Keras's compiled
    train function; None otherwise. Read from the classes: no step is built here, and keras is not imported."""
    overrides = lambda item, base, method: getattr(type(item), method) is not getattr(base, method)
    if (overrides(extra, Extra, "compile_options") and not overrides(extra, Extra, "make_train_step")
            and overrides(backend, Backend, "make_train_step")):
        return (f"sets model.compile options and brings no train step, but backend '{backend.name}' trains with a "
                f"step of its own that does not run Keras's compiled train function, so a run stops rather than "
                f"apply them to evaluation only")
    return None


def backend_devices(backend):
    """(`device_info()`, None), or (None, why not): the framework missing, or failing to start. A backend plugin that
    fails here is said in its extras' rows, and the listing goes on."""
    try:
        missing = backend.missing_framework()
        return (None, missing) if missing else (backend.device_info(), None)
    except Exception as error:  # noqa: BLE001 (one broken backend must not hide the other plugins)
        return None, f"backend '{backend.name}' cannot describe its devices: {type(error).__name__}: {error}"


def extras_availability(registry):
    """One row per (extra, backend it serves): available or the reason, for a default run on this machine.
    Describing a backend's devices imports its framework (not keras)."""
    devices = {}
    rows = []
    for extra in registry.extras.values():
        for backend_name in extra.backends:
            backend = registry.backends.get(backend_name)
            if backend is None:
                reason = f"backend '{backend_name}' is not installed as a plugin"
            else:
                if backend_name not in devices:
                    devices[backend_name] = backend_devices(backend)
                reason = devices[backend_name][1]
                if reason is None:
                    # The dtype `--dtype auto` trains in here (mixed bfloat16 on a GPU that computes it), as the
                    # extras of a default run are asked: TrainConfig's own default is float32.
                    device = devices[backend_name][0]
                    config = TrainConfig(backend=backend_name, dtype=auto_dtype(backend, device)[0])
                    run = RunContext(config=config, backend=backend, device=device,
                                     model_shape=config.model)
                    family = registry.models.get(config.model_family[0])
                    if family is not None:  # what the default model tells its extras (remat: its blocks)
                        read_model_family(run, family)
                    try:
                        reason = extra.unavailable_reason(run)
                    except Exception as error:  # one broken extra must not hide the others
                        reason = f"unavailable_reason failed: {type(error).__name__}: {error}"
                    reason = reason or ignored_compile_options_reason(extra, backend)
            rows.append({"extra": extra.name, "backend": backend_name, "available": reason is None,
                         "reason": reason, "description": extra.description,
                         "conflicts": list(extra.conflicts)})
    return rows
