import contextlib
import csv

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image

from tfaccel import data

COLOURS = {"cat": (250, 10, 10), "dog": (10, 250, 10), "owl": (10, 10, 250)}


def write_image(path, colour, size=(20, 24), fmt="JPEG"):
    Image.new("RGB", size, colour).save(path, fmt, quality=95)


@pytest.fixture
def class_folder(tmp_path):
    for name, colour in COLOURS.items():
        (tmp_path / name).mkdir()
        for i in range(3):
            fmt, ext = ("PNG", "png") if i == 2 else ("JPEG", "jpg")
            write_image(tmp_path / name / f"{i}.{ext}", colour, fmt=fmt)
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    return tmp_path


def test_from_arrays_pairs_and_features_only():
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    y = np.arange(6)
    pairs = list(data.from_arrays(x, y).as_numpy_iterator())
    assert len(pairs) == 6
    np.testing.assert_array_equal(pairs[4][0], [8.0, 9.0])
    assert pairs[4][1] == 4
    features = list(data.from_arrays({"a": x}).as_numpy_iterator())
    np.testing.assert_array_equal(features[1]["a"], [2.0, 3.0])


def test_from_arrays_length_mismatch():
    with pytest.raises(ValueError, match="same number of rows"):
        data.from_arrays(np.zeros((5, 2)), np.zeros(4))


def test_image_folder_inferred_decodes_and_resizes(class_folder):
    ds, names = data.from_image_folder(str(class_folder), image_size=(8, 6))
    assert names == ["cat", "dog", "owl"]
    assert ds.element_spec[0].shape == (8, 6, 3)
    items = list(ds.as_numpy_iterator())
    assert [int(label) for _, label in items] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for image, label in items:
        expected = np.array(COLOURS[names[label]], np.float32)
        np.testing.assert_allclose(image.mean(axis=(0, 1)), expected, atol=4)
    # Decoding runs in the dataset's parallel map, not in Python.
    assert data.graph_ops(ds) == ["TensorSlice", "ParallelMap"]


def test_image_folder_grey_channels(class_folder):
    ds, _ = data.from_image_folder(str(class_folder), image_size=(4, 4), channels=1)
    image, _ = next(iter(ds))
    assert image.shape == (4, 4, 1)


def test_image_folder_csv_kaggle_layout(tmp_path):
    (tmp_path / "train").mkdir()
    rows = [("a1", "beagle"), ("b2", "akita"), ("c3.jpg", "beagle")]
    for name, breed in rows:
        stem = name.removesuffix(".jpg")
        write_image(
            tmp_path / "train" / f"{stem}.jpg", COLOURS["cat" if breed == "akita" else "owl"]
        )
    labels = tmp_path / "labels.csv"
    with open(labels, "w", newline="") as handle:
        csv.writer(handle).writerows([("id", "breed"), *rows])
    ds, names = data.from_image_folder(
        str(tmp_path / "train"), labels=str(labels), image_size=(5, 5)
    )
    assert names == ["akita", "beagle"]
    assert [int(label) for _, label in ds.as_numpy_iterator()] == [1, 0, 1]


