"""What a comparison asks a child process before any run trains: the machine (as `mtbench env --json` describes
it) and, for each run, whether its device refuses it (its dtype there, or an extra's `unavailable_reason`) as the
run's own process would at its start. In a child, so that the comparing process never holds a device; once for
all runs, so that a refusal costs seconds instead of the runs scheduled before it.

    python -m mtbench.runner.orchestration.preflight < runs.json   # [{"label", "config", "processes"}] in, JSON out
"""

import dataclasses
import json
import sys

from mtbench.plugins.api import Launch, ProcessGroup, RunContext
from mtbench.plugins.manager import registry as plugin_registry
from mtbench.runner.choices import choose_dtype
from mtbench.runner.config import TrainConfig
from mtbench.runner.measurement.environment import describe_environment
from mtbench.runner.orchestration.environments import backend_devices
from mtbench.runner.setup import (check_configuration_changes, choose_plugins, configuration_changes, device_refusal,
                                  read_model_family)


def device_refusals(runs, registry, devices, changes=None):
    """{label: why the run cannot train on the device its backend sees here (`devices`: {backend: its devices},
    None where it is unavailable)}, for the runs (`processes` of each, 1 where not given) whose refusal this process
    can tell as the run's own would: those whose extras leave the framework's environment alone (an extra's
    `XLA_FLAGS` may show its run other devices). A run of several processes is refused only where its extras refuse
    it both with each process seeing the devices seen here and with every process's devices together (which of the
    two the backend shows them is theirs to find): what its processes' count, shape or task refuses, whatever devices
    they see. An extra whose own check fails is named here, as the run's process would name it; whatever else fails
    (a backend that does not start) is left to the run's process, which says it in its context. `changes`, where
    given, gets {label: {"config": its configuration as dict, "changed_by": {key: extra}}} of each run of one
    process that its extras' `config_changes` change; the changed run is refused as its process would refuse it
    (`check_configuration_changes`)."""
    refusals = {}
    for entry in runs:
        processes = entry.get("processes", 1)
        try:
            config = TrainConfig.from_dict(entry["config"])
            plugins = choose_plugins(config, registry)
            device = devices.get(plugins.backend.name)
            if device is None or any(answer for _, answer in plugins.ask_extras("environment", config)):
                continue
            with plugins.model_code():
                shape = plugins.model.shape(plugins.model_path, config)
            views = [device] if processes == 1 else [device, {**device, "count": device.get("count", 1) * processes}]
            runs_seen = []
            for seen in views:
                run = RunContext(config=config, backend=plugins.backend, device=seen, model_shape=shape,
                                 task=plugins.task, processes=ProcessGroup(Launch(num_processes=processes)))
                read_model_family(run, plugins.model)
                choose_dtype(run, plugins)
                runs_seen.append(run)
        except Exception:  # noqa: BLE001 (the run's own process reports it, in full)
            continue
        try:
            reasons = [device_refusal(run, plugins.extras, plugins.extra_code, plugins.registry) for run in runs_seen]
            if changes is not None and processes == 1 and not reasons[0]:
                changed, changed_by = configuration_changes(runs_seen[0], plugins)
                check_configuration_changes(dataclasses.replace(runs_seen[0], config=changed), plugins, changed_by)
                if changed_by:
                    changes[entry["label"]] = {"config": changed.to_dict(), "changed_by": changed_by}
        except Exception as error:  # noqa: BLE001 (an extra's own code failed: `extra_code` names the extra)
            reasons = [str(error)]
        if all(reasons):
            refusals[entry["label"]] = reasons[0]
    return refusals


def main():
    registry = plugin_registry()
    runs = json.load(sys.stdin)
    environment = describe_environment(registry)  # each backend's devices, asked once
    changes = {}
    refusals = device_refusals(runs, registry, backend_devices(environment), changes)
    json.dump({"environment": environment, "refusals": refusals, "changes": changes}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
