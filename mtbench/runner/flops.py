"""Analytic training FLOPs of the Transformer and the peak they are measured against (MFU).

Counted on the padded batch (the work the device really does): every matmul of the forward pass at 2 FLOPs per
multiply-add, attention's two batched matmuls over the full (not causally halved) score matrix, the tied output
projection; training = 3x forward (the backward pass costs two matmuls per forward matmul). Element-wise work
(softmax, layer norm, the optimizer) is left out, as MFU conventionally does.
"""

import json
import os

# Dense peak FLOP/s from vendor datasheets (without sparsity), by device name fragment and dtype class.
DATASHEET_PEAKS = {
    "H200": {"float32": 67e12, "tf32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12,
             "source": "NVIDIA H200 datasheet (SXM, dense)"},
    "H100": {"float32": 67e12, "tf32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12,
             "source": "NVIDIA H100 datasheet (SXM, dense)"},
    "A100": {"float32": 19.5e12, "tf32": 156e12, "bfloat16": 312e12, "float16": 312e12,
             "source": "NVIDIA A100 datasheet (dense)"},
    "TPU v4": {"float32": 275e12, "bfloat16": 275e12, "float16": 275e12, "source": "Google Cloud TPU v4 documentation"},
    "TPU v5": {"float32": 197e12, "bfloat16": 197e12, "float16": 197e12, "source": "Google Cloud TPU v5e documentation"},
}


def compute_dtype(dtype_policy):
    """The dtype the matmuls run in under a Keras dtype policy name."""
    return dtype_policy.replace("mixed_", "")


def forward_flops(model, batch, source_length, target_length):
    """FLOPs of one forward pass of `model` (a ModelPreset) over a padded batch."""
    d, f, vocab = model.d_model, model.ff_dim, model.vocab_size
    source_tokens, target_tokens = batch * source_length, batch * target_length

    def attention(query_tokens, query_length, key_tokens, key_length):
        projections = 2 * query_tokens * d * d * 2 + 2 * key_tokens * d * d * 2  # Q and output; K and V
        scores_and_mix = 2 * (2 * batch * query_length * key_length * d)
        return projections + scores_and_mix

    feed_forward = lambda tokens: 2 * 2 * tokens * d * f
    encoder = model.encoder_layers * (attention(source_tokens, source_length, source_tokens, source_length)
                                      + feed_forward(source_tokens))
    decoder = model.decoder_layers * (attention(target_tokens, target_length, target_tokens, target_length)
                                      + attention(target_tokens, target_length, source_tokens, source_length)
                                      + feed_forward(target_tokens))
    output_layer = 2 * target_tokens * d * vocab
    return encoder + decoder + output_layer


def training_flops(model, batch, source_length, target_length):
    return 3 * forward_flops(model, batch, source_length, target_length)


def datasheet_peak(device_name, dtype):
    for fragment, peaks in DATASHEET_PEAKS.items():
        if fragment.lower() in (device_name or "").lower():
            return peaks.get(compute_dtype(dtype)), peaks["source"]
    return None, None


def device_peak(backend, device, dtype, cache_dir, all_backends=()):
    """(peak FLOP/s, source). Accelerators: the datasheet. CPUs: the fastest square matmul measured on this CPU
    model in this dtype by any backend of `all_backends` whose framework is installed and runs on the CPU. One
    framework's matmul may reach half of another's on the same cores (on this project's 2-core EPYC, torch's
    float32 matmul reaches 235 GFLOP/s where XLA's reaches 525): the hardware's peak is the best of them, so
    that every backend's MFU is measured against the same figure. Measurements are cached per CPU model (`mtbench
    env --calibrate` redoes them)."""
    if device.get("kind") != "cpu":
        peak, source = datasheet_peak(device.get("name"), dtype)
        return peak, source or f"no datasheet peak known for {device.get('name')}"
    dtype, device_name = compute_dtype(dtype), device.get("name")
    candidates = [backend] + [other for other in all_backends if other.name != backend.name]
    measured = {}
    for candidate in candidates:
        path = calibration_path(cache_dir, candidate.name, dtype, device_name)
        if os.path.exists(path):
            with open(path) as f:
                cached = json.load(f)
            measured[candidate.name] = (cached["flops_per_s"], cached["source"])
        elif candidate is backend:
            measured[candidate.name] = calibrate(candidate, dtype, device_name, cache_dir)
        elif _runs_on_cpu(candidate):
            try:
                measured[candidate.name] = calibrate(candidate, dtype, device_name, cache_dir)
            except Exception:  # a plugin backend without a matmul measurement (or one that fails) sets no peak
                pass
    peak, source = max(measured.values())
    if len(measured) > 1:
        source += f" (the fastest of {', '.join(sorted(measured))} on this CPU)"
    return peak, source


def _runs_on_cpu(backend):
    """Whether `backend`'s framework is installed, starts, and computes on the CPU by default (a framework that
    would measure a GPU must not set a CPU's peak)."""
    from mtbench.runner.environment import describe_backend
    description = describe_backend(backend)
    return description["available"] and description["device"].get("kind") == "cpu"


def calibration_path(cache_dir, backend_name, dtype, device_name):
    safe = "".join(c if c.isalnum() else "-" for c in (device_name or "cpu"))
    return os.path.join(cache_dir, "calibration", f"{backend_name}-{dtype}-{safe}.json")


def calibrate(backend, dtype, device_name, cache_dir, size=2048):
    from mtbench.runner.files import write_json_atomic
    flops_per_s = backend.matmul_flops_per_s(dtype, size)
    source = f"measured: {size}x{size} {dtype} matmul on {backend.name}, median of repeats"
    write_json_atomic(calibration_path(cache_dir, backend.name, dtype, device_name),
                      {"flops_per_s": flops_per_s, "source": source})
    return flops_per_s, source
