"""Held-out jobs: published Keras examples, ported as written, never used to choose anything.

`benchmarks/time_to_accuracy.py`'s own jobs (`JOBS` there) are the *choice* jobs: the only
ones the stacks of `methods="fast"`, thresholds such as `methods.LONG_EPOCH_STEPS`, the
cycle's scales and every other default were screened and chosen on. The jobs here are
*held out*: nothing in `tfaccel/` may be chosen on them, name them or read them
(`tests/test_heldout_jobs.py` fails if `tfaccel/` or the choice jobs name one). Their
figures are the ones to quote as what a new user gets.

Each job is a keras.io example ported as written (its model, loss, optimizer, batch,
epochs and callbacks), on data a package ships or that is generated here, offline. What
changed to fit two shared CPU cores and to measure time to a target, the same for every job:
the held-out split is the validation data (the examples' `validation_split` or test set
becomes one fixed, stratified held-out split, read at every epoch's end); the metric is
`"accuracy"` (Keras reads the labels' form; `for_fit` may make labels one-hot, which a
`sparse_categorical_accuracy` refuses); the data is smaller. Per job:

- `mnist_convnet_digits` (image): "Simple MNIST convnet",
  https://keras.io/examples/vision/mnist_convnet/ . Conv(32)-pool-conv(64)-pool-flatten-
  dropout(0.5)-softmax, categorical cross-entropy on one-hot labels, Adam, batch 128,
  15 epochs. Changed: scikit-learn's 1,797 8x8 digits upsampled (bilinear) to 28x28
  instead of MNIST's 60,000 (1,257 train, 540 held out).
- `fcn_forda_shaped` (1-D convolution, time series): "Timeseries classification from
  scratch", https://keras.io/examples/timeseries/timeseries_classification_from_scratch/ .
  Three Conv1D(64, 3)+BatchNorm+ReLU, global average pooling, softmax; Adam, batch 32,
  500 epochs with ModelCheckpoint (best val_loss), ReduceLROnPlateau(0.5, patience 20,
  min 1e-4) and EarlyStopping(patience 50). Changed: generated series shaped like UCR
  FordA (z-normalized, length 500, two classes) - 1,400 train and 600 held out instead
  of 3,601 and 1,320: each series is a few random sinusoids and red noise, with a weaker
  component in one band of frequencies or the other (the class). The checkpoint is written to
  a temporary folder.
- `structured_mlp_hastie` (table): "Structured data classification from scratch",
  https://keras.io/examples/structured_data/structured_data_classification_from_scratch/ .
  Dense(32, relu)-Dropout(0.5)-Dense(1, sigmoid), binary cross-entropy, Adam, batch 32,
  50 epochs. Changed: scikit-learn's generated `make_hastie_10_2` (Hastie, Tibshirani and
  Friedman, ESL 10.2: 10 Gaussian features, class = sum of squares above the chi-square
  median; 6,000 rows, 4,200 train) instead of the Cleveland heart-disease CSV (303 rows,
  fetched), standardized with the training rows' statistics (what the example's adapted
  `Normalization` layers do; there are no categorical columns). The published recipe *is*
  the plain script (Adam, batch 32): its "recipe" contenders are the naive ones.
- `transformer_text_generated` (attention, text): "Text classification with Transformer",
  https://keras.io/examples/nlp/text_classification_with_transformer/ . Token and
  position embedding (32), one transformer block (2 heads, feed-forward 32, dropout 0.1),
  global average pooling, dropout, Dense(20, relu), dropout, softmax over 2; sparse
  categorical cross-entropy, Adam, batch 32, 2 epochs. Changed: generated reviews instead
  of IMDB (fetched): 4,000 documents of 100 tokens (vocabulary 2,000, maxlen 100 instead
  of 20,000 and 200), Zipf-like filler with one to six sentiment tokens, each of the
  document's polarity with probability 0.75. The published recipe is the plain script.

Each job's `target` and `needed_epochs` were set once, before any contender ran, from the
published recipe alone (`python benchmarks/time_to_accuracy_heldout.py --calibrate`: 3
seeds, `model.fit`, the recipe's epochs capped at 30): the target is a round held-out
accuracy the recipe reached in every calibration seed (the lowest seed's best epoch,
rounded down to 0.01), the needed epochs the most any seed took to it. MNIST convnet:
0.95 in 7-9 epochs (its calibration stopped at 0.95, a provisional target); FCN: bests
0.936, 0.953, 0.922 in 12 epochs, target 0.90 (its held-out accuracy jumps by points
between epochs) in 10-11; structured MLP: bests 0.868, 0.868, 0.864 in 30 epochs, 0.86 in
22-28; Transformer: bests 0.892, 0.894, 0.889 in its 2 epochs, 0.88 in 1-2. The curves are
in `benchmarks/results/time_to_accuracy_heldout.json` (`calibration`).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from sklearn import datasets, model_selection, preprocessing

Parts = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # x_train, x_held, y_train, y_held


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A published recipe's training arguments (the model is the job's)."""

    batch: int
    epochs: int
    learning_rate: float | None = None  # None: Adam's default, as the example writes it
    callbacks: Callable[[], list] | None = None

    def same_as_naive(self) -> bool:
        """True when the recipe is the plain script: Adam's default, batch 32, no callbacks."""
        return self.batch == 32 and self.learning_rate is None and self.callbacks is None

    def optimizer(self) -> keras.optimizers.Optimizer:
        """A fresh Adam at the recipe's rate (Keras' default where it names none)."""
        rate = self.learning_rate
        return keras.optimizers.Adam() if rate is None else keras.optimizers.Adam(rate)

    def inputs(self, parts: Parts, seed: int) -> tuple[Any, Any, keras.optimizers.Optimizer, list]:
        """(train, validation, optimizer, callbacks) for one run: the training rows shuffled
        by `seed` in the recipe's batches, the held-out rows in batches of 256, fresh
        callbacks."""
        xt, xv, yt, yv = parts
        train = tf.data.Dataset.from_tensor_slices((xt, yt)).shuffle(len(xt), seed=seed)
        val = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(256)
        callbacks = self.callbacks() if self.callbacks else []
        return train.batch(self.batch), val, self.optimizer(), callbacks


