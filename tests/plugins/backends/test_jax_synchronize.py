"""The JAX backend's synchronize waits on what a model's variables still hold, also when a train step has taken
some of a variable's buffers. jax 0.11 donates a variable laid out whole over several devices copy by copy, and
may leave it holding some (seen on an H100 machine's simulated CPU devices, under --extra tensor-parallel): the
array then reads as not deleted, and waiting on it whole fails. Made here by deleting one copy, on 2 simulated
devices, in a process of its own (XLA reads the device count at start)."""

import subprocess
import sys

from conftest import REPOSITORY, cli_environment, json_answer, simulated_devices

SCRIPT = r"""
import json
import jax, keras
from mtbench.plugins.backends.jax_backend import JaxBackend

keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
kernel, bias, other_kernel = model.variables[0], model.variables[1], model.variables[2]
kernel.value.addressable_shards[1].data.delete()  # one copy taken, as a donation may leave it
other_kernel.value.delete()  # every copy taken
try:
    jax.block_until_ready(kernel.value)
    whole_wait = "waited"
except Exception as error:
    whole_wait = str(error)
waited, wait = [], jax.block_until_ready
jax.block_until_ready = lambda arrays: waited.extend(tuple(a.shape) for a in arrays) or wait(arrays)
JaxBackend().synchronize(model)
jax.block_until_ready = wait
print(json.dumps({"devices": len(jax.devices()), "kernel_copies": len(kernel.value.addressable_shards),
                  "kernel_deleted": kernel.value.is_deleted(), "whole_wait": whole_wait,
                  "bias": bias.numpy().tolist(), "waited": sorted(waited)}))
"""


def test_synchronize_waits_on_the_copies_a_donation_left():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                          env=cli_environment({**simulated_devices(2), "KERAS_BACKEND": "jax"}), cwd=REPOSITORY)
    record = json_answer(proc)
    assert record["devices"] == record["kernel_copies"] == 2
    # What the backend must step around: an array that says it is whole, and cannot be waited on whole.
    assert record["kernel_deleted"] is False
    assert "deleted or donated buffer" in record["whole_wait"]
    assert record["bias"] == [0.0, 0.0, 0.0, 0.0]  # the untouched variables are still there to read
    # It waited on every copy that is left, and only those: the kernel's one, both of each bias, none of the
    # kernel whose copies were all taken.
    assert record["waited"] == [[2], [2], [3, 4], [4], [4]]
