"""What watches a run is one list of observers the caller hands in (run/observers.py)."""

from hpcai500_tf.run.observers import Observer, Observers


class Calls(Observer):
    def __init__(self, name, seen):
        self.name, self.seen = name, seen

    def on_eval(self, epoch, quality, target):
        self.seen.append((self.name, epoch, quality, target))

    def on_run_start(self, run_dir, setup):
        return [f"{self.name} saw {run_dir}"]


def test_each_call_goes_to_each_observer_in_order_and_none_is_left_out():
    seen = []
    observers = Observers([Calls("a", seen), None, Calls("b", seen)])
    observers.on_eval(3, 0.5, 0.75)
    observers.on_epoch_start(1, 2, 10)  # the base class's: nothing
    assert seen == [("a", 3, 0.5, 0.75), ("b", 3, 0.5, 0.75)]
    assert observers.on_run_start("RUN", None) == ["a saw RUN", "b saw RUN"]
    assert observers and not Observers() and not Observers(None)


def test_an_observer_of_any_shape_gives_the_record_no_warning():
    class Anything:  # a test's view: every call answered with None
        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    assert Observers([Anything()]).on_run_start("RUN", None) == []
