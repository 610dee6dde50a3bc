"""The runs a comparison plans (`mtbench.runner.orchestration.runs`): torch's compiled twins on a CUDA GPU, each run's
step, --compile-mode, and the checks against the devices, all before anything trains. The devices are described
(no GPU here)."""

import pytest

from conftest import with_torch_extra


CPU = {"kind": "cpu", "name": "Intel(R) Xeon(R) Processor", "count": 1}
H100 = {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "count": 1}


def test_on_cuda_compare_trains_torch_eager_and_compiled():
    from mtbench.runner.orchestration.runs import eager_only_lines, plan_runs
    labels = lambda specs: [spec.label for spec in specs]
    assert labels(plan_runs("jax,torch", devices={"jax": H100, "torch": H100})) == \
        ["jax", "torch", "torch+torch-compile"]
    assert labels(plan_runs("jax,torch", devices={"jax": CPU, "torch": CPU})) == ["jax", "torch"]
    # Under every extra that lets the step compile, the compiled row stands beside the eager one.
    assert labels(plan_runs("jax,torch", ["flash-attention"], devices={"torch": H100})) == \
        ["jax+flash-attention", "torch+flash-attention", "torch+flash-attention+torch-compile"]
    assert labels(plan_runs("torch", ["ddp"], devices={"torch": H100})) == ["torch+ddp", "torch+ddp+torch-compile"]
    assert labels(plan_runs("torch", ["torch-compile"], devices={"torch": H100})) == ["torch+torch-compile"]
    assert labels(plan_runs("torch", ["fsdp"], devices={"torch": H100})) == ["torch+fsdp", "torch+fsdp+torch-compile"]
    # Where an extra refuses torch-compile (its declared conflicts), torch runs eager, and compare says why.
    plugins = with_uncompiled(registry())
    uncompiled = plan_runs("torch", ["uncompiled"], devices={"torch": H100}, registry=plugins)
    assert labels(uncompiled) == ["torch+uncompiled"]
    assert eager_only_lines(uncompiled, {"torch": H100}, plugins) == [
        ("run 'torch+uncompiled' trains torch eager only (no compiled row beside it): extra 'uncompiled' cannot run "
         "together with 'torch-compile'")]
    assert eager_only_lines(uncompiled, {"torch": CPU}, plugins) == []
    # `mtbench train` says the same of a torch run that --step auto left eager on a CUDA GPU, and nothing of others.
    from mtbench.runner.results.run_result import eager_torch_note
    trained = lambda backend, device, **chosen: {"backend": backend, "env": {"device": device},
                                                 "train_step_chosen": {"asked": "auto", "by_extra": None, **chosen}}
    assert eager_torch_note(trained("torch", H100, why_not="extra 'uncompiled' cannot run together with "
                                                           "'torch-compile'")) == (
        "note: torch trained its step eager on a CUDA GPU, where its best users compile it (JAX's step is compiled): "
        "extra 'uncompiled' cannot run together with 'torch-compile'")
    assert [eager_torch_note(run) for run in (
        trained("torch", CPU, why_not="compiled by default on a CUDA GPU only"),
        trained("torch", H100, by_extra="torch-compile"), trained("torch", H100, asked="eager"),
        trained("jax", H100, why_not="the jax backend trains its own step"))] == [None] * 4
    # A matrix is left as named.
    assert labels(plan_runs(matrix="jax;torch", devices={"torch": H100})) == ["jax", "torch"]


def registry():
    from mtbench.plugins import manager
    return manager.registry()


def with_uncompiled(plugins):
    """`plugins` with a torch extra that declares it cannot run beside torch-compile."""
    return with_torch_extra(plugins, "uncompiled", conflicts=("torch-compile",))


