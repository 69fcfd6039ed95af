"""The Keras user's own learning-rate callbacks with the methods' schedules (issue 68,
item 6): `ReduceLROnPlateau`, `LearningRateScheduler` and any callback that sets
`optimizer.learning_rate` multiply the cycle from then on (no crash mid-run), through
`for_fit` + `model.fit` and the Trainer; the factor survives a Trainer resume; History gets
`learning_rate`; without methods Keras behaves as it does."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_audit3_schedules import Rates, build, dataset, trainer
from test_methods_trainer import max_diff

import tfaccel
from tfaccel import methods
from tfaccel.methods.schedules import ComposedRate, Cycle, driving_cycle

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
EPOCHS, STEPS, PEAK = 4, 4, 0.05  # dataset(): 64 rows in batches of 16


def plateau():
    """Halves the rate at every epoch's end but the first: the loss can never improve by
    `min_delta` (the first epoch only sets the best)."""
    return keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=1e9)


def by_hand(initial, peak, warmup, decay, alpha, step):
    """`Cycle`'s rate at `step` (counted from its start), written out."""
    done = min(max(step, 0), warmup + decay)
    if done < warmup:
        return initial + (peak - initial) * done / warmup
    return peak * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * (done - warmup) / decay)) + alpha)


def one_cycle_by_hand(step, steps=EPOCHS * STEPS, peak=PEAK):
    """OneCycle(peak)'s defaults over `steps`: warm-up 30 %, div 25, final_div 1e4."""
    warmup = round(0.3 * steps)
    return by_hand(peak / 25, peak, warmup, steps - warmup, 1 / 25e4, step)


def halved_from_epoch(first, epochs=EPOCHS, steps=STEPS):
    """The factor each step trains with when the rate halves at every epoch's start from
    epoch `first` on (0.5 ** k)."""
    return [0.5 ** max(0, e - first + 1) for e in range(epochs) for _ in range(steps)]


def logged_by_hand():
    """`learning_rate` in History with `plateau()`: each epoch's end, before its halving."""
    return [one_cycle_by_hand(STEPS * (e + 1)) * 0.5 ** max(0, e - 1) for e in range(EPOCHS)]


def compiled_plan(chosen, model=None):
    model = model or build()
    plan = methods.for_fit(
        chosen, model, dataset(), epochs=EPOCHS, loss=LOSS, optimizer=keras.optimizers.SGD(0.1)
    )
    model.compile(plan.optimizer, plan.loss)
    return model, plan


def test_reduce_lr_on_plateau_multiplies_one_cycle_in_model_fit():
    model, plan = compiled_plan([methods.OneCycle(peak=PEAK)])
    seen = Rates()
    history = model.fit(
        plan.dataset, epochs=EPOCHS, callbacks=[*plan.callbacks, plateau(), seen], verbose=0
    )
    factors = halved_from_epoch(2)  # epoch 0 sets the best; epoch 1's end halves first
    want = [one_cycle_by_hand(s) * f for s, f in enumerate(factors)]
    np.testing.assert_allclose(seen.seen, want, rtol=1e-5)
    cycle = plan.methods[0].schedule
    assert float(cycle.callback_factor.numpy()) == pytest.approx(0.5**3)  # and after the last
    # History has the rate at each epoch's end (before that end's reduction), as Keras logs it.
    np.testing.assert_allclose(history.history["learning_rate"], logged_by_hand(), rtol=1e-5)
    # The fit over, the optimizer is of its own class again; its rate is Keras' unsettable one.
    assert type(model.optimizer) is keras.optimizers.SGD
    with pytest.raises(TypeError, match="not settable"):
        model.optimizer.learning_rate = 0.1


def test_learning_rate_scheduler_gets_the_scheduled_rate_and_is_honoured():
    model, plan = compiled_plan([methods.OneCycle(peak=PEAK)])
    given, seen = [], Rates()

    def halve(epoch, rate):
        given.append(rate)
        return rate * 0.5

    scheduler = keras.callbacks.LearningRateScheduler(halve)
    model.fit(plan.dataset, epochs=EPOCHS, callbacks=[*plan.callbacks, scheduler, seen], verbose=0)
    # Each epoch's start: the scheduled rate (times the halvings so far), then halved.
    want_given = [one_cycle_by_hand(STEPS * e) * 0.5**e for e in range(EPOCHS)]
    np.testing.assert_allclose(given, want_given, rtol=1e-5)
    factors = [0.5 ** (e + 1) for e in range(EPOCHS) for _ in range(STEPS)]
    want = [one_cycle_by_hand(s) * f for s, f in enumerate(factors)]
    np.testing.assert_allclose(seen.seen, want, rtol=1e-5)


