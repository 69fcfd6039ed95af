"""Schedules sized to the fit that runs them (issue 69, item 4): a later Trainer `fit`
gets a cycle of its own, the progressive batch's cycle ends at the last step `model.fit`
runs, and a dropped method or schedule is said in a warning."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_methods_trainer import StopAfter

import tfaccel
from tfaccel import methods

RNG = np.random.default_rng(69)
X = RNG.normal(size=(64, 6)).astype("float32")
Y = RNG.integers(0, 3, size=64).astype("int32")
LOSS = "sparse_categorical_crossentropy"


def build(seed=1):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    )


def dataset(batch=16):
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(batch)


def trainer(chosen, **kwargs):
    return tfaccel.Trainer(
        build,
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=1,
        jit_compile=False,
        methods=chosen,
        **kwargs,
    )


class Rates(keras.callbacks.Callback):
    """The learning rate each step trains with (read before the step)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_begin(self, batch, logs=None):
        self.seen.append(float(self.model.optimizer.learning_rate))


def fresh_cycle(method, epochs, steps, batch=16):
    """The rates of a cycle sized to `epochs` x `steps`, from its step 0."""
    job = methods.Job(build(), LOSS, keras.optimizers.SGD(0.1), (), epochs, steps, batch)
    cycle = method.make(job)
    return [float(cycle(s)) for s in range(epochs * steps)]


def test_a_second_trainer_fit_runs_a_fresh_cycle_sized_to_it():
    ours = trainer([methods.OneCycle(peak=0.05)])
    first, second = Rates(), Rates()
    ours.fit(dataset(), epochs=2, callbacks=[first], verbose=0)
    ours.fit(dataset(), epochs=3, callbacks=[second], verbose=0)
    assert int(ours.optimizer.iterations) == 8 + 12
    np.testing.assert_allclose(first.seen, fresh_cycle(methods.OneCycle(peak=0.05), 2, 4))
    # Not the first cycle's floor (0.05 / 25e4 = 2e-7): a cycle of 12 steps from step 0.
    want = fresh_cycle(methods.OneCycle(peak=0.05), 3, 4)
    np.testing.assert_allclose(second.seen, want, rtol=1e-5)
    assert second.seen[0] == pytest.approx(0.05 / 25) and max(second.seen) == pytest.approx(0.05)
    assert min(second.seen) > 1e-4


def test_a_later_fit_shorter_than_a_given_cycle_length_says_so():
    ours = trainer([methods.WarmupCosine(peak=0.05, steps=8)])
    ours.fit(dataset(), epochs=2, verbose=0)
    rates = Rates()
    with pytest.warns(UserWarning, match=r"steps=8\) is longer than this fit \(4 steps\)"):
        ours.fit(dataset(), epochs=1, callbacks=[rates], verbose=0)
    np.testing.assert_allclose(rates.seen, fresh_cycle(methods.WarmupCosine(0.05), 1, 8)[:4])


def test_a_resumed_later_fit_continues_its_own_cycle(tmp_path):
    def stack():
        return [methods.WarmupCosine(peak=0.05, warmup=0.25)]

    whole = trainer(stack())
    whole.fit(dataset(), epochs=2, verbose=0)
    rates = Rates()
    whole.fit(dataset(), epochs=3, callbacks=[rates], verbose=0)
    interrupted = trainer(stack())
    interrupted.fit(dataset(), epochs=2, verbose=0)
    interrupted.fit(
        dataset(), epochs=3, callbacks=[StopAfter(1)], checkpoint_dir=tmp_path, verbose=0
    )
    resumed, resumed_rates = trainer(stack()), Rates()
    resumed.fit(dataset(), epochs=3, callbacks=[resumed_rates], checkpoint_dir=tmp_path, verbose=0)
    assert int(resumed.optimizer.iterations) == 8 + 12
    np.testing.assert_allclose(resumed_rates.seen, rates.seen[4:], rtol=1e-6)  # epochs 2-3
    weights = zip(whole.model.get_weights(), resumed.model.get_weights(), strict=True)
    assert max(float(np.max(np.abs(a - b))) for a, b in weights) < 1e-6


