"""Reports the library makes on its own threads reach Python's logging (logger "tensorwire"),
never stderr directly (include/tensorwire/runtime/log.h, python/src/log_py.cpp)."""
import logging
import os
import subprocess
import sys

import pytest

from conftest import PYTHONPATH
from tensorwire import _C


def test_a_report_made_without_the_gil_is_a_record_of_the_tensorwire_logger(caplog):
    caplog.set_level(logging.WARNING, logger="tensorwire")
    _C._log_report("error", "transport failed")
    _C._log_report("warning", "slow client")
    got = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "tensorwire"]
    assert got == [(logging.ERROR, "transport failed"), (logging.WARNING, "slow client")]


def test_a_bad_level_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="level must be"):
        _C._log_report("info", "x")


def report(setup):
    code = f"import logging\nfrom tensorwire import _C\n{setup}\n_C._log_report('error', 'boom')\nprint('ok')"
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=PYTHONPATH),
                          capture_output=True, text=True, timeout=60)


def test_what_reaches_stderr_is_decided_by_the_programs_logging_configuration():
    silenced = report("logging.getLogger('tensorwire').setLevel(logging.CRITICAL)")
    assert silenced.returncode == 0 and silenced.stdout == "ok\n" and silenced.stderr == ""
    configured = report("logging.basicConfig(format='%(name)s|%(levelname)s|%(message)s')")
    assert configured.returncode == 0 and configured.stderr == "tensorwire|ERROR|boom\n"
