"""Energy: the arithmetic, simulated sensors (fake NVML, fake powercap tree, meter logs), the
record's energy block, and a training run measured end to end."""

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from hpcai500_tf import config, record
from hpcai500_tf.cli import main
from hpcai500_tf.energy import sampler as power
from hpcai500_tf.energy.integrate import energy_over
from hpcai500_tf.energy.meter_log import read_meter_log
from hpcai500_tf.energy.sources import Source, discover, nvml_sources, rapl_sources
from hpcai500_tf.errors import UserError
from hpcai500_tf.results import scoring

# ------------------------------------------------------------------------ arithmetic


def test_constant_power_over_a_cut_interval():
    readings = [(float(t), 100.0) for t in range(11)]
    measured = energy_over(readings, "power", [(2.5, 7.5)])
    assert measured.joules == pytest.approx(500.0)
    assert measured.coverage == pytest.approx(1.0)
    assert measured.samples == 5  # t = 3..7
    assert measured.sample_hz == pytest.approx(1.0)
    assert measured.average_watts == pytest.approx(100.0)


def test_power_ramp_is_integrated_piecewise_linearly():
    readings = [(0.0, 0.0), (10.0, 100.0)]
    assert energy_over(readings, "power", [(0.0, 10.0)]).joules == pytest.approx(500.0)
    assert energy_over(readings, "power", [(5.0, 10.0)]).joules == pytest.approx(375.0)


def test_counter_wraps_once_per_fall_when_its_range_is_known():
    readings = [(0.0, 900.0), (1.0, 950.0), (2.0, 20.0), (3.0, 70.0)]
    wrapped = energy_over(readings, "counter", [(0.0, 3.0)], wrap=1000.0)
    assert wrapped.joules == pytest.approx(50 + 70 + 50)
    assert wrapped.counter_faults == 0
    unknown = energy_over(readings, "counter", [(0.0, 3.0)])
    assert unknown.joules == pytest.approx(100.0) and unknown.covered_s == pytest.approx(2.0)
    assert unknown.counter_faults == 1


def test_counter_pair_cut_by_the_interval_is_taken_pro_rata():
    readings = [(0.0, 0.0), (2.0, 200.0)]
    assert energy_over(readings, "counter", [(0.5, 1.5)]).joules == pytest.approx(100.0)


def test_a_long_gap_is_neither_energy_nor_covered_time():
    readings = [(float(t), 100.0) for t in [0, 1, 2, 3, 4, 20, 21, 22, 23, 24]]
    measured = energy_over(readings, "power", [(0.0, 24.0)])
    assert measured.joules == pytest.approx(800.0)
    assert measured.covered_s == pytest.approx(8.0)
    assert measured.coverage == pytest.approx(8 / 24)
    assert measured.average_watts == pytest.approx(100.0)


def test_several_segments_add_up_and_skip_the_time_between():
    readings = [(float(t), 10.0 * t) for t in range(11)]  # a counter at 10 W
    measured = energy_over(readings, "counter", [(0.0, 2.0), (5.0, 7.0)])
    assert measured.joules == pytest.approx(40.0) and measured.interval_s == pytest.approx(4.0)


def test_run_outside_the_readings_is_not_covered():
    readings = [(float(t), 50.0) for t in range(5, 11)]
    measured = energy_over(readings, "power", [(0.0, 10.0)])
    assert measured.coverage == pytest.approx(0.5) and measured.joules == pytest.approx(250.0)


# ------------------------------------------------------------------------ meter logs


