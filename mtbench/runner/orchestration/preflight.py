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
from mtbench.runner.setup import choose_plugins, device_refusal


def device_refusals(runs, registry):
    """{label: why the run cannot train on the device its backend sees here}, for the runs (of one process each:
    the devices of several are theirs to join) whose refusal this process can tell as the run's own would: those
    whose extras leave the framework's environment alone (an extra's `XLA_FLAGS` may show its run other devices).
    Whatever fails here (a plugin's own code) is left to the run's process, which says it in its context."""
    devices, refusals = {}, {}
    for entry in runs:
        try:
            config = TrainConfig.from_dict(entry["config"])
            plugins = choose_plugins(config, registry)
            if any(answer for _, answer in plugins.ask_extras("environment", config)):
                continue
            backend = plugins.backend
            if backend.name not in devices:
                devices[backend.name] = backend.device_info()
            with plugins.model_code():
                shape = plugins.model.shape(plugins.model_path, config)
            run = RunContext(config=config, backend=backend, device=devices[backend.name], model_shape=shape,
                             task=plugins.task)
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
    json.dump({"environment": describe_environment(registry), "refusals": device_refusals(runs, registry)},
              sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
