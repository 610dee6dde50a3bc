"""Which runs `compare` holds to one loss curve: those that compute the same steps, however a step is laid out."""

from mtbench.runner.results.report import parity_class


def result(**config):
    return {"config": {"batch_size": 64, "max_tokens": None, "grad_accum": 1, "tensor_parallel_size": None, **config},
            "model": {"dtype_policy": "float32"}, "env": {}}


def test_micro_batches_the_model_axis_and_what_remat_keeps_do_not_part_runs_that_train_the_same_rows():
    swept = ("batch_size", "grad_accum", "tensor_parallel_size", "remat_policy")
    whole = parity_class(result(batch_size=64), swept)
    assert parity_class(result(batch_size=32, grad_accum=2), swept) == whole
    assert parity_class(result(batch_size=16, grad_accum=4, tensor_parallel_size=2), swept) == whole
    assert parity_class(result(batch_size=64, remat_policy="matmuls"), swept) == whole
    assert parity_class(result(batch_size=32), swept) != whole


def test_micro_batches_of_the_same_size_train_different_rows_a_step():
    swept = ("grad_accum",)
    assert parity_class(result(grad_accum=2), swept) != parity_class(result(), swept)
    # --max-tokens rounds each micro-batch's rows to a multiple of 8 first: at a bucket of 96 tokens 2 x 2,048
    # tokens are 2 x 16 rows, 4,096 tokens 40 rows. Not the same batches, so not one curve.
    by_tokens = ("max_tokens", "grad_accum")
    classes = [parity_class(result(**config), by_tokens) for config in (
        {"max_tokens": 2048, "grad_accum": 2}, {"max_tokens": 4096}, {"max_tokens": 2048})]
    assert len(set(classes)) == 3  # each apart from the other two
