import os
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tfaccel import data
from tfaccel.data.assembly import cache as build_cache
from tfaccel.data.order import partial

N = 40


def arrays(n=N):
    x = np.arange(n, dtype=np.float32).reshape(n, 1)
    return data.from_arrays(x, np.arange(n, dtype=np.int64))


def labels_of(dataset):
    return [int(v) for _, y in dataset for v in y.numpy()]


def scale(x, y):
    return x * 10.0, y


def jitter(x, y):
    return x + tf.random.uniform(tf.shape(x)), y


def double_batch(x, y):
    return x * 2.0, y


def test_order_of_operations_in_plan_and_graph():
    ds = data.pipeline(
        arrays(),
        batch_size=8,
        training=True,
        preprocess=scale,
        augment=jitter,
        repeat=True,
        batch_map=double_batch,
    )
    plan = data.plan_of(ds)
    assert plan.names == [
        "source", "preprocess", "cache", "augment", "shuffle", "repeat", "batch",
        "batch_map", "prefetch", "options",
    ]  # fmt: skip
    assert data.graph_ops(ds) == [
        "TensorSlice", "ParallelMap", "Cache", "ParallelMap", "Shuffle", "Repeat",
        "ParallelBatch", "ParallelMap", "Prefetch", "Options",
    ]  # fmt: skip
    text = data.explain(ds)
    assert "buffer=40" in text and "size=8, drop_remainder=False" in text
    assert text.index("preprocess") < text.index("cache") < text.index("augment")
    assert text.index("augment") < text.index("shuffle") < text.index("batch_map")


def test_evaluation_keeps_order_and_does_not_shuffle():
    ds = data.pipeline(arrays(10), batch_size=4, training=False, preprocess=scale)
    assert "shuffle" not in data.plan_of(ds).names
    assert data.graph_ops(ds) == [
        "TensorSlice", "ParallelMap", "Cache", "ParallelBatch", "Prefetch", "Options",
    ]  # fmt: skip
    batches = [x.numpy().ravel().tolist() for x, _ in ds]
    assert batches == [[0, 10, 20, 30], [40, 50, 60, 70], [80, 90]]


def test_augment_stays_random_across_epochs_while_preprocess_is_cached():
    calls = tf.Variable(0, dtype=tf.int64)

    def counted_scale(x, y):
        calls.assign_add(1)
        return x * 10.0, y

    ds = data.pipeline(
        arrays(), batch_size=8, training=True, preprocess=counted_scale, augment=jitter, seed=1
    )
    epochs = []
    for _ in range(3):
        pairs = sorted((int(y), float(x[0])) for xb, yb in ds for x, y in zip(xb, yb, strict=True))
        epochs.append(np.array([x for _, x in pairs]))
    assert int(calls.numpy()) == N  # preprocess ran once per element, then the cache served
    for values in epochs:  # x * 10 plus a draw in [0, 1): in float32, 290 + 0.99999994 is 291
        assert np.all((values >= np.arange(N) * 10.0) & (values <= np.arange(N) * 10.0 + 1.0))
    assert not np.allclose(epochs[0], epochs[1]) and not np.allclose(epochs[1], epochs[2])


def test_seed_and_deterministic_give_the_same_order_every_run():
    def run():
        ds = data.pipeline(
            arrays(), batch_size=8, training=True, seed=7, deterministic=True, preprocess=scale
        )
        return [labels_of(ds) for _ in range(2)]

    first, second = run(), run()
    assert first == second
    assert first[0] != first[1]  # still reshuffled each epoch
    assert sorted(first[0]) == list(range(N))


def test_shuffling_gives_a_different_order_each_epoch():
    ds = data.pipeline(arrays(), batch_size=10, training=True)
    orders = [labels_of(ds) for _ in range(3)]
    assert all(sorted(order) == list(range(N)) for order in orders)
    assert orders[0] != orders[1] and orders[1] != orders[2]


def test_repeat_count_and_drop_remainder():
    ds = data.pipeline(arrays(10), batch_size=4, training=True, repeat=2, drop_remainder=True)
    sizes = [int(x.shape[0]) for x, _ in ds]
    assert sizes == [4, 4, 4, 4, 4]  # 20 elements over two epochs, last partial batch dropped


def test_drop_remainder_defaults(mirrored):
    def resolved(**kw):
        return data.plan_of(data.pipeline(arrays(), batch_size=8, **kw)).step("batch").settings

    assert resolved(training=True)["drop_remainder"] is False
    assert resolved(training=True, jit_compile=True)["drop_remainder"] is True
    assert resolved(training=False, jit_compile=True)["drop_remainder"] is False
    fn = data.pipeline(arrays(), batch_size=8, training=True, strategy=mirrored)
    assert fn.drop_remainder is False  # the Trainer trains the partial batch exactly
    assert (
        data.pipeline(arrays(), batch_size=8, training=False, strategy=mirrored).drop_remainder
        is False
    )