@dataclasses.dataclass(frozen=True)
class HeldOutJob:
    """One held-out job: its data, model, loss and published recipe."""

    name: str
    kind: str  # what the model is (for the docs; `tfaccel` reads it from the model itself)
    source: str
    data: Callable[[], Parts]
    build: Callable[[], keras.Model]
    loss: str
    recipe: Recipe
    target: float
    needed_epochs: int


def _split(x: np.ndarray, y: np.ndarray, held: float = 0.3) -> Parts:
    xt, xv, yt, yv = model_selection.train_test_split(
        x, y, test_size=held, stratify=y if y.ndim == 1 else y.argmax(-1), random_state=0
    )
    return xt, xv, yt, yv


# -- Simple MNIST convnet, on the digits upsampled ---------------------------------------------


def digits_28() -> Parts:
    import tensorflow as tf

    x, y = datasets.load_digits(return_X_y=True)
    x = (x.reshape(-1, 8, 8, 1) / 16.0).astype("float32")
    x = tf.image.resize(x, (28, 28), method="bilinear").numpy().clip(0.0, 1.0)
    return _split(x, keras.utils.to_categorical(y, 10).astype("float32"))


def mnist_convnet() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input(shape=(28, 28, 1)),
            keras.layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            keras.layers.MaxPooling2D(pool_size=(2, 2)),
            keras.layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
            keras.layers.MaxPooling2D(pool_size=(2, 2)),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


# -- Timeseries classification from scratch, on FordA-shaped series ----------------------------


def forda_shaped(n: int = 1_200, length: int = 500, seed: int = 0) -> Parts:
    """Two classes of noisy series told apart by a weak component's band (generated)."""
    rng = np.random.default_rng(seed)
    t = np.arange(length, dtype="float64")
    y = rng.integers(0, 2, n)
    x = np.zeros((n, length))
    for _ in range(3):  # background: random sinusoids between the classes' bands
        freq, phase = rng.uniform(0.07, 0.13, (n, 1)), rng.uniform(0, 2 * np.pi, (n, 1))
        x += rng.uniform(0.2, 1.0, (n, 1)) * np.sin(2 * np.pi * freq * t + phase)
    x += np.cumsum(rng.normal(0, 0.1, (n, length)), axis=1) * 0.2  # red noise
    x += rng.normal(0, 0.5, (n, length))  # white noise
    band = np.where(y == 1, rng.uniform(0.03, 0.05, n), rng.uniform(0.16, 0.2, n))
    level = rng.uniform(0.4, 0.9, n)[:, None]  # the class's band, weaker than the background
    x += level * np.sin(2 * np.pi * band[:, None] * t + rng.uniform(0, 6.3, (n, 1)))
    x = (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True)  # FordA is z-normalized
    return _split(x[..., None].astype("float32"), y.astype("int32"))


def fcn() -> keras.Model:
    inputs = keras.layers.Input((500, 1))
    x = inputs
    for _ in range(3):
        x = keras.layers.Conv1D(filters=64, kernel_size=3, padding="same")(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(x))


def fcn_callbacks() -> list:
    folder = tempfile.mkdtemp(prefix="heldout_fcn_")
    return [
        keras.callbacks.ModelCheckpoint(
            f"{folder}/best_model.keras", save_best_only=True, monitor="val_loss"
        ),
        keras.callbacks.ReduceLROnPlateau(
            monitor="val_loss", factor=0.5, patience=20, min_lr=0.0001
        ),
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=50, verbose=0),
    ]