def test_each_compared_run_trains_the_step_its_label_names():
    """Each run's --step follows its extras: torch compiled where its label has torch-compile, eager elsewhere
    (`--step auto` would compile an unnamed one on a GPU); JAX's its own. compare's --step plans the runs."""
    from mtbench import MtbenchError
    from mtbench.runner.orchestration.runs import plan_runs, with_steps
    steps = lambda specs: [(spec.label, dict(spec.sizes)["step"]) for spec in specs]
    plugins = registry()
    assert steps(with_steps(plan_runs("jax,torch", devices={"torch": H100}), "auto", plugins)) == [
        ("jax", "auto"), ("torch", "eager"), ("torch+torch-compile", "compiled")]
    assert steps(with_steps(plan_runs("jax,torch", ["flash-attention"]), "compiled", plugins)) == [
        ("jax+flash-attention", "auto"), ("torch+flash-attention+torch-compile", "compiled")]
    assert steps(with_steps(plan_runs("jax,torch"), "eager", plugins)) == [("jax", "auto"), ("torch", "eager")]
    assert steps(with_steps(plan_runs(matrix="jax;torch;torch+torch-compile"), "auto", plugins, named=True)) == [
        ("jax", "auto"), ("torch", "eager"), ("torch+torch-compile", "compiled")]
    with pytest.raises(MtbenchError, match="^--matrix names each run's extras"):
        with_steps(plan_runs(matrix="jax;torch"), "eager", plugins, named=True)

    # torch-compile goes before an extra that wraps whatever step it is given, which then wraps the compiled step.
    wrapping = with_torch_extra(plugins, "wrapping", wraps_step=True)
    assert steps(with_steps(plan_runs("torch", ["wrapping"], devices={"torch": H100}, registry=wrapping), "auto",
                            wrapping)) == [("torch+wrapping", "eager"), ("torch+torch-compile+wrapping", "compiled")]
    assert steps(with_steps(plan_runs("torch", ["fsdp", "wrapping"], registry=wrapping), "compiled", wrapping)) == [
        ("torch+fsdp+torch-compile+wrapping", "compiled")]

    plugins = with_uncompiled(plugins)
    with pytest.raises(MtbenchError, match="^--step compiled: run 'torch\\+uncompiled': extra 'uncompiled' cannot"):
        with_steps(plan_runs("torch", ["uncompiled"], registry=plugins), "compiled", plugins)


def test_compile_mode_reaches_only_the_runs_that_compile_and_does_not_split_them():
    from mtbench.runner.orchestration.runs import plan_runs, with_compile_mode
    from mtbench.runner.results.report import configuration_differences
    specs = with_compile_mode(plan_runs("jax,torch", devices={"torch": H100}), "reduce-overhead")
    assert [spec.size_arguments() for spec in specs] == [[], [], ["--compile-mode", "reduce-overhead"]]
    assert specs[2].label == "torch+torch-compile"
    eager = {"extras": [], "compile_mode": "default", "seed": 0}
    compiled = {"extras": ["torch-compile"], "compile_mode": "reduce-overhead", "seed": 0}
    assert configuration_differences(eager, compiled) == []  # the mode applies to the compiled run alone
    assert configuration_differences({**compiled, "compile_mode": "default"}, compiled) == \
        [("compile_mode", "default", "reduce-overhead")]


def test_runs_that_would_see_different_hardware_are_refused_before_training():
    from mtbench.errors import MtbenchError
    from mtbench.runner.orchestration.environments import check_same_hardware
    from mtbench.runner.orchestration.runs import plan_runs
    specs = plan_runs("jax,torch")
    check_same_hardware(specs, {"jax": H100, "torch": H100})
    check_same_hardware(specs, {"jax": CPU, "torch": CPU})
    with pytest.raises(MtbenchError) as error:
        check_same_hardware(specs, {"jax": CPU, "torch": H100})
    assert str(error.value) == (
        "the runs would train on different hardware: jax sees cpu (Intel(R) Xeon(R) Processor), torch sees gpu "
        "(NVIDIA H100 80GB HBM3); jax sees only the CPU on a machine with an accelerator: install its accelerator "
        "build (JAX: pip install 'mtbench[jax-cuda]')")
    a100 = {"kind": "gpu", "name": "NVIDIA A100-SXM4-80GB", "count": 1}
    with pytest.raises(MtbenchError, match="jax sees gpu \\(NVIDIA A100-SXM4-80GB\\), torch sees gpu"):
        check_same_hardware(specs, {"jax": a100, "torch": H100})


def options(**given):
    """compare's shared train options, as the command line hands them over."""
    return {"model_name": "transformer", "preset": "tiny", "step": "auto", "dtype": "auto", "compile_mode": None,
            **given}


