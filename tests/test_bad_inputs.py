"""Bad inputs get specific exceptions whose messages say what was wrong and how to fix it.

One row per case of issue 10's audit: the callable provokes the case; the row names
the exception (or warning) type and the words that make the message useful.
"""

import io
import json
import socket
import sys
import threading
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import tfaccel
from tfaccel import callbacks, cli, data, devices, precision
from tfaccel.launcher import launch

# -- helpers ---------------------------------------------------------------------------


def model_fn(features=4, classes=3):
    def build():
        inputs = keras.Input((features,))
        return keras.Model(inputs, keras.layers.Dense(classes)(inputs))

    return build


def make_trainer(**kwargs):
    kwargs.setdefault("loss", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    kwargs.setdefault("strategy", tf.distribute.get_strategy())
    return tfaccel.Trainer(kwargs.pop("model", model_fn()), **kwargs)


def batches(x, y, batch=4):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


X4 = np.zeros((8, 4), np.float32)
Y3 = np.array([0, 1, 2, 1, 0, 1, 2, 0], np.int32)


def fit(x, y, **kwargs):
    make_trainer().fit(batches(x, y), epochs=1, verbose=0, **kwargs)


def tf_config(cluster, index=0):
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


def write_csv(path, text):
    path.write_text(text)
    return str(path)


def image_folder(root, sizes=None):
    sizes = sizes or {"cat": 2, "dog": 2}
    for name, count in sizes.items():
        (root / name).mkdir()
        for i in range(count):
            Image.new("RGB", (6, 6), (40 * i, 90, 200)).save(root / name / f"{i}.png")
    return root


def truncate(path):
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def write_record(path):
    example = tf.train.Example(
        features=tf.train.Features(
            feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0, 2.0])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
            }
        )
    )
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(example.SerializeToString())
    return str(path)


def parse_label_as_float(record):
    spec = {
        "x": tf.io.FixedLenFeature([2], tf.float32),
        "label": tf.io.FixedLenFeature([], tf.float32),
    }
    parsed = tf.io.parse_single_example(record, spec)
    return parsed["x"], parsed["label"]


def normalize(image):  # one argument, but pair elements pass two
    return image / 255.0


# -- cases -----------------------------------------------------------------------------


