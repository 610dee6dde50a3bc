"""The JAX backend."""

import os
import re

from mtbench import Backend, cpu_model, hookimpl, median_flops_per_s, native_bfloat16


_compile_events = []  # [count] once the listener is registered
# Lookups of the persistent compilation cache in this process, once the listener is registered. JAX's own
# "cache_misses" event counts the programs it writes, which only process 0 of several does: a miss is a lookup
# that did not hit.
_cache_lookups = {}
CACHE_LOOKUP_EVENTS = {"/jax/compilation_cache/compile_requests_use_cache": "lookups",
                       "/jax/compilation_cache/cache_hits": "hits"}
CACHE_ENTRY_SUFFIX = "-cache"  # each program is one file: <key>-cache (beside it, <key>-atime for the LRU)


def _count_compile(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        _compile_events[0] += 1


def _count_cache_lookup(event, **kwargs):
    if event in CACHE_LOOKUP_EVENTS:
        _cache_lookups[CACHE_LOOKUP_EVENTS[event]] += 1


def compile_cache_dir(cache_dir, jax_version, device_kind):
    """One directory per JAX version and device kind, so that caches of different GPUs or versions stay apart
    (JAX's own cache key separates them too; separate directories keep each one's count meaningful)."""
    kind = re.sub(r"[^A-Za-z0-9._-]+", "-", device_kind).strip("-") or "unknown"
    return os.path.join(cache_dir, "compile", f"jax-{jax_version}-{kind}")


def gpu_bfloat16(device):
    """Whether JAX's GPU `device` multiplies bfloat16 natively, from its compute capability (a CUDA GPU's '9.0', a
    ROCm GPU's 'gfx942'), or where a ROCm build names none, from the Instinct model: MI100 and later have bfloat16
    matrix units, the MI50 and MI60 before them do not."""
    capability = getattr(device, "compute_capability", None)
    if capability:
        return native_bfloat16(capability)
    instinct = re.search(r"\bMI(\d+)", getattr(device, "device_kind", ""))
    return bool(instinct) and "AMD" in device.device_kind.upper() and int(instinct.group(1)) >= 100


def rocm_version(platform_version):
    """ROCm's version ('6.4.0') from what JAX's client says it runs on ('rocm 60400', as XLA writes ROCm's
    major * 10000 + minor * 100 + patch), or None on anything else ('cuda 12080', 'cpu')."""
    found = re.fullmatch(r"rocm (\d+)", platform_version.strip().lower())
    if not found:
        return None
    number = int(found.group(1))
    return f"{number // 10000}.{number // 100 % 100}.{number % 100}"


class JaxBackend(Backend):
    name = "jax"
    keras_backend = "jax"
    framework_modules = ("jax", "jaxlib")
    description = "Keras 3 on JAX: train steps compiled by XLA (jax.jit)"
    inference = ("compiled: jax.jit; a translation decoded in a loop inside one XLA program, a language model's "
                 "sample token by token from Python")

    def unsupported_dtype_reason(self, dtype, device):
        if device.get("kind") == "cpu" and "float16" in dtype and "bfloat16" not in dtype:
            return f"XLA on the CPU has no float16 matmul ({dtype}); use bfloat16 or mixed_bfloat16 there"
        return None

    def start_processes(self, launch):
        if launch.num_processes == 1:
            return super().start_processes(launch)
        from mtbench.plugins.backends.jax_processes import JaxProcessGroup
        return JaxProcessGroup(launch)

    def framework_versions(self):
        import jax
        import jaxlib
        return {"jax": jax.__version__, "jaxlib": jaxlib.__version__}

    def device_info(self):
        import jax
        devices = jax.devices()
        first = devices[0]
        name = cpu_model() if first.platform == "cpu" else first.device_kind
        info = {"kind": first.platform, "name": name, "count": len(devices)}
        if first.platform == "tpu":
            info["bfloat16"] = True
        elif first.platform == "gpu":
            info["bfloat16"] = gpu_bfloat16(first)
        return info

    def synchronize(self, model=None):
        import jax
        # XLA runs asynchronously: a clock is only honest once the values the step produced exist.
        if model is not None:
            # A variable whose buffers the train step took over (donated) is waited for by the step's `block`.
            # Taken buffer by buffer: a donated array laid out whole over several devices may have given up
            # only some of its copies (jax 0.11 on simulated CPU devices), and a deleted one cannot be waited on.
            jax.block_until_ready([shard.data for v in model.variables if not v.value.is_deleted()
                                   for shard in v.value.addressable_shards if not shard.data.is_deleted()])
        jax.effects_barrier()

    def peak_device_bytes(self):
        import jax
        peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in jax.local_devices()]
        peaks = [p for p in peaks if p is not None]
        # The largest device's, as torch reads its one device: a sum would grow with the devices a run spans.
        return max(peaks) if peaks else None

    def device_memory(self):
        import jax
        import keras
        # The devices this process computes on: its distribution's mesh where one is set; else (one device, or
        # pmap's step over every local device, which sets no distribution) each device that has held bytes, the
        # first at least: an unused GPU of the machine allocates nothing.
        distribution = keras.distribution.distribution()
        local = [(device, device.memory_stats()) for device in jax.local_devices()]
        if any(not stats or "peak_bytes_in_use" not in stats for _, stats in local):
            return None
        if distribution:
            mesh = set(distribution.device_mesh.devices.flatten())
            used = [(device, stats) for device, stats in local if device in mesh]
        else:
            used = local[:1] + [(device, stats) for device, stats in local[1:] if stats["peak_bytes_in_use"] > 0]
        # XLA's allocators keep a peak from the process's start and offer no reset.
        return [{"device": device.device_kind, "index": device.id, "peak_bytes": int(stats["peak_bytes_in_use"]),
                 "in_use_bytes": int(stats["bytes_in_use"])} for device, stats in used]

    def matmul_flops_per_s(self, dtype, size):
        import jax
        import jax.numpy as jnp
        a = jax.random.normal(jax.random.key(0), (size, size), dtype=dtype)
        b = jax.random.normal(jax.random.key(1), (size, size), dtype=dtype)
        matmul = jax.jit(jnp.matmul)
        return median_flops_per_s(lambda: matmul(a, b).block_until_ready(), 2 * size ** 3)

    def compilations(self):
        import jax
        if not _compile_events:
            jax.monitoring.register_event_duration_secs_listener(_count_compile)
            _compile_events.append(0)
        return _compile_events[0]

    def open_compile_cache(self, config):
        import jax
        if not config.compile_cache:
            # A JAX_COMPILATION_CACHE_DIR in the user's environment would still serve programs.
            jax.config.update("jax_enable_compilation_cache", False)
            return self.compile_cache_state(None, "--no-compile-cache")
        directory = compile_cache_dir(config.cache_dir, jax.__version__, jax.devices()[0].device_kind)
        state = self.compile_cache_state(directory)
        if state["state"] == "off":  # the directory cannot be made: said, not tried at every compilation
            jax.config.update("jax_enable_compilation_cache", False)
            return state
        jax.config.update("jax_enable_compilation_cache", True)
        jax.config.update("jax_compilation_cache_dir", directory)
        # By default JAX keeps only programs that took a second or more to compile: a CPU's, and on a GPU the
        # many small ones of the first step, would be compiled again in every process. -1, not 0, for the size:
        # 0 lets JAX substitute a filesystem-dependent minimum.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        if not _cache_lookups:
            _cache_lookups.update(lookups=0, hits=0)
            jax.monitoring.register_event_listener(_count_cache_lookup)
        return state

    def compile_cache_entries(self, directory):
        if not os.path.isdir(directory):
            return 0
        return sum(1 for name in os.listdir(directory) if name.endswith(CACHE_ENTRY_SUFFIX))

    def compile_cache_hits(self):
        if not _cache_lookups:
            return None
        return {"hits": _cache_lookups["hits"], "misses": _cache_lookups["lookups"] - _cache_lookups["hits"]}

    def set_matmul_precision(self, precision):
        import jax
        # XLA runs float32 dots as TF32 on Ampere and newer GPUs unless told otherwise (jax-ml/jax#12008).
        jax.config.update("jax_default_matmul_precision", {"highest": "float32", "high": "tensorfloat32"}[precision])
        return self.accelerator_environment()["float32_matmul"]

    def attention_implementation(self, fused, device):
        if not fused:
            return "xla (unfused)"
        return "splash (fused)" if device.get("kind") == "tpu" else "cudnn (fused)"

    def compile_inference(self, fn, model):
        import jax
        import keras

        def stateless(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
                return fn(*args)

        compiled = jax.jit(stateless)

        def call(*args):
            # Read the variables afresh on every call: Keras may have replaced the arrays since the last one.
            return compiled([v.value for v in model.variables], *args)

        return call

    def host_sync_counter(self):
        from mtbench.plugins.backends.jax_host_syncs import JaxHostSyncCounter
        return JaxHostSyncCounter()

    def step_profiler(self, directory):
        from mtbench.plugins.backends.jax_profiler import JaxStepProfiler
        return JaxStepProfiler(directory)

    def make_train_step(self, run, model):
        import keras
        from mtbench.plugins.backends.jax_jit_step import JitTrainStep, accumulated_gradients
        accumulate = run.config.grad_accum
        # Under a distribution (data-parallel, TPU) the step runs over the mesh the extra set.
        return JitTrainStep(model, keras.distribution.distribution(),
                            gradients_of=accumulated_gradients(accumulate) if accumulate > 1 else None)

    def accelerator_environment(self):
        import jax
        from mtbench import cudnn_version_text
        try:
            # The `_versions` module of jaxlib's CUDA plugin, as jax finds it; None in a CPU-only jaxlib.
            from jax._src.lib import cuda_versions
        except ImportError:
            cuda_versions = None

        def reported(getter):
            try:
                return getattr(cuda_versions, getter)()
            except Exception:  # no CUDA plugin, or one whose libraries do not load here
                return None

        runtime = reported("cuda_runtime_get_version")  # 12080 for CUDA 12.8
        # None: XLA's own default, which runs float32 dots as TF32 on GPUs that have it.
        precision = jax.config.jax_default_matmul_precision
        return {"cuda_version": f"{runtime // 1000}.{runtime % 1000 // 10}" if runtime else None,
                "rocm_version": rocm_version(getattr(jax.devices()[0].client, "platform_version", "")),
                "cudnn_version": cudnn_version_text(reported("cudnn_get_version")),
                "float32_matmul": {"jax.config.jax_default_matmul_precision": precision}}


@hookimpl
def mtbench_register_backends(register):
    register(JaxBackend())
