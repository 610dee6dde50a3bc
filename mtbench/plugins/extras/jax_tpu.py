"""tpu: the TPU strategy on JAX: a device mesh over every TPU core, data parallel, bfloat16 compute, and batch
and length sizes rounded to what the TPU's matrix units tile well."""

from mtbench import Extra, hookimpl

ROWS_PER_CORE = 8   # a TPU core's vector registers hold 8 rows (sublanes): batches per core in multiples of 8
LENGTH_MULTIPLE = 8


def round_up(value, multiple):
    return -(-value // multiple) * multiple


def tpu_batch_size(batch_size, cores):
    """The smallest batch at least `batch_size` that gives every core a multiple of 8 rows."""
    return round_up(batch_size, ROWS_PER_CORE * cores)


def tpu_mesh(devices):
    """A one-axis ('batch') mesh over all devices and the data-parallel distribution over it."""
    import keras
    mesh = keras.distribution.DeviceMesh(shape=(len(devices),), axis_names=("batch",), devices=devices)
    return mesh, keras.distribution.DataParallel(device_mesh=mesh)


class TpuStrategy(Extra):
    name = "tpu"
    description = "device mesh over all TPU cores, data parallel, bfloat16 compute, TPU-friendly sizes"
    backends = ("jax",)
    conflicts = ("pmap", "data-parallel", "flash-attention")
    parallelism = "data"

    def unavailable_reason(self, run):
        if run.device_kind != "tpu":
            return (f"needs TPU devices; this run has {run.device.get('count', 1)} "
                    f"{run.device_kind} device(s)")
        if run.config.max_tokens is not None:
            return "sizes a fixed --batch-size for the TPU cores; --max-tokens gives each length bucket its own rows"
        if run.config.dtype not in ("float32", "mixed_bfloat16", "bfloat16"):
            return f"computes in bfloat16; --dtype {run.config.dtype} does not fit it"
        return None

    def config_changes(self, run):
        config = run.config
        cores = run.device.get("count", 1)
        before = {"batch_size": config.batch_size, "max_len": config.max_len, "dtype": config.dtype}
        used = {"batch_size": tpu_batch_size(config.batch_size, cores),
                "max_len": round_up(config.max_len, LENGTH_MULTIPLE),
                "dtype": "mixed_bfloat16" if config.dtype == "float32" else config.dtype}
        # `devices`: what the run spans, which MFU divides the peak by (`devices_used`); `cores`, as first recorded.
        run.extras_state[self.name] = {"devices": cores, "cores": cores, "requested": before, "used": used}
        return {key: value for key, value in used.items() if value != before[key]}

    def before_model(self, run):
        import jax
        import keras
        mesh, distribution = tpu_mesh(jax.devices())
        keras.distribution.set_distribution(distribution)
        run.extras_state[self.name]["mesh_shape"] = list(mesh.shape)


@hookimpl
def mtbench_register_extras(register):
    register(TpuStrategy())