def test_gradient_accumulation_sizes_the_cycle_to_the_optimizer_steps():
    ours = trainer([methods.OneCycle(peak=0.05)], accumulate_steps=2)
    rates = Rates()
    ours.fit(dataset(batch=8), epochs=2, callbacks=[rates], verbose=0)  # 8 batches an epoch
    assert int(ours.optimizer.iterations) == 8  # 16 batches, 2 per step
    np.testing.assert_allclose(rates.seen, fresh_cycle(methods.OneCycle(peak=0.05), 2, 4))


def images(n):
    x = RNG.normal(size=(n, 8, 8, 1)).astype("float32")
    return x, RNG.integers(0, 3, size=n).astype("int32")


def image_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(3)])


class Steps(keras.callbacks.Callback):
    """The steps model.fit runs and each one's rate, the whole and the cycle's (read
    before the step, kept once it ran: Keras begins a batch past an epoch's end)."""

    def __init__(self, cycle):
        super().__init__()
        self.cycle, self.rates, self.positions, self._read = cycle, [], [], None

    def on_train_batch_begin(self, batch, logs=None):
        optimizer = self.model.optimizer
        self._read = (
            float(optimizer.learning_rate),
            float(self.cycle.schedule(optimizer.iterations)),
        )

    def on_train_batch_end(self, batch, logs=None):
        self.rates.append(self._read[0])
        self.positions.append(self._read[1])


@pytest.mark.parametrize("n, batch, epochs", [(64, 4, 6), (70, 4, 7), (100, 8, 10)])
def test_progressive_batch_cycle_ends_at_the_last_step_model_fit_runs(n, batch, epochs):
    x, y = images(n)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=1).batch(batch)
    model = image_model()
    stack = [  # the image stack "fast" held with its one-cycle (a cycle that ends)
        methods.ProgressiveBatch(growth=8, stages=4, until=0.4),
        methods.OneCycle(scale=10.0),
        methods.LabelSmoothing(0.1),
    ]
    plan = methods.for_fit(stack, model, data, epochs=epochs, loss=LOSS, optimizer="adam")
    growth, cycle = plan.methods[0], plan.methods[1]
    assert isinstance(growth, methods.ProgressiveBatch) and isinstance(cycle, methods.OneCycle)
    model.compile(plan.optimizer, plan.loss)
    steps = Steps(cycle)
    model.fit(plan.dataset, epochs=epochs, callbacks=[*plan.callbacks, steps], verbose=0)
    total = plan.job.total_steps
    lowest = min(steps.rates)  # reached at the last step only (the final stage's batch)
    assert steps.rates.index(lowest) == len(steps.rates) - 1 and steps.rates.count(lowest) == 1
    # The plan counts each stage's partial last batch: the steps model.fit runs.
    assert (
        len(steps.rates)
        == total
        == sum(math.ceil(n / (batch * growth.callback.factor_at(e))) for e in range(epochs))
    )
    # Keras counts one optimizer step more per epoch on data of unknown length (its last
    # call finds no batch; without XLA the step counter still moves): the cycle does not.
    assert int(model.optimizer.iterations) in (total, total + epochs)
    copy = methods.schedules.Cycle.from_config(cycle.schedule.get_config())  # from step 0
    want = [float(copy(s)) for s in range(total)]
    np.testing.assert_allclose(steps.positions, want, rtol=1e-5)
    factors = [growth.callback.factor_at(e) for e in range(epochs)]
    grown = [f for e, f in enumerate(factors) for _ in range(plan.job.epoch_steps[e])]
    np.testing.assert_allclose(steps.rates, np.array(want) * np.sqrt(grown), rtol=1e-5)
    floor = cycle.schedule.get_config()["peak"] * cycle.schedule.alpha
    assert min(steps.positions) > floor  # the floor is not reached before the end...
    peak = int(np.argmax(steps.positions))
    assert np.all(np.diff(steps.positions[peak:]) < 0)  # falling to the last step...
    assert steps.positions[-1] < 0.02 * steps.positions[peak]  # ...which is at the cycle's end