def test_a_rate_set_as_a_number_scales_the_schedule_from_that_step():
    """A user's callback setting an absolute rate: the rate is that number at that step,
    and the cycle keeps its shape after it (x new / current)."""

    class SetAt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                self.model.optimizer.learning_rate = 0.01

    model, plan = compiled_plan([methods.WarmupCosine(peak=PEAK)])
    seen = Rates()
    model.fit(plan.dataset, epochs=EPOCHS, callbacks=[*plan.callbacks, SetAt(), seen], verbose=0)
    warmup = round(0.05 * 16)
    shape = [by_hand(0.0, PEAK, warmup, 16 - warmup, 0.0, s) for s in range(16)]
    factor = 0.01 / shape[8]
    want = shape[:8] + [r * factor for r in shape[8:]]
    np.testing.assert_allclose(seen.seen, want, rtol=1e-5)
    assert seen.seen[8] == pytest.approx(0.01)


def test_a_rate_set_where_the_schedule_is_zero_is_said_not_crashed():
    class SetFirst(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 0:
                self.model.optimizer.learning_rate = 0.01

    model, plan = compiled_plan([methods.WarmupCosine(peak=PEAK, warmup=0.25)])
    with pytest.warns(UserWarning, match="schedule's rate is 0.*relative to the current one"):
        model.fit(plan.dataset, epochs=EPOCHS, callbacks=[*plan.callbacks, SetFirst()], verbose=0)
    assert float(plan.methods[0].schedule.callback_factor.numpy()) == 1.0


def test_reduce_lr_on_plateau_in_the_trainer_with_one_cycle():
    ours = trainer([methods.OneCycle(peak=PEAK)])
    seen = Rates()
    history = ours.fit(dataset(), epochs=EPOCHS, callbacks=[plateau(), seen], verbose=0)
    want = [one_cycle_by_hand(s) * f for s, f in enumerate(halved_from_epoch(2))]
    np.testing.assert_allclose(seen.seen, want, rtol=1e-5)
    np.testing.assert_allclose(history.history["learning_rate"], logged_by_hand(), rtol=1e-5)


def sequences(batch=16):
    """A tiny sequence job (GRU): "fast" puts its one-cycle on it."""
    rng = np.random.default_rng(68)
    x = rng.normal(size=(64, 4, 3)).astype("float32")
    y = rng.integers(0, 3, size=64).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def build_gru():
    keras.utils.set_random_seed(2)
    return keras.Sequential([keras.Input((4, 3)), keras.layers.GRU(4), keras.layers.Dense(3)])


def test_reduce_lr_on_plateau_in_the_trainer_with_fast():
    ours = tfaccel.Trainer(
        build_gru,
        optimizer=keras.optimizers.Adam(1e-3),
        loss=LOSS,
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=1,
        jit_compile=False,
        methods="fast",
    )

    class Factors(keras.callbacks.Callback):
        """The callbacks' factor each step trains with (whatever schedule "fast" made)."""

        def __init__(self):
            super().__init__()
            self.seen = []

        def on_train_batch_begin(self, batch, logs=None):
            cycle = driving_cycle(self.model.optimizer)
            self.seen.append(float(cycle.callback_factor.numpy()))

    seen, factors = Rates(), Factors()
    callbacks = [plateau(), seen, factors]
    history = ours.fit(sequences(), epochs=EPOCHS, callbacks=callbacks, verbose=0)
    np.testing.assert_allclose(factors.seen, halved_from_epoch(2), rtol=1e-6)
    assert len(history.history["learning_rate"]) == EPOCHS
    cycle = driving_cycle(ours.optimizer)
    assert isinstance(cycle, Cycle)
    if type(cycle) is Cycle:  # a one-cycle (short sequences): its rates by hand too
        sizes = [float(v) for v in cycle.sizes.numpy()]
        want = [by_hand(*sizes, cycle.alpha, s) * f for s, f in enumerate(factors.seen)]
        np.testing.assert_allclose(seen.seen, want, rtol=1e-5)


def test_a_resumed_trainer_keeps_the_factor_and_the_uninterrupted_weights(tmp_path):
    """Halved at epoch 1's end (step 8), saved at step 10, stopped there: the resumed run
    trains its last steps at the halved rate, as the uninterrupted run did."""

    class Crash(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if int(self.model.optimizer.iterations) == 10:
                raise RuntimeError("stopped at step 10")

    def run(callbacks, directory=None):
        ours = trainer([methods.OneCycle(peak=PEAK)])
        kwargs = {"checkpoint_dir": directory, "checkpoint_every": 2} if directory else {}
        ours.fit(dataset(), epochs=3, callbacks=callbacks, verbose=0, **kwargs)
        return ours

    class Factor(keras.callbacks.Callback):
        restored = None

        def on_train_batch_begin(self, batch, logs=None):
            if self.restored is None:  # the resumed run's first step
                cycle = self.model.optimizer._learning_rate
                self.restored = float(cycle.callback_factor.numpy())

    whole_rates = Rates()
    whole = run([plateau(), whole_rates])
    assert whole_rates.seen[10] == pytest.approx(one_cycle_by_hand(10, steps=12) * 0.5)
    with pytest.raises(RuntimeError, match="stopped at step 10"):
        run([plateau(), Crash()], tmp_path)
    factor = Factor()
    resumed = run([plateau(), factor], tmp_path)
    assert int(resumed.step) == 12
    assert factor.restored == 0.5  # not 1: the checkpoint of step 10 holds it
    assert max_diff(whole.model.get_weights(), resumed.model.get_weights()) < 1e-6
    fresh = run([plateau()])
    fresh.fit(dataset(), epochs=3, callbacks=[plateau()], verbose=0)  # 12 more steps: differ
    assert max_diff(whole.model.get_weights(), fresh.model.get_weights()) > 1e-4


def test_a_checkpoint_written_before_the_factor_was_saved_still_resumes(tmp_path, monkeypatch):
    """tfaccel 0.1.0's checkpoints hold no factor: the resumed run starts it at 1."""
    with monkeypatch.context() as patch:
        patch.setattr(Cycle, "keep_factor", lambda self: None)
        first = trainer([methods.OneCycle(peak=PEAK)])
        first.fit(dataset(), epochs=1, checkpoint_dir=tmp_path, verbose=0)
    resumed = trainer([methods.OneCycle(peak=PEAK)])
    resumed.fit(dataset(), epochs=3, checkpoint_dir=tmp_path, callbacks=[plateau()], verbose=0)
    assert int(resumed.step) == 12
    cycle = resumed.methods.plan.methods[0].schedule
    assert float(cycle.callback_factor.numpy()) == 0.5  # resumed epoch 1 set the best


def test_a_callback_setting_the_rate_before_step_one_in_the_trainer():
    """The Trainer calls the user's callbacks before its own: the rate is settable from
    the callbacks' `set_model` on, so `on_train_begin` already composes."""

    class AtStart(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.model.optimizer.learning_rate = self.model.optimizer.learning_rate * 0.1

    ours = trainer([methods.OneCycle(peak=PEAK)])
    seen = Rates()
    ours.fit(dataset(), epochs=EPOCHS, callbacks=[AtStart(), seen], verbose=0)
    want = [one_cycle_by_hand(s) * 0.1 for s in range(EPOCHS * STEPS)]
    np.testing.assert_allclose(seen.seen, want, rtol=1e-5)


def test_model_checkpoint_mid_fit_saves_and_loads(tmp_path):
    """While the fit lets callbacks set the rate, the optimizer serializes as made (its
    own class, the schedule's config) and `ModelCheckpoint`'s model loads."""

    class Serialized(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.config = keras.saving.serialize_keras_object(self.model.optimizer)
            self.kind = type(self.model.optimizer)

    model, plan = compiled_plan([methods.OneCycle(peak=PEAK)])
    before = keras.saving.serialize_keras_object(model.optimizer)
    path, serialized = str(tmp_path / "model.keras"), Serialized()
    saving = keras.callbacks.ModelCheckpoint(path)
    callbacks = [*plan.callbacks, plateau(), saving, serialized]
    model.fit(plan.dataset, epochs=EPOCHS, callbacks=callbacks, verbose=0)
    assert serialized.kind is not keras.optimizers.SGD  # the fit's composing subclass
    assert serialized.config == before  # the schedule as made: the factor is training state
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is keras.optimizers.SGD
    assert isinstance(loaded.optimizer._learning_rate, Cycle)
    assert max_diff(loaded.get_weights(), model.get_weights()) == 0
    assert int(loaded.optimizer.iterations) == EPOCHS * STEPS


def test_without_methods_keras_behaves_as_it_does():
    """A float rate: ReduceLROnPlateau halves Keras' rate variable and logs it; a Keras
    schedule stays unsettable (Keras' TypeError)."""
    model = build()
    model.compile(keras.optimizers.SGD(0.1), LOSS)
    history = model.fit(dataset(), epochs=3, callbacks=[plateau()], verbose=0)
    assert history.history["learning_rate"] == pytest.approx([0.1, 0.1, 0.05])
    assert float(model.optimizer.learning_rate) == pytest.approx(0.025)
    schedule = keras.optimizers.schedules.CosineDecay(0.1, 12)
    model = build()
    model.compile(keras.optimizers.SGD(schedule), LOSS)
    with pytest.raises(TypeError, match="not settable"):
        model.fit(dataset(), epochs=3, callbacks=[plateau()], verbose=0)
    ours = trainer(None)
    history = ours.fit(dataset(), epochs=3, verbose=0)
    assert "learning_rate" not in history.history  # nothing added without a method


def test_through_loss_scaling_the_inner_optimizer_composes():
    """The Trainer wraps the optimizer for float16: a rate set on the wrapper reaches the
    cycle of the one inside, which gets its own class back at the fit's end."""
    _, plan = compiled_plan([methods.OneCycle(peak=PEAK)])
    inner = plan.optimizer
    scaled = keras.optimizers.LossScaleOptimizer(inner)
    ComposedRate.on(scaled)
    assert isinstance(inner, keras.optimizers.SGD) and inner.__class__ is keras.optimizers.SGD
    scaled.learning_rate = float(scaled.learning_rate) * 0.25
    assert float(plan.methods[0].schedule.callback_factor.numpy()) == pytest.approx(0.25)
    assert float(scaled.learning_rate) == pytest.approx(one_cycle_by_hand(0) * 0.25)
    ComposedRate.off(scaled)
    assert type(inner) is keras.optimizers.SGD


def test_two_replicas_halve_as_one(mirrored):
    """The factor is a mirrored variable there: set between steps, read by both replicas."""
    one = trainer([methods.OneCycle(peak=PEAK)])
    one.fit(dataset(), epochs=3, callbacks=[plateau()], verbose=0)
    two = tfaccel.Trainer(
        build,
        optimizer=keras.optimizers.SGD(0.1),
        loss=LOSS,
        strategy=mirrored,
        steps_per_loop=1,
        jit_compile=False,
        methods=[methods.OneCycle(peak=PEAK)],
    )
    seen = Rates()
    two.fit(dataset(), epochs=3, callbacks=[plateau(), seen], verbose=0)
    want = [one_cycle_by_hand(s, steps=12) * f for s, f in enumerate(halved_from_epoch(2, 3))]
    np.testing.assert_allclose(seen.seen, want, rtol=1e-5)
    assert max_diff(one.model.get_weights(), two.model.get_weights()) < 1e-5


class EpochRates(keras.callbacks.Callback):
    """(epoch, the rate each step trains with)."""

    def __init__(self):
        super().__init__()
        self.seen, self.epoch = [], 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.seen.append((self.epoch, float(self.model.optimizer.learning_rate)))


def test_a_cycle_the_progressive_batch_scales_composes_and_is_checkpointed(tmp_path):
    """The progressive batch wraps the cycle in its scaling: the rate a callback sets still
    multiplies the cycle (the same steps at half the rate without it), and the optimizer's
    checkpoint holds the factor."""

    def run(callbacks):
        chosen = [methods.ProgressiveBatch(growth=2, stages=2), methods.OneCycle(peak=PEAK)]
        model, plan = compiled_plan(chosen)
        seen = EpochRates()
        callbacks = [*plan.callbacks, *callbacks, seen]
        model.fit(plan.dataset, epochs=EPOCHS, callbacks=callbacks, verbose=0)
        return model, seen.seen

    plain = run([])[1]
    model, halved = run([plateau()])
    assert [e for e, _ in halved] == [e for e, _ in plain]  # the stages' fewer steps: alike
    ratios = [rate / alone for (_, rate), (_, alone) in zip(halved, plain, strict=True)]
    want = [0.5 ** max(0, e - 1) for e, _ in plain]
    np.testing.assert_allclose(ratios, want, rtol=1e-5)
    path = tf.train.Checkpoint(optimizer=model.optimizer).write(str(tmp_path / "ckpt"))
    saved = {name for name, _ in tf.train.list_variables(path)}
    assert any("callback_factor" in name for name in saved), sorted(saved)
