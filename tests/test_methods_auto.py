"""methods="auto": a job too short to pay declines at once (no batch read, no clone, no
step); a long one is probed (none, "fast", "fast" with Plateau) reproducibly with a seed,
and the plan's table shows the comparison measured."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_methods_trainer import X, Y, build, trainer

from tfaccel import methods
from tfaccel.methods.adaptive import auto
from tfaccel.methods.composition import plan_for, resolve


def job(epochs, batch=16):
    model = build()
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(batch)
    made = methods.Job(
        model,
        "sparse_categorical_crossentropy",
        keras.optimizers.Adam(1e-3),
        data.element_spec,
        epochs,
        len(data),
        batch,
    )
    return made, data


def test_a_short_job_declines_without_reading_a_batch_cloning_or_training(monkeypatch):
    made, data = job(epochs=30)  # 4 steps an epoch: 120 steps
    read = []
    counted = data.map(
        lambda x, y: (tf.py_function(lambda: read.append(1) or 0.0, [], tf.float32) + x, y)
    )

    def refused(*args, **kwargs):
        raise AssertionError("auto probed a job too short to pay")

    monkeypatch.setattr(keras.models, "clone_model", refused)
    monkeypatch.setattr(auto, "_probe", refused)
    before = [w.copy() for w in made.model.get_weights()]
    plan = plan_for("auto", made, data=counted, kind="sequence")
    assert not read and int(made.optimizer.iterations) == 0
    assert all(np.array_equal(a, b) for a, b in zip(before, made.model.get_weights(), strict=True))
    assert f"probed from {auto.probes_from(3):,} steps" in plan.chosen
    assert "120 optimizer steps is too short" in plan.chosen and '"fast"\'s stack' in plan.chosen
    assert [m.name for m in plan.methods] == ["plateau", "label smoothing"]  # fast's, short GRU
    assert plan.table()[0] == ("auto", plan.chosen) and "auto: no probe" in plan.describe()


def test_the_size_rule_by_hand():
    # 3 stacks x 3 seeds x (16 steps + 8 held-out batches) = 216 steps, 5 % of 4,320
    assert auto.probes_from(3) == 4_320
    made, _ = job(epochs=1_080)  # 4,320 steps
    assert auto.probe_steps(made) == auto.MIN_PROBE_STEPS
    made, _ = job(epochs=1_079)
    assert auto.probe_steps(made) < auto.MIN_PROBE_STEPS


def test_without_data_it_declines_to_fast_saying_so():
    made, _ = job(epochs=2_000)
    plan = plan_for("auto", made)
    assert "no training data was given to probe" in plan.chosen


def choice(seed):
    made, data = job(epochs=740)  # 2,960 steps: two stacks, 16 steps a probe
    candidates = {
        "none": lambda made: [],
        "one-cycle": lambda made: [methods.OneCycle(peak=0.05)],
    }
    planner = lambda argument, job_: plan_for(argument, job_)  # noqa: E731
    return made, auto.choose(made, data.shuffle(64, seed=0), candidates, planner, seed=seed)


@pytest.fixture
def untimed(monkeypatch):
    """The tests' jobs are seconds long: the probes' traces are most of them."""
    monkeypatch.setattr(auto, "TIME_RULE", False)


def test_probes_are_reproducible_with_a_seed_and_leave_the_model_untouched(untimed):
    made, first = choice(seed=3)
    before = [w.copy() for w in made.model.get_weights()]
    _, again = choice(seed=3)
    assert first.losses == again.losses and first.name == again.name
    assert first.projected > 0 and first.seconds > 0
    assert first.steps == 16 and all(len(v) == auto.SEEDS for v in first.losses.values())
    assert all(np.isfinite(v).all() for v in first.losses.values())
    assert first.losses["none"] != first.losses["one-cycle"]
    assert int(made.optimizer.iterations) == 0
    assert all(np.array_equal(a, b) for a, b in zip(before, made.model.get_weights(), strict=True))


def test_the_significance_rule_keeps_only_a_candidate_lower_on_every_seed(monkeypatch, untimed):
    made, data = job(epochs=1_500)  # 6,000 steps: four stacks probed from 5,760
    measured = {
        "none": [1.0, 1.0, 1.0],
        "a": [0.5, 0.5, 1.2],
        "b": [0.9, 0.95, 0.98],
        "c": [0.8, 0.7, 0.985],
    }
    monkeypatch.setattr(auto, "_probe", lambda job_, argument, *rest: measured[argument])
    candidates = {name: (lambda made, n=name: n) for name in measured}
    chosen = auto.choose(made, data, candidates, lambda a, j: None)
    # a: worse on one seed; b and c: lower on every seed by more than 1 %; c the lowest mean
    assert chosen.name == "c" and chosen.methods == "c"
    assert "none 1.0000/1.0000/1.0000" in chosen.text and ": c" in chosen.text
    measured["c"] = [0.8, 0.7, 0.995]  # within 1 % on one seed: not kept
    assert auto.choose(made, data, candidates, lambda a, j: None).name == "b"
    measured["b"] = [0.9, 0.95, 1.0]
    assert auto.choose(made, data, candidates, lambda a, j: None).name == "none"


def test_plan_for_auto_probes_and_puts_the_comparison_in_the_table(untimed):
    made, data = job(epochs=1_100)
    plan = plan_for("auto", made, data=data.shuffle(64, seed=0), kind="sequence")
    assert plan.chosen.startswith("auto: probed none, fast, fast-one-cycle on 3 seeds x 16 steps")
    assert "held-out loss none " in plan.chosen and "kept when below none's" in plan.chosen
    assert "216 steps, 4.9% of the job's 4,400" in plan.chosen
    assert "of the job's projected" in plan.chosen  # the seconds, at the probes' step time


def test_probes_whose_seconds_outgrow_the_share_stop_after_the_plain_stack(monkeypatch):
    probed = []

    def probe(job_, argument, *rest):
        probed.append(argument)
        rest[-1].append(1.0)  # a second a step: the job projected at 4,400 s
        return [1.0] * auto.SEEDS

    monkeypatch.setattr(auto, "_probe", probe)
    ticks = iter([0.0, 1_000.0])  # the plain probes "took" 1,000 s: x3 is over 5 % of 4,400
    monkeypatch.setattr(auto.time, "perf_counter", lambda: next(ticks))
    made, data = job(epochs=1_100)
    candidates = {"none": lambda m: [], "fast": lambda m: "fast", "other": lambda m: []}
    chosen = auto.choose(made, data, candidates, lambda a, j: None)
    assert probed == [[]] and chosen.methods == "fast" and not chosen.losses
    assert "over 5% of the job's projected 4,400.0 s" in chosen.text


def test_resolve_accepts_auto_and_lists_it_among_the_valid_names():
    assert [m.name for m in resolve("auto", "sequence")] == ["plateau", "label smoothing"]
    with pytest.raises(ValueError, match="use 'fast', 'none', 'auto' or a list"):
        resolve("fastest", "image")
    with pytest.raises(TypeError, match=r"a method or a list of methods .*, or 'auto'"):
        resolve(3, "image")
    with pytest.raises(ValueError, match="methods='auto' needs the job's kind"):
        resolve("auto", None)


def test_for_fit_and_the_trainer_take_auto_and_say_why_they_did_not_probe():
    model, data = build(), tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    plan = methods.for_fit(
        "auto", model, data, epochs=3, loss="sparse_categorical_crossentropy", optimizer="adam"
    )
    assert plan.chosen.startswith("auto: no probe (") and '"fast"\'s stack' in plan.chosen
    trained = trainer("auto")
    trained.fit(data, epochs=2, verbose=0)
    rows = trained.methods.rows()
    assert rows["method: auto"].startswith("auto: no probe (")
    assert int(trained.step) == 8


def test_for_fit_probes_a_long_job_on_its_own_dataset(untimed):
    model, data = build(), tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    plan = methods.for_fit(
        "auto",
        model,
        data.shuffle(64, seed=0),
        epochs=1_100,
        loss="sparse_categorical_crossentropy",
        optimizer="adam",
    )
    assert plan.chosen.startswith("auto: probed none, fast, ")
    assert plan.table()[0] == ("auto", plan.chosen)


class StopAfterFirstEpoch(keras.callbacks.Callback):
    """A generous declaration and a stop (the probes are sized to the declared job)."""

    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = True


def test_the_trainer_probes_a_long_job_on_its_own_model_and_data(monkeypatch, untimed):
    # Smaller probes for a fast test: 3 stacks x 3 seeds x (4 + 2) = 54 steps, 5 % of 1,080.
    monkeypatch.setattr(auto, "MIN_PROBE_STEPS", 4)
    monkeypatch.setattr(auto, "EVAL_BATCHES", 2)
    probed = []

    def spied(made, data, *rest, **kwargs):  # the Trainer's own model, optimizer and data
        before = [w.copy() for w in made.model.get_weights()]
        chosen = real(made, data, *rest, **kwargs)
        after = made.model.get_weights()
        untouched = all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
        untouched = untouched and int(made.optimizer.iterations) == 0  # not trained
        again = real(made, data, *rest, **kwargs)  # the same seed (0): the same probes
        probed.append((made, data, chosen, again, untouched))
        return chosen

    real = auto.choose
    monkeypatch.setattr(auto, "choose", spied)
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    ours = trainer("auto")
    ours.fit(data, epochs=280, callbacks=[StopAfterFirstEpoch()], verbose=0)  # 1,120 steps
    ((made, given, chosen, again, untouched),) = probed
    assert made.model is ours.model and given is data and untouched
    assert chosen.losses == again.losses and chosen.name == again.name
    assert all(len(v) == 3 and np.isfinite(v).all() for v in chosen.losses.values())
    row = ours.settings["method: auto"]
    assert row.startswith("auto: probed none, fast, fast-") and row.startswith(chosen.text)
    assert "3 seeds x 4 steps (54 steps, 4.8% of the job's 1,120" in row
    assert "held-out loss none " in row and "kept when below none's" in row
    assert int(ours.step) == 4  # one epoch trained, after the probes


def test_a_short_trainer_job_declines_reading_and_probing_nothing(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("auto probed or checked a job too short to pay")

    monkeypatch.setattr(auto, "_probe", refused)
    ours, checked = trainer("auto"), []
    real = ours.feed  # the input checks: once, by fit itself (none before a probe)
    monkeypatch.setattr(
        ours, "feed", lambda *args, **kwargs: checked.append(1) or real(*args, **kwargs)
    )
    ours.fit(tf.data.Dataset.from_tensor_slices((X, Y)).batch(16), epochs=2, verbose=0)
    row = ours.settings["method: auto"]
    assert "a job of 8 optimizer steps is too short" in row
    assert f"probed from {auto.probes_from(3):,} steps" in row and int(ours.step) == 8
    assert checked == [1]


def test_the_trainer_checks_its_data_before_probing(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("auto probed data the Trainer had not checked")

    monkeypatch.setattr(auto, "_probe", refused)
    ours = trainer("auto")
    bad = tf.data.Dataset.from_tensor_slices((X, Y + np.float32(0.5))).batch(16)  # fractions
    with pytest.raises(ValueError, match="takes integer class indices, but the labels hold"):
        ours.fit(bad, epochs=1_100, verbose=0)  # long enough to probe: checked first
    assert int(ours.step) == 0