def test_partial_batch_is_shared_by_the_replicas_of_one_step(mirrored):
    fn = data.pipeline(arrays(21), batch_size=8, training=True, seed=0, strategy=mirrored)
    context = tf.distribute.InputContext(num_replicas_in_sync=2)
    sizes = [int(x.shape[0]) for x, _ in fn(context)]
    assert sizes == [4, 4, 4, 4, 2, 3]  # 8 + 8 + 5: the last step's 5 split 2 / 3
    stream = [[int(v) for v in y.numpy()] for _, y in fn(context).repeat(2)]  # as the Trainer
    epochs = [sum(stream[:6], []), sum(stream[6:], [])]  # 3 steps of 2 replicas each
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(21))  # no step spans two
    assert epochs[0] != epochs[1]  # reshuffled


def test_workers_shards_are_padded_to_the_same_number_of_steps(mirrored):
    # 2 workers of 1 replica, 17 examples, global batch 8: shards of 9 and 8 examples both
    # take ceil(17 / 8) = 3 steps; the shard of 8 gets an empty third batch (4 + 4 | 0).
    assert partial.shard_padding(17, 2, 0, 4) == 0 and partial.shard_padding(17, 2, 1, 4) == 1
    fn = data.pipeline(arrays(17), batch_size=8, training=True, seed=0, strategy=mirrored)
    sizes, labels = [], []
    for index in range(2):
        batches = list(fn(tf.distribute.InputContext(2, index, 2)))
        sizes.append([int(x.shape[0]) for x, _ in batches])
        labels += [int(v) for _, y in batches for v in y.numpy()]
    assert sizes == [[4, 4, 1], [4, 4, 0]]
    assert sorted(labels) == list(range(17))


def test_batch_map_is_vectorised_over_batches():
    seen = []

    def record(x, y):
        seen.append(x.shape.as_list())
        return x * 2.0, y

    ds = data.pipeline(arrays(8), batch_size=4, training=False, batch_map=record)
    assert [x.numpy().ravel().tolist() for x, _ in ds][0] == [0, 2, 4, 6]
    assert seen == [[None, 1]]


def test_single_replica_strategy_returns_a_plain_dataset():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    ds = data.pipeline(arrays(), batch_size=8, training=True, strategy=strategy)
    assert isinstance(ds, tf.data.Dataset)
    assert next(iter(ds))[0].shape == (8, 1)


def test_mirrored_gives_per_replica_batches(mirrored):
    fn = data.pipeline(arrays(), batch_size=8, training=True, strategy=mirrored, seed=0)
    assert isinstance(fn, data.DatasetFn)
    assert fn.global_batch_size == 8 and fn.training and fn.strategy is mirrored
    assert "per-replica batch 4" in data.explain(fn)
    seen = []
    for _, y in fn.distribute():
        parts = mirrored.experimental_local_results(y)
        assert [int(p.shape[0]) for p in parts] == [4, 4]
        seen += [int(v) for p in parts for v in p.numpy()]
    assert sorted(seen) == list(range(N))
    distributed = mirrored.distribute_datasets_from_function(fn)
    x, _ = next(iter(distributed))
    assert [p.shape for p in mirrored.experimental_local_results(x)] == [(4, 1), (4, 1)]


@pytest.mark.parametrize("training", [True, False])
def test_two_workers_shards_cover_every_element_once(mirrored, training):
    fn = data.pipeline(arrays(), batch_size=4, training=training, strategy=mirrored)
    seen = []
    for worker in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=worker, num_replicas_in_sync=2
        )
        ds = fn(context)
        assert data.plan_of(ds).names[:2] == ["source", "shard"]
        assert data.graph_ops(ds)[:2] == ["TensorSlice", "Shard"]
        batches = [y.numpy() for _, y in ds]
        assert all(len(b) == 2 for b in batches)  # per-replica batch
        seen += [int(v) for b in batches for v in b]
    assert sorted(seen) == list(range(N))


