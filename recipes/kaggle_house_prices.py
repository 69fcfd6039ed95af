"""Kaggle "House Prices": tabular regression on log prices, K-fold cross-validation, submission.csv.

Needs the competition's `train.csv` and `test.csv` (`Id`, 79 features, `SalePrice`) in
`--data-dir`:

    kaggle competitions download -c house-prices-advanced-regression-techniques
    python recipes/kaggle_house_prices.py --data-dir <folder with the CSVs> --folds 5

Features: numeric columns get their missing values filled with the training median and
are standardised (`keras.layers.Normalization`); text columns are one-hot encoded, with
missing values as their own level and levels never seen in training as one shared
out-of-vocabulary level (`keras.layers.StringLookup`). Both are adapted on the training
split of each fold only. The model (an MLP) learns log(SalePrice) with the tfaccel
Trainer; its RMSE is Kaggle's score (log-RMSE). After cross-validation, one model
trained on all of train.csv predicts test.csv.

Takes the core recipe flags (`--help`), e.g. `--tune-batch-size` to probe the batch size first.
"""

from __future__ import annotations

import os

import batch_tuning  # recipes/batch_tuning.py: --tune-batch-size
import common  # recipes/common.py: the shared command line and set-up
import keras
import numpy as np
import outputs  # recipes/outputs.py: history.csv, metrics.json, curves.png, model.keras
import pandas as pd

import tfaccel

NAME = "kaggle_house_prices"
COMPETITION = "house-prices-advanced-regression-techniques"
ID, TARGET = "Id", "SalePrice"


