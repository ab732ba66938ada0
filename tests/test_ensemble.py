"""`train BENCHMARK --instances M --ensemble` (run/ensemble.py): each member on its own
bootstrap sample (data/bootstrap.py), its evaluation probabilities saved (run/predictions.py),
in evaluation-set order on any number of workers, the ensemble's quality, window and Valid
FLOPS recomputed here from the members' files, for TensorFlow and PyTorch members alike, and
what `--ensemble` cannot go with refused in one line before any training."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcai500_tf import config, record
from hpcai500_tf.cli import main
from hpcai500_tf.data import bootstrap
from hpcai500_tf.errors import UserError
from hpcai500_tf.results import scoring
from hpcai500_tf.run import ensemble, predictions, throughput

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["train", "image_classification", "--preset", "tiny", "--no-tensorboard", "--power-hz", "0"]


# ----------------------------------------------------------------------------- the draw


def test_the_bootstrap_draw_is_reproducible_and_differs_between_members():
    first, again, other = bootstrap.draw(10, 0, 1000), bootstrap.draw(10, 0, 1000), None
    other = bootstrap.draw(10, 1, 1000)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)
    assert first.size == 1000 and first.min() >= 0 and first.max() < 1000
    # with replacement: about 1 - 1/e of the examples are drawn at least once
    assert 0.58 < np.unique(first).size / 1000 < 0.68
    said = bootstrap.description(10, 0, first)
    assert said["seed"] == [10, 0] and said["draws"] == 1000
    assert said["digest"] == bootstrap.digest(again) != bootstrap.digest(other)


def test_an_epoch_of_a_bootstrap_sample_is_the_sample_shuffled_the_same_every_epoch():
    """The sample is the member's data: each epoch's stream (its own shuffle seed) holds
    exactly the drawn examples, duplicates included, in its own order."""
    from hpcai500_tf.data import procedural

    sample = bootstrap.draw(3, 1, 48)

    def epoch(shuffle_seed: int) -> list[bytes]:
        dataset = procedural.procedural_dataset(
            48, 3, 16, 4, 0.0, True, shuffle_seed=shuffle_seed, sample=sample
        )
        return [image.numpy().tobytes() for image, _ in dataset]

    import tensorflow as tf

    drawn = tf.data.Dataset.from_tensor_slices(sample).map(
        lambda i: procedural.procedural_example(i, 3, 16, 4, 0.0)
    )
    drawn = [image.numpy().tobytes() for image, _ in drawn]
    one, two = epoch(3), epoch(4)
    assert sorted(one) == sorted(drawn) == sorted(two)
    assert one != two  # the order is each epoch's own


# ----------------------------------------------------------------------------- the evaluation


def _member(tmp_path: Path, index: int, probabilities, labels, status="completed") -> dict:
    run_dir = tmp_path / f"instance-{index}" / "run"
    run_dir.mkdir(parents=True)
    predictions.save(run_dir, 2, probabilities, labels)
    rec = {"status": status, "layers": {"L9": {"training_sample": {"digest": str(index)}}},
           "quality": {"achieved": 0.5, "curve": [{"epoch": 1}, {"epoch": 2}]}}  # fmt: skip
    return {"index": index, "seed": 10, "run_dir": f"instance-{index}/run", "record": rec,
            "problem": None, "run_start": 1.0, "run_stop": 2.0}  # fmt: skip


def test_the_ensemble_is_the_mean_of_its_members_probabilities(tmp_path):
    labels = np.array([0, 1, 2])
    # each member is right on one example only; their mean is right on all three
    a = np.array([[0.5, 0.0, 0.5], [0.6, 0.4, 0.0], [0.0, 0.6, 0.4]])
    b = np.array([[0.5, 0.5, 0.0], [0.0, 0.4, 0.6], [0.4, 0.0, 0.6]])
    stopped = np.eye(3)[[1, 2, 0]]
    members = [_member(tmp_path, 0, a, labels), _member(tmp_path, 1, b, labels),
               _member(tmp_path, 2, stopped, labels, status="stopped")]  # fmt: skip
    quality, shown, examples = ensemble.evaluate(
        tmp_path / "throughput.json", members, "image_classification"
    )
    assert predictions.top1(a, labels) == pytest.approx(1 / 3)
    assert quality == 1.0 and examples == 3
    assert [m["in_ensemble"] for m in shown] == [True, True, False]
    assert shown[2]["why"] == "status stopped"


def test_members_evaluated_on_other_examples_are_not_one_ensemble(tmp_path):
    members = [_member(tmp_path, 0, np.eye(3), np.array([0, 1, 2])),
               _member(tmp_path, 1, np.eye(3), np.array([0, 2, 1]))]  # fmt: skip
    with pytest.raises(UserError, match="labels differ"):
        ensemble.evaluate(tmp_path / "throughput.json", members, "image_classification")


def test_workers_shards_are_put_back_in_evaluation_order():
    """Worker r of W evaluated examples r, r + W, ... (tf.data's shard): 8 examples on 3."""
    parts = [np.arange(rank, 8, 3) for rank in range(3)]  # 3, 3 and 2 rows
    assert predictions.in_evaluation_order(parts).tolist() == list(range(8))
    rows = [np.stack([part, -part], axis=1) for part in parts]
    assert predictions.in_evaluation_order(rows)[:, 1].tolist() == [-i for i in range(8)]
    assert predictions.in_evaluation_order([np.arange(5)]).tolist() == list(range(5))
    with pytest.raises(UserError, match="not a 3-way split"):
        predictions.in_evaluation_order([np.arange(2), np.arange(3), np.arange(3)])


def test_tensorflows_gathered_steps_are_put_back_in_evaluation_order():
    """A TensorFlow member on 2 workers, 5 examples in batches of 2: worker 0 read 0, 2, 4
    and worker 1 read 1, 3; each step's gather holds worker 0's rows, then worker 1's."""
    from hpcai500_tf.engine.loop import gathered_in_evaluation_order

    steps = [[0, 2, 1, 3], [4]]  # the examples of each gathered step
    workers = [[0, 0, 1, 1], [0]]
    batches = [
        {"labels": np.array(s), "probabilities": np.array(s)[:, None] / 10, "worker": np.array(w)}
        for s, w in zip(steps, workers, strict=True)
    ]
    ordered = gathered_in_evaluation_order(batches, 2)
    assert sorted(ordered) == ["labels", "probabilities"]
    assert ordered["labels"].tolist() == [0, 1, 2, 3, 4]
    assert ordered["probabilities"][:, 0].tolist() == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])


