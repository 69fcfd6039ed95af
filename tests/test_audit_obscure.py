"""Issue 54's obscure and silent cases: each a clear error or a stated figure."""

import pytest

from tfaccel import check, cli

UNWRITABLE = "/proc/tfaccel-check.json"  # /proc takes no new files, not even from root


def test_check_json_to_an_unwritable_path_fails_before_any_check(capfd):
    ran = []

    def probe(ctx):
        ran.append(1)
        return check.Found("-", "-", "-")

    with pytest.raises(ValueError, match=f"cannot write the JSON to {UNWRITABLE}"):
        check.run(json_path=UNWRITABLE, checks={"probe": probe})
    assert ran == []
    assert cli.main(["check", "--json", UNWRITABLE]) == 2
    err = capfd.readouterr().err
    assert f"tfaccel check: --json: cannot write the JSON to {UNWRITABLE}" in err
    assert "tfaccel check: devices" not in err  # no check ran


def _top_level(a):
    return a * 2


def test_a_function_defined_inside_preprocess_is_named_before_it_ships():
    import importlib

    import numpy as np
    import tensorflow as tf

    from tfaccel.errors import ServiceError

    local = importlib.import_module("tfaccel.data.service.local")

    def preprocess(x):
        def double(a):
            return a * 2

        return tf.numpy_function(lambda a: double(a), [x], tf.float32)

    def plain(x):
        return tf.numpy_function(_top_level, [x], tf.float32)

    source = tf.data.Dataset.from_tensor_slices(np.ones(4, "float32"))
    functions = local.python_functions(source.map(preprocess))
    with pytest.raises(ServiceError, match=r"preprocess.<locals>.double cannot be sent") as info:
        local.encode_functions(functions)
    assert "Define them at module level" in str(info.value)
    assert local.encode_functions(local.python_functions(source.map(plain)))  # ships
