"""What mtbench chooses where the user left it to mtbench (`auto`), so that the obvious command trains as each
backend's best users train: the dtype (`--dtype`), the compiled step (`--step`) and fused attention
(`--attention`). Each choice is made on the RunContext once the device is known, before any plugin reads it, and
recorded with its reason where mtbench chose the plainer way; an extra that joins is placed among the others as
`joined` says."""

import dataclasses

from mtbench.errors import MtbenchError
from mtbench.plugins.manager import A_REASON
from mtbench.runner.config import AUTO_16_BIT, COMPILED_STEP_EXTRA, FUSED_ATTENTION_EXTRA


def choose_dtype(run, plugins):
    """`--dtype auto`: mixed bfloat16 where the device computes bfloat16 natively (`device_info()['bfloat16']`: a
    CUDA GPU of compute capability 8.0 or more, an AMD MI100 or later, a TPU), as nanoGPT and JAX's GPU users
    train, unless the backend refuses it there; float32 elsewhere, so that CPU figures keep their arithmetic. Sets
    `run.dtype_choice` (what was asked, the dtype, why float32) and `run.config` holding the dtype chosen."""
    asked = run.config.dtype
    if asked != "auto":
        run.dtype_choice = {"asked": asked, "dtype": asked}
        return
    dtype, reason = auto_dtype(run.backend, run.device, plugins.registry)
    run.config = dataclasses.replace(run.config, dtype=dtype)
    run.dtype_choice = {"asked": asked, "dtype": dtype, **({"why_float32": reason} if reason else {})}


def auto_dtype(backend, device, registry=None):
    """(the dtype `--dtype auto` trains in with `backend` on `device` (`device_info()`), why float32 or None);
    `registry`: the plugins', which names the backend's plugin where its code fails."""
    if not device.get("bfloat16"):
        return "float32", (f"this {device.get('kind', 'unknown')} does not compute bfloat16 natively, as the "
                           f"{backend.name} backend reports it; --dtype {AUTO_16_BIT} trains in it anyway")
    refused = dtype_refusal(backend, AUTO_16_BIT, device, registry)
    return ("float32", refused) if refused else (AUTO_16_BIT, None)


def dtype_refusal(backend, dtype, device, registry=None):
    """Why `backend` cannot train in `dtype` on `device` (`device_info()`), in one line, or None; `registry`: the
    plugins', which names the backend's plugin where its code fails or answers other than a reason or None."""
    reason = (backend.unsupported_dtype_reason(dtype, device) if registry is None else
              registry.answer("backends", backend, "unsupported_dtype_reason", dtype, device,
                              expect=A_REASON))
    return f"--dtype {dtype}: {reason}" if reason else None


def choose_fused_attention(run, plugins):
    """`--attention auto`: the fused-attention extra joins the run where it can run here (a GPU, a 16-bit dtype,
    the model's heads; the extra says), so that the obvious command trains as the backend's best users do; the
    extra then proves its kernels ran, as when asked for. Sets `run.attention_choice` (what was chosen and why)
    and, where the extra joined, `run.config` naming it."""
    config, name = run.config, FUSED_ATTENTION_EXTRA
    asked = config.attention
    extra = plugins.registry.extras.get(name)
    if asked != "auto" or name in config.extras:
        run.attention_choice = {"asked": asked, "fused": name in config.extras}
        return
    reason = None
    if extra is None or run.backend.name not in extra.backends:
        reason = f"no '{name}' extra serves the {run.backend.name} backend here"
    elif not run.attention_kinds:
        reason = "the model has no attention"
    elif conflicting_extras(extra, plugins.extras):
        reason = f"'{name}' cannot run with the extras given"
    reason = join_where_it_runs(run, plugins, extra, reason)
    run.attention_choice = ({"asked": asked, "fused": False, "why_unfused": reason} if reason
                            else {"asked": asked, "fused": True, "by_extra": name})


def conflicting_extras(extra, others):
    """The names of `others` that cannot run beside `extra`, as either of the two declares (`Extra.conflicts`)."""
    return [other.name for other in others if extra.name in other.conflicts or other.name in extra.conflicts]