MIRRORED_PROBE = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
def dataset(context):
    shard = (context.num_input_pipelines, context.input_pipeline_id)
    return tf.data.Dataset.range(11).shard(*shard).batch(context.get_per_replica_batch_size(4))
@tf.function
def step(x):
    def replica(x):
        return x, tf.fill(tf.shape(x), tf.distribute.get_replica_context().replica_id_in_sync_group)
    return [strategy.gather(v, axis=0) for v in strategy.run(replica, (x,))]
steps = [step(x) for x in strategy.distribute_datasets_from_function(dataset)]
print([[v.numpy().tolist() for v in s] for s in steps])
"""


def test_one_workers_replicas_take_its_pipelines_batches_in_turn():
    """What the TensorFlow engine's reordering rests on (gathered_in_evaluation_order): a
    worker's replicas (here 2 logical CPUs) take its input pipeline's batches in turn, and
    the gather keeps replica order, so a worker's rows as gathered are its shard in order."""
    done = subprocess.run(
        [sys.executable, "-c", MIRRORED_PROBE], env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    steps = json.loads(done.stdout.strip().splitlines()[-1])
    assert [rows for rows, _ in steps] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    assert [replicas for _, replicas in steps] == [[0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 1]]


# ----------------------------------------------------------------------------- PyTorch members


def _normalised(images) -> list[bytes]:
    return [np.asarray(image, np.float32).tobytes() for image in images]


def test_a_pytorch_members_feeder_trains_on_its_sample_as_tensorflow_does(torch_installed):
    """The PyTorch runner's data process builds the member's workload from its config: each
    epoch is the TensorFlow member's stream of the same sample (data/bootstrap.py), a
    resumed epoch skips the batches trained before the stop, and the evaluation split is
    read in order."""
    import tensorflow as tf

    from hpcai500_tf.data import procedural
    from hpcai500_tf.pytorch.feeder import Feeder
    from hpcai500_tf.run import data_position
    from hpcai500_tf.workloads.image_classification import ImageClassification

    settings = ["data.train_examples=48", "data.eval_examples=20", "data.bootstrap_member=1"]
    setup = config.prepare("image_classification", "tiny", settings)
    workload, d = ImageClassification(setup.config, None), setup.config["data"]
    seed, sample = setup.training.seed, bootstrap.draw(10, 1, 48)
    tf.random.set_seed(seed)  # the shuffle's global seed, as in the data process
    stream = workload.dataset(True, data_position.epoch_seed(seed, 0), (1, 0)).batch(8)
    tensorflow_epoch = [_normalised(workload.model_inputs(x)) for x, _ in stream]
    drawn = tf.data.Dataset.from_tensor_slices(sample).map(
        lambda i: procedural.procedural_example(
            i, seed, d["image_size"], d["num_classes"], d["noise"]
        )
    )
    drawn = sorted(_normalised(workload.model_inputs(x) for x, _ in drawn))
    feeder = Feeder("image_classification", setup.config, None, 8, True)
    try:
        assert feeder.workload.keeps_predictions
        assert feeder.workload.problem["training_sample"] == bootstrap.description(10, 1, sample)
        epoch = feeder.batches(True, seed, (0, 0, 2, 6))
        pytorch_epoch = [_normalised(next(epoch)[0]) for _ in range(6)]
        epoch.close()
        resumed = feeder.batches(True, seed, (0, 4, 2, 6))  # stopped after 4 batches
        assert _normalised(next(resumed)[0]) == pytorch_epoch[4]
        resumed.close()
        labels = [labels.copy() for _, labels, _ in feeder.batches(False, seed)]
    finally:
        feeder.close()
    assert pytorch_epoch == tensorflow_epoch
    assert sorted(b for batch in pytorch_epoch for b in batch) == drawn
    in_order = [int(label) for _, label in workload.dataset(False, seed, (1, 0))]
    assert np.concatenate(labels).tolist() == in_order


def _train(out: Path, *extra: str) -> str:
    """`train` in a process of its own (PyTorch's never loads TensorFlow); its console."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "hpcai500_tf.cli", *TRAIN, "--out", str(out), *extra],
        env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    return done.stdout


def test_a_pytorch_members_predictions_are_tensorflows_file_over_the_evaluation_set(
    tmp_path, torch_installed
):
    """One PyTorch member (bootstrap member 0) of one short epoch: its probabilities file has
    the TensorFlow member's keys, dtypes and shape, covers the evaluation split in its
    order, gives its record's quality, and run/ensemble.py reads it unchanged."""
    from hpcai500_tf.workloads.image_classification import ImageClassification

    settings = ["data.train_examples=64", "data.eval_examples=50", "training.epochs=1"]
    extra = [f"--set={s}" for s in [*settings, "data.bootstrap_member=0"]]
    _train(tmp_path, "--framework", "pytorch", *extra)
    (run_dir,) = (path.parent for path in tmp_path.glob("*/record.json"))
    rec = record.load(run_dir / "record.json")
    assert rec["source"]["framework"] == "pytorch" and rec["status"] == "completed"
    assert rec["layers"]["L9"]["training_sample"]["digest"] == bootstrap.digest(
        bootstrap.draw(10, 0, 64)
    )
    with np.load(run_dir / "predictions-e1.npz") as held:
        saved = {key: held[key] for key in held.files}
    workload = ImageClassification(config.prepare("image_classification", "tiny", settings).config,
                                   None)  # fmt: skip
    label_dtype = workload.empty_label().dtype.as_numpy_dtype  # what TensorFlow's eval saves
    assert sorted(saved) == ["epoch", "labels", "probabilities"] and int(saved["epoch"]) == 1
    assert saved["probabilities"].dtype == np.float32 and saved["labels"].dtype == label_dtype
    assert saved["probabilities"].shape == (50, 10)
    np.testing.assert_allclose(saved["probabilities"].sum(axis=1), 1.0, rtol=1e-5)
    in_order = [int(label) for _, label in workload.dataset(False, 10, (1, 0))]
    assert saved["labels"].tolist() == in_order
    quality = predictions.top1(saved["probabilities"], saved["labels"])
    assert quality == pytest.approx(rec["quality"]["achieved"])
    member = {"index": 0, "seed": 10, "run_dir": run_dir.name, "record": rec, "problem": None,
              "run_start": 1.0, "run_stop": 2.0}  # fmt: skip
    assert (
        ensemble.evaluate(tmp_path / "throughput.json", [member], "image_classification")[0]
        == quality
    )


@pytest.mark.slow  # two workers (PyTorch's with their data processes): 30-70 s on 2 busy cores
@pytest.mark.parametrize("framework", ["tensorflow", "pytorch"])
def test_a_member_on_two_workers_saves_the_whole_evaluation_set_in_order(
    tmp_path, request, framework
):
    """51 evaluation examples on 2 workers (26 and 25, in batches of 16): the chief's file
    holds all 51 in the split's order (TensorFlow's gather gives each step's rows worker by
    worker: engine/loop.py puts them back) and gives the record's quality. The fast paths:
    the order tests above and tests/test_pytorch_distributed.py's gather probe."""
    from hpcai500_tf.workloads.image_classification import ImageClassification

    if framework == "pytorch":
        request.getfixturevalue("torch_installed")
    settings = ["data.train_examples=64", "data.eval_examples=51", "training.epochs=1",
                "training.batch_per_replica=16"]  # fmt: skip
    extra = [f"--set={s}" for s in [*settings, "data.bootstrap_member=0"]]
    _train(tmp_path, "--framework", framework, "--workers", "2", *extra)
    (run_dir,) = (path.parent for path in tmp_path.glob("*/record.json"))
    rec = record.load(run_dir / "record.json")
    assert rec["layers"]["L6"]["workers"] == 2
    probabilities, labels = predictions.load(run_dir, 1)
    workload = ImageClassification(config.prepare("image_classification", "tiny", settings).config,
                                   None)  # fmt: skip
    assert labels.tolist() == [int(label) for _, label in workload.dataset(False, 10, (1, 0))]
    assert probabilities.shape == (51, 10)
    assert predictions.top1(probabilities, labels) == pytest.approx(rec["quality"]["achieved"])


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--ensemble"], "--ensemble trains M members at once: give --instances M"),
        (["--instances", "2", "--ensemble", "--set", "data.source=random"],
         "needs source = 'procedural' or 'imagenet', not 'random'"),
        (["--instances", "2", "--ensemble", "--set", "data.bootstrap_member=1"],
         "data.bootstrap_member is set by --ensemble"),
        (["--instances", "2", "--ensemble", "--workers", "4", "--set", "data.source=imagenet",
          "--data", "x"], "--ensemble on ImageNet TFRecords trains each member on one worker"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2_before_any_training(tmp_path, capsys, extra, words):
    out = tmp_path / "runs"
    assert main([*TRAIN, "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    ("environ", "workers", "per_member"),
    [
        ({"SLURM_JOB_ID": "42", "SLURM_NTASKS": "4"}, None, 1),  # salloc -n4: runs here
        ({"SLURM_JOB_ID": "42", "SLURM_NTASKS": "1", "SLURM_PROCID": "0",
          "SLURM_STEP_NUM_TASKS": "1"}, 4, 2),  # srun -n1 in a larger job: --workers counts
        ({"SLURM_JOB_ID": "42", "SLURM_NTASKS": "4", "SLURM_PROCID": "1",
          "SLURM_STEP_NUM_TASKS": "4"}, None, 2),  # srun -n4: the step's tasks
    ],
)  # fmt: skip
def test_members_workers_come_from_the_step_not_the_job(monkeypatch, environ, workers,
                                                         per_member):  # fmt: skip
    """The job's SLURM_NTASKS outside a step (salloc, a batch shell) is not the members'
    workers: they run on this machine."""
    from types import SimpleNamespace

    for name in [n for n in os.environ if n.startswith("SLURM")]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    args = SimpleNamespace(instances=2, workers=workers)
    assert ensemble._workers_per_member(args) == per_member


def test_a_framework_whose_evaluation_saves_no_probabilities_is_refused(tmp_path, capsys,
                                                                      monkeypatch):  # fmt: skip
    """Both frameworks save them; a backend that did not would be refused by its capability."""
    import dataclasses

    from hpcai500_tf import backends

    lacking = dataclasses.replace(backends.get("pytorch"), saves_predictions=False)
    monkeypatch.setitem(backends._BACKENDS, "pytorch", lacking)
    out = tmp_path / "runs"
    extra = ["--instances", "2", "--ensemble", "--framework", "pytorch", "--out", str(out)]
    assert main([*TRAIN, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not built for --framework pytorch" in err[0], err
    assert not out.exists() or not any(out.iterdir())


# ----------------------------------------------------------------------------- a real run


def _two_members(out: Path, *extra: str):
    output = _train(out, "--instances", "2", "--ensemble", *extra)
    (path,) = out.glob("*/throughput.json")
    return path, output


@pytest.fixture(scope="module")
def two_members(tmp_path_factory):
    return _two_members(tmp_path_factory.mktemp("ensemble"))


@pytest.fixture(scope="module")
def two_pytorch_members(tmp_path_factory):
    pytest.importorskip("torch")
    return _two_members(tmp_path_factory.mktemp("ensemble-pytorch"), "--framework", "pytorch")


def _mlperf_times(log: Path) -> tuple[float, float]:
    entries = [json.loads(line[len(":::MLLOG ") :]) for line in log.read_text().splitlines()]
    start = next(e["time_ms"] for e in entries if e["key"] == "run_start")
    stop = [e["time_ms"] for e in entries if e["key"] == "run_stop"][-1]
    return start / 1000, stop / 1000


@pytest.mark.slow
@pytest.mark.parametrize(
    ("members", "framework"),
    [("two_members", "tensorflow"), ("two_pytorch_members", "pytorch")],
)
def test_two_members_make_one_ensemble_the_test_recomputes(request, members, framework):
    from hpcai500_tf.workloads.image_classification import ImageClassification

    if framework == "pytorch":
        request.getfixturevalue("torch_installed")  # a missing torch fails in CI, else skips
    path, output = request.getfixturevalue(members)
    data = throughput.load(path)
    assert (data["form"], data["instances"], data["status"]) == ("ensemble", 2, "completed")
    records, held, times, samples = [], [], [], []
    for index, member in enumerate(data["members"]):
        run_dir = path.parent / member["run_dir"]
        rec = record.load(run_dir / "record.json")
        records.append(rec)
        assert rec["source"]["framework"] == framework
        assert rec["layers"]["L8"]["seed"] == 10  # one seed: one data set, one evaluation set
        saved = json.loads((run_dir / "config.json").read_text())["config"]
        assert saved["data"]["bootstrap_member"] == index
        rebuilt = ImageClassification(saved, None).sample  # what a resume of it trains on
        assert np.array_equal(rebuilt, bootstrap.draw(10, index, 256))
        sample = rec["layers"]["L9"]["training_sample"]
        assert sample["digest"] == bootstrap.digest(bootstrap.draw(10, index, 256))
        samples.append(sample["digest"])
        epoch = rec["quality"]["curve"][-1]["epoch"]
        probabilities, labels = predictions.load(run_dir, epoch)
        assert predictions.top1(probabilities, labels) == pytest.approx(rec["quality"]["achieved"])
        assert (run_dir / "predictions-e1.npz").is_file()  # every evaluation's
        held.append((probabilities, labels))
        times.append(_mlperf_times(run_dir / "mlperf.log"))
    assert samples[0] != samples[1]
    assert throughput.layer_difference(records) is None  # L1-L9 the same, the sample apart
    assert np.array_equal(held[0][1], held[1][1])  # the same examples, in the same order
    mean = (held[0][0] + held[1][0]) / 2
    quality = float(np.mean(np.argmax(mean, axis=1) == held[0][1]))
    start, stop = min(t[0] for t in times), max(t[1] for t in times)
    one = throughput.score(path)
    assert one.quality == pytest.approx(quality) and one.members_in == 2
    assert one.window_s == pytest.approx(stop - start)
    total = sum(r["flops"]["total"] for r in records)
    benchmark = config.load_benchmark("image_classification")
    factor = scoring.quality_factor(quality, 0.15, benchmark.convention().penalty_exponent)
    assert one.valid_flops == pytest.approx(total / (stop - start) * factor)
    assert [m["quality"] for m in one.members] == [r["quality"]["achieved"] for r in records]
    assert f"top-1 {quality:.4f}" in output


@pytest.mark.slow
def test_ensembles_are_ranked_apart_and_reported_with_their_members(two_members, tmp_path,
                                                                     capsys):  # fmt: skip
    path, _ = two_members
    assert main(["rank", "--json", str(path)]) == 0
    (ranking,) = json.loads(capsys.readouterr().out)
    assert (ranking["form"], ranking["benchmark"]) == ("ensemble", "image_classification")
    weak = tmp_path / "weak"  # the same members read as the weak-scaling form: ranked apart
    shutil.copytree(path.parent, weak)
    data = json.loads((weak / "throughput.json").read_text())
    data["form"], data["rule"] = "weak_scaling", dict(throughput.RULE)
    (weak / "throughput.json").write_text(json.dumps(data))
    assert main(["rank", "--json", str(path), str(weak / "throughput.json")]) == 0
    forms = [r["form"] for r in json.loads(capsys.readouterr().out)]
    assert forms == ["ensemble", "weak_scaling"]
    assert main(["score", str(path)]) == 0
    assert "Ensemble quality" in capsys.readouterr().out
    member = path.parent / throughput.load(path)["members"][0]["run_dir"] / "record.json"
    assert main(["rank", "--json", str(member)]) == 0  # a member alone is not ranked
    assert "an ensemble member" in capsys.readouterr().out
    assert not any("ensemble member" in why for why in ranking["refused"][0]["reasons"])
    assert main(["report", str(path.parent), "--out", str(tmp_path / "report")]) == 0
    (page,) = (tmp_path / "report").glob("throughput-*.html")
    text = page.read_text()
    assert "Ensemble quality" in text and "Member 0" in text and "Member 1" in text
    assert f"{throughput.score(path).quality:.4f} top-1" in text


def resumed_member_equals_uninterrupted(
    tmp_path: Path, settings: list[str], stop_at: int, draws: int, **data_dir
) -> tuple[dict, Path]:
    """Member 1 (tiny, `settings`) stopped as epoch `stop_at` begins and resumed ends with the
    draw (of `draws` examples) and the weights of one never stopped; (the uninterrupted
    record, the stopped run's record path). `data_dir`: the runs' (TFRecords')."""
    from tests.test_stop_keeps_work import TINY, Stopping, _run, _tensorflow_build, _weights

    build = _tensorflow_build()
    setup = config.prepare("image_classification", "tiny", [*TINY, *settings])
    stopped, path = _run(setup, Stopping(build, stop_at), out_dir=tmp_path / "stopped", **data_dir)
    assert stopped["status"] == "stopped", stopped["warnings"]
    resuming = Stopping(build)
    resumed, _ = _run(setup, resuming, resume=str(path.parent), **data_dir)
    whole = Stopping(build)
    plain, _ = _run(setup, whole, out_dir=tmp_path / "whole", **data_dir)
    assert resumed["status"] == "completed", resumed["warnings"]
    sample = resumed["layers"]["L9"]["training_sample"]
    assert sample == plain["layers"]["L9"]["training_sample"]
    assert sample["digest"] == bootstrap.digest(bootstrap.draw(10, 1, draws))
    for got, want in zip(_weights(resuming.built), _weights(whole.built), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return plain, path


@pytest.mark.slow  # three tiny runs in this process: 1-2 minutes on 2 busy cores
def test_a_member_stopped_mid_epoch_resumes_on_its_sample_to_an_uninterrupted_members_weights(
    tmp_path,
):
    """The sample is drawn again from the saved config, and the epoch's seeded stream skips
    the batches trained before the stop (run/data_position.py): the resumed member ends where
    one never stopped ends, with the same draw in its record."""
    plain, path = resumed_member_equals_uninterrupted(tmp_path, ["data.bootstrap_member=1"], 3, 256)
    held, _ = predictions.load(path.parent, 2)
    again, _ = predictions.load(plain["artifacts"]["run_dir"], 2)
    np.testing.assert_allclose(held, again, rtol=1e-4, atol=1e-5)
