import json
import subprocess
import sys

from hpcai500_tf.cli import main


def test_help_lists_every_command(capsys):
    try:
        main(["--help"])
    except SystemExit as exit_:
        assert exit_.code == 0
    out = capsys.readouterr().out
    for command in ("sysinfo", "score", "rank"):
        assert command in out


def test_sysinfo_json_reports_this_machine(capsys):
    assert main(["sysinfo", "--json"]) == 0
    layers = json.loads(capsys.readouterr().out)
    assert list(layers) == ["L1", "L2", "L3", "L4", "L5"]
    assert layers["L1"]["cpu_logical_cores"] >= 1
    assert layers["L5"]["framework"] == "tensorflow"
    assert layers["L5"]["framework_version"].startswith("2.")


def test_unknown_command_exits_non_zero():
    result = subprocess.run(
        [sys.executable, "-m", "hpcai500_tf.cli", "fly"], capture_output=True, text=True
    )
    assert result.returncode != 0 and "invalid choice" in result.stderr


def test_sysinfo_names_the_layers_in_words(capsys):
    assert main(["sysinfo"]) == 0
    out = capsys.readouterr().out
    for words in ("L1 hardware", "L2 operating system", "L4 accelerator libraries", "L5 framework"):
        assert words in out


def test_an_install_without_tensorflow_is_told_which_extra_to_install(monkeypatch, capsys):
    from hpcai500_tf import tensorflow_import

    monkeypatch.delitem(sys.modules, "tensorflow")
    monkeypatch.setattr(tensorflow_import.importlib.util, "find_spec", lambda name: None)
    assert main(["flops", "image_classification", "--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "TensorFlow is not installed" in err and "'.[cpu]'" in err and "'.[cuda]'" in err


def test_every_command_has_its_arguments_in_the_module_named_for_it(capsys):
    import importlib

    from hpcai500_tf.cli import COMMANDS

    for command, (module, _) in COMMANDS.items():
        assert command in importlib.import_module(f"hpcai500_tf.cli.{module}").PARSERS
        try:
            main([command, "--help"])
        except SystemExit as exit_:
            assert exit_.code == 0
        assert capsys.readouterr().out.startswith(f"usage: hpcai500-tf {command} [-h]")


def test_train_help_loads_the_train_command_alone():
    """`train --help` imports train's module and nothing of the run or any framework."""
    script = (
        "import contextlib, io, sys\n"
        "from hpcai500_tf.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['train', '--help'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('hpcai500_tf', 'tensorflow', 'keras', 'torch', 'numpy', 'rich')))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    ours = ["", ".cli", ".cli.train", ".errors", ".report", ".report.text", ".tensorflow_import"]
    assert result.stdout.strip() == str([f"hpcai500_tf{name}" for name in ours])


def test_trains_framework_choices_are_the_registrys():
    from hpcai500_tf import backends
    from hpcai500_tf.cli import train

    assert train.FRAMEWORKS == backends.NAMES