def _log(tmp_path, text, name="meter.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_meter_log_header_unit_and_timestamp_forms(tmp_path):
    path = _log(
        tmp_path,
        "# exported from the PDU\ntimestamp,kW\n1000,1.5\n1000.5 ; 1.0\n2026-11-29T00:00:01Z,2\n",
    )
    readings, warnings = read_meter_log(path)
    assert warnings == []
    assert readings[0] == (1000.0, 1500.0) and readings[1] == (1000.5, 1000.0)
    assert readings[2][1] == 2000.0


def test_meter_log_repairs_are_warned(tmp_path):
    path = _log(
        tmp_path,
        "1000,300\nnot a line\n1002,320\n1001,310\n1001,999\n1003,-5\n"
        "2026-11-29T00:00:01,300\n1004,300\n",
    )
    readings, warnings = read_meter_log(path)
    assert [t for t, _ in readings] == [1000, 1001, 1002, 1004]
    assert dict(readings)[1001] == 310  # the first of the repeated timestamp
    text = " | ".join(warnings)
    assert "3 unreadable line(s) skipped (line 2, 6, 7)" in text
    assert "out of time order (sorted)" in text
    assert "1 repeated timestamp(s)" in text


@pytest.mark.parametrize(
    "content, message",
    [
        ("time,furlongs\n1,2\n2,3\n", "unknown power unit 'furlongs'"),
        ("1000,300\n", "fewer than two usable readings"),
        ("", "fewer than two usable readings"),
        (b"\x89HDF\r\n\x1a\n\xff\xfe\x00", "not UTF-8 text; a meter log is"),
    ],
)
def test_unusable_meter_logs_are_refused(tmp_path, content, message):
    path = tmp_path / "meter.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UserError, match=message):
        read_meter_log(path)


# ------------------------------------------------------------------------ simulated sensors


def _zone(root: Path, zone: str, name: str, energy_uj: int, max_uj: int = 262143328850):
    directory = root / zone
    directory.mkdir(parents=True)
    (directory / "name").write_text(name + "\n")
    (directory / "energy_uj").write_text(f"{energy_uj}\n")
    (directory / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return directory


@pytest.fixture
def powercap(tmp_path):
    root = tmp_path / "powercap"
    _zone(root, "intel-rapl:0", "package-0", 0, max_uj=1_000_000_000)  # wraps at 1000 J
    _zone(root, "intel-rapl:0:0", "core", 0)
    _zone(root, "intel-rapl:0:1", "dram", 0)
    _zone(root, "intel-rapl:1", "psys", 0)
    _zone(root, "intel-rapl-mmio:0", "package-0", 0)
    return root


def _set(root: Path, zone: str, joules: float) -> None:
    (root / zone / "energy_uj").write_text(f"{int(joules * 1e6)}\n")


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_rapl_finds_packages_and_dram_only(powercap):
    sources, note = rapl_sources(powercap)
    assert note is None
    assert [(s.name, s.part, s.kind) for s in sources] == [
        ("rapl:package-0", "CPU package", "counter"),
        ("rapl:dram-0", "DRAM", "counter"),
    ]
    assert sources[0].wrap_j == pytest.approx(1000.0)


def test_rapl_absent_or_root_only_says_why(tmp_path, powercap, monkeypatch):
    assert rapl_sources(tmp_path / "nothing")[1].endswith(
        "absent (no RAPL: not a Linux x86 host, or no powercap driver)"
    )
    from hpcai500_tf.energy import sources as sources_module

    def denied(path):
        raise PermissionError(path)

    monkeypatch.setattr(sources_module, "_read_number", denied)
    sources, note = rapl_sources(powercap)
    assert sources == [] and "need root (intel-rapl:0, intel-rapl:0:1)" in note


def test_sampler_unwraps_a_rapl_counter(powercap):
    sources, _ = rapl_sources(powercap)
    clock = FakeClock()
    sampler = power.PowerSampler(sources[:1], hz=10, clock=clock)
    package = 0.0
    for _ in range(41):  # 4 s at 10 Hz and 300 W: 1200 J, one wrap at 1000 J
        _set(powercap, "intel-rapl:0", package % 1000)
        sampler.sample_once()
        clock.now += 0.1
        package += 30.0
    (measured,) = sampler.measure([(1000.0, 1004.0)])
    assert measured["joules"] == pytest.approx(1200.0)
    assert measured["covered_s"] == pytest.approx(4.0)


def test_a_vanishing_rapl_file_leaves_a_gap_and_a_warning(powercap):
    sources, _ = rapl_sources(powercap)
    clock = FakeClock()
    sampler = power.PowerSampler(sources[:1], hz=10, clock=clock)
    for step in range(100):  # 10 s at 10 W; the zone disappears after 5 s
        if step == 50:
            (powercap / "intel-rapl:0" / "energy_uj").unlink()
        if step < 50:
            _set(powercap, "intel-rapl:0", step * 1.0)
        sampler.sample_once()
        clock.now += 0.1
    block, warnings = power.energy_block(sampler.measure([(1000.0, 1010.0)]), [], 10.0, 10.0)
    assert block["measured"] and block["average_watts"] == pytest.approx(10.0)
    assert block["coverage"] == pytest.approx(0.49)
    assert any("50 failed read(s), first: FileNotFoundError" in w for w in warnings)
    assert any("cover 49.0% of the run" in f for f in block["quality_flags"])


class FakeNVML:
    """The part of pynvml the sources use, with a GPU that has an energy counter (in mJ),
    one that has only power readings (in mW), and a fault switch."""

    class NVMLError(Exception):
        pass

    def __init__(self, clock, fail_after=None):
        self.clock = clock
        self.fail_after = fail_after
        self.calls = 0

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return ["Fake H100", "Fake T4"][handle]

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{handle}{handle}c0ffee-0000-0000-0000-00000000000{handle}"

    def _check(self):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise self.NVMLError("GPU is lost")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if handle == 1:
            raise self.NVMLError("Not Supported")
        self._check()
        return int(400_000 * (self.clock() - 1000.0))  # 400 W

    def nvmlDeviceGetPowerUsage(self, handle):
        self._check()
        return 70_000  # 70 W


def test_fake_nvml_counter_and_power_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    clock = FakeClock()
    sources, note = nvml_sources(FakeNVML(clock))
    assert note is None
    assert [(s.name, s.kind) for s in sources] == [("gpu0", "counter"), ("gpu1", "power")]
    sampler = power.PowerSampler(sources, hz=10, clock=clock)
    for _ in range(21):
        sampler.sample_once()
        clock.now += 0.1
    block, warnings = power.energy_block(sampler.measure([(1000.0, 1002.0)]), [], 2.0, 10.0)
    assert warnings == [] and block["quality_flags"] == []
    assert block["average_watts"] == pytest.approx(470.0)
    assert block["joules"] == pytest.approx(940.0)
    assert block["scope"] == "2 GPU boards only"


def test_nvml_errors_mid_run_never_stop_sampling(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    clock = FakeClock()
    nvml = FakeNVML(clock)
    sources, _ = nvml_sources(nvml)
    nvml.fail_after = nvml.calls + 2 * 10  # both GPUs fail after 1 s of 10 Hz
    sampler = power.PowerSampler(sources, hz=10, clock=clock)
    for _ in range(21):
        sampler.sample_once()
        clock.now += 0.1
    block, warnings = power.energy_block(sampler.measure([(1000.0, 1002.0)]), [], 2.0, 10.0)
    assert block["measured"] and block["coverage"] == pytest.approx(0.45)
    assert len([w for w in warnings if "GPU is lost" in w]) == 2


def test_nvml_missing_is_a_note_not_an_error():
    class Broken(FakeNVML):
        def nvmlInit(self):
            raise self.NVMLError("NVML Shared Library Not Found")

    assert nvml_sources(Broken(FakeClock())) == (
        [],
        "NVML unavailable (NVML Shared Library Not Found)",
    )


class FourGPUs(FakeNVML):
    """A board of four GPUs, the second without an energy counter (as in FakeNVML)."""

    names = ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA B200"]

    def nvmlDeviceGetCount(self):
        return 4

    def nvmlDeviceGetName(self, handle):
        return self.names[handle].encode()  # older nvidia-ml-py releases return bytes


def test_nvml_sources_are_the_gpus_cuda_visible_devices_names(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    sources, note = nvml_sources(FourGPUs(FakeClock()))
    assert [(s.name, s.method.split(", ")[-1]) for s in sources] == [
        ("gpu0", "NVIDIA H100 80GB HBM3"),
        ("gpu2", "NVIDIA H200"),
    ]
    assert note == (
        "gpu1 (NVIDIA H100 PCIe), gpu3 (NVIDIA B200) left out: not among the GPUs this run "
        "uses (CUDA_VISIBLE_DEVICES='0,2')"
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-33c0ffee-0000-0000-0000-000000000003,GPU-11")
    sources, _ = nvml_sources(FourGPUs(FakeClock()))
    assert [(s.name, s.kind) for s in sources] == [("gpu3", "counter"), ("gpu1", "power")]


def test_nvml_sources_with_no_gpu_or_a_missing_one_say_so_in_one_line(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    sources, note = nvml_sources(FourGPUs(FakeClock()))
    assert sources == [] and note.startswith("gpu0 (NVIDIA H100 80GB HBM3), gpu1")
    assert note.endswith("left out: not among the GPUs this run uses (CUDA_VISIBLE_DEVICES='')")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,7,2")
    sources, note = nvml_sources(FourGPUs(FakeClock()))
    assert [s.name for s in sources] == ["gpu1"] and "\n" not in note
    assert note.startswith(
        "CUDA_VISIBLE_DEVICES='1,7,2': '7' is none of the 4 GPUs here (CUDA ignores it and the "
        "entries after it); gpu0 (NVIDIA H100 80GB HBM3), gpu2 (NVIDIA H200), gpu3"
    )
    _, discovered = discover(FourGPUs(FakeClock()), Path("/nonexistent"))
    assert discovered[0] == f"GPU boards: {note}"


def test_mig_instances_are_out_of_scope(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-4f1a2b3c-0000-0000-0000-000000000000")
    sources, note = nvml_sources(FourGPUs(FakeClock()))
    assert sources == [] and "names MIG instances" in note and "out of scope" in note


@pytest.mark.parametrize(
    "value, indices",
    [
        (None, [0, 1, 2]),
        ("2,0", [2, 0]),
        ("0,0,1", [0, 1]),
        ("1,-1,2", [1]),  # CUDA stops at the first negative entry
        ("GPU-ab", [1]),  # a UUID prefix no other GPU shares
        ("GPU-a", []),  # shared by two GPUs: names none, and CUDA stops there
    ],
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(value, indices):
    from hpcai500_tf.cluster.devices import cuda_visible_gpus

    uuids = ["GPU-aa01", "GPU-ab02", "GPU-cc03"]
    assert cuda_visible_gpus(value, uuids)[0] == indices


# ------------------------------------------------------------------------ the energy block


def _measurement(name, part, joules, covered, samples):
    return {
        "name": name,
        "part": part,
        "kind": "power",
        "method": "test",
        "worker": 0,
        "host": "h",
        "joules": joules,
        "covered_s": covered,
        "samples": samples,
        "sample_hz": samples / covered,
        "failed_reads": 0,
        "first_error": None,
        "counter_faults": 0,
    }


def test_a_node_meter_is_the_scope_when_present():
    items = [
        _measurement("gpu0", "GPU board", 4000.0, 10.0, 100),
        _measurement("meter", power.NODE, 9000.0, 10.0, 10),
    ]
    block, _ = power.energy_block(items, [], 10.0, 10.0)
    assert block["scope"] == "whole node (meter log)" and block["joules"] == 9000.0
    assert block["average_watts"] == pytest.approx(900.0)
    assert block["parts_not_measured"] == []


def test_without_a_meter_the_sampled_parts_add_up_and_the_rest_is_named():
    items = [
        _measurement("rapl:package-0", "CPU package", 1000.0, 10.0, 100),
        _measurement("rapl:dram-0", "DRAM", 100.0, 10.0, 100),
    ]
    notes = ["GPU boards: NVML unavailable"]
    block, _ = power.energy_block(items, notes, 10.0, 10.0)
    assert block["scope"] == "1 CPU package, 1 DRAM only"
    assert block["average_watts"] == pytest.approx(110.0)
    assert block["parts_not_measured"] == [*notes, power.REST_OF_NODE]


def test_slow_or_partial_sampling_is_flagged():
    items = [_measurement("meter", power.NODE, 900.0, 9.0, 5)]
    block, warnings = power.energy_block(items, [], 10.0, None)
    assert block["coverage"] == pytest.approx(0.9) and block["sample_hz"] == pytest.approx(5 / 9)
    assert len(block["quality_flags"]) == 2 and block["quality_flags"][0] in warnings


def test_nothing_measured_is_not_a_zero():
    block, _ = power.energy_block([], ["GPU boards: none", "CPU packages: none"], 10.0, 10.0)
    assert block["measured"] is False and block["joules"] is None
    assert block["reason"] == "GPU boards: none; CPU packages: none"


def test_segments_of_a_resumed_run_add_up():
    first = [_measurement("gpu0", "GPU board", 100.0, 1.0, 10)]
    second = [_measurement("gpu0", "GPU board", 300.0, 2.0, 20)]
    (total,) = power.combine_segments([first, second])
    assert (total["joules"], total["covered_s"], total["samples"]) == (400.0, 3.0, 30)


def test_a_measured_record_needs_sane_energy(published_record, tmp_path):
    energy = published_record["energy"]
    energy.update(measured=True, reason=None, joules=10.0, interval_s=1.0, scope="x")
    energy.update(average_watts=10.0, coverage=1.5, sample_hz=10.0)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(published_record))
    with pytest.raises(UserError, match="'energy.coverage' must be a fraction"):
        record.load(path)


# ------------------------------------------------------------------------ commands


def test_power_command_on_a_machine_without_sensors(capsys, monkeypatch):
    monkeypatch.setattr("hpcai500_tf.energy.sources.POWERCAP_ROOT", Path("/nonexistent"))
    assert main(["power", "--json", "--seconds", "0.2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sources"] == [] or all(s["samples"] > 0 for s in report["sources"])
    assert any(note.startswith("CPU packages:") for note in report["missing"])


def test_power_command_checks_a_meter_log(tmp_path, capsys):
    path = _log(tmp_path, "timestamp,W\n" + "".join(f"{t},250\n" for t in range(100, 111)))
    assert main(["power", "--json", "--seconds", "0.1", "--meter-log", str(path)]) == 0
    meter = json.loads(capsys.readouterr().out)["meter_log"]
    assert meter["average_watts"] == pytest.approx(250.0) and meter["readings"] == 11
    assert main(["power", "--meter-log", str(tmp_path / "none.csv")]) == 2
    assert capsys.readouterr().err.strip().endswith("none.csv: no such meter log")


# ------------------------------------------------------------------------ a measured run


class RaplWriter:
    """Advances a fake package counter at constant power while a run trains, in a file other
    processes can read (the multi-worker test); in-process runs use `fake_rapl_counter`."""

    def __init__(self, root: Path, watts: float):
        self.root, self.watts = root, watts
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        start = time.time()
        target = self.root / "intel-rapl:0" / "energy_uj"
        while not self.stop.wait(0.005):
            joules = (time.time() - start) * self.watts % 1000.0  # wraps at 1000 J
            temporary = target.with_suffix(".tmp")
            temporary.write_text(f"{int(joules * 1e6)}\n")
            os.replace(temporary, target)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def fake_rapl_counter(monkeypatch, root: Path, watts: float) -> None:
    """The package counter of `root` at constant power, its value computed from the clock at
    the moment it is read (a writer thread, delayed on a busy machine, would serve stale values
    and skew the average). It goes in where sysfs is read (`sources._read_number`), so
    discovery, the sampler and the integration run as for real; it wraps at 1000 J, as the
    fixture's range says. For runs in this process: workers in other processes need
    `RaplWriter`."""
    from hpcai500_tf.energy import sources

    target, start, read = root / "intel-rapl:0" / "energy_uj", time.time(), sources._read_number

    def read_number(path: Path) -> float:
        if Path(path) != target:
            return read(path)
        return float(int((time.time() - start) * watts % 1000.0 * 1e6))  # microjoules

    monkeypatch.setattr(sources, "_read_number", read_number)


def test_a_run_measured_by_rapl_and_a_meter_log(tmp_path, powercap, monkeypatch):
    from hpcai500_tf.engine import run
    from hpcai500_tf.run import energy as run_energy

    monkeypatch.setattr(run_energy, "discover", lambda **_: discover(FakeNVMLMissing(), powercap))
    now = time.time()
    meter = _log(tmp_path, "".join(f"{now - 30 + t},{300 + t % 2}\n" for t in range(600)))
    setup = config.prepare("image_classification", "tiny", ["training.epochs=1"])
    fake_rapl_counter(monkeypatch, powercap, watts=80.0)
    rec, path = run.run_benchmark(setup, None, tmp_path / "runs", power_hz=20, meter_log=str(meter))
    energy = record.load(path)["energy"]
    assert energy["measured"] and energy["scope"] == "whole node (meter log)"
    assert energy["average_watts"] == pytest.approx(300.5, abs=0.5)
    assert energy["coverage"] == pytest.approx(1.0)
    sampled = {s["name"]: s for s in energy["sources"]}
    assert sampled["rapl:package-0"]["average_watts"] == pytest.approx(80.0, rel=0.05)
    assert sampled["rapl:package-0"]["sample_hz"] > 10
    assert "GPU boards: NVML unavailable (no driver)" in energy["notes"]
    assert Path(rec["artifacts"]["power_samples"]).read_text().startswith("worker,source")
    score = scoring.score(rec, config.load_benchmark("image_classification"))
    assert score.valid_flops_per_watt == pytest.approx(score.valid_flops / energy["average_watts"])


class FakeNVMLMissing(FakeNVML):
    def __init__(self):
        super().__init__(FakeClock())

    def nvmlInit(self):
        raise self.NVMLError("no driver")


def test_a_resumed_run_measures_energy_over_both_segments(tmp_path, powercap, monkeypatch):
    from hpcai500_tf.engine import run
    from hpcai500_tf.run import energy as run_energy

    from .test_train import StopBeforeEpoch

    monkeypatch.setattr(run_energy, "discover", lambda **_: discover(FakeNVMLMissing(), powercap))
    setup = config.prepare("image_classification", "tiny", ["training.epochs=3"])
    fake_rapl_counter(monkeypatch, powercap, watts=40.0)
    stopped, path = run.run_benchmark(setup, None, tmp_path, view=[StopBeforeEpoch(3)], power_hz=20)
    time.sleep(1.0)  # between the processes: not part of the run
    done, _ = run.run_benchmark(setup, None, tmp_path, resume=str(path.parent), power_hz=20)
    first, whole = stopped["energy"], done["energy"]
    segments = done["timeline"]["segments"]
    assert whole["interval_s"] == pytest.approx(sum(s["stop"] - s["start"] for s in segments))
    (package,) = [s for s in whole["sources"] if s["name"] == "rapl:package-0"]
    (package_first,) = [s for s in first["sources"] if s["name"] == "rapl:package-0"]
    assert package["joules"] > package_first["joules"]
    assert package["average_watts"] == pytest.approx(40.0, rel=0.05)
    assert whole["coverage"] == pytest.approx(1.0, abs=0.01)
    assert len(done["layers"]) == 9  # the record is whole


@pytest.mark.parametrize(
    "content, warning",
    [
        ("10,300\n11,300\n12,300\n", "no reading covers the timed run"),
        ("time,horsepower\n1000,1\n1001,1\n", "meter log not used: "),
    ],
)
def test_a_meter_log_that_cannot_serve_is_a_warning_not_a_lost_run(tmp_path, content, warning):
    from hpcai500_tf.run.energy import energy_result
    from hpcai500_tf.run.progress import Progress

    progress = Progress("x", segments=[{"start": 1000.0, "stop": 1010.0}], energy=[[]])
    meter = _log(tmp_path, content)
    block, warnings = energy_result(progress, ["GPU boards: none"], 10.0, str(meter))
    assert block["measured"] is False and block["reason"] == "GPU boards: none"
    assert any(warning in w for w in warnings)


def test_a_counter_that_never_moves_is_left_out_not_a_zero():
    items = [_measurement("rapl:dram-0", "DRAM", 0.0, 10.0, 100)]
    block, warnings = power.energy_block(items, [], 10.0, 10.0)
    assert block["measured"] is False and any("did not move" in w for w in warnings)


def test_other_workers_are_gathered_once_per_host():
    own = [
        {**_measurement("rapl:package-0", "CPU package", 500.0, 10.0, 100), "sample_hz": 10.0},
        {**_measurement("gpu0", "GPU board", 3000.0, 10.0, 100), "sample_hz": 10.0},
    ]
    vector = power.worker_vector(own)
    same_host = list(vector)  # worker 1: worker 0's package and board
    other_host = [vector[0] + 1, *power.worker_vector([own[0], {**own[1], "host": "h2"}])[1:]]
    bare_host = [vector[0] + 2] + [0.0] * (len(vector) - 1)
    measurements, notes = power.other_workers([vector, same_host, other_host, bare_host])
    assert {m["worker"] for m in measurements} == {2}  # worker 1 shares worker 0's host
    assert notes == ["worker 3: no power source on its node"]
    gpu = next(m for m in measurements if m["part"] == "GPU board")
    assert gpu["joules"] == 3000.0 and gpu["sample_hz"] == pytest.approx(10.0)
    block, _ = power.energy_block([*own, *measurements], notes, 10.0, 10.0)
    assert block["average_watts"] == pytest.approx(2 * 350.0)
    assert block["scope"] == "2 CPU packages, 2 GPU boards only"


def test_a_meter_on_worker_0_adds_the_other_nodes_sampled_parts():
    meter = _measurement("meter", power.NODE, 9000.0, 10.0, 10)
    remote = {**_measurement("worker1:cpu_packages", "CPU package", 2000.0, 10.0, 100),
              "worker": 1, "count": 2}  # fmt: skip
    block, _ = power.energy_block([meter, remote], [], 10.0, 10.0)
    assert block["average_watts"] == pytest.approx(1100.0)
    assert block["scope"] == "whole node of worker 0 (meter log), other workers' 2 CPU packages"


class GPUsOfAHost(FakeNVML):
    """`count` GPUs with energy counters, GPU i at 100 W x (i + 1), UUIDs unique to `host`."""

    def __init__(self, clock, host: str, count: int):
        super().__init__(clock)
        self.host, self.count = host, count

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetName(self, handle):
        return "Fake H200"

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{self.host}-{handle}"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return int(100_000 * (handle + 1) * (self.clock() - 1000.0))


def _worker(monkeypatch, host: str, rank: int, visible: str, gpus: int = 8):
    """(measurements, gathered vector) of worker `rank` on `host` over 2 s: the GPUs of a fake
    NVML that CUDA_VISIBLE_DEVICES=`visible` names, and the host's CPU package at 50 W."""
    clock = FakeClock()
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    sources, _ = nvml_sources(GPUsOfAHost(clock, host, gpus))
    package = Source("rapl:package-0", "CPU package", "counter", "fake RAPL",
                     read_value=lambda: 50.0 * (clock() - 1000.0))  # fmt: skip
    sampler = power.PowerSampler([*sources, package], hz=10, worker=rank, clock=clock)
    for _ in range(21):
        sampler.sample_once()
        clock.now += 0.1
    measurements = sampler.measure([(1000.0, 1002.0)])
    return measurements, power.worker_vector(measurements)


def _gathered(workers: list, notes=(), meter: list = ()) -> dict:
    others, more = power.other_workers([vector for _, vector in workers])
    block, _ = power.energy_block([*workers[0][0], *meter, *others], [*notes, *more], 2.0, 10.0)
    return block


def test_eight_workers_of_one_host_count_every_gpu_and_the_package_once(monkeypatch):
    workers = [_worker(monkeypatch, "node0", rank, str(rank)) for rank in range(8)]
    assert all(len(vector) == power.VECTOR_LENGTH for _, vector in workers)
    block = _gathered(workers)
    assert block["scope"] == "8 GPU boards, 1 CPU package only"
    assert block["average_watts"] == pytest.approx(100.0 * sum(range(1, 9)) + 50.0)
    assert block["joules"] == pytest.approx(2.0 * (3600.0 + 50.0))
    meter = [_measurement("meter", power.NODE, 9000.0, 2.0, 20)]  # holds all 8 GPUs already
    assert _gathered(workers, meter=meter)["scope"] == "whole node (meter log)"


def test_two_hosts_of_four_workers_count_eight_gpus_and_two_packages(monkeypatch):
    workers = [_worker(monkeypatch, f"node{r // 4}", r, str(r % 4), gpus=4) for r in range(8)]
    block = _gathered(workers)
    assert block["scope"] == "8 GPU boards, 2 CPU packages only"
    assert block["average_watts"] == pytest.approx(2 * (100.0 * sum(range(1, 5)) + 50.0))


def test_a_board_two_workers_see_is_counted_once(monkeypatch):
    workers = [_worker(monkeypatch, "node0", 0, "0"), _worker(monkeypatch, "node0", 1, "0,1")]
    others, _ = power.other_workers([vector for _, vector in workers])
    (gpus,) = [m for m in others if m["part"] == "GPU board"]
    assert gpus["count"] == 1 and gpus["joules"] == pytest.approx(400.0)  # gpu1 only
    assert "1 more seen by a lower rank" in gpus["method"]
    assert _gathered(workers)["scope"] == "2 GPU boards, 1 CPU package only"


def test_gpu_boards_beyond_the_slots_are_named(monkeypatch):
    count = power.GPU_SLOTS + 2
    many = ",".join(str(i) for i in range(count))
    workers = [_worker(monkeypatch, "a", 0, "0"), _worker(monkeypatch, "b", 1, many, count)]
    _, notes = power.other_workers([vector for _, vector in workers])
    assert notes == [
        f"worker 1: 2 of its {count} GPU boards not gathered (at most {power.GPU_SLOTS} per worker)"
    ]


def _one_segment(ending: BaseException | None):
    """The epoch loop `timed_run` runs: one 0.2 s segment, then `ending` raised if set."""

    def train_epochs(one, power=None):
        start = time.time()
        time.sleep(0.2)
        one.progress.segments.append({"start": start, "stop": time.time()})
        if ending:
            raise ending

    return train_epochs


def _timed(tmp_path, monkeypatch, rank: int, workers: int, ending=None):
    """A worker's timed run, sampling a fake 50 W package: (the run, its outcome)."""
    from types import SimpleNamespace

    from hpcai500_tf.mlperf.mllog import MLLogger
    from hpcai500_tf.run import energy as run_energy
    from hpcai500_tf.run import lifecycle, progress
    from hpcai500_tf.run.directory import RunDirectory

    start = time.time()
    package = Source("rapl:package-0", "CPU package", "counter", "fake RAPL",
                     read_value=lambda: 50.0 * (time.time() - start))  # fmt: skip
    monkeypatch.setattr(run_energy, "discover", lambda **_: ([package], []))
    monkeypatch.setattr(lifecycle, "train_epochs", _one_segment(ending))
    trainer = SimpleNamespace(workers=workers, rank=rank, explain=lambda error: None)
    bench = lifecycle.Run(None, trainer, RunDirectory(tmp_path), False, progress.Progress("x"),
                          MLLogger(None))  # fmt: skip
    return bench, lifecycle.timed_run(bench, 20.0)


def test_a_workers_power_sample_rows_name_it(tmp_path, monkeypatch):
    bench, _ = _timed(tmp_path, monkeypatch, rank=3, workers=8)
    rows = bench.samples_path.read_text().splitlines()
    assert bench.samples_path.name == "power-samples-worker3.csv" and len(rows) > 2
    assert all(row.startswith("3,rapl:package-0,") for row in rows[1:])


def test_a_stopped_multi_worker_record_names_the_workers_it_lacks(
    tmp_path, monkeypatch, published_record
):
    from hpcai500_tf.run import energy as run_energy
    from hpcai500_tf.run.status import Terminated

    bench, outcome = _timed(tmp_path, monkeypatch, rank=0, workers=8, ending=Terminated())
    assert outcome.status == "stopped" and outcome.peer_lost
    others, notes, nodes = run_energy.gather_energy(bench, outcome)  # no collective: stopping
    assert nodes is None  # not gathered: unknown
    energy, _ = run_energy.energy_result(bench.progress, outcome.notes + notes, 20.0, None, others)
    missing = "workers 1-7: energy not gathered (the run was stopped by SIGTERM: no collective"
    assert energy["measured"] and energy["scope"] == "1 CPU package only"
    assert any(item.startswith(missing) for item in energy["parts_not_measured"])
    published_record["energy"] = energy
    path = tmp_path / "r.json"
    path.write_text(json.dumps(published_record))
    assert record.load(path)["energy"]["parts_not_measured"] == energy["parts_not_measured"]
    meter = [_measurement("meter", power.NODE, 9000.0, 10.0, 10)]  # worker 0's node only
    block, _ = power.energy_block(meter, notes, 10.0, 10.0)
    assert block["scope"] == "whole node (meter log)" and block["parts_not_measured"] == notes


@pytest.mark.parametrize(
    "outcome, why",
    [
        (
            {"status": "stopped", "peer_lost": True},
            "a peer worker was lost: no collective after it",
        ),
        ({"status": "failed"}, "the run failed: a peer may never join a collective"),
        (
            {"status": "stopped", "peer_lost": True, "interrupted": True},
            "the run was interrupted (Ctrl-C): no collective after it",
        ),
    ],
)
def test_a_run_that_ended_without_gathering_says_whose_energy_is_missing(outcome, why):
    from types import SimpleNamespace

    from hpcai500_tf.run import energy as run_energy
    from hpcai500_tf.run import lifecycle

    two_workers = SimpleNamespace(workers=2)
    notes = [f"worker 1: energy not gathered ({why})"]
    assert run_energy.gather_energy(two_workers, lifecycle.Outcome(**outcome)) == ([], notes, None)


def _meter_run(tmp_path, nodes, others=()):
    """A 10 s run's energy block measured by a meter log at 300 W (worker 0's node), the run's
    workers on `nodes` nodes."""
    from hpcai500_tf.run.energy import energy_result
    from hpcai500_tf.run.progress import Progress

    progress = Progress("x", segments=[{"start": 1000.0, "stop": 1010.0}], energy=[[]])
    meter = _log(tmp_path, "".join(f"{995 + t},300\n" for t in range(20)))
    block, _ = energy_result(progress, [], 10.0, str(meter), list(others), nodes)
    assert block["measured"] and block["scope"].startswith("whole node")
    return block


def test_a_meter_log_names_the_nodes_it_misses_only_where_the_workers_span_several(
    tmp_path, monkeypatch
):
    """Eight workers on one node: the meter holds them all, their GPUs included; on two nodes
    it misses the other; with the hosts unknown (nothing gathered) it says so."""
    same_node = [_worker(monkeypatch, "node0", rank, str(rank)) for rank in range(8)]
    others, _ = power.other_workers([vector for _, vector in same_node])
    assert others and power.node_count([vector for _, vector in same_node]) == 1
    single = _meter_run(tmp_path, 1, others)
    assert not any("meter log" in part for part in single["parts_not_measured"])
    assert single["average_watts"] == pytest.approx(300.0)  # the GPUs are inside the meter's
    two = [_worker(monkeypatch, f"node{r // 4}", r, str(r % 4), gpus=4) for r in range(8)]
    assert power.node_count([vector for _, vector in two]) == 2
    others, _ = power.other_workers([vector for _, vector in two])
    missing = "workers on the other node: not in the meter log (worker 0's node)"
    assert missing in _meter_run(tmp_path, 2, others)["parts_not_measured"]  # sampled there
    assert _meter_run(tmp_path, 2)["parts_not_measured"] == [missing]  # nothing sampled there
    assert _meter_run(tmp_path, 4)["parts_not_measured"] == [
        "workers on the other 3 nodes: not in the meter log (worker 0's node)"
    ]
    (unknown,) = _meter_run(tmp_path, None)["parts_not_measured"]
    assert unknown.startswith("workers other than 0: not in the meter log")
    assert unknown.endswith("their hosts were not gathered")


def test_a_gathered_run_counts_the_meter_logs_nodes_from_the_workers_hosts(monkeypatch):
    """gather_energy's node count: the distinct hosts of the gathered vectors."""
    from types import SimpleNamespace

    from hpcai500_tf.run import energy as run_energy
    from hpcai500_tf.run import lifecycle, progress

    for hosts, expected in ((["a", "a"], 1), (["a", "b"], 2)):
        vectors = [_worker(monkeypatch, host, rank, "0")[1] for rank, host in enumerate(hosts)]
        trainer = SimpleNamespace(gather_rows=lambda own, rows=vectors: rows)
        one = SimpleNamespace(workers=2, trainer=trainer, warnings=[], finished=False,
                              progress=progress.Progress("x", energy=[[]]))  # fmt: skip
        _, _, nodes = run_energy.gather_energy(one, lifecycle.Outcome())
        assert nodes == expected


def test_a_rebuilt_multi_worker_record_gathers_no_energy_from_the_chiefs_saved_state():
    """A finished run's record rebuilt on resume: every worker restored the chief's state, so
    a gather would count the chief's CPU readings again as each other node's."""
    from types import SimpleNamespace

    from hpcai500_tf.run import energy as run_energy
    from hpcai500_tf.run import lifecycle, progress

    def no_collective(row):
        raise AssertionError("no collective over restored readings")

    one = SimpleNamespace(workers=2, finished=True, warnings=[],
                          trainer=SimpleNamespace(gather_rows=no_collective),
                          progress=progress.Progress("x", energy=[[]]))  # fmt: skip
    others, notes, nodes = run_energy.gather_energy(one, lifecycle.Outcome(status="completed"))
    assert (others, nodes) == ([], None)
    assert notes == ["worker 1: energy not gathered (the record was rebuilt from the saved "
                     "state, which holds worker 0's readings)"]  # fmt: skip
