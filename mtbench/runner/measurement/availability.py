"""Which extras can run on this machine, and why not: what `mtbench plugins` shows."""

from mtbench.plugins.api import RunContext
from mtbench.runner.config import TrainConfig


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
                reason = backend.missing_framework()
                if reason is None:
                    if backend_name not in devices:
                        devices[backend_name] = backend.device_info()
                    config = TrainConfig(backend=backend_name)
                    run = RunContext(config=config, backend=backend, device=devices[backend_name],
                                     model_shape=config.model)
                    try:
                        reason = extra.unavailable_reason(run)
                    except Exception as error:  # one broken extra must not hide the others
                        reason = f"unavailable_reason failed: {type(error).__name__}: {error}"
            rows.append({"extra": extra.name, "backend": backend_name, "available": reason is None,
                         "reason": reason, "description": extra.description,
                         "conflicts": list(extra.conflicts)})
    return rows
