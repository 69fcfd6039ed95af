"""Issue 54's obscure and silent cases: each a clear error or a stated figure."""

import re

import pytest

from tfaccel import check, cli
from tfaccel.data.sources.counted import Counted

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


def _rows(count, empty=()):
    import numpy as np

    def rows(shard, shards):
        if shard in empty:
            return
        for index in range(shard, count, shards):
            yield np.float32(index)

    return rows


def test_from_generator_names_deterministic_and_a_wrong_count():
    import tensorflow as tf

    from tfaccel import data

    spec = tf.TensorSpec((), tf.float32)
    with pytest.raises(TypeError, match="deterministic must be True, False or None, got 'yes'"):
        data.from_generator(_rows(64), spec, shards=4, deterministic="yes")
    short = data.from_generator(_rows(64), spec, shards=4, count=100)
    with pytest.raises(tf.errors.OpError, match="count=100, but the 4 shards of 'rows' yielded 64"):
        list(short.as_numpy_iterator())
    long = data.from_generator(_rows(64), spec, shards=4, count=10)
    with pytest.raises(tf.errors.OpError, match="count=10, but .* yielded more than 10"):
        list(long.as_numpy_iterator())
    empty = data.from_generator(_rows(64, empty=(2,)), spec, shards=4, count=64)
    with pytest.raises(
        tf.errors.OpError, match=r"yielded 48 elements; shard\(s\) 2 yielded nothing"
    ):
        list(empty.as_numpy_iterator())
    single = data.from_generator(lambda: iter(range(3)), tf.TensorSpec((), tf.int32), count=5)
    with pytest.raises(
        tf.errors.OpError, match="count=5, but the generator of '<lambda>' yielded 3"
    ):
        list(single.as_numpy_iterator())
    right = data.from_generator(_rows(64), spec, shards=4, count=64)
    assert sorted(right.as_numpy_iterator()) == list(range(64))
    assert sorted(right.as_numpy_iterator()) == list(range(64))  # a second epoch, counted anew
    import pickle

    copy = pickle.loads(pickle.dumps(Counted(range, 3, None)))  # ships to service workers
    assert (copy.count, copy.shards, list(copy(3))) == (3, 1, [0, 1, 2])


def test_mfu_says_what_numpy_function_work_it_leaves_out(capsys):
    import keras
    import numpy as np
    import tensorflow as tf

    from tfaccel import callbacks

    def slow_square(x):
        y = tf.numpy_function(lambda a: a * a, [x], tf.float32)
        y.set_shape(x.shape)
        return y

    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Lambda(slow_square, name="in_python"),
            keras.layers.Dense(4),
        ]
    )
    model.compile("sgd", "mse")
    throughput = callbacks.Throughput(warmup_steps=1, mfu=True, peak_flops=1e12, verbose=1)
    x, y = np.ones((64, 8), "float32"), np.ones((64, 4), "float32")
    model.fit(x, y, batch_size=16, epochs=1, callbacks=[throughput], verbose=0)
    out = capsys.readouterr().out
    assert "MFU " in out
    said = "leave out the work inside numpy_function/py_function: sequential[_0-9]*/in_python"
    assert re.search(said, out), out
    (where,) = throughput.summary["flops_leave_out"]
    assert "in_python" in where


def test_a_feed_is_taken_wherever_data_is():
    import keras
    import numpy as np
    import tensorflow as tf

    import tfaccel

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 3, 64)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    strategy = tfaccel.devices.strategy("one_device")

    def trainer():
        keras.utils.set_random_seed(0)
        return tfaccel.Trainer(
            keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            strategy=strategy,
            steps_per_loop=1,
        )

    fed = trainer()
    feed = fed.feed(dataset)
    history = fed.fit(feed, epochs=2, validation_data=feed, verbose=0).history
    plain = trainer()
    want = plain.fit(dataset, epochs=2, validation_data=dataset, verbose=0).history
    np.testing.assert_allclose(history["loss"], want["loss"], rtol=1e-6)
    np.testing.assert_allclose(history["val_loss"], want["val_loss"], rtol=1e-6)
    assert fed.evaluate(feed)["loss"] == pytest.approx(plain.evaluate(dataset)["loss"], rel=1e-6)
    other = tfaccel.Trainer(
        keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=tfaccel.devices.strategy("default"),
    )
    with pytest.raises(ValueError, match="This Feed was made for another strategy"):
        other.evaluate(feed)


def test_a_worker_failing_at_once_on_every_start_is_a_script_error():
    import io
    import sys

    from tfaccel.launcher import launch
    from tfaccel.launcher.elastic import Elastic

    out, err = io.StringIO(), io.StringIO()
    command = [sys.executable, "-c", "import sys; sys.exit(1)"]
    status = launch.launch(
        command, 3, elastic=Elastic(min_workers=1), max_restarts=1, out=out, err=err
    )
    said = err.getvalue()
    assert status == 1, said
    assert "within 10 s of each of its 2 start(s): a script error, not a lost worker" in said
    assert "lost; continuing" not in said
    assert said.count("restarting all workers (1 of 1)") == 1


def test_the_doctor_row_gives_figures_a_user_can_use():
    from tfaccel.check import suite as checks

    rates = {"ceiling_input": 480.4, "ceiling_compute": 32e9, "cached_step": 12_010.0}
    figure = checks.doctor_figure(rates)
    assert figure == "input 480 ex/s, the step on cached data 12,010 ex/s (25.0x the input)"
    assert "32,000,000,000" not in figure


def test_a_function_that_cannot_be_pickled_is_named():
    import importlib
    import threading

    import numpy as np
    import tensorflow as tf

    from tfaccel.errors import ServiceError

    local = importlib.import_module("tfaccel.data.service.local")
    lock = threading.Lock()

    def guarded(a):
        with lock:
            return a

    source = tf.data.Dataset.from_tensor_slices(np.ones(4, "float32"))
    dataset = source.map(lambda x: tf.numpy_function(guarded, [x], tf.float32))
    said = r"cannot be sent to the workers: .*guarded: TypeError: cannot pickle '_thread.lock'"
    with pytest.raises(ServiceError, match=said):
        local.encode_functions(local.python_functions(dataset))