def port_in_use(tmp_path, monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        workers = [f"127.0.0.1:{port}", "127.0.0.1:1"]
        monkeypatch.setenv("TF_CONFIG", tf_config({"worker": workers}))
        try:
            devices.strategy("multi_worker")
        except devices.DeviceConfigError as error:
            assert str(port) in str(error)
            raise


def csv_type_change(tmp_path, monkeypatch):
    rows = "".join(f"{i},{i % 2}\n" for i in range(1000))
    data.from_csv(write_csv(tmp_path / "t.csv", f"age,label\n{rows}unknown,1\n"), label="label")


def corrupt_image(tmp_path, monkeypatch):
    root = image_folder(tmp_path)
    truncate(root / "dog" / "1.png")
    data.from_image_folder(str(root), image_size=(4, 4))


def damaged_jpeg_header(tmp_path, monkeypatch):
    root = image_folder(tmp_path)
    photo = root / "cat" / "2.jpg"
    Image.new("RGB", (6, 6), (10, 20, 30)).save(photo)
    raw = photo.read_bytes()  # start and end markers intact, header segments zeroed
    photo.write_bytes(raw[:20] + bytes(100) + raw[120:])
    data.from_image_folder(str(root), image_size=(4, 4))


def empty_class_folder(tmp_path, monkeypatch):
    root = image_folder(tmp_path, {"cat": 2, "dog": 1, "owl": 0})
    data.from_image_folder(str(root), image_size=(4, 4))


def profile_dir_is_file(tmp_path, monkeypatch):
    (tmp_path / "runs").write_text("")
    callbacks.ProfileSteps(str(tmp_path / "runs"), 1, 3)


def csv_rows(tmp_path, text, name="c.csv", **kwargs):
    return data.from_csv(write_csv(tmp_path / name, text), label="label", **kwargs)


def csv_bad_int(cell):
    return lambda t, m: csv_rows(t, f"n,label\n1,0\n2,1\n{cell},0\n")


def csv_not_utf8(tmp_path, monkeypatch):
    (tmp_path / "l.csv").write_bytes("city,label\nZürich,0\n".encode("latin-1"))
    data.from_csv(str(tmp_path / "l.csv"), label="label")


def csv_label_not_in_vocabulary(tmp_path, monkeypatch):
    csv_rows(tmp_path, "x,label\n1,cat\n2,dgo\n", label_vocabulary=["cat", "dog"])


def damaged_keras_file(how):
    def provoke(tmp_path, monkeypatch):
        from tfaccel import parallel

        path = tmp_path / "model.keras"
        inputs = keras.Input((2,))
        keras.Model(inputs, keras.layers.Dense(1)(inputs)).save(path)
        raw = path.read_bytes()
        path.write_bytes(
            {"truncated": raw[: len(raw) // 2], "not_zip": b"hello", "empty": b""}[how]
        )
        parallel.load_model(str(path))

    return provoke


def checkpoint_dir_becomes_file(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"

    class ReplaceByFile(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1 and folder.is_dir():
                for thread in threading.enumerate():  # not mid-write: the swap, not a race
                    if thread.name.startswith("tfaccel-save"):
                        thread.join()
                for item in folder.iterdir():
                    if item.is_file():
                        item.unlink()
                    else:
                        import shutil

                        shutil.rmtree(item)
                folder.rmdir()
                folder.write_text("not a folder any more")

    trainer = make_trainer(steps_per_loop=1)
    trainer.fit(batches(X4, Y3, batch=2), epochs=1, verbose=0, callbacks=[ReplaceByFile()],
                checkpoint_dir=str(folder), checkpoint_every=1)  # fmt: skip


CASES = [
    # devices
    ("visible_string", lambda t, m: devices.configure(visible="0"), TypeError,
     ["visible", "list of GPU indices", "visible=[0]"]),
    ("devices_string", lambda t, m: devices.strategy(devices="/cpu:0"), TypeError,
     ["devices must be a list", "devices=['/cpu:0']"]),
    ("tf_config_cluster_list",
     lambda t, m: (m.setenv("TF_CONFIG", tf_config(["a:1", "b:2"])), devices.strategy("auto")),
     devices.DeviceConfigError, ['"cluster" must be a mapping', "list", '{"worker": [']),
    ("tf_config_worker_string",
     lambda t, m: (m.setenv("TF_CONFIG", tf_config({"worker": "a:1"})), devices.strategy()),
     devices.DeviceConfigError, ['cluster["worker"]', 'list of "host:port"', "'a:1'"]),
    ("port_in_use", port_in_use, devices.DeviceConfigError,
     ["already in use", "task worker:0", "free port"]),
    ("memory_growth_string", lambda t, m: devices.configure(memory_growth="no"), TypeError,
     ["memory_growth must be True, False or None", "'no'"]),
    # precision
    ("wrap_optimizer_unknown_name", lambda t, m: precision.wrap_optimizer("adamm"), ValueError,
     ["Unknown optimizer name 'adamm'", "'adam'"]),
    ("wrap_optimizer_number", lambda t, m: precision.wrap_optimizer(0.1), TypeError,
     ["needs a Keras optimizer", "0.1", "keras.optimizers.Adam"]),
    # callbacks
    ("ordered_class_not_instance", lambda t, m: callbacks.ordered(callbacks.Throughput),
     TypeError, ["keras.callbacks.Callback", "parentheses"]),
    ("profile_logdir_is_file", profile_dir_is_file, NotADirectoryError,
     ["runs", "is a file", "folder"]),
    # data
    ("from_arrays_none", lambda t, m: data.from_arrays(None), TypeError,
     ["x is None", "one row per example"]),
    ("from_arrays_scalar", lambda t, m: data.from_arrays(3.0), ValueError,
     ["x is a scalar (3.0)", "first axis"]),
    ("from_arrays_ragged", lambda t, m: data.from_arrays([[1, 2], [3]], [0, 1]), ValueError,
     ["x is ragged", "lengths [1, 2]", "tf.ragged.constant"]),
    ("preprocess_arity",
     lambda t, m: data.pipeline(data.from_arrays(X4, Y3), batch_size=2, training=False,
                                preprocess=normalize),
     TypeError, ["preprocess=normalize(image)", "tuple of 2", "def normalize(features, label)"]),
    ("csv_type_changes", csv_type_change, ValueError,
     ["line 1002", "column 'age'", "'unknown'", "int64", "first 1000 rows"]),
    ("csv_ragged_row",
     lambda t, m: data.from_csv(write_csv(t / "r.csv", "a,b,label\n1,2,0\n3,1\n"), label="label"),
     ValueError, ["line 3", "2 cell(s)", "header has 3"]),
    ("csv_blank_line",
     lambda t, m: data.from_csv(write_csv(t / "b.csv", "a,label\n1,0\n\n2,1\n"), label="label"),
     ValueError, ["line 3", "is blank", "Remove the blank line"]),
    ("csv_empty_label",
     lambda t, m: data.from_csv(write_csv(t / "e.csv", "a,label\n1,0\n2,\n"), label="label"),
     ValueError, ["line 3", "empty label", "class 0"]),
    ("corrupt_image", corrupt_image, ValueError,
     ["1 of 4 image(s)", "dog/1.png", "skip_corrupt=True"]),
    ("damaged_jpeg_header", damaged_jpeg_header, ValueError,
     ["1 of 5 image(s)", "cat/2.jpg", "skip_corrupt=True"]),
    ("tfrecord_spec_mismatch",
     lambda t, m: data.from_tfrecords(write_record(t / "a.tfrecord"), parse_label_as_float),
     ValueError, ["feature 'label'", "int64", "float", "int64_list[1]"]),
    ("empty_class_folder", empty_class_folder, UserWarning,
     ["['owl']", "no images", "keep their index"]),
    # data.from_csv never guesses (issue 21, section 2)
    ("csv_duplicate_columns", lambda t, m: csv_rows(t, "a,a,label\n1,2,0\n"), ValueError,
     ["names column(s) more than once", "'a' (columns [1, 2])", "its own name"]),
    ("csv_duplicate_label_column", lambda t, m: csv_rows(t, "label,x,label\n1,2,0\n"),
     ValueError, ["more than once", "'label' (columns [1, 3])"]),
    ("csv_not_utf8", csv_not_utf8, ValueError,
     ["l.csv", "is not utf-8 text", "encoding='latin-1'", "re-save it as UTF-8"]),
    ("csv_unknown_encoding", lambda t, m: csv_rows(t, "x,label\n1,0\n", encoding="klingon"),
     ValueError, ["unknown encoding='klingon'"]),
    ("csv_utf16_encoding", lambda t, m: csv_rows(t, "x,label\n1,0\n", encoding="utf-16"),
     ValueError, ["encoding='utf-16'", "cannot split", "Re-save the file as UTF-8"]),
    ("csv_header_no_rows", lambda t, m: csv_rows(t, "x,label\n"), ValueError,
     ["has a header but no rows", "no rows"]),
    ("csv_float32_overflow", lambda t, m: csv_rows(t, "x,label\n1.5,0\n1e40,1\n"), ValueError,
     ["line 3", "column 'x'", "'1e40'", "beyond float32's range", "read as inf"]),
    ("csv_float32_overflow_negative", lambda t, m: csv_rows(t, "x,label\n1.5,0\n-4e38,1\n"),
     ValueError, ["line 3", "'-4e38'", "float32"]),
    ("csv_int_underscore", csv_bad_int("1_000"), ValueError,
     ["line 4", "column 'n'", "'1_000'", "int64 TensorFlow's reader accepts"]),
    ("csv_int_other_digits", csv_bad_int("\u0661\u0662"), ValueError,
     ["line 4", "column 'n'", "int64 TensorFlow's reader accepts"]),
    ("csv_int_beyond_int64", csv_bad_int("9223372036854775808"), ValueError,
     ["line 4", "'9223372036854775808'", "int64"]),
    ("csv_float_underscore", lambda t, m: csv_rows(t, "x,label\n1.5,0\n1_0.5,1\n"), ValueError,
     ["line 3", "'1_0.5'", "not a number TensorFlow's CSV reader accepts"]),
    ("csv_select_includes_label",
     lambda t, m: csv_rows(t, "x,y,label\n1,2,0\n", select=["x", "label"]), ValueError,
     ["includes the label column 'label'", "leave it out of select="]),
    ("csv_select_string", lambda t, m: csv_rows(t, "x,y,label\n1,2,0\n", select="x"),
     ValueError, ["select='x' is a string", "select=['x']"]),
    ("csv_label_not_in_vocabulary", csv_label_not_in_vocabulary, ValueError,
     ["line 3", "label 'dgo'", "not in label_vocabulary=['cat', 'dog']"]),
    ("csv_vocabulary_repeats",
     lambda t, m: csv_rows(t, "x,label\n1,cat\n", label_vocabulary=["cat", "cat"]),
     ValueError, ["each label value once", "repeated: ['cat']"]),
    # checked when given, not when first read (issue 21, section 3)
    ("pipeline_seed_string",
     lambda t, m: data.pipeline(data.from_arrays(X4, Y3), batch_size=2, training=True, seed="abc"),
     ValueError, ["seed must be None or an integer", "'abc'", "seed=0"]),
    ("pipeline_seed_float",
     lambda t, m: data.pipeline(data.from_arrays(X4, Y3), batch_size=2, training=True, seed=1.5),
     ValueError, ["seed must be None or an integer", "1.5"]),
    ("pipeline_seed_negative",
     lambda t, m: data.pipeline(data.from_arrays(X4, Y3), batch_size=2, training=True, seed=-1),
     ValueError, ["integer in [0, 2**63)", "-1"]),
    ("pipeline_seed_bool",
     lambda t, m: data.pipeline(data.from_arrays(X4, Y3), batch_size=2, training=True, seed=True),
     ValueError, ["seed must be None or an integer", "True"]),
    ("cache_not_writable",
     lambda t, m: data.pipeline(data.from_arrays(X4, Y3), batch_size=2, training=False,
                                cache="/proc/tfaccel-cache"),
     PermissionError, ["cache='/proc/tfaccel-cache'", "cannot write in '/proc'",
                       "writable directory", "cache='memory'"]),
    ("keras_file_truncated", damaged_keras_file("truncated"), ValueError,
     ["model.keras", "not a zip archive", "truncated", "damaged, not missing", "model.save("]),
    ("keras_file_not_zip", damaged_keras_file("not_zip"), ValueError,
     ["model.keras", "not a zip archive (5 bytes)", "damaged"]),
    ("keras_file_empty", damaged_keras_file("empty"), ValueError,
     ["model.keras", "is empty (0 bytes)", "damaged"]),
    ("keras_file_missing",
     lambda t, m: __import__("tfaccel.parallel").parallel.load_model(str(t / "none.keras")),
     FileNotFoundError, ["no file at", "none.keras"]),
    ("from_arrays_object_mixed",
     lambda t, m: data.from_arrays(np.array([1.0, "a", None], dtype=object)), TypeError,
     ["x has dtype object", "NoneType, float, str", "astype('float32')", "fillna"]),
    ("from_arrays_object_in_dict",
     lambda t, m: data.from_arrays({"age": np.array([1, None], dtype=object)}, [0, 1]),
     TypeError, ["x['age'] has dtype object", "NoneType, int"]),
    ("from_arrays_object_labels",
     lambda t, m: data.from_arrays(X4[:2], np.array([0, None], dtype=object)), TypeError,
     ["y has dtype object", "y.astype('float32')"]),
    ("checkpoint_dir_becomes_file", checkpoint_dir_becomes_file, NotADirectoryError,
     ["Cannot save checkpoint", "ckpt", "is a file now", "Move that file away"]),
    # Trainer
    ("label_out_of_range", lambda t, m: fit(X4, np.array([0, 1, 2, 5, 0, 1, 2, 0])), ValueError,
     ["label 5", "3 classes", "'sparse_categorical_crossentropy'", "0..2"]),
    ("fractional_labels", lambda t, m: fit(X4, Y3 + np.float32(0.5)), ValueError,
     ["integer class indices", "fractions (e.g. 0.5)", "'categorical_crossentropy'"]),
    ("feature_shape", lambda t, m: fit(np.zeros((8, 5), np.float32), Y3), ValueError,
     ["expects input of shape (None, 4)", "features have shape (None, 5)"]),
    ("string_features", lambda t, m: fit(np.full((8, 4), "a"), Y3), TypeError,
     ["features hold strings", "StringLookup"]),
    ("optimizer_number", lambda t, m: make_trainer(optimizer=0.1), TypeError,
     ["optimizer must be a Keras optimizer", "0.1", "keras.optimizers.Adam(0.1)"]),
    ("model_none", lambda t, m: make_trainer(model=None), TypeError,
     ["model must be a keras.Model", "None"]),
    ("empty_dataset", lambda t, m: fit(X4[:0], Y3[:0]), ValueError,
     ["training dataset is empty", "0 batches"]),
    ("validation_steps_zero",
     lambda t, m: fit(X4, Y3, validation_data=batches(X4, Y3), validation_steps=0), ValueError,
     ["validation_steps must be an integer >= 1", "got 0"]),
    # model.fit's arguments in Trainer.fit (issue 27): refused, or misused as model.fit refuses
    ("fit_validation_freq", lambda t, m: make_trainer().fit(X4, Y3, validation_freq=2),
     ValueError, ["does not support validation_freq=2", "model.fit argument", "every epoch"]),
    ("fit_shuffle_batch", lambda t, m: make_trainer().fit(X4, Y3, shuffle="batch"), ValueError,
     ["shuffle must be True or False", "shuffle='batch' is not supported"]),
    ("fit_y_with_dataset", lambda t, m: make_trainer().fit(batches(X4, Y3), Y3), ValueError,
     ["y= is for arrays", "(x, y) elements", "Remove y="]),
    ("fit_batch_size_with_dataset",
     lambda t, m: make_trainer().fit(batches(X4, Y3), batch_size=4), ValueError,
     ["batch_size= is for arrays", "batched already"]),
    ("fit_class_weight_with_dataset",
     lambda t, m: make_trainer().fit(batches(X4, Y3), class_weight={0: 2.0}), ValueError,
     ["class_weight= is for arrays", "(x, y, sample_weight)"]),
    ("fit_class_and_sample_weight",
     lambda t, m: make_trainer().fit(X4, Y3, class_weight={0: 2.0}, sample_weight=Y3 + 1.0),
     ValueError, ["class_weight and sample_weight were both given"]),
    ("fit_validation_split_and_data",
     lambda t, m: make_trainer().fit(X4, Y3, validation_split=0.5, validation_data=(X4, Y3)),
     ValueError, ["validation_split and validation_data were both given"]),
    ("fit_validation_split_one", lambda t, m: make_trainer().fit(X4, Y3, validation_split=1.0),
     ValueError, ["validation_split must be in [0, 1)", "last fraction"]),
    ("fit_validation_split_leaves_nothing",
     lambda t, m: make_trainer().fit(X4, Y3, validation_split=0.9), ValueError,
     ["validation_split=0.9 of 8 examples", "leaves no training example"]),
    ("fit_arrays_without_y", lambda t, m: make_trainer().fit(X4), ValueError,
     ["y is None", "needs labels"]),
    ("fit_generator", lambda t, m: make_trainer().fit(iter([X4]), Y3), TypeError,
     ["generator", "tf.data.Dataset.from_generator"]),
    ("fit_validation_data_list",
     lambda t, m: make_trainer().fit(X4, Y3, validation_data=[X4, Y3]), ValueError,
     ["validation_data must be a dataset or a tuple (x_val, y_val)", "list"]),
    ("fit_initial_epoch_negative", lambda t, m: make_trainer().fit(X4, Y3, initial_epoch=-1),
     ValueError, ["initial_epoch must be an integer >= 0", "-1"]),
    ("fit_class_weight_list", lambda t, m: make_trainer().fit(X4, Y3, class_weight=[1.0, 2.0]),
     ValueError, ["class_weight must be a dict", "[1.0, 2.0]"]),
    ("trainer_no_loss",
     lambda t, m: tfaccel.Trainer(model_fn(), strategy=tf.distribute.get_strategy()),
     ValueError, ["No loss", "loss=", "model.compile(optimizer, loss, metrics)"]),
    ("trainer_loss_weights_for_two_outputs",
     lambda t, m: make_trainer(loss_weights=[1.0, 0.5]), ValueError,
     ["loss_weights=[1.0, 0.5] has 2 weights", "single-output", "loss_weights=1.0"]),
    # launch (the Python API; the command line is below)
    ("launch_missing_program", lambda t, m: launch.launch(["no-such-program-x1"], 2),
     FileNotFoundError, ["'no-such-program-x1'", "not found on PATH"]),
    ("launch_cpus_zero", lambda t, m: launch.launch(["true"], 2, cpus_per_worker=0), ValueError,
     ["--cpus-per-worker must be an integer >= 1", "got 0"]),
    ("launch_timeout_zero", lambda t, m: launch.launch(["true"], 2, timeout_s=0), ValueError,
     ["--timeout must be a number of seconds > 0", "got 0"]),
    ("launch_startup_timeout_negative",
     lambda t, m: launch.launch(["true"], 2, startup_timeout_s=-1), ValueError,
     ["--startup-timeout must be a number of seconds > 0", "got -1"]),
]  # fmt: skip


@pytest.mark.parametrize(
    "provoke, kind, words", [pytest.param(*row[1:], id=row[0]) for row in CASES]
)
def test_bad_input_is_explained(provoke, kind, words, tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    if issubclass(kind, Warning):
        with pytest.warns(kind) as record:
            provoke(tmp_path, monkeypatch)
        message = " ".join(str(w.message) for w in record if issubclass(w.category, kind))
    else:
        with pytest.raises(kind) as caught:
            provoke(tmp_path, monkeypatch)
        message = str(caught.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"{missing} not in: {message}"


@pytest.mark.parametrize(
    "argv, status, words",
    [
        pytest.param(["--", "no-such-program-x1"], 127, ["'no-such-program-x1'"], id="missing"),
        pytest.param(["--cpus-per-worker", "0", "--", "true"], 2, ["got 0"], id="cpus_zero"),
        pytest.param(["--timeout", "-5", "--", "true"], 2, ["--timeout", "-5.0"], id="timeout"),
        pytest.param(["--startup-timeout", "0", "--", "true"], 2, ["--startup-timeout"], id="su"),
    ],
)
def test_bad_launch_command_line_is_one_line(argv, status, words, capsys):
    assert cli.main(["launch", "--workers", "2", *argv]) == status
    err = capsys.readouterr().err
    assert err.startswith("tfaccel launch: ") and err.count("\n") == 1
    assert "Traceback" not in err and all(w in err for w in words), err


def test_peer_that_never_starts_is_named_and_the_job_stops():
    # Worker 0 starts a server on its TF_CONFIG port (as TensorFlow would); worker 1 never does.
    code = (
        "import json, os, socket, time\n"
        "config = json.loads(os.environ['TF_CONFIG'])\n"
        "if config['task']['index'] == 0:\n"
        "    port = int(config['cluster']['worker'][0].rsplit(':', 1)[1])\n"
        "    server = socket.socket(); server.bind(('127.0.0.1', port)); server.listen()\n"
        "time.sleep(60)\n"
    )
    out = io.StringIO()
    status = launch.launch([sys.executable, "-c", code], 2, startup_timeout_s=1.0, out=out)
    assert status == launch.TIMEOUT_STATUS
    text = out.getvalue()
    assert "worker 1 (127.0.0.1:" in text and "did not start its TensorFlow server" in text
    assert "within 1 s of worker(s) 0" in text and "--startup-timeout" in text


def test_workers_without_a_server_are_not_stopped_by_the_startup_wait():
    out = io.StringIO()
    command = [sys.executable, "-c", "import time; time.sleep(1.5)"]
    assert launch.launch(command, 2, startup_timeout_s=0.2, out=out) == 0


# -- what Keras accepts is accepted ------------------------------------------------------


def test_callbacks_none_or_single_are_accepted_like_keras():
    seen = []

    class Count(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(epoch)

    single = Count()
    assert callbacks.ordered(single) == [single]
    assert callbacks.ordered(None) == []
    trainer = make_trainer()
    trainer.fit(batches(X4, Y3), epochs=1, verbose=0, callbacks=None)
    trainer.fit(batches(X4, Y3), epochs=2, verbose=0, callbacks=single)
    assert seen == [0, 1]


def test_wrap_optimizer_resolves_a_name():
    optimizer = precision.wrap_optimizer("sgd", policy="float32")
    assert isinstance(optimizer, keras.optimizers.SGD)
    wrapped = precision.wrap_optimizer("adam", policy="mixed_float16")
    assert isinstance(wrapped, keras.optimizers.LossScaleOptimizer)
    assert isinstance(wrapped.inner_optimizer, keras.optimizers.Adam)


def test_skip_corrupt_leaves_the_file_out_with_one_warning(tmp_path):
    root = image_folder(tmp_path, {"cat": 3, "dog": 2})
    truncate(root / "cat" / "0.png")
    (root / "dog" / "1.png").write_bytes(b"not an image at all")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        dataset, names = data.from_image_folder(str(root), image_size=(4, 4), skip_corrupt=True)
    assert len(record) == 1 and record[0].filename == __file__
    message = str(record[0].message)
    assert "skipped 2 corrupt image(s)" in message
    assert "cat/0.png" in message and "dog/1.png" in message
    labels = [int(label) for _, label in dataset.as_numpy_iterator()]
    assert labels == [0, 0, 1] and len(dataset.file_paths) == 3
