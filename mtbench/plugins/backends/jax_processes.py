"""A JAX run of several processes: `jax.distributed.initialize` joins them (every process then sees the devices
of all as `jax.devices()`, the global mesh that `keras.distribution` lays a model over); between CPUs the
processes talk through gloo, between GPUs through NCCL (RCCL on ROCm), as XLA chooses."""

import contextlib

from mtbench import MtbenchError, ProcessGroup

def coordinator_address(launch):
    """Where JAX's coordination service runs: the launch's coordinator; under torchrun, whose agent serves its
    store on MASTER_PORT, a port process 0 finds free and leaves for the others (the port after MASTER_PORT, taken
    before, was once another program's): in the launch's directory where mtbench started torchrun, else in
    torchrun's store, which only torch reads."""
    if launch.launcher != "torchrun":
        return launch.coordinator
    import os
    host, _, port = launch.coordinator.rpartition(":")
    # A restarted group meets under a name of its own.
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if launch.launch_dir:
        return f"{host}:{port_in_directory(launch, f'jax-coordinator-{restart}')}"
    import datetime

    from torch.distributed import TCPStore
    store = TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=launch.timeout_s))
    key = f"mtbench/jax-coordinator/{restart}"
    if launch.process_id == 0:
        store.set(key, str(free_port()))
    return f"{host}:{store.get(key).decode()}"


def port_in_directory(launch, name):
    """A free port process 0 finds and writes into file `name` of the launch's directory, read there by the
    others, which wait for it as long as for any of process 0's answers."""
    import os
    import time
    path = os.path.join(launch.launch_dir, name)
    if launch.process_id == 0:
        with open(path + ".tmp", "w") as f:
            f.write(str(free_port()))
        os.replace(path + ".tmp", path)  # whole or absent: a reader never sees half a number
    deadline = time.monotonic() + launch.timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"process 0 left no port in {path} within {launch.timeout_s} s")
        time.sleep(0.02)
    with open(path) as f:
        return int(f.read())


def free_port():
    """A port no program listens on now, from the system."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def collectives_library(device):
    """What carries JAX's collectives between processes on `device`'s platform: gloo on CPUs, NCCL on CUDA GPUs,
    RCCL on ROCm's, the chips' own interconnect on TPUs."""
    if device.platform == "cpu":
        return "gloo"
    if device.platform == "tpu":
        return "tpu interconnect"
    version = getattr(getattr(device, "client", None), "platform_version", "") or ""
    return "rccl" if "rocm" in version.lower() else "nccl"


class JaxProcessGroup(ProcessGroup):
    def __init__(self, launch):
        import jax
        super().__init__(launch)
        # Collectives between CPU processes need a library (none by default); GPUs use NCCL without being told.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        coordinator = launch.coordinator
        try:
            # Under torchrun a question to its store, which may not answer.
            coordinator = coordinator_address(launch)
            # Several processes on a machine: one GPU each, its local rank's, as torchrun's processes have, or the
            # one a scheduler left it (JAX reads it as the GPUs it may see; a machine without GPUs ignores it).
            jax.distributed.initialize(coordinator, launch.num_processes, launch.process_id,
                                       local_device_ids=[launch.device_ordinal()] if launch.local_processes > 1
                                       else None,
                                       initialization_timeout=launch.timeout_s,
                                       heartbeat_timeout_seconds=min(launch.timeout_s, 100))
        except (RuntimeError, ValueError, OSError) as error:  # OSError: a launch directory gone or unwritable
            raise MtbenchError(f"process {launch.process_id} of {launch.num_processes} could not join the others "
                               f"at {coordinator}: {str(error).splitlines()[0]}") from None
        self.collectives = collectives_library(jax.devices()[0])

    def record(self, devices_per_process):
        record = super().record(devices_per_process)
        if self.launch.launcher == "torchrun":  # torch's import is in the memory of every process that read the store
            record["coordinator_port_from"] = ("the launch's directory" if self.launch.launch_dir
                                               else "torchrun's store (torch imported)")
        return record

    def any(self, flag):
        import numpy as np
        from jax.experimental import multihost_utils
        return bool(np.max(multihost_utils.process_allgather(np.int32(1 if flag else 0))))

    def sum(self, values):
        import numpy as np
        from jax.experimental import multihost_utils
        # float32 (JAX's default): each figure to 7 digits.
        gathered = multihost_utils.process_allgather(np.asarray(values, dtype=np.float32))
        return [float(value) for value in np.asarray(gathered).sum(axis=0)]

    def barrier(self):
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("mtbench")

    @contextlib.contextmanager
    def alone(self):
        """Without keras's distribution: under one that spans the processes every variable Keras creates is placed
        over all their devices, which `jax.device_put` checks with a collective (`multihost_utils.assert_equal`)
        that the other processes never join. Keras's `save_weights` creates variables (a reference optimizer, to
        know which attributes to leave out), so process 0 saving alone would wait for ever. Created here, they stay
        on this process; reading the model's variables needs none, once `TrainStep.finalize` left them whole on
        every process (data-parallel replicates them, fsdp's step gathers them)."""
        import keras
        distribution = keras.distribution.distribution()
        keras.distribution.set_distribution(None)
        try:
            yield
        finally:
            keras.distribution.set_distribution(distribution)

    def close(self):
        import jax
        jax.distributed.shutdown()
