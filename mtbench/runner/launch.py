"""Where this process stands among the run's processes, read before any framework is imported: from explicit
flags (--coordinator, --num-processes, --process-id), from torchrun's environment, or from SLURM's. A process
started on its own is a run of one."""

import dataclasses
import json
import os
import socket
import time

from mtbench.errors import MtbenchError
from mtbench.plugins.api import Launch

# Set by mtbench for the processes of a torchrun it starts on this machine: `Launch.launch_dir`.
LAUNCH_DIR_VARIABLE = "MTBENCH_LAUNCH_DIR"


def read_launch(coordinator=None, num_processes=None, process_id=None, timeout_s=300, environ=os.environ):
    explicit = (coordinator, num_processes, process_id)
    if any(value is not None for value in explicit):
        if not all(value is not None for value in explicit):
            raise MtbenchError("--coordinator, --num-processes and --process-id go together: give all three")
        launch = Launch(process_id, num_processes, coordinator=coordinator, launcher="flags", timeout_s=timeout_s)
        if not 0 <= process_id < num_processes:
            raise MtbenchError(f"process id {process_id} is not one of {num_processes} processes (flags)")
        if "LOCAL_RANK" in environ and "LOCAL_WORLD_SIZE" in environ:
            local = _int(environ, "LOCAL_RANK"), _int(environ, "LOCAL_WORLD_SIZE")
        else:
            local = _local_place(launch) if num_processes > 1 else (0, 1)
        launch = dataclasses.replace(launch, local_rank=local[0], local_processes=local[1])
    elif "TORCHELASTIC_RUN_ID" in environ or ("RANK" in environ and "WORLD_SIZE" in environ):
        launch = Launch(_int(environ, "RANK"), _int(environ, "WORLD_SIZE"), _int(environ, "LOCAL_RANK", 0),
                        _int(environ, "LOCAL_WORLD_SIZE", 1), _master(environ, "torchrun"), "torchrun", timeout_s,
                        launch_dir=environ.get(LAUNCH_DIR_VARIABLE) or None)
    elif "SLURM_PROCID" in environ and _int(environ, "SLURM_NTASKS", 1) > 1:
        launch = Launch(_int(environ, "SLURM_PROCID"), _int(environ, "SLURM_NTASKS"), _int(environ, "SLURM_LOCALID", 0),
                        _int(environ, "SLURM_NTASKS_PER_NODE", 1), _master(environ, "SLURM"), "slurm", timeout_s)
    else:
        return Launch(timeout_s=timeout_s)
    if launch.num_processes < 1 or not 0 <= launch.process_id < launch.num_processes:
        raise MtbenchError(f"process id {launch.process_id} is not one of {launch.num_processes} processes "
                           f"({launch.launcher})")
    if launch.num_processes > 1 and not launch.coordinator:
        raise MtbenchError(f"{launch.num_processes} processes need the address of process 0: --coordinator "
                           f"HOST:PORT ({launch.launcher})")
    return launch


def _local_place(launch):
    """(local rank, local processes) of a process started by the flags, whose launcher said nothing of its machine:
    each process tells process 0 its hostname over the coordinator's port, before the framework serves there, and
    learns everyone's. Without it every process would count as a machine of its own: no share of the cores, every
    process on GPU 0, and MFU's peak counted once per process."""
    host, port = _host_port(launch.coordinator)
    me = socket.gethostname()
    deadline = time.monotonic() + launch.timeout_s
    if launch.process_id == 0:
        hosts = _serve_hostnames(port, launch.num_processes, me, deadline)
    else:
        hosts = _ask_hostnames(host, port, launch.process_id, me, deadline)
    same = [index for index, name in enumerate(hosts) if name == me]
    return same.index(launch.process_id), len(same)