def test_a_comparison_is_planned_and_checked_before_the_devices_are_asked():
    """`plan_comparison` is compare's whole plan: on a CUDA GPU torch's eager run and its compiled twin, each with
    its step, reduce-overhead for the twin alone, and the line that says so; a bad plan fails before the probe."""
    from mtbench import MtbenchError
    from mtbench.runner.orchestration.runs import plan_comparison
    plugins = registry()
    planned = plan_comparison("jax,torch", (), None, options(), plugins, probe=lambda runs: {"jax": H100, "torch": H100})
    assert [(spec.label, dict(spec.sizes)) for spec in planned.specs] == [
        ("jax", {"step": "auto"}), ("torch", {"step": "eager"}),
        ("torch+torch-compile", {"step": "compiled", "compile_mode": "reduce-overhead"})]
    assert planned.compile_mode == "reduce-overhead"
    assert planned.lines == ["torch sees a CUDA GPU: each torch run trains eager and compiled (torch-compile, "
                             "--compile-mode reduce-overhead), two rows; --matrix names the runs exactly"]
    # On a CPU: no twin, nothing to say; a mode the user asked for reaches the compiling runs alone.
    on_cpu = plan_comparison(None, (), "jax;torch;torch+torch-compile", options(compile_mode="max-autotune"),
                             plugins, probe=lambda runs: {"jax": CPU, "torch": CPU})
    assert [(spec.label, dict(spec.sizes)) for spec in on_cpu.specs] == [
        ("jax", {"step": "auto"}), ("torch", {"step": "eager"}),
        ("torch+torch-compile", {"step": "compiled", "compile_mode": "max-autotune"})]
    assert on_cpu.lines == []
    # The probe is handed each run with its processes, to tell its device's refusal (for several, only what
    # refuses it whatever devices they join).
    asked = []
    plan_comparison(None, (), "jax:batch-size=8;torch+ddp@2", options(), plugins,
                    probe=lambda runs: asked.extend(runs) or {"jax": CPU, "torch": CPU})
    assert [(run["label"], run["config"]["backend"], run["processes"]) for run in asked] == [
        ("jax:batch-size=8", "jax", 1), ("torch+ddp@2:batch-size=64", "torch", 2)]
    assert asked[0]["config"]["batch_size"] == 8

    def never(runs):
        raise AssertionError("the devices were asked before the plan was checked")
    for backends, extras, matrix, given, expected in [
            ("jax,tensorflow", (), None, {}, "unknown backend 'tensorflow'"),
            ("jax,torch", (), None, {"steps": 0}, "--steps must be at least 1"),
            (None, (), "jax;torch", {"step": "eager"}, "--matrix names each run's extras"),
            ("torch", ("torch-compile",), None, {"step": "eager"}, "--step eager contradicts --extra torch-compile")]:
        with pytest.raises(MtbenchError, match=expected):
            plan_comparison(backends, extras, matrix, options(**given), plugins, probe=never)
    # A mode no run would compile with would be recorded for nothing.
    with pytest.raises(MtbenchError, match="^--compile-mode max-autotune: no run compiles torch's step"):
        plan_comparison("jax,torch", (), None, options(compile_mode="max-autotune"), plugins,
                        probe=lambda runs: {"jax": CPU, "torch": CPU})
    # Against the devices: torch on a GPU beside JAX on the CPU compares machines.
    with pytest.raises(MtbenchError, match="^the runs would train on different hardware"):
        plan_comparison("jax,torch", (), None, options(), plugins, probe=lambda runs: {"jax": CPU, "torch": H100})


def test_beside_a_run_naming_fused_attention_the_others_attend_unfused_as_their_names_say():
    """On a GPU `--attention auto` fuses every run where the kernels run: 'jax;jax+flash-attention' trained fused
    twice, and the two rows' results, alike, were grouped as one run of twice the repeats."""
    from mtbench.runner.orchestration.runs import plan_comparison
    plugins = registry()
    on_gpu = lambda runs: {"jax": H100, "torch": H100}
    planned = plan_comparison(None, (), "jax;jax+flash-attention", options(attention="auto"), plugins, probe=on_gpu)
    assert [(spec.label, dict(spec.sizes)) for spec in planned.specs] == [
        ("jax", {"step": "auto", "attention": "unfused"}), ("jax+flash-attention", {"step": "auto"})]
    # and the report compares their results: the extras they name say what ran, not the --attention each was given
    from mtbench.runner.results.report import configuration_differences
    assert configuration_differences({"attention": "unfused", "extras": ["flash-attention"], "seed": 0},
                                     {"attention": "auto", "extras": [], "seed": 0}) == []
    # Without a run that names the extra, auto stays each run's to choose; what the user asked is every run's.
    planned = plan_comparison(None, (), "jax;torch", options(attention="auto"), plugins, probe=on_gpu)
    assert all("attention" not in dict(spec.sizes) for spec in planned.specs)
    from mtbench import MtbenchError
    # --attention fused gives every run the extra: 'jax' is then the run 'jax+flash-attention' is
    with pytest.raises(MtbenchError) as refused:
        plan_comparison(None, (), "jax;jax+flash-attention", options(attention="fused"), plugins, probe=on_gpu)
    assert str(refused.value) == ("runs 'jax' and 'jax+flash-attention' train the same configuration (the options "
                                  "they share give both 'flash-attention'); list it once, or use --repeats to run it "
                                  "again")
    with pytest.raises(MtbenchError, match="--attention unfused contradicts --extra flash-attention"):
        plan_comparison(None, (), "jax;jax+flash-attention", options(attention="unfused"), plugins, probe=on_gpu)