def join_where_it_runs(run, plugins, extra, reason=None):
    """`extra` joins the run unless `reason` says why not, or the extra's own `unavailable_reason` here; returns
    the reason it did not join, None where it joined."""
    if reason is None:
        with plugins.extra_code(extra):
            reason = extra.unavailable_reason(run)
    if reason is None:
        join_extra(run, plugins, extra)
    return reason


def joined(names, joining, registry):
    """The extras `names` (in order) with `joining` added where an extra that joins by mtbench's choice belongs:
    before the first one that wraps whatever step it is given (`Extra.wraps_step`), so that the wrapper wraps the
    step the joining one makes; else after them all."""
    wraps = [getattr(registry.extras.get(name), "wraps_step", False) for name in names]
    at = wraps.index(True) if True in wraps else len(names)
    return (*names[:at], joining, *names[at:])


def join_extra(run, plugins, extra):
    """`extra` joins the run where `joined` places it: among its plugins, and named in `run.config`."""
    names = joined(run.config.extras, extra.name, plugins.registry)
    plugins.extras.insert(names.index(extra.name), extra)
    run.config = dataclasses.replace(run.config, extras=names)


def step_compiling_extra(config, plugins):
    """(the extra that compiles the backend's step, `config.COMPILED_STEP_EXTRA`, or None where none serves the
    backend; the names of the run's extras that cannot run beside it). Refused in one line, before anything is
    imported: `--step eager` where no extra serves the backend (nothing could make its step eager), `--step
    compiled` beside an extra that cannot run with it."""
    name = COMPILED_STEP_EXTRA
    extra = plugins.registry.extras.get(name)
    if extra is None or plugins.backend.name not in extra.backends:
        if config.step == "eager":
            raise MtbenchError(f"--step eager: no '{name}' extra serves the {plugins.backend.name} backend, which "
                               f"trains its own step (JAX's is always compiled); leave --step out")
        refuse_compile_mode(config, f"no '{name}' extra serves the {plugins.backend.name} backend, which trains its "
                                    f"own step")
        return None, []
    if config.step == "eager":
        refuse_compile_mode(config, "--step eager")
    conflicting = conflicting_extras(extra, plugins.extras)
    if config.step == "compiled" and conflicting:
        raise MtbenchError(f"--step compiled: extra '{conflicting[0]}' cannot run together with '{name}'")
    return extra, conflicting


def choose_compiled_step(run, plugins):
    """`--step`: the extra that compiles the backend's step (torch-compile, for torch) joins the run where its
    best users compile (auto: a CUDA GPU; compiled: everywhere), unless the run's extras cannot run with it, so that
    the obvious command on a GPU trains compiled on both backends; `eager` keeps it out. A backend no such extra
    serves (JAX) trains its own step, compiled by XLA. Sets `run.step_choice` (what was asked, whether the extra
    joined, and why not) and, where it joined, `run.config` naming it."""
    config, name = run.config, COMPILED_STEP_EXTRA
    asked = config.step
    extra, conflicting = step_compiling_extra(config, plugins)
    if extra is None:
        own = f"the {run.backend.name} backend trains its own step: no '{name}' extra serves it"
        run.step_choice = {"asked": asked, "by_extra": None, "why_not": own}
        return
    if name in config.extras:
        run.step_choice = {"asked": asked, "by_extra": name}
        return
    if asked == "compiled":
        join_extra(run, plugins, extra)  # where it cannot run, `device_refusal` says so
        run.step_choice = {"asked": asked, "by_extra": name}
        return
    reason = ("asked (--step eager)" if asked == "eager"
              else f"extra '{conflicting[0]}' cannot run together with '{name}'" if conflicting
              else f"compiled by default on a CUDA GPU only; this device is {run.device_kind} (--step compiled "
                   f"compiles it here)" if run.device_kind != "gpu" else None)
    reason = join_where_it_runs(run, plugins, extra, reason)
    if reason:
        refuse_compile_mode(config, reason)
    run.step_choice = ({"asked": asked, "by_extra": None, "why_not": reason} if reason
                       else {"asked": asked, "by_extra": name})


def refuse_compile_mode(config, why_uncompiled):
    """--compile-mode other than the default where nothing compiles the step: the result would record a mode that
    never ran. Refused in one line, with why the step is not compiled."""
    if config.compile_mode != "default":
        raise MtbenchError(f"--compile-mode {config.compile_mode}: this run's step is not compiled "
                           f"({why_uncompiled}); leave --compile-mode out")
