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