def test_image_folder_is_sharded_by_file_before_decoding(tmp_path, mirrored):
    for c in range(2):
        (tmp_path / f"c{c}").mkdir()
        for i in range(5):
            Image.new("RGB", (8, 8), (i * 40, c * 200, 0)).save(tmp_path / f"c{c}" / f"{i}.png")
    source, _ = data.from_image_folder(str(tmp_path), image_size=(4, 4))
    fn = data.pipeline(source, batch_size=2, training=False, strategy=mirrored)
    totals = []
    for worker in range(2):
        context = tf.distribute.InputContext(2, worker, 2)
        ds = fn(context)
        assert data.plan_of(ds).step("shard").settings["by"] == "files"
        assert data.graph_ops(ds)[:3] == ["TensorSlice", "Shard", "ParallelMap"]
        totals += [
            (int(y), float(x[0, 0, 0])) for xb, yb in ds for x, y in zip(xb, yb, strict=True)
        ]
    assert sorted(totals) == sorted((c, float(i * 40)) for c in range(2) for i in range(5))


def test_source_function_receives_the_input_context(mirrored):
    contexts = []

    def source(context):
        contexts.append(context)
        return arrays()

    fn = data.pipeline(source, batch_size=4, training=False, strategy=mirrored)
    fn(tf.distribute.InputContext(2, 1, 2))
    assert contexts[-1].input_pipeline_id == 1
    assert data.plan_of(fn(tf.distribute.InputContext(2, 0, 2))).step("shard").settings["by"] == (
        "source function (input_context)"
    )
    plain = data.pipeline(source, batch_size=4, training=False)
    assert contexts[-1] is None and len(labels_of(plain)) == N


def test_file_cache_is_written_and_reused(tmp_path):
    path = str(tmp_path / "cache")
    ds = data.pipeline(arrays(), batch_size=8, training=False, cache=path, preprocess=scale)
    first = labels_of(ds)
    assert os.path.exists(path + ".index")
    again = data.pipeline(arrays(), batch_size=8, training=False, cache=path, preprocess=scale)
    assert labels_of(again) == first == list(range(N))
    assert f"to=file {path}" in data.explain(ds)


INTERRUPTED_RUN = """
import os, sys
import numpy as np, tensorflow as tf
ds = tf.data.Dataset.from_tensor_slices(np.arange(40)).cache(sys.argv[1])
iterator = iter(ds)
next(iterator)
os._exit(0)  # killed mid-epoch: the cache lock stays behind
"""


def test_stale_cache_lock_from_an_interrupted_run_is_recovered(tmp_path, jobs):
    path = str(tmp_path / "cache")
    run = jobs.run([sys.executable, "-c", INTERRUPTED_RUN, path], timeout=120)  # conftest.py
    assert run.returncode == 0, run.stderr[-2000:]
    locks = [f for f in os.listdir(tmp_path) if f.endswith(".lockfile")]
    assert locks, "the interrupted run should have left a lock"
    with pytest.warns(data.StaleCacheWarning, match="interrupted run"):
        ds = data.pipeline(arrays(), batch_size=8, training=False, cache=path)
    assert labels_of(ds) == list(range(N))
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".lockfile")]
    assert os.path.exists(path + ".index")


def test_a_lock_held_by_a_live_iterator_is_left_alone(tmp_path):
    path = str(tmp_path / "cache")
    iterator = iter(tf.data.Dataset.range(100).cache(path))
    next(iterator)  # this process is writing the cache now
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build_cache.recover_stale_lock(path) == []
    assert os.path.exists(path + "_0.lockfile")
    assert list(iterator)[-1] == 99


def test_auto_shuffle_buffer_is_capped_by_cardinality_and_budget():
    big = data.from_arrays(np.zeros((50, 1000), np.float32), np.zeros(50))
    ds = data.pipeline(big, batch_size=5, training=True, shuffle_budget_mb=0.04)
    buffer = data.plan_of(ds).step("shuffle").settings["buffer"]
    assert buffer == int(0.04 * 2**20) // (1000 * 4 + 8)
    ds = data.pipeline(big, batch_size=5, training=True)
    assert data.plan_of(ds).step("shuffle").settings["buffer"] == 50


def test_auto_shuffle_buffer_measures_strings():
    words = data.from_arrays(np.array(["x" * 1000] * 30), np.zeros(30))
    ds = data.pipeline(words, batch_size=5, training=True, shuffle_budget_mb=0.01)
    assert data.plan_of(ds).step("shuffle").settings["buffer"] == int(0.01 * 2**20) // 1008


def test_measuring_an_element_does_not_touch_the_file_cache(tmp_path):
    words = data.from_arrays(np.array(["abc"] * 10), np.zeros(10))
    ds = data.pipeline(words, batch_size=5, training=True, cache=str(tmp_path / "c"))
    assert data.plan_of(ds).step("shuffle").settings["buffer"] == 10
    # Nothing but the cache's record (what it is built from) and its owner's lock file
    # until the pipeline is iterated.
    assert sorted(os.listdir(tmp_path)) == ["c.fingerprint.json", "c.owner"]
    assert sum(int(y.shape[0]) for _, y in ds) == 10
    assert sorted(os.listdir(tmp_path)) == [
        "c.data-00000-of-00001",
        "c.fingerprint.json",
        "c.index",
        "c.owner",
    ]