def test_image_folder_without_images(tmp_path):
    (tmp_path / "empty_class").mkdir()
    (tmp_path / "empty_class" / "readme.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="no images"):
        data.from_image_folder(str(tmp_path), image_size=(8, 8))


def test_image_folder_csv_names_missing_files(tmp_path):
    write_image(tmp_path / "here.jpg", (1, 2, 3))
    labels = tmp_path / "labels.csv"
    labels.write_text("id,breed\nhere,pug\ngone,pug\n")
    with pytest.raises(FileNotFoundError, match=r"1 of 2 file.*gone"):
        data.from_image_folder(str(tmp_path), labels=str(labels), image_size=(8, 8))


def test_image_folder_bad_image_size(class_folder):
    with pytest.raises(ValueError, match="image_size"):
        data.from_image_folder(str(class_folder), image_size=(8,))


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "table.csv"
    path.write_text("age,height,city,label\n31,1.75,Oslo,1\n45,1.62,Lima,0\n,1.80,Pune,1\n")
    return str(path)


def test_from_csv_numeric_and_string_columns(table):
    with pytest.warns(UserWarning, match=r"read as 0 — 'age': 1 \(first at line 4\)"):
        dataset = data.from_csv(table, label="label")
    rows = list(dataset.as_numpy_iterator())
    assert len(rows) == 3
    features, label = rows[1]
    assert set(features) == {"age", "height", "city"}
    assert features["age"] == 45 and features["age"].dtype == np.int64
    assert features["height"] == pytest.approx(1.62) and features["height"].dtype == np.float32
    assert features["city"] == b"Lima"
    assert label == 0
    assert rows[2][0]["age"] == 0  # an empty numeric cell reads as 0


def test_from_csv_missing_nan_or_error(table):
    rows = list(data.from_csv(table, label="label", missing="nan").as_numpy_iterator())
    ages = [features["age"] for features, _ in rows]
    assert ages[:2] == [31.0, 45.0] and np.isnan(ages[2]) and ages[0].dtype == np.float32
    assert rows[2][0]["height"] == pytest.approx(1.80)  # columns without blanks keep their type
    with pytest.raises(ValueError, match=r"line 4 .* empty cell in numeric column 'age'"):
        data.from_csv(table, label="label", missing="error")
    with pytest.raises(ValueError, match=r"missing must be one of \('zero', 'nan', 'error'\)"):
        data.from_csv(table, label="label", missing="drop")


def test_from_csv_select(table):
    features, label = next(iter(data.from_csv(table, label="city", select=["height"])))
    assert list(features) == ["height"]
    assert label.numpy() == b"Oslo"


def test_from_csv_label_not_in_file(table):
    with pytest.raises(ValueError, match=r"label column 'target' is not in .*'age', 'height'"):
        data.from_csv(table, label="target")


def test_from_csv_strips_a_byte_order_mark(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufefflabel,x\n1,2.5\n0,3.5\n".encode())
    rows = list(data.from_csv(str(path), label="label").as_numpy_iterator())
    assert [(f["x"], y) for f, y in rows] == [(2.5, 1), (3.5, 0)]


def test_from_csv_reads_another_encoding_as_utf8(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes("city,label\nZürich,0\nSão Paulo,1\n".encode("latin-1"))
    rows = list(data.from_csv(str(path), label="label", encoding="latin-1").as_numpy_iterator())
    assert [f["city"].decode() for f, _ in rows] == ["Zürich", "São Paulo"]


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_from_csv_label_vocabulary_maps_strings_to_class_indices(tmp_path, encoding):
    path = tmp_path / "pets.csv"
    path.write_bytes(
        "weight,label\n4.1,chien\n3.0,chat\n5.2, chien\n1.0,hérisson\n".encode(encoding)
    )
    vocabulary = ["chat", "chien", "hérisson"]
    dataset = data.from_csv(
        str(path), label="label", label_vocabulary=vocabulary, encoding=encoding
    )
    assert [int(y) for _, y in dataset] == [1, 0, 1, 2]
    assert dataset.element_spec[1].dtype == tf.int64


def test_from_csv_accepts_what_the_reader_accepts(tmp_path):
    # Written-out inf/nan read as written; spaces and signs around numbers are the reader's.
    path = tmp_path / "ok.csv"
    path.write_text("n,x,label\n 7 ,inf,0\n+8,-NaN,1\n-9,3e38,0\n")
    rows = list(data.from_csv(str(path), label="label").as_numpy_iterator())
    assert [int(f["n"]) for f, _ in rows] == [7, 8, -9]
    xs = [f["x"] for f, _ in rows]
    assert np.isinf(xs[0]) and np.isnan(xs[1]) and xs[2] == pytest.approx(3e38)


@pytest.mark.parametrize(
    "text, vocabulary",
    [
        ("n,x,day,label\n1,1.5,2020-01-05,0\n,2.5,2021-02-03,1\n3,,2022-01-01,0\n", None),
        ("x,n,label\ninf,1,0\nnan, 2 ,1\n-Infinity,+3,0\n", None),
        ("city,label\nOslo,cat\nLima, dog\n", ["cat", "dog"]),
        ("a,b,label\n1,x,0\n2,,1\n", None),
        ("dash,tiny,label\n-,tiny,0\n1,any,1\n", None),
        ('q,label\n"1,5",0\n"2",1\n', None),
    ],
    ids=["empties_and_dates", "specials", "vocabulary", "empty_string", "near_numbers", "quoted"],
)
def test_from_csv_fast_scan_agrees_with_the_row_by_row_check(tmp_path, text, vocabulary):
    from tfaccel.data import sources
    from tfaccel.data.sources import csv_rules

    path = tmp_path / "t.csv"
    path.write_text(text)
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        wanted = list(range(len(header)))
        sample = [(reader.line_num, row) for row in reader]
    args = (str(path), "utf-8-sig", header, wanted, "label", vocabulary, False, 1000)
    fast = csv_rules.fast_scan(*args)
    assert fast is not None  # these tables need no row-by-row look
    slow = sources._check_rows(str(path), header, "label", wanted, vocabulary, sample, [], "zero")
    assert (fast.kinds, fast.empty) == slow


@pytest.mark.parametrize(
    "late, dtype", [("2.5", tf.float32), ("NA", tf.string), ("7", tf.int64)], ids=str
)
def test_from_csv_kind_comes_from_the_first_1000_rows_not_the_first_few(tmp_path, late, dtype):
    rows = [str(i) for i in range(300)]
    rows[120] = late  # after the first rows
    path = tmp_path / "late.csv"
    path.write_text("n,label\n" + "".join(f"{v},0\n" for v in rows))
    assert data.from_csv(str(path), label="label").element_spec[0]["n"].dtype == dtype


def _write_records(tmp_path, files=3, per_file=4):
    for f in range(files):
        with tf.io.TFRecordWriter(str(tmp_path / f"part-{f}.tfrecord")) as writer:
            for i in range(per_file):
                value = f * per_file + i
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "x": tf.train.Feature(float_list=tf.train.FloatList(value=[value])),
                            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[value])),
                        }
                    )
                )
                writer.write(example.SerializeToString())
    return str(tmp_path / "part-*.tfrecord")


