"""`PipelineModel`: a Keras model whose stages live on different devices.

The batch is cut into micro-batches along axis 0; stage i of every micro-batch
runs under `tf.device(devices[i])`. Micro-batch m+1 enters stage i while
micro-batch m is in stage i+1: the two have no data or control dependency, so
TensorFlow's executor runs them at the same time on their two devices (GPipe's
schedule). The gradient of the whole batch is accumulated into one optimizer
step, and each stage's backward pass runs on its own device.

BatchNormalization: each micro-batch is normalized with its own batch
statistics, and a BN layer's moving statistics are updated once per micro-batch,
in micro-batch order — the pipeline computes `concat([model(part) for part in
micro_batches])`. With `micro_batches=1` training equals the unsplit model's.
Inference uses the moving statistics, so it does not depend on micro-batching.

Example:
    >>> stages = tfaccel.parallel.split(model, num_stages=2)
    >>> pp = tfaccel.parallel.PipelineModel(stages, devices=["/gpu:0", "/gpu:1"],
    ...                                     micro_batches=4)
    >>> pp.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    >>> pp.fit(x, y, batch_size=64)                                 # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import os
import threading
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import tree

from tfaccel import devices as devices_lib
from tfaccel.parallel import costs, keras_file

logger = logging.getLogger("tfaccel")
_override = threading.local()


@contextlib.contextmanager
def _devices_at_load(devices):
    previous = getattr(_override, "devices", None)
    _override.devices = devices
    try:
        yield
    finally:
        _override.devices = previous


def load_model(
    path: str | os.PathLike, *, devices: Sequence[str] | None = None, **kwargs: Any
) -> keras.Model:
    """Loads a `.keras` file that holds `PipelineModel`s, placing stages on `devices`.

    Args:
        path: the `.keras` file.
        devices: one device per stage for every `PipelineModel` in the file. None:
            the saved devices when they all exist on this machine, else every stage
            on one device (the first GPU, or the CPU).
        **kwargs: passed on to `keras.saving.load_model`.

    Returns:
        The loaded model.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: the file is damaged (empty, truncated, not a zip, a bad member).
    """
    with _devices_at_load(None if devices is None else list(devices)):
        try:
            return keras.saving.load_model(path, **kwargs)
        except (ValueError, OSError, KeyError) as error:  # KeyError: a zip without a member
            clear = keras_file.explain_load_failure(path, error)
            if clear is None:
                raise
            raise clear from error


def check_strategy() -> None:
    """Raises ValueError under a strategy other than the default or a one-device one."""
    strategy = tf.distribute.get_strategy()
    if not tf.distribute.has_strategy() or isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return
    raise ValueError(
        f"PipelineModel runs under the default or a one-device strategy in this release, "
        f"not under {type(strategy).__name__} ({strategy.num_replicas_in_sync} replica(s)): "
        "its stages already own the devices. Build and train it outside any strategy scope "
        "(tfaccel.Trainer(..., strategy=tfaccel.devices.strategy('default')))."
    )


def _positive_int(value, name: str) -> int:
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or isinstance(value, bool) or number < 1:
        raise ValueError(
            f"{name} must be an integer >= 1, got {value!r}. With micro_batches=M each "
            "batch is cut into M parts that flow through the stages one after another."
        )
    return number


def _check_stages(stages) -> list:
    if isinstance(stages, keras.Model) or not isinstance(stages, (list, tuple)) or not stages:
        raise TypeError(
            "stages must be a non-empty list of keras.Model (e.g. from "
            f"tfaccel.parallel.split(model, num_stages=2)), got {type(stages).__name__}."
        )
    for index, stage in enumerate(stages):
        if not isinstance(stage, keras.Model) or getattr(stage, "_nodes_by_depth", None) is None:
            raise TypeError(
                f"Stage {index} must be a functional keras.Model (with known inputs), got "
                f"{type(stage).__name__}. Build stages with tfaccel.parallel.split or "
                "keras.Model(inputs, outputs)."
            )
    for index, (before, after) in enumerate(itertools.pairwise(stages)):
        outputs, inputs = tree.flatten(before.outputs), tree.flatten(after.inputs)
        if len(outputs) != 1 or len(inputs) != 1:
            raise ValueError(
                f"Stage {index} must hand stage {index + 1} a single tensor; it has "
                f"{len(outputs)} output(s) and the next stage {len(inputs)} input(s)."
            )
        out_shape, in_shape = tuple(outputs[0].shape)[1:], tuple(inputs[0].shape)[1:]
        if len(out_shape) != len(in_shape) or any(
            a is not None and b is not None and a != b
            for a, b in zip(out_shape, in_shape, strict=True)
        ):
            raise ValueError(
                f"Stage {index} outputs examples of shape {out_shape}, but stage {index + 1} "
                f"expects {in_shape}. Pass the stages in order."
            )
    return list(stages)


def _check_devices(devices, num_stages: int) -> list[str]:
    if isinstance(devices, str) or not isinstance(devices, (list, tuple)):
        raise TypeError(
            f"devices must be a list with one device name per stage, e.g. ['/gpu:0', "
            f"'/gpu:1'], got {devices!r}."
        )
    if len(devices) != num_stages:
        more = "stages than devices" if num_stages > len(devices) else "devices than stages"
        raise ValueError(
            f"More {more}: {num_stages} stage(s) and {len(devices)} device(s) {list(devices)}. "
            "Give one device per stage (a device may repeat), or split the model into "
            f"{len(devices)} stage(s)."
        )
    return devices_lib._check_devices(list(devices))


def _fallback_devices(saved: list[str], num_stages: int) -> list[str]:
    available = {devices_lib._canonical(d.name) for d in tf.config.list_logical_devices()}
    if all(devices_lib._canonical(d) in available for d in saved):
        return saved
    gpus = tf.config.list_logical_devices("GPU")
    one = (gpus or tf.config.list_logical_devices("CPU"))[0].name
    logger.warning(
        "PipelineModel: saved devices %s do not all exist here; placing all %d stages on %s. "
        "Pass devices= to tfaccel.parallel.load_model to choose.",
        saved,
        num_stages,
        one,
    )
    return [one] * num_stages


@keras.saving.register_keras_serializable(package="tfaccel")
class PipelineModel(keras.Model):
    """A pipeline-parallel model: stages on devices, fed with micro-batches.

    A plain `keras.Model`: `compile` / `fit` / `evaluate` / `predict`, `save` and
    the `tfaccel.Trainer` (default or one-device strategy) work as usual. Each
    stage is copied onto its device when the `PipelineModel` is constructed, so its
    weights live there; the stages passed in are left untouched.

    Micro-batches: a batch of B examples is cut into `micro_batches` parts of B/M
    examples. A batch that M does not divide (the short last batch of an epoch) is
    cut into parts that differ by at most one example (10 examples, M=4: 3, 3, 2,
    2), so that no micro-batch is empty; a static training batch inside a
    `tf.function` (e.g. `drop_remainder=True`) must be a multiple of M.

    BatchNormalization sees each micro-batch alone: its statistics, and one update
    of the moving statistics per micro-batch (M updates per step, so the moving
    averages forget M times faster than with one update per step).

    Args:
        stages: functional `keras.Model`s, each taking the previous one's output
            (see `tfaccel.parallel.split`).
        devices: one device name per stage, e.g. `["/gpu:0", "/gpu:1"]` (a device
            may repeat).
        micro_batches: number of micro-batches per batch, >= 1.
        **kwargs: `keras.Model` arguments (e.g. `name`).

    Raises:
        TypeError: `stages` or `devices` of the wrong type.
        ValueError: `micro_batches` < 1, more stages than devices (or the reverse),
            stages that do not chain, or use under `MirroredStrategy` /
            multi-worker strategies.
        tfaccel.DeviceConfigError: a device that does not exist.
    """

    def __init__(self, stages, devices, micro_batches: int = 4, **kwargs):
        placed = kwargs.pop("_placed", False)
        check_strategy()
        stages = _check_stages(stages)
        devices = _check_devices(devices, len(stages))
        micro_batches = _positive_int(micro_batches, "micro_batches")
        super().__init__(**kwargs)
        if not placed:
            stages = [_place(stage, device) for stage, device in zip(stages, devices, strict=True)]
        self.stages = stages
        self._devices = devices
        self.micro_batches = micro_batches
        self.supports_jit = False  # XLA would compile all stages for one device
        self.built = True

    @property
    def devices(self) -> list[str]:
        """The device of each stage."""
        return list(self._devices)

    @property
    def inputs(self) -> list:
        """The first stage's symbolic inputs (as a functional model's `inputs`)."""
        return self.stages[0].inputs

    @property
    def outputs(self) -> list:
        """The last stage's symbolic outputs (as a functional model's `outputs`)."""
        return self.stages[-1].outputs

    def build(self, input_shape: Any = None) -> None:
        self.built = True

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        check_strategy()
        with tf.device(self._devices[0]), tf.name_scope("micro_batches"):
            parts = self._split(inputs, training)
        outputs = []
        for m, part in enumerate(parts):
            x = part
            for i, (stage, device) in enumerate(zip(self.stages, self._devices, strict=True)):
                with tf.name_scope(f"micro_batch{m}_stage{i}"):
                    x = _run_stage(stage, device, x, training)
            outputs.append(x)
        with tf.device(self._devices[-1]):
            if len(outputs) == 1:
                return outputs[0]
            return tree.map_structure(lambda *xs: tf.concat(xs, axis=0), *outputs)

    def _split(self, inputs, training):
        flat = [tf.convert_to_tensor(x) for x in tree.flatten(inputs)]
        count = self.micro_batches
        if count == 1:
            return [inputs]
        static = flat[0].shape[0]
        if static is not None:
            if training and static % count and not tf.executing_eagerly():
                raise ValueError(
                    f"micro_batches={count} does not divide the training batch of {static} "
                    f"examples. Use a batch size that is a multiple of {count} (a short last "
                    "batch of an epoch is fine: its remainder is spread over the "
                    "micro-batches), or micro_batches that divides the batch."
                )
            if training and static < count:
                raise ValueError(
                    f"A training batch of {static} example(s) is smaller than "
                    f"micro_batches={count}; every micro-batch needs at least one example. "
                    "Use a larger batch or fewer micro-batches."
                )
            sizes = [static // count + (1 if m < static % count else 0) for m in range(count)]
            pieces = [tf.split(x, sizes, axis=0) for x in flat]
        else:
            batch = tf.shape(flat[0], out_type=tf.int32)[0]
            if training:
                tf.debugging.assert_greater_equal(
                    batch,
                    count,
                    message=(
                        f"A training batch needs at least micro_batches={count} examples "
                        "(one per micro-batch); drop the short last batch "
                        "(drop_remainder=True) or lower micro_batches."
                    ),
                )
            extra = tf.cast(tf.range(count) < batch % count, tf.int32)
            sizes = batch // count + extra
            pieces = [tf.split(x, sizes, axis=0, num=count) for x in flat]
        return [tree.pack_sequence_as(inputs, list(group)) for group in zip(*pieces, strict=True)]

    def plan(self) -> str:
        """A table of the stages: device, layers, parameters, weight memory, estimated FLOPs.

        FLOPs are forward FLOPs per example (TensorFlow's profiler on a batch of one);
        weight memory is the variables' size on the stage's device (activations and
        optimizer slots come on top; `tfaccel.callbacks.DeviceMemory` measures them).
        """
        header = ("stage", "device", "layers", "parameters", "weights MB", "forward FLOPs/example")
        table, total = [header], 0
        for index, (stage, device) in enumerate(zip(self.stages, self._devices, strict=True)):
            layers = [layer.name for layer in stage.layers if not _is_input(layer)]
            span = f"{layers[0]} .. {layers[-1]}" if len(layers) > 1 else "".join(layers)
            try:
                flops = f"{costs.model_flops(stage):,}"
            except ValueError:
                flops = "unknown (dynamic shape)"
            params = stage.count_params()
            total += params
            size = sum(
                int(np.prod(v.shape)) * np.dtype(keras.backend.standardize_dtype(v.dtype)).itemsize
                for v in stage.weights
            )
            table.append(
                (
                    str(index),
                    device,
                    f"{len(layers)} ({span})",
                    f"{params:,}",
                    f"{size / 2**20:.2f}",
                    flops,
                )
            )
        widths = [max(len(row[k]) for row in table) for k in range(len(header))]
        lines = [
            f"PipelineModel {self.name!r}: {len(self.stages)} stages, "
            f"micro_batches={self.micro_batches}"
        ]
        for row in table:
            cells = zip(row, widths, strict=True)
            lines.append("  ".join(cell.ljust(width) for cell, width in cells).rstrip())
        lines.append(f"total parameters: {total:,}")
        return "\n".join(lines)

    def get_config(self) -> dict:
        return {
            "name": self.name,
            "trainable": self.trainable,
            "stages": [keras.saving.serialize_keras_object(s) for s in self.stages],
            "devices": self.devices,
            "micro_batches": self.micro_batches,
        }

    @classmethod
    def from_config(cls, config: dict, custom_objects: dict | None = None) -> PipelineModel:
        config = dict(config)
        configs = config.pop("stages")
        saved = config.pop("devices")
        override = getattr(_override, "devices", None)
        if override is not None:
            devices = _check_devices(override, len(configs))
        else:
            devices = _fallback_devices(saved, len(configs))
        stages = []
        for stage_config, device in zip(configs, devices, strict=True):
            with _variables_on(device):
                stages.append(
                    keras.saving.deserialize_keras_object(
                        stage_config, custom_objects=custom_objects
                    )
                )
        return cls(stages, devices=devices, _placed=True, **config)


def _is_input(layer) -> bool:
    return isinstance(layer, keras.layers.InputLayer)


def _place(stage: keras.Model, device: str) -> keras.Model:
    """A copy of `stage` whose variables are created on `device`, with its weights."""
    with _variables_on(device):
        copy = keras.models.clone_model(stage, clone_function=_clone_layer)
        copy.set_weights(stage.get_weights())
    return copy


def _clone_layer(layer):
    """A layer's copy from its config; a `Lambda` (no variables) is shared, not re-read.

    Re-reading a Lambda's config would refuse its Python function as unsafe to load,
    although it is this process's own code and nothing is loaded.
    """
    if isinstance(layer, keras.layers.Lambda) and not layer.weights:
        return layer
    return layer.__class__.from_config(layer.get_config())


@contextlib.contextmanager
def _variables_on(device: str):
    """Creates variables on `device`, also inside a `OneDeviceStrategy` scope.

    That strategy puts every variable on its own device unless the variable is
    colocated with a tensor, so one tensor on `device` serves as the anchor.
    """
    if not isinstance(tf.distribute.get_strategy(), tf.distribute.OneDeviceStrategy):
        with tf.device(device):
            yield
        return
    with tf.init_scope(), tf.device(device):
        anchor = tf.zeros(())

    def creator(next_creator, **kwargs):
        if kwargs.get("colocate_with") is None:
            kwargs["colocate_with"] = anchor
        return next_creator(**kwargs)

    with tf.device(device), tf.variable_creator_scope(creator):
        yield


def _run_stage(stage, device, inputs, training):
    """Runs `stage` on `device`; inside a graph its gradient is computed there too."""
    if tf.executing_eagerly():
        with tf.device(device):
            return stage(inputs, training=training)
    structure = inputs
    flat = tree.flatten(inputs)
    holder = {}

    @tf.custom_gradient
    def forward(*xs):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x for x in xs if x.dtype.is_floating])
            y = stage(tree.pack_sequence_as(structure, list(xs)), training=training)
        flat_y = tree.flatten(y)
        holder["structure"] = y

        def backward(*dys, variables=None):
            sources = list(xs) + list(variables or [])
            with tf.device(device):
                grads = tape.gradient(flat_y, sources, output_gradients=list(dys))
            return grads[: len(xs)], grads[len(xs) :]

        return flat_y, backward

    with tf.device(device):
        result = forward(*flat)
    return tree.pack_sequence_as(holder["structure"], list(result))
