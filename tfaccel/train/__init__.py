"""The Trainer: custom multi-step `tf.function` training under any `tf.distribute` strategy."""

from tfaccel.train.trainer import Trainer

__all__ = ["Trainer"]