SCHEMA = {"x": tf.io.FixedLenFeature([1], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}


def parse(record):
    parsed = tf.io.parse_single_example(record, SCHEMA)
    return parsed["x"], parsed["y"]


def test_from_tfrecords_reads_every_record(tmp_path):
    ds = data.from_tfrecords(_write_records(tmp_path), parse)
    labels = sorted(int(y) for _, y in ds.as_numpy_iterator())
    assert labels == list(range(12))
    assert "ParallelInterleave" in data.graph_ops(ds)


def test_from_tfrecords_needs_pairs(tmp_path):
    pattern = _write_records(tmp_path)
    with pytest.raises(TypeError, match="features, label"):
        data.from_tfrecords(pattern, lambda r: tf.io.parse_single_example(r, SCHEMA))


def test_from_tfrecords_no_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no file matches"):
        data.from_tfrecords(str(tmp_path / "*.tfrecord"), parse)


def test_from_tfds_mock_mnist():
    with tfds.testing.mock_data(num_examples=12):
        ds = data.from_tfds("mnist", "train")
        batches = data.pipeline(ds, batch_size=5, training=True, seed=0)
        shapes = [tuple(x.shape) for x, _ in batches]
    assert ds.element_spec[0].shape == (28, 28, 1)
    assert shapes == [(5, 28, 28, 1), (5, 28, 28, 1), (2, 28, 28, 1)]
    assert "kind=tfds" in data.explain(batches)


def test_from_tfds_shards_files_with_input_context(monkeypatch):
    seen = {}
    real_load = tfds.load

    def recording_load(*args, **kwargs):
        seen.update(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(tfds, "load", recording_load)
    context = tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2
    )
    with tfds.testing.mock_data(num_examples=4):
        ds = data.from_tfds("mnist", "test", input_context=context)
    assert seen["read_config"].input_context is context
    assert seen["as_supervised"] is True and seen["shuffle_files"] is False
    assert ds.element_spec[1].dtype == tf.int64


def _numbered_folder(root, counts):
    for name, count in counts.items():
        (root / name).mkdir()
        for i in range(count):
            write_image(root / name / f"{i:02d}.png", COLOURS[name], fmt="PNG")
    return str(root)


def test_image_folder_split_picks_the_files_keras_picks(tmp_path):
    path = _numbered_folder(tmp_path, {"cat": 6, "dog": 5, "owl": 4})
    (train, val), names = data.from_image_folder(
        path, image_size=(4, 4), validation_split=0.2, subset="both", seed=11
    )
    kwargs = dict(image_size=(4, 4), validation_split=0.2, seed=11, verbose=False)
    k_train, k_val = keras.utils.image_dataset_from_directory(path, subset="both", **kwargs)
    assert train.file_paths == k_train.file_paths and val.file_paths == k_val.file_paths
    assert len(val.file_paths) == 3 and not set(train.file_paths) & set(val.file_paths)
    assert names == train.class_names == val.class_names == k_train.class_names
    # The same seed gives the same subsets one at a time.
    alone, _ = data.from_image_folder(
        path, image_size=(4, 4), validation_split=0.2, subset="validation", seed=11
    )
    assert alone.file_paths == val.file_paths
    # Labels follow their files.
    for (image, label), file in zip(val.as_numpy_iterator(), val.file_paths, strict=True):
        assert names[label] in file
        np.testing.assert_allclose(image.mean(axis=(0, 1)), COLOURS[names[label]], atol=4)
    plan = data.explain(data.pipeline(train, batch_size=4, training=False))
    assert "subset=training, validation_split=0.2, seed=11, images=12" in plan


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(validation_split=1.5, subset="training", seed=1), "between 0 and 1"),
        (dict(validation_split=0.2, seed=1), "without subset"),
        (dict(subset="training", seed=1), "without validation_split"),
        (dict(validation_split=0.2, subset="test", seed=1), "subset must be one of"),
        (dict(validation_split=0.2, subset="training"), "needs an integer seed"),
        (dict(validation_split=0.01, subset="both", seed=1), "leaves the validation subset empty"),
    ],
)
def test_image_folder_bad_split_arguments(class_folder, kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.from_image_folder(str(class_folder), image_size=(4, 4), **kwargs)


def test_image_folder_class_names_on_the_dataset(class_folder):
    dataset, names = data.from_image_folder(str(class_folder), image_size=(4, 4))
    assert dataset.class_names == names == ["cat", "dog", "owl"]
    assert len(dataset.file_paths) == 9 and dataset.file_paths[0].endswith("cat/0.jpg")


def test_image_folder_screening_keeps_every_decodable_file(tmp_path):
    (tmp_path / "all").mkdir()
    for fmt, ext in (("BMP", "bmp"), ("GIF", "gif"), ("JPEG", "jpg"), ("PNG", "png")):
        write_image(tmp_path / "all" / f"a.{ext}", COLOURS["owl"], fmt=fmt)
    # Bytes after a JPEG's end marker (some cameras append data) still decode: not corrupt.
    jpeg = tmp_path / "all" / "b.jpg"
    write_image(jpeg, COLOURS["owl"])
    jpeg.write_bytes(jpeg.read_bytes() + b"\0" * 100 + b"trailer" * 20)
    dataset, _ = data.from_image_folder(str(tmp_path), image_size=(4, 4))
    assert len(dataset.file_paths) == 5
    for image, _ in dataset.as_numpy_iterator():
        np.testing.assert_allclose(image.mean(axis=(0, 1)), COLOURS["owl"], atol=6)


_MIXED = (
    'n,x,city,label\n1,1.5,Oslo,0\n{blank},2.5, Lima ,1\n3,,"Rio, BR",0\n-4,nan,,1\n 5 ,-inf,X,0\n'
)


@pytest.mark.parametrize(
    "missing, int_blank, from_memory",
    [("zero", True, True), ("nan", False, True), ("nan", True, False)],  # last: n reads as float
)
def test_from_csv_served_from_its_check_equals_the_streamed_file(
    tmp_path, monkeypatch, missing, int_blank, from_memory
):
    # Read once (the check's decoding) or streamed by CsvDataset: the same elements.
    from tfaccel.data.sources import csv_table as sources

    path = tmp_path / "mixed.csv"
    path.write_text(_MIXED.format(blank="" if int_blank else "2"))

    def rows():
        with pytest.warns(UserWarning) if missing == "zero" else contextlib.nullcontext():
            dataset = data.from_csv(str(path), label="label", missing=missing)
        return list(dataset.as_numpy_iterator())

    checked = sources._checked_columns
    served_from = []
    monkeypatch.setattr(
        sources, "_checked_columns", lambda *a: served_from.append(checked(*a)) or served_from[-1]
    )
    served = rows()
    monkeypatch.setattr(sources, "_SERVED_FROM_MEMORY", -1)
    streamed = rows()
    assert (served_from[0] is not None) == from_memory and served_from[1] is None
    assert len(served) == len(streamed) == 5
    for (a, ya), (b, yb) in zip(served, streamed, strict=True):
        assert ya == yb and a.keys() == b.keys()
        for key in a:
            assert type(a[key]) is type(b[key])
            np.testing.assert_array_equal(a[key], b[key])