def test_runs_are_named_by_the_settings_they_differ_in_as_the_table_names_their_results():
    """What every run shares names none of them; a run that keeps the shared value of a swept setting is named by
    it too: the progress lines, the run files and --baseline use the names the table and verdicts show."""
    from mtbench import MtbenchError
    from mtbench.runner.orchestration.runs import plan_comparison
    plugins, on_cpu = registry(), lambda runs: {"jax": CPU, "torch": CPU}

    def labels(matrix, **given):
        return [spec.label for spec in plan_comparison(None, (), matrix, options(**given), plugins,
                                                       probe=on_cpu).specs]
    assert labels("jax:batch-size=16;torch:batch-size=16") == ["jax", "torch"]
    assert labels("jax;torch:batch-size=16", batch_size=48) == ["jax:batch-size=48", "torch:batch-size=16"]
    assert labels("jax:max-tokens=4096;jax:batch-size=8") == ["jax:batch-size=64,max-tokens=4096",
                                                             "jax:batch-size=8"]
    # A block sets the language model's length: named once.
    assert labels("jax:block-size=32;jax:block-size=64", model_name="gpt") == \
        ["jax:model=gpt,block-size=32", "jax:model=gpt,block-size=64"]
    with pytest.raises(MtbenchError, match="^run 'jax' is listed twice"):
        labels("jax:batch-size=48;jax", batch_size=48)


def test_two_entries_that_train_the_same_configuration_are_refused_by_the_flags_that_made_them_look_different():
    """`tiny` is 64 wide: `jax:d-model=64` is the run `jax` is, under another name, and each would be held against
    the other. Entries whose flags make a difference are planned."""
    from mtbench import MtbenchError
    from mtbench.runner.orchestration.runs import plan_comparison
    plan = lambda matrix, **given: plan_comparison(None, (), matrix, options(**given), registry(),
                                                  probe=lambda runs: {"jax": CPU, "torch": CPU})
    with pytest.raises(MtbenchError) as refused:
        plan("jax;torch;jax:d-model=64")
    assert str(refused.value) == ("runs 'jax' and 'jax:d-model=64' train the same configuration (d-model=64 is what "
                                  "both train); list it once, or use --repeats to run it again")
    with pytest.raises(MtbenchError, match="^runs 'jax:heads=4' and 'jax:heads=4,ff-dim=128' train the same"):
        plan("jax:heads=4;jax:heads=4,ff-dim=128")
    assert [spec.label for spec in plan("jax;jax:d-model=32").specs] == ["jax", "jax:d-model=32"]
    # the same configuration on the other backend is another run
    assert [spec.label for spec in plan("jax:d-model=64;torch").specs] == ["jax:d-model=64", "torch"]


def test_two_entries_whose_auto_dtype_resolves_to_the_others_on_the_device_are_refused():
    """`auto` is each run's dtype to choose on its device: on a CPU `jax:dtype=auto;jax:dtype=float32` trained
    float32 twice, two results alike that the report grouped as repeats of one run under one name. Where auto
    chooses another dtype (a GPU's mixed bfloat16), they are two runs."""
    from mtbench import MtbenchError
    from mtbench.runner.orchestration.runs import plan_comparison
    plan = lambda matrix, device: plan_comparison(None, (), matrix, options(), registry(),
                                                  probe=lambda runs: {"jax": device, "torch": device})
    for matrix in ("jax:dtype=auto;jax:dtype=float32", "jax;torch;jax:dtype=float32"):
        with pytest.raises(MtbenchError) as refused:
            plan(matrix, CPU)
        assert str(refused.value) == (
            "runs 'jax:dtype=auto' and 'jax:dtype=float32' train the same configuration (dtype=auto trains float32 on "
            "this cpu: this cpu does not compute bfloat16 natively, as the jax backend reports it; --dtype "
            "mixed_bfloat16 trains in it anyway); list it once, or use --repeats to run it again")
    on_gpu = plan("jax:dtype=auto;jax:dtype=float32", {**H100, "bfloat16": True})
    assert [spec.label for spec in on_gpu.specs] == ["jax:dtype=auto", "jax:dtype=float32"]
    # the same dtype on the other backend is another run
    assert [spec.label for spec in plan("jax;torch:dtype=float32", CPU).specs] == ["jax:dtype=auto",
                                                                                 "torch:dtype=float32"]


def test_each_block_size_of_a_sweep_starts_from_a_weights_file_of_its_own():
    """A block sizes the position embeddings: each block size is a shape, with a file of its own."""
    from mtbench.runner.orchestration.compare import ComparePlan
    from mtbench.runner.orchestration.runs import plan_comparison
    specs = plan_comparison(None, (), "jax:block-size=32;torch:block-size=32;jax:block-size=64",
                            options(model_name="gpt"), registry(), probe=lambda runs: {"jax": CPU, "torch": CPU}).specs
    plan = ComparePlan(specs, 1, None, [], "/r/c.json", False, 5, 0.01)
    assert [plan.weights_file(spec) for spec in specs] == [
        "/r/c.runs/initial-weights-block-size=32.npz", "/r/c.runs/initial-weights-block-size=32.npz",
        "/r/c.runs/initial-weights-block-size=64.npz"]
