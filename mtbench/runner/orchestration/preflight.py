"""What a comparison asks a child process before any run trains: the machine (as `mtbench env --json` describes
it) and, for each run, whether its device refuses it (its dtype there, or an extra's `unavailable_reason`) as the
run's own process would at its start. In a child, so that the comparing process never holds a device; once for
all runs, so that a refusal costs seconds instead of the runs scheduled before it.

    python -m mtbench.runner.orchestration.preflight < runs.json   # [{"label", "config"}] in, JSON out
"""

import json
import sys

from mtbench.plugins.api import RunContext
from mtbench.plugins.manager import registry as plugin_registry
from mtbench.runner.choices import choose_dtype
from mtbench.runner.config import TrainConfig
from mtbench.runner.measurement.environment import describe_environment
from mtbench.runner.orchestration.environments import backend_devices
from mtbench.runner.setup import choose_plugins, device_refusal, read_model_family


def device_refusals(runs, registry, devices):
    """{label: why the run cannot train on the device its backend sees here (`devices`: {backend: its devices},
    None where it is unavailable)}, for the runs (of one process each: the devices of several are theirs to join)
    whose refusal this process can tell as the run's own would: those whose extras leave the framework's
    environment alone (an extra's `XLA_FLAGS` may show its run other devices). Whatever fails here (a plugin's own
    code, a backend that does not start) is left to the run's process, which says it in its context."""
    refusals = {}
    for entry in runs:
        try:
            config = TrainConfig.from_dict(entry["config"])
            plugins = choose_plugins(config, registry)
            device = devices.get(plugins.backend.name)
            if device is None or any(answer for _, answer in plugins.ask_extras("environment", config)):
                continue
            with plugins.model_code():
                shape = plugins.model.shape(plugins.model_path, config)
            run = RunContext(config=config, backend=plugins.backend, device=device, model_shape=shape,
                             task=plugins.task)
            read_model_family(run, plugins.model)
            choose_dtype(run, plugins)
            reason = device_refusal(run, plugins.extras, plugins.extra_code)
        except Exception:  # noqa: BLE001 (the run's own process reports it, in full)
            continue
        if reason:
            refusals[entry["label"]] = reason
    return refusals


def main():
    registry = plugin_registry()
    runs = json.load(sys.stdin)
    environment = describe_environment(registry)  # each backend's devices, asked once
    refusals = device_refusals(runs, registry, backend_devices(environment))
    json.dump({"environment": environment, "refusals": refusals}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