def test_explicit_shuffle_buffer_and_none():
    ds = data.pipeline(arrays(), batch_size=8, training=True, shuffle_buffer=16)
    assert data.plan_of(ds).step("shuffle").settings["buffer"] == 16
    ds = data.pipeline(
        arrays(), batch_size=8, training=True, shuffle_buffer=None, deterministic=True
    )
    assert "shuffle" not in data.plan_of(ds).names
    assert labels_of(ds) == list(range(N))


def test_explain_any_dataset_from_its_graph():
    ds = tf.data.Dataset.range(10).map(lambda v: v + 1).batch(2)
    # A stateless map: tf.data's map_parallelization runs it in parallel already.
    assert data.explain(ds).splitlines()[1:4] == [
        "  1. Range",
        "  2. Map         parallel=AUTOTUNE",
        "  3. Batch",
    ]
    assert "note: missing: prefetch" in data.explain(ds)
    with pytest.raises(TypeError, match="explain"):
        data.explain([1, 2])


def test_benchmark_counts_elements_after_warmup(mirrored):
    ds = data.pipeline(arrays(), batch_size=8, training=True, repeat=True)
    result = data.benchmark(ds, batches=12, warmup=3)
    assert result["batches"] == 12 and result["elements"] == 96
    assert result["elements_per_s"] == pytest.approx(96 / result["seconds"])
    assert result["batches_per_s"] == pytest.approx(12 / result["seconds"])
    fn = data.pipeline(arrays(), batch_size=8, training=True, strategy=mirrored, repeat=True)
    assert data.benchmark(fn, batches=4, warmup=1)["elements"] == 32
    finite = data.pipeline(arrays(), batch_size=8, training=False)
    assert data.benchmark(finite, batches=50, warmup=1)["batches"] == 4
    with pytest.raises(ValueError, match="repeat=True"):
        data.benchmark(finite, batches=5, warmup=5)


# --- bad input ---------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [0, -8, 2.5, True])
def test_batch_size_must_be_positive_int(batch_size):
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        data.pipeline(arrays(), batch_size=batch_size, training=True)


def test_batch_size_not_divisible_by_replicas(mirrored):
    with pytest.raises(ValueError, match=r"batch_size=7 .* 2 replicas .* e\.g\. 8"):
        data.pipeline(arrays(), batch_size=7, training=True, strategy=mirrored)


def test_augment_without_training_is_an_error():
    with pytest.raises(ValueError, match="augment was given with training=False"):
        data.pipeline(arrays(), batch_size=8, training=False, augment=jitter)


def test_cache_directory_must_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.pipeline(arrays(), batch_size=8, training=True, cache=str(tmp_path / "no" / "c"))


def test_shuffle_buffer_over_the_memory_budget():
    big = data.from_arrays(np.zeros((20, 1000), np.float32), np.zeros(20, np.int64))
    with pytest.raises(ValueError, match=r"shuffle_buffer=10,000 needs .* more than the 1 MiB"):
        data.pipeline(big, batch_size=4, training=True, shuffle_buffer=10_000, shuffle_budget_mb=1)


@pytest.mark.parametrize("buffer", [0, -1, "big"])
def test_bad_shuffle_buffer(buffer):
    with pytest.raises(ValueError, match="shuffle_buffer must be"):
        data.pipeline(arrays(), batch_size=8, training=True, shuffle_buffer=buffer)


def test_training_needs_feature_label_pairs():
    features_only = data.from_arrays(np.zeros((10, 2), np.float32))
    with pytest.raises(TypeError, match=r"pipeline\(training=True\) needs \(features, label\)"):
        data.pipeline(features_only, batch_size=2, training=True)
    # inference on features only is fine
    assert len(list(data.pipeline(features_only, batch_size=5, training=False))) == 2


def test_preprocess_must_keep_pairs():
    with pytest.raises(TypeError, match="output of preprocess=drop_label"):

        def drop_label(x, y):
            return x

        data.pipeline(arrays(), batch_size=8, training=True, preprocess=drop_label)


def test_source_must_be_a_dataset():
    with pytest.raises(TypeError, match="from_arrays"):
        data.pipeline(np.zeros((4, 2)), batch_size=2, training=False)


def test_bad_repeat():
    with pytest.raises(ValueError, match="repeat must be"):
        data.pipeline(arrays(), batch_size=8, training=False, repeat=0)