def _host_port(coordinator):
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise MtbenchError(f"--coordinator {coordinator!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _serve_hostnames(port, num_processes, me, deadline):
    """Process 0's side: every process's hostname, by process id, sent back to each. The listening socket closes
    before the answers go out and each peer closes first, so the port is free (no TIME_WAIT on it) for the
    framework's coordination service that binds it next."""
    hosts, peers = {0: me}, []
    try:
        with socket.create_server(("", port), family=socket.AF_INET6 if socket.has_dualstack_ipv6()
                                  else socket.AF_INET, dualstack_ipv6=socket.has_dualstack_ipv6()) as server:
            while len(hosts) < num_processes:
                server.settimeout(max(deadline - time.monotonic(), 0.001))
                peer, _ = server.accept()
                peers.append(peer)
                peer.settimeout(max(deadline - time.monotonic(), 0.001))
                said = json.loads(_read_line(peer))
                if said["process_id"] in hosts or not 0 < said["process_id"] < num_processes:
                    raise MtbenchError(f"two processes gave process id {said['process_id']}, or one out of range")
                hosts[said["process_id"]] = said["host"]
        answer = (json.dumps([hosts[index] for index in range(num_processes)]) + "\n").encode()
        for peer in peers:
            peer.sendall(answer)
        for peer in peers:
            _read_line(peer)  # the peer's close
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise MtbenchError(f"process 0 could not learn the other processes' machines on port {port}: "
                           f"{error or type(error).__name__}") from None
    finally:
        for peer in peers:
            peer.close()
    return [hosts[index] for index in range(num_processes)]


def _ask_hostnames(host, port, process_id, me, deadline):
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.001)) as peer:
                peer.sendall((json.dumps({"process_id": process_id, "host": me}) + "\n").encode())
                return json.loads(_read_line(peer))
        except (ConnectionRefusedError, ConnectionResetError):  # process 0 is not listening yet
            if time.monotonic() > deadline:
                raise MtbenchError(f"process {process_id} found no process 0 at {host}:{port} within "
                                   f"--process-timeout") from None
            time.sleep(0.1)
        except (OSError, ValueError) as error:
            raise MtbenchError(f"process {process_id} could not learn the processes' machines from {host}:{port}: "
                               f"{error or type(error).__name__}") from None


def _read_line(peer):
    """One line from `peer`, or what came before it closed ('' for a close with nothing said)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = peer.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _int(environ, name, default=None):
    text = environ.get(name)
    if text is None:
        if default is None:
            raise MtbenchError(f"the launcher set no {name}")
        return default
    try:
        return int(text.split("(")[0])  # SLURM writes '2(x3)' for repeated counts
    except ValueError:
        raise MtbenchError(f"{name}={text!r} is not a number") from None


def _master(environ, launcher):
    """host:port of process 0, as MASTER_ADDR and MASTER_PORT give it (torchrun sets them; a SLURM script
    exports them)."""
    host, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if not host or not port:
        return None
    return f"{host}:{port}"


def devices_spanned(states):
    """How many devices the run spans, all processes together, as its extras' states or records say (their
    `devices`; 1 where none does): what MFU divides the peak by on accelerators."""
    return max([state.get("devices", 1) for state in states if isinstance(state, dict)] + [1])


# The CPUs that this machine's processes of the run share out, where this process is one of several.
_shared_cpus = None


def process_cpus():
    """The CPUs this process may run on, in order; None where the OS pins no process."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def measuring_cpus():
    """The CPUs a measurement of this machine (its matmul peak) runs on, in a process of its own: those this
    machine's processes of the run share out (the affinity this process had before `share_cores` gave it its
    slice), or this process's; None where the OS pins no process (it is measured in this one)."""
    return _shared_cpus if _shared_cpus is not None else process_cpus()


def share_cores(launch, environ=os.environ):
    """Gives this process its share of the CPUs when it runs beside others on one machine: the local rank's
    equal slice of the CPUs the process may run on, and as many intra-op threads. XLA's CPU runtime sizes its
    thread pool to the CPUs a process may run on and torchrun binds only torch (`OMP_NUM_THREADS=1`), so N
    processes would otherwise run N x cores threads on the cores one had, and JAX's N-process figure would
    measure the oversubscription. Called before any framework is imported; returns the record of what was set,
    or None for a process alone on its machine (or with fewer CPUs than processes, where no share is whole)."""
    if launch.local_processes == 1 or process_cpus() is None:
        return None
    global _shared_cpus
    _shared_cpus = process_cpus()
    share = core_share(_shared_cpus, launch.local_rank, launch.local_processes)
    if share is None:
        return None
    os.sched_setaffinity(0, share["cpus"])
    environ["OMP_NUM_THREADS"] = str(share["threads"])  # torch's intra-op threads (over torchrun's 1), at its import
    return share


def core_share(cpus, local_rank, local_processes):
    """The record of local process `local_rank`'s share of `cpus` (its equal slice, as many threads), or None where
    a share would not be whole."""
    size = len(cpus) // local_processes
    if size == 0:
        return None
    return {"cpus": cpus[local_rank * size:(local_rank + 1) * size], "threads": size, "of_cpus": len(cpus),
            "local_processes": local_processes}
