"""docs/results.md names every key that mtbench writes: read off real results, not off a list kept beside the code."""

import pytest

from result_keys import documented_names, undocumented_keys


def test_the_check_finds_a_key_the_docs_do_not_name_and_passes_over_data_keys(tiny_runs):
    result = tiny_runs["jax"]["result"]
    invented = {**result, "timing": {**result["timing"], "steps_per_fortnight": 1},
                "env": {**result["env"], "float32_matmul": {"a framework's own setting": True}}}
    assert undocumented_keys(invented) == ["timing.steps_per_fortnight"]
    names, options = documented_names()
    assert "batch_size" in options and "compile_cache" in names


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_every_key_of_a_train_result_is_in_the_results_doc(tiny_runs, backend):
    assert undocumented_keys(tiny_runs[backend]["result"]) == []


def test_every_key_of_a_compare_json_is_in_the_results_doc(compared):
    assert undocumented_keys(compared["combined"]) == []
