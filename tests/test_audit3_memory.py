"""The third audit's memory and fork cases (issue 69, "worth fixing"): what the Trainer keeps
after `fit` on arrays, what each `fit` left behind in one process, and a child forked after
TensorFlow started."""

import gc
import sys
import weakref

import keras
import numpy as np

import tfaccel
from tfaccel.launcher import forking
from tfaccel.train.step import registrations

RETAINED = """
import gc, sys
import keras, numpy as np, psutil
import tfaccel
from tfaccel.data import iterators

rows = 256 * 2**20 // (4 * 256)  # 256 MiB of float32 features
x = np.random.default_rng(0).random((rows, 256), dtype="float32")
y = (x[:, 0] * 10).astype("int64")
model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(10)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.predict(x[:2], verbose=0)
gc.collect()
before = psutil.Process().memory_info().rss
if sys.argv[1] == "model.fit":
    model.fit(x, y, batch_size=1024, epochs=1, verbose=0)
else:
    tfaccel.Trainer(model).fit(x, y, batch_size=1024, epochs=1, verbose=0)
iterators.wait_for(lambda: iterators.pending() == 0, 120)
gc.collect()
print((psutil.Process().memory_info().rss - before) / x.nbytes)
"""


def test_the_trainer_keeps_no_more_of_the_arrays_than_model_fit(jobs):
    """After training on a 256 MiB array, the Trainer's process holds what model.fit's holds
    (it held one more copy of the array: tf.data's rewrite of a graph holding the rows)."""
    copies = {}
    for way in ("model.fit", "Trainer.fit"):
        result = jobs.run([sys.executable, "-c", RETAINED, way], timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        copies[way] = float(result.stdout.split()[-1])
    assert copies["Trainer.fit"] <= copies["model.fit"] + 0.5, copies


def _fit_a_new_trainer(x, y) -> weakref.ref:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = tfaccel.Trainer(model, steps_per_loop=2, jit_compile=False)
    trainer.fit(x, y, batch_size=16, epochs=1, verbose=0, validation_split=0.25)
    return weakref.ref(trainer.model)


def test_each_fit_leaves_nothing_behind_in_the_process():
    """A new Trainer per fit (a notebook): each trace's all-reduce left a gradient
    registration holding its graph and, through it, the model (3 a fit, ~4-6 MB), kept for
    the life of the process. Read from the registry and the models, not from RSS or the
    iterators still being freed (another test's may take a minute)."""
    x = np.random.default_rng(0).random((100, 4)).astype("float32")
    y = np.arange(100) % 3
    _fit_a_new_trainer(x, y)  # what a first fit creates once
    entries = registrations.count()
    models = [_fit_a_new_trainer(x, y) for _ in range(3)]
    assert registrations.count() == entries
    gc.collect()
    assert [ref() for ref in models[:-1]] == [None, None]  # the earlier fits' models are gone


FORKS = """
import os, subprocess, sys
import multiprocessing as mp
import tensorflow as tf
import tfaccel

def child(name):
    os.write(2, f"child {name} ended\\n".encode())

def fork(name):
    process = mp.get_context("fork").Process(target=child, args=(name,))
    process.start()
    process.join(60)
    assert process.exitcode == 0, (name, process.exitcode)

fork("before any op")  # TensorFlow imported only (the test suite's fork server)
float(tf.reduce_sum(tf.ones([4])))  # the runtime starts
subprocess.run([sys.executable, "-c", "pass"], preexec_fn=lambda: None, check=True)
os.environ["TFACCEL_FORK_WARNING"] = "0"
fork("silenced")
del os.environ["TFACCEL_FORK_WARNING"]
fork("after an op")
print("parent ended")
"""


def test_a_child_forked_after_tensorflow_started_is_warned(jobs):
    """Only the child forked after the runtime started hears it; each child ends."""
    result = jobs.run([sys.executable, "-c", FORKS], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "parent ended" in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith(("tfaccel:", "child"))]
    assert lines == [
        "child before any op ended",
        "child silenced ended",
        forking.MESSAGE.strip(),
        "child after an op ended",
    ], result.stderr[-3000:]
    assert "multiprocessing.get_context('spawn')" in forking.MESSAGE
    assert "TensorFlow does not survive fork" in forking.MESSAGE