def read_competition(data_dir: str | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Reads train.csv and test.csv, checking that they have the competition's columns.

    Raises:
        FileNotFoundError: a file is missing (the message gives the download command).
        ValueError: a file is empty, has no rows or cannot be parsed (named); train.csv
            lacks `Id` or `SalePrice` or has a missing, non-numeric or non-positive price
            (line and Id named); test.csv lacks `Id`; or the files do not share their
            feature columns.
    """
    folder = data_dir or "."
    frames = []
    for file in ("train.csv", "test.csv"):
        path = os.path.join(folder, file)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{path} is missing: this recipe needs the competition's train.csv and "
                f"test.csv in --data-dir. Download them with `kaggle competitions download -c "
                f"{COMPETITION}`, unzip, and pass that folder as --data-dir."
            )
        frames.append(_read_csv(path))
    train, test = frames
    for file, frame, needed in (("train.csv", train, (ID, TARGET)), ("test.csv", test, (ID,))):
        missing = [c for c in needed if c not in frame.columns]
        if missing:
            raise ValueError(
                f"{os.path.join(folder, file)} has no {' or '.join(map(repr, missing))} column; "
                f"expected Kaggle's House Prices schema ({ID}, 79 features"
                f"{', ' + TARGET if file == 'train.csv' else ''}). Its columns start "
                f"{list(frame.columns[:5])}. Use the competition's original file."
            )
    features = [c for c in train.columns if c not in (ID, TARGET)]
    absent = [c for c in features if c not in test.columns]
    if absent:
        raise ValueError(
            f"test.csv lacks the feature column(s) {absent[:5]} that train.csv has; both "
            "files must come from the same competition download."
        )
    _check_target(os.path.join(folder, "train.csv"), train)
    return train, test


def _read_csv(path: str) -> pd.DataFrame:
    """`pd.read_csv`, with errors that name the file; a header alone is an error."""
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ValueError(
            f"{path} is empty ({os.path.getsize(path)} bytes); expected the competition's CSV "
            "with a header row. Download it again."
        ) from None
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a readable CSV file: {error}") from None
    if frame.empty:
        raise ValueError(f"{path} has a header but no rows; expected one row per house.")
    return frame


def _cell(value) -> str:
    return "empty" if pd.isna(value) else repr(value if isinstance(value, str) else value.item())


def _check_target(path: str, train: pd.DataFrame) -> None:
    """Raises ValueError naming the rows whose SalePrice is missing, not a number, or <= 0."""
    prices = pd.to_numeric(train[TARGET], errors="coerce")
    for what, bad in (
        ("no (missing)", train[TARGET].isna()),
        ("a non-numeric", prices.isna() & train[TARGET].notna()),
        ("a zero or negative", prices <= 0),
    ):
        if bad.any():
            first = int(bad.to_numpy().argmax())
            raise ValueError(
                f"{path} has {int(bad.sum())} row(s) with {what} {TARGET}, first at line "
                f"{first + 2} ({ID}={train[ID].iloc[first]}: {_cell(train[TARGET].iloc[first])}). "
                "Every training house needs a positive price: fill it in or drop the row."
            )


class TabularEncoder:
    """Numeric columns filled and standardised, text columns one-hot; adapted on one frame."""

    def __init__(self, frame: pd.DataFrame, features: list[str]):
        numeric = frame[features].select_dtypes("number").columns
        self.numeric = list(numeric)
        self.text = [c for c in features if c not in numeric]
        self.fill = frame[self.numeric].median().fillna(0.0)
        self.normalize = keras.layers.Normalization()
        self.normalize.adapt(self._numbers(frame))
        # One vocabulary of "column=value" tokens: multi-hot over it is every text column
        # one-hot, side by side, with one shared bin for levels unseen in training.
        self.lookup = keras.layers.StringLookup(output_mode="multi_hot", num_oov_indices=1)
        self.lookup.adapt(self._tokens(frame))

    def _numbers(self, frame: pd.DataFrame) -> np.ndarray:
        values = frame[self.numeric].apply(pd.to_numeric, errors="coerce")
        return values.fillna(self.fill).to_numpy("float32")

    def _tokens(self, frame: pd.DataFrame) -> np.ndarray:
        text = frame[self.text].astype("string").fillna("<missing>")
        rows = text.to_numpy(dtype=object)
        return np.array([[f"{c}={v}" for c, v in zip(self.text, r, strict=True)] for r in rows])

    def __call__(self, frame: pd.DataFrame) -> np.ndarray:
        """Returns the float32 feature matrix of `frame`."""
        numbers = np.asarray(self.normalize(self._numbers(frame)))
        parts = [numbers]
        if self.text:
            parts.append(np.asarray(self.lookup(self._tokens(frame)), dtype="float32"))
        return np.concatenate(parts, axis=1)


def build_model(features: int, mean_log_price: float) -> keras.Model:
    """An MLP whose output starts at the mean log price."""
    inputs = keras.Input((features,))
    x = keras.layers.Dense(128, activation="relu")(inputs)
    x = keras.layers.Dropout(0.1)(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    outputs = keras.layers.Dense(
        1, dtype="float32", bias_initializer=keras.initializers.Constant(mean_log_price)
    )(x)
    return keras.Model(inputs, outputs, name="house_prices_mlp")


def train_one(run, encoder, train, val=None, *, tag: str, checkpoint_dir=None):
    """Trains one model with the Trainer on `train` (validating on `val`); returns it."""
    args = run.args
    x = encoder(train)
    y = np.log(train[TARGET].to_numpy("float32"))[:, None]
    source = tfaccel.data.from_arrays(x, y)
    data = tfaccel.data.pipeline(
        source, batch_size=args.batch_size, training=True, seed=args.seed, strategy=run.strategy
    )
    validation = None
    if val is not None:
        y_val = np.log(val[TARGET].to_numpy("float32"))[:, None]
        validation = tfaccel.data.pipeline(
            tfaccel.data.from_arrays(encoder(val), y_val),
            batch_size=args.batch_size,
            training=False,
            strategy=run.strategy,
        )
    if tag in ("fold 1", "all data"):
        print(f"Data plan ({x.shape[1]} features):\n{tfaccel.data.explain(data)}")
    trainer = tfaccel.Trainer(
        lambda: build_model(x.shape[1], float(y.mean())),
        optimizer=lambda: keras.optimizers.Adam(args.learning_rate),
        loss="mse",
        metrics=[keras.metrics.RootMeanSquaredError(name="log_rmse")],
        methods=args.methods,  # --one-cycle's, or the tuners' for a grown batch
        strategy=run.strategy,
    )
    if tag == "all data":
        chosen, throughput = outputs.callbacks(run)
    else:
        throughput = tfaccel.callbacks.Throughput(verbose=0)
        chosen = [throughput]
    history = trainer.fit(
        data,
        epochs=args.epochs,
        validation_data=validation,
        callbacks=chosen,
        checkpoint_dir=checkpoint_dir,
        verbose=args.verbose if tag == "all data" else 0,
    ).history
    return trainer, history, throughput, data


def main(argv=None) -> dict:
    p = common.parser(
        __doc__, epochs=60, batch_size=64, learning_rate=1e-3, fallback=False, methods=True
    )
    common.default_is(p, "--data-dir", "the current folder")
    p.add_argument("--folds", type=int, default=5, help="K of K-fold cross-validation (>= 2)")
    args = p.parse_args(argv)
    if args.folds < 2:
        raise ValueError(
            f"--folds must be >= 2 for K-fold cross-validation (each fold trains on the other "
            f"K-1), got {args.folds}. Use e.g. --folds 5."
        )
    train, test = read_competition(args.data_dir)
    run = common.setup(args, NAME)
    run.dataset = "kaggle house prices"
    if args.smoke:
        train = train.iloc[: common.SMOKE_TRAIN * 2]
    features = [c for c in train.columns if c not in (ID, TARGET)]
    if args.tune_batch_size:
        encoder = TabularEncoder(train, features)
        x = encoder(train)
        y = np.log(train[TARGET].to_numpy("float32"))[:, None]
        batch_tuning.tune_batch_size(
            run,
            lambda: build_model(x.shape[1], float(y.mean())),
            tfaccel.data.from_arrays(x, y),
            loss="mse",
            optimizer="adam",
        )

    order = np.random.default_rng(args.seed).permutation(len(train))
    folds = np.array_split(order, args.folds)
    scores = []
    for k, held_out in enumerate(folds, start=1):
        fold_train = train.iloc[np.setdiff1d(order, held_out)]
        fold_val = train.iloc[held_out]
        encoder = TabularEncoder(fold_train, features)  # adapted on this fold's training part
        trainer, history, _, _ = train_one(run, encoder, fold_train, fold_val, tag=f"fold {k}")
        scores.append(float(history["val_log_rmse"][-1]))
        print(
            f"fold {k}/{args.folds}: train log-RMSE {history['log_rmse'][-1]:.4f}, "
            f"validation log-RMSE {scores[-1]:.4f}"
        )
    mean = float(np.mean(scores))
    print(f"{args.folds}-fold cross-validation: mean validation log-RMSE {mean:.4f}")

    encoder = TabularEncoder(train, features)
    trainer, history, throughput, data = train_one(
        run, encoder, train, tag="all data", checkpoint_dir=args.checkpoint_dir
    )
    if history.get("log_rmse"):
        train_score = history["log_rmse"][-1]
    else:  # nothing left to train (a finished checkpoint): score what was restored
        train_score = trainer.evaluate(data)["log_rmse"]
    log_prices = trainer.model.predict(encoder(test), batch_size=256, verbose=0)[:, 0]
    submission = pd.DataFrame({ID: test[ID], TARGET: np.exp(log_prices.astype("float64"))})
    if run.is_chief:
        submission.to_csv(run.out / "submission.csv", index=False)
        print(f"Wrote {len(submission)} predictions to {run.out / 'submission.csv'}")
    return outputs.finish(
        run,
        history,
        metric="log_rmse",
        final={"cv_log_rmse": mean, "train_log_rmse": train_score},
        examples_per_sec=outputs.examples_per_second(throughput),
        settings=trainer.settings,
        trainer=trainer,
        extra={"folds": args.folds, "fold_log_rmse": scores, "cv_log_rmse_mean": mean},
    )


if __name__ == "__main__":
    common.main_guard(main)