@pytest.mark.parametrize("method", [methods.OneCycle, methods.WarmupCosine])
@pytest.mark.parametrize("n", [64, 70])
def test_schedules_without_progressive_batch_end_at_the_last_step(method, n):
    x = np.concatenate([X, X[:6] + 1.0])[:n]
    y = np.concatenate([Y, Y[:6]])[:n]
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=2).batch(8)
    model = build()
    chosen = method(peak=0.05)
    plan = methods.for_fit([chosen], model, data, epochs=5, loss=LOSS, optimizer="adam")
    model.compile(plan.optimizer, plan.loss)
    rates = Rates()
    model.fit(plan.dataset, epochs=5, callbacks=[*plan.callbacks, rates], verbose=0)
    total = 5 * math.ceil(n / 8)  # 70 examples: 9 batches an epoch, the last of 6
    assert plan.job.total_steps == int(model.optimizer.iterations) == total == len(rates.seen)
    want = fresh_cycle(method(peak=0.05), 5, math.ceil(n / 8), 8)
    np.testing.assert_allclose(rates.seen, want, rtol=1e-5)
    assert rates.seen[-1] < 0.05 * max(rates.seen)


def test_a_second_model_fit_on_the_plan_restarts_its_cycle():
    model = build()
    cycle = methods.OneCycle(peak=0.05)
    plan = methods.for_fit([cycle], model, dataset(), epochs=2, loss=LOSS, optimizer="sgd")
    model.compile(plan.optimizer, plan.loss)
    model.fit(plan.dataset, epochs=2, callbacks=plan.callbacks, verbose=0)
    rates = Rates()
    model.fit(plan.dataset, epochs=3, callbacks=[*plan.callbacks, rates], verbose=0)
    np.testing.assert_allclose(rates.seen, fresh_cycle(methods.OneCycle(peak=0.05), 3, 4))


def test_the_cycle_survives_keras_serialization():
    cycle = methods.OneCycle(peak=0.1).make(
        methods.Job(build(), LOSS, keras.optimizers.SGD(0.1), (), 2, 10, 16)
    )
    copy = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(cycle))
    assert type(copy) is methods.schedules.Cycle
    assert [float(copy(s)) for s in range(21)] == [float(cycle(s)) for s in range(21)]


# -- what is dropped is warned ------------------------------------------------------------


def test_a_method_left_out_by_the_rules_is_warned():
    with pytest.warns(UserWarning, match="warmup-cosine dropped: one learning-rate schedule"):
        plan = methods.for_fit(
            [methods.OneCycle(), methods.WarmupCosine()], build(), dataset(), epochs=2, loss=LOSS
        )
    assert [m.name for m in plan.methods] == ["one-cycle"]


def test_a_replaced_user_schedule_is_warned_and_in_the_table():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, 100, 0.5)
    with pytest.warns(
        UserWarning, match="the optimizer's ExponentialDecay is replaced by one-cycle"
    ):
        plan = methods.for_fit(
            [methods.OneCycle()],
            build(),
            dataset(),
            epochs=2,
            loss=LOSS,
            optimizer=keras.optimizers.Adam(schedule),
        )
    replaced = "dropped: the optimizer's ExponentialDecay is replaced by one-cycle"
    assert ("learning-rate schedule", replaced) in plan.table()


def test_fast_drops_the_progressive_batch_in_the_trainer_with_a_warning_at_verbose_0():
    """Under gradient accumulation, where the Trainer does not grow the batch."""
    x, y = images(32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    ours = tfaccel.Trainer(
        image_model,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=tf.distribute.get_strategy(),
        methods="fast",
        accumulate_steps=2,
    )
    with pytest.warns(UserWarning, match="progressive batch dropped: does not fit this job") as got:
        ours.fit(data, epochs=1, verbose=0)
    said = [str(w.message) for w in got if "progressive batch" in str(w.message)]
    assert len(said) == 1 and "accumulate_steps=1" in said[0]