# -- Structured data classification from scratch, on Hastie's 10.2 ----------------------------


def hastie() -> Parts:
    x, y = datasets.make_hastie_10_2(n_samples=6_000, random_state=0)
    xt, xv, yt, yv = _split(x, (y > 0).astype("float32"))
    scaler = preprocessing.StandardScaler().fit(xt)
    xt, xv = (scaler.transform(a).astype("float32") for a in (xt, xv))
    return xt, xv, yt[:, None], yv[:, None]


def structured_mlp() -> keras.Model:
    inputs = keras.Input((10,))
    x = keras.layers.Dense(32, activation="relu")(inputs)
    x = keras.layers.Dropout(0.5)(x)
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))


# -- Text classification with Transformer, on generated reviews -------------------------------

VOCAB, MAXLEN = 2_000, 100


def reviews(n: int = 10_000, seed: int = 0) -> Parts:
    """Filler tokens (Zipf-like) with a few sentiment tokens of the label's side, mostly."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, VOCAB - 110 + 1)
    p = 1.0 / ranks
    x = 110 + rng.choice(len(ranks), size=(n, MAXLEN), p=p / p.sum())
    y = rng.integers(0, 2, n)
    for i in range(n):
        k = rng.integers(2, 9)
        same = rng.random(k) < 0.8
        side = np.where(same, y[i], 1 - y[i])  # 1: positive words 10-59, 0: negative 60-109
        words = np.where(side == 1, rng.integers(10, 60, k), rng.integers(60, 110, k))
        x[i, rng.choice(MAXLEN, k, replace=False)] = words
    return _split(x.astype("int32"), y.astype("int32"))


class TransformerBlock(keras.layers.Layer):
    """The example's block: attention and a feed-forward, each with dropout and a norm."""

    def __init__(self, embed_dim: int, num_heads: int, ff_dim: int, rate: float = 0.1, **kw):
        super().__init__(**kw)
        self.att = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [keras.layers.Dense(ff_dim, activation="relu"), keras.layers.Dense(embed_dim)]
        )
        self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = keras.layers.Dropout(rate)
        self.dropout2 = keras.layers.Dropout(rate)

    def call(self, inputs: Any, training: bool = False) -> Any:
        attn_output = self.dropout1(self.att(inputs, inputs), training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.dropout2(self.ffn(out1), training=training)
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(keras.layers.Layer):
    """The example's embedding: a token's plus its position's."""

    def __init__(self, maxlen: int, vocab_size: int, embed_dim: int, **kw):
        super().__init__(**kw)
        self.token_emb = keras.layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = keras.layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x: Any) -> Any:
        positions = self.pos_emb(keras.ops.arange(0, keras.ops.shape(x)[-1], 1))
        return self.token_emb(x) + positions


def text_transformer() -> keras.Model:
    inputs = keras.layers.Input(shape=(MAXLEN,))
    x = TokenAndPositionEmbedding(MAXLEN, VOCAB, 32)(inputs)
    x = TransformerBlock(32, 2, 32)(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dropout(0.1)(x)
    x = keras.layers.Dense(20, activation="relu")(x)
    x = keras.layers.Dropout(0.1)(x)
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(x))


# -- the jobs ----------------------------------------------------------------------------------

JOBS: dict[str, HeldOutJob] = {
    job.name: job
    for job in (
        HeldOutJob(
            name="mnist_convnet_digits",
            kind="image (2-D convolutions)",
            source="https://keras.io/examples/vision/mnist_convnet/",
            data=digits_28,
            build=mnist_convnet,
            loss="categorical_crossentropy",
            recipe=Recipe(batch=128, epochs=15),
            target=0.95,
            needed_epochs=9,
        ),
        HeldOutJob(
            name="fcn_forda_shaped",
            kind="time series (1-D convolutions)",
            source="https://keras.io/examples/timeseries/timeseries_classification_from_scratch/",
            data=forda_shaped,
            build=fcn,
            loss="sparse_categorical_crossentropy",
            recipe=Recipe(batch=32, epochs=500, callbacks=fcn_callbacks),
            target=0.90,
            needed_epochs=11,
        ),
        HeldOutJob(
            name="structured_mlp_hastie",
            kind="table (dense)",
            source="https://keras.io/examples/structured_data/"
            "structured_data_classification_from_scratch/",
            data=hastie,
            build=structured_mlp,
            loss="binary_crossentropy",
            recipe=Recipe(batch=32, epochs=50),
            target=0.86,
            needed_epochs=28,
        ),
        HeldOutJob(
            name="transformer_text_generated",
            kind="text (attention)",
            source="https://keras.io/examples/nlp/text_classification_with_transformer/",
            data=reviews,
            build=text_transformer,
            loss="sparse_categorical_crossentropy",
            recipe=Recipe(batch=32, epochs=2),
            target=0.88,
            needed_epochs=2,
        ),
    )
}
